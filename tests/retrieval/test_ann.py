"""Tests for dualjax.retrieval.ann.exact_search against a numpy brute-force reference."""
import numpy as np
import pytest

from dualjax.retrieval import ann

NQ, NC, DIM = 13, 37, 8
# (query_chunk, corpus_chunk): defaults, chunk=1, non-dividing, exact, larger than sizes.
CHUNKS = [(256, 4096), (1, 1), (4, 7), (5, 10), (13, 37), (100, 100)]


def _data(seed=0, nq=NQ, nc=NC, dim=DIM):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(nq, dim)).astype(np.float32),
            rng.normal(size=(nc, dim)).astype(np.float32))


def _reference(q, c):
    """Scores [nq, nc] in float64 and the full ranking (best first) per query."""
    scores = q.astype(np.float64) @ c.astype(np.float64).T
    return scores, np.argsort(-scores, axis=1, kind="stable")


def _assert_no_near_ties(scores):
    """Guards the fixed test data: float32 rounding cannot reorder the ranking."""
    gaps = np.diff(np.sort(scores, axis=1), axis=1)
    assert gaps.min() > 1e-4


def test_reference_data_has_no_ties():
    q, c = _data()
    _assert_no_near_ties(_reference(q, c)[0])


@pytest.mark.parametrize("query_chunk,corpus_chunk,k",
                         [(qc, cc, 5) for qc, cc in CHUNKS]
                         + [(4, 7, 1), (256, 4096, NC), (1, 1, NC), (5, 10, NC)])
