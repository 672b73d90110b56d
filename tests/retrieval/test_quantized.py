"""Quantized indexes (issue 32): int8 and binary codes searched and rescored against a
float query (`retrieval.quantized`), and `dualjax.index --quantize`."""

import numpy as np
import pytest

from dualjax.retrieval import ann, quantized


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _data(n=400, dim=32, nq=40, seed=0):
    rng = np.random.default_rng(seed)
    corpus = _unit(rng.normal(size=(n, dim)))
    queries = _unit(corpus[:nq] + 0.5 / np.sqrt(dim) * rng.normal(size=(nq, dim)))  # near doc i
    return corpus, queries


def test_int8_codes_decode_within_half_a_step():
    corpus, _ = _data()
    idx = quantized.QuantizedIndex.build(corpus, "int8")
    assert idx.codes.dtype == np.int8 and idx.codes.shape == corpus.shape
    err = np.abs(idx.decoded(np.arange(len(corpus))) - corpus)
    assert (err <= idx.step / 2 + 1e-6).all()
    assert idx.nbytes < corpus.nbytes / 3.5


def test_binary_codes_are_the_signs_a_bit_each():
    corpus, _ = _data(dim=20)
    idx = quantized.QuantizedIndex.build(corpus, "binary")
    assert idx.codes.shape == (len(corpus), 3)  # 20 bits in 3 bytes
    np.testing.assert_allclose(idx.decoded(np.arange(len(corpus))),  # unit vectors
                               np.sign(corpus) / np.sqrt(20), rtol=1e-6)


@pytest.mark.parametrize("kind", quantized.KINDS)
def test_scores_are_cosines_on_the_float_indexes_scale(kind):
    """A binary index printed scores of +4 to +6 where float and int8 ones print
    cosines: each query's first score now lies in [-1, 1], near the float cosine."""
    corpus, queries = _data(n=500, dim=64, nq=20)
    floats = ann.ExactIndex(corpus, 16, 128).search(queries, 1)[0][:, 0]
    scores = quantized.QuantizedIndex.build(corpus, kind).search(queries, 1)[0][:, 0]
    assert (np.abs(scores) <= 1 + 1e-5).all()
    assert np.abs(scores - floats).max() < (0.05 if kind == "int8" else 0.4)


@pytest.mark.parametrize("kind", quantized.KINDS)
def test_rescoring_every_candidate_is_the_decoded_vectors_exact_search(kind):
    """With rescore = n the first pass cannot lose anything: the ranking is the float
    query against the decoded corpus, exactly; the own document is excluded."""
    corpus, queries = _data()
    idx = quantized.QuantizedIndex.build(corpus, kind, rescore=len(corpus))
    exclude = np.arange(len(queries))
    exclude[::2] = -1
    scores, ids = idx.search(queries, 10, exclude)
    decoded = idx.decoded(np.arange(len(corpus)))
    ref_scores, ref_ids = ann.ExactIndex(decoded, 16, 128).search(queries, 10, exclude)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    assert (ids == ref_ids).mean() > 0.99  # float ties aside
    assert not (ids[1::2] == exclude[1::2, None]).any()


@pytest.mark.parametrize("kind", quantized.KINDS)
def test_quantized_search_finds_each_querys_own_neighbour(kind):
    """Query i is document i plus a little noise: the codes and their rescoring find it
    first, as the float vectors do (random directions: the hard case for binary codes)."""
    corpus, queries = _data(n=2000, dim=256, nq=100)
    assert (ann.ExactIndex(corpus, 16, 512).search(queries, 1)[1][:, 0]
            == np.arange(100)).all()
    ids = quantized.QuantizedIndex.build(corpus, kind).search(queries, 10)[1]
    assert (ids[:, 0] == np.arange(100)).mean() >= 0.98