def test_matches_brute_force(query_chunk, corpus_chunk, k):
    q, c = _data()
    ref_scores, ref_rank = _reference(q, c)
    scores, ids = ann.exact_search(q, c, k, query_chunk=query_chunk,
                                     corpus_chunk=corpus_chunk)
    assert scores.shape == ids.shape == (NQ, k)
    assert scores.dtype == np.float32 and ids.dtype == np.int32
    np.testing.assert_array_equal(ids, ref_rank[:, :k])
    np.testing.assert_allclose(scores, np.take_along_axis(ref_scores, ref_rank[:, :k], 1),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("query_chunk,corpus_chunk", [(256, 4096), (1, 1), (3, 16)])
def test_exclude_removes_that_id_and_next_best_moves_up(query_chunk, corpus_chunk):
    q, c = _data(seed=1)
    ref_scores, ref_rank = _reference(q, c)
    _assert_no_near_ties(ref_scores)
    k = 6
    # Exclude the best id (even queries), a mid-ranked id (every third), or nothing (-1).
    exclude = np.full(NQ, -1, np.int64)
    exclude[0::2] = ref_rank[0::2, 0]
    exclude[1::3] = ref_rank[1::3, 3]
    scores, ids = ann.exact_search(q, c, k, exclude=exclude, query_chunk=query_chunk,
                                     corpus_chunk=corpus_chunk)
    for i in range(NQ):
        expected = [j for j in ref_rank[i] if j != exclude[i]][:k]
        np.testing.assert_array_equal(ids[i], expected, err_msg=f"query {i}")
        np.testing.assert_allclose(scores[i], ref_scores[i, expected], rtol=0, atol=1e-5)
        if exclude[i] >= 0:
            assert exclude[i] not in ids[i]
    # Excluding the best: the old second is now first, the rest shift up by one.
    np.testing.assert_array_equal(ids[0, :k - 1], ref_rank[0, 1:k])
    # Without an exclusion (query 5 is odd and not 1 mod 3) nothing changes.
    assert exclude[5] == -1
    np.testing.assert_array_equal(ids[5], ref_rank[5, :k])


def test_self_retrieval_excluded():
    """Queries that are corpus rows (their own best match) retrieve the others instead."""
    rng = np.random.default_rng(2)
    c = rng.normal(size=(20, DIM)).astype(np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    own = np.array([3, 0, 19, 7])
    q = c[own]
    _, ids_all = ann.exact_search(q, c, 3, corpus_chunk=6)
    np.testing.assert_array_equal(ids_all[:, 0], own)  # unit vectors: self is the best
    _, ids = ann.exact_search(q, c, 3, exclude=own, corpus_chunk=6)
    _, rank = _reference(q, c)
    expected = [[j for j in row if j != o][:3] for row, o in zip(rank, own, strict=True)]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(ids[:, :2], ids_all[:, 1:])


@pytest.mark.parametrize("corpus_chunk", [4096, 1, 4])
def test_k_larger_than_corpus_pads_with_minus_one_and_inf(corpus_chunk):
    q, c = _data(seed=3, nq=5, nc=6)
    ref_scores, ref_rank = _reference(q, c)
    scores, ids = ann.exact_search(q, c, 9, query_chunk=2, corpus_chunk=corpus_chunk)
    assert ids.shape == (5, 9)
    np.testing.assert_array_equal(ids[:, :6], ref_rank)
    np.testing.assert_allclose(scores[:, :6], np.take_along_axis(ref_scores, ref_rank, 1),
                               rtol=0, atol=1e-5)
    assert (ids[:, 6:] == -1).all()
    assert np.isneginf(scores[:, 6:]).all()


@pytest.mark.parametrize("corpus_chunk", [4096, 1, 4])
def test_exclusion_with_k_equal_to_corpus_size(corpus_chunk):
    q, c = _data(seed=4, nq=6, nc=6)
    ref_scores, ref_rank = _reference(q, c)
    exclude = np.array([ref_rank[0, 0], -1, ref_rank[2, 5], 0, 5, ref_rank[5, 2]])
    scores, ids = ann.exact_search(q, c, 6, exclude=exclude, corpus_chunk=corpus_chunk)
    for i in range(6):
        if exclude[i] < 0:
            np.testing.assert_array_equal(ids[i], ref_rank[i])
            assert np.isfinite(scores[i]).all()
        else:
            expected = [j for j in ref_rank[i] if j != exclude[i]]
            np.testing.assert_array_equal(ids[i, :5], expected)
            np.testing.assert_allclose(scores[i, :5], ref_scores[i, expected], rtol=0, atol=1e-5)
            assert ids[i, 5] == -1 and np.isneginf(scores[i, 5])


@pytest.mark.parametrize("corpus_chunk", [4, 16])
def test_padding_rows_never_returned_when_all_scores_negative(corpus_chunk):
    """Zero padding rows would score 0 and beat every real (negative) score."""
    rng = np.random.default_rng(5)
    q = -np.abs(rng.normal(size=(7, DIM))).astype(np.float32)
    c = np.abs(rng.normal(size=(9, DIM))).astype(np.float32)
    ref_scores, ref_rank = _reference(q, c)
    assert (ref_scores < 0).all()
    scores, ids = ann.exact_search(q, c, 12, query_chunk=3, corpus_chunk=corpus_chunk)
    np.testing.assert_array_equal(ids[:, :9], ref_rank)
    assert (scores[:, :9] < 0).all()
    assert (ids[:, 9:] == -1).all() and np.isneginf(scores[:, 9:]).all()


def test_registered_kinds():
    assert ann.INDEXES == ("exact", "scann", "hnsw")


# ----------------------------------------------------------------------------- HNSW (faiss)
def _unit_corpus(n=600, dim=16, seed=3):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(n, dim)).astype(np.float32)
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def test_hnsw_exact_top_k_at_high_ef_search_and_exclude():
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install faiss-cpu)")
    import ml_collections
    corpus = _unit_corpus()
    queries, k = corpus[:40], 7
    cfg = ml_collections.ConfigDict({"M": 16, "ef_construction": 200, "ef_search": 600})
    hnsw = ann.HnswIndex.build(corpus, cfg, k)
    assert hnsw.settings == {"M": 16, "ef_construction": 200, "ef_search": 600}
    exclude = np.arange(40) - 1  # query i (corpus row i) excludes row i - 1; -1: nothing
    exclude[::2] = np.arange(0, 40, 2)  # even queries exclude themselves
    for ex in (None, exclude):
        scores, ids = hnsw.search(queries, k, ex)
        want_scores, want_ids = ann.exact_search(queries, corpus, k, ex)
        assert ids.dtype == np.int32 and scores.dtype == np.float32 and ids.shape == (40, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    # k above the corpus size pads with -1 / -inf, as ExactIndex does.
    small = ann.HnswIndex.build(corpus[:5], cfg, 8)
    scores, ids = small.search(queries[:3], 8, np.array([0, -1, 2]))
    assert (ids[:, 5:] == -1).all() and np.isneginf(scores[:, 5:]).all()
    assert (ids[[0, 2], 4] == -1).all() and 0 not in ids[0] and 2 not in ids[2]
    assert sorted(ids[1, :5]) == [0, 1, 2, 3, 4]


def test_hnsw_make_index_saves_loads_and_rebuilds(tmp_path):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install faiss-cpu)")
    import ml_collections
    corpus, k = _unit_corpus(300, 8), 5
    cfg = ml_collections.ConfigDict({"query_chunk": 64, "corpus_chunk": 1024,
                                     "hnsw": ann.default_hnsw_config()})
    directory = str(tmp_path / "hnsw")
    first, info = ann.make_index("hnsw", corpus, cfg, k, directory)
    assert isinstance(first, ann.HnswIndex) and info["built"] and info["bytes_on_disk"] > 0
    assert info["settings"]["ef_search"] == 128  # auto: max(128, 2 * (k + 1))
    cfg.hnsw.ef_search = 300  # search-time knob: the saved index is reused
    again, info = ann.make_index("hnsw", corpus, cfg, k, directory)
    assert not info["built"] and again.settings["ef_search"] == 300
    np.testing.assert_array_equal(again.search(corpus[:10], k, np.arange(10))[1],
                                  first.search(corpus[:10], k, np.arange(10))[1])
    cfg.hnsw.M = 8  # build knob: rebuilt
    assert ann.make_index("hnsw", corpus, cfg, k, directory)[1]["built"]
    with pytest.raises(ValueError, match="M=1"):
        ann.hnsw_settings(10, 4, 1, ml_collections.ConfigDict(
            {"M": 1, "ef_construction": 10, "ef_search": 0}))


def test_hnsw_answers_k_up_to_the_corpus_size_like_exact_search():
    """An index built for k = 100, asked for every document: the graph walk alone found
    1,410 of 2,259; the rows it leaves short are scanned, so every document comes back,
    in exact order."""
    pytest.importorskip("faiss", reason="HNSW needs faiss-cpu (the test extra)")
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(2259, 16)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    hnsw = ann.HnswIndex.build(corpus, ann.default_hnsw_config(), 100)
    scores, ids = hnsw.search(corpus[:4], 2259)
    assert (ids >= 0).all()
    want_scores, want_ids = ann.exact_search(corpus[:4], corpus, 2259)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


def test_the_corpus_goes_to_the_device_a_block_at_a_time_from_an_array_or_a_file(
        tmp_path, monkeypatch):
    """Blocks of 7 rows (the last one moved back to end at the buffer's end) and chunks of
    5: 53 rows, from memory and from a .npy file read a block at a time, search as numpy's
    brute force does."""
    from dualjax.retrieval import exact
    monkeypatch.setattr(exact, "_BLOCK_BYTES", 7 * 4 * 8)
    rng = np.random.default_rng(3)
    corpus = rng.normal(size=(53, 8)).astype(np.float32)
    queries = rng.normal(size=(6, 8)).astype(np.float32)
    np.save(tmp_path / "c.npy", corpus)
    want = np.argsort(-(queries @ corpus.T), axis=1, kind="stable")[:, :10]
    for index in (ann.ExactIndex(corpus, 4, 5),
                  ann.ExactIndex.from_npy(str(tmp_path / "c.npy"), 4, 5)):
        scores, ids = index.search(queries, 10)
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_allclose(scores, np.take_along_axis(queries @ corpus.T, want, 1),
                                   rtol=1e-5)
        buffer, valid = index._device
        assert buffer.shape == (55, 8) and int(valid.sum()) == 53
        np.testing.assert_array_equal(np.asarray(buffer)[:53], corpus)
