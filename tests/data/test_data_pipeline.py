"""dualjax.data.pipeline: the training iterator (shapes, seeds, resume, epochs,
mixed and hard negatives, pretokenized batches, worker processes) and text ids."""
import json
import os

import numpy as np
import pytest
from conftest import SYNTHETIC_SEED

from dualjax.data import pipeline
from dualjax.text import features as feature_lib
from dualjax.text.features import SideFeatures
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import WordTokenizer, build_word_tokenizer

SEED = SYNTHETIC_SEED  # the seed of the `train_src` tables (conftest.py)


# --- pipeline.train_iterator ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(train_src):
    texts = [train_src[i]["query"].decode() for i in range(len(train_src))]
    return build_word_tokenizer(texts, vocab_size=500, num_oov_buckets=50)


_NO_FEATURES = SideFeatures()


def _inputs(tok, query_len, doc_len=None, doc_features=_NO_FEATURES):
    return Inputs(Side(tok, query_len), Side(tok, doc_len or query_len, doc_features))


def _iterator(src, tok, seed=SEED, batch=32, max_len=16):
    return pipeline.train_iterator(src, _inputs(tok, max_len), batch, seed=seed)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def _differ(a, b):
    return any(not np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def test_batch_shapes_and_dtypes(train_src, tokenizer):
    batch = next(_iterator(train_src, tokenizer))
    assert set(batch) == {"q_ids", "q_mask", "d_ids", "d_mask", "doc_ids", "query_ids",
                          "cluster_ids"}
    assert batch["doc_ids"].shape == (32,) and batch["doc_ids"].dtype == np.int32
    for side in ("q", "d"):
        ids, mask = batch[f"{side}_ids"], batch[f"{side}_mask"]
        assert ids.shape == mask.shape == (32, 16)
        assert ids.dtype == np.int32 and mask.dtype == np.bool_
        np.testing.assert_array_equal(mask, ids != 0)
        assert mask[:, 0].all()  # every synthetic text has words
        assert ids.max() < tokenizer.vocab_size


def test_same_seed_same_batches_different_seed_different(train_src, tokenizer):
    first = _take(_iterator(train_src, tokenizer, seed=3), 4)
    _assert_same(first, _take(_iterator(train_src, tokenizer, seed=3), 4))
    assert _differ(first, _take(_iterator(train_src, tokenizer, seed=4), 4))


def test_get_state_set_state_resumes(train_src, tokenizer):
    it = _iterator(train_src, tokenizer)
    start = _take(it, 3)
    state = it.get_state()
    following = _take(it, 2)
    resumed = _iterator(train_src, tokenizer)
    resumed.set_state(state)
    _assert_same(_take(resumed, 2), following)
    assert _differ(following, start[:2])  # the resumed batches are not the first ones


def test_query_and_document_max_lengths_and_categorical_fields(train_src, tokenizer):
    """Each side is cut at its own length (Chang et al.: 64 / 288); a side with categorical
    fields gets their ids, the 'missing' id 0 for a pair without them."""
    batch = next(pipeline.train_iterator(train_src, _inputs(tokenizer, 3, 5), 8, seed=SEED))
    assert batch["q_ids"].shape == (8, 3) and batch["d_ids"].shape == (8, 5)
    src, tok = _indexed_source(8)
    for i, r in enumerate(src):
        r["query_fields"] = b""
        r["document_fields"] = json.dumps({"shop": f"s{i % 2}"} if i < 6 else {}).encode()
    shop = feature_lib.build_side([("shop", 4)], [{"shop": "s0"}, {"shop": "s1"}], 10, 3)
    batch = next(pipeline.train_iterator(src, _inputs(tok, 3, doc_features=shop), 8, seed=SEED))
    assert "q_cats" not in batch and batch["d_cats"].shape == (8, 1)
    for q, cat in zip(batch["q_ids"][:, 0] - 1, batch["d_cats"][:, 0], strict=True):  # record q
        assert cat == (q % 2 + 1 if q < 6 else 0)  # s0 -> 1, s1 -> 2, none -> missing


@pytest.mark.slow
def test_mixed_negatives_are_uniform_draws_of_training_documents():
    n = 24
    src, tok = _indexed_source(n)
    inputs = _inputs(tok, 3)
    it = pipeline.train_iterator(src, inputs, 6, seed=SEED, num_mixed_negatives=8)
    batches = _take(it, 300)
    b = batches[0]
    assert b["m_ids"].shape == (8, 3) and b["m_doc_ids"].shape == (8,)
    drawn = np.concatenate([x["m_ids"][:, 0] - 1 - n for x in batches])  # d{i} -> i
    assert drawn.min() >= 0 and drawn.max() < n
    counts = np.bincount(drawn, minlength=n)  # 2400 draws, 100 expected per document
    assert counts.min() > 60 and counts.max() < 140
    np.testing.assert_array_equal(b["m_doc_ids"], pipeline.text_ids(
        [f"d{i}" for i in b["m_ids"][:, 0] - 1 - n]))
    again = pipeline.train_iterator(src, inputs, 6, seed=SEED, num_mixed_negatives=8)
    _assert_same(_take(again, 3), batches[:3])  # seeded
    it2 = pipeline.train_iterator(src, inputs, 6, seed=SEED, num_mixed_negatives=8)
    _take(it2, 5)
    state = it2.get_state()
    resumed = pipeline.train_iterator(src, inputs, 6, seed=SEED, num_mixed_negatives=8)
    resumed.set_state(state)
    _assert_same(_take(resumed, 2), batches[5:7])


def test_mixed_negatives_are_uniform_over_distinct_documents_not_pairs():
    n = 12
    src, tok = _indexed_source(n)
    src += [{"query": f"q{i}".encode(), "document": b"d0"} for i in range(n)] * 4  # 49 pairs
    it = pipeline.train_iterator(src, _inputs(tok, 3), 6, seed=SEED, num_mixed_negatives=8)
    drawn = np.concatenate([x["m_ids"][:, 0] - 1 - n for x in _take(it, 300)])
    counts = np.bincount(drawn, minlength=n)  # 2400 draws, 200 expected per document
    assert counts[0] < 280 and counts.min() > 130


def test_hard_negatives_stay_with_their_pair():
    n = 12
    src, tok = _indexed_source(n)
    for i, r in enumerate(src):
        r["hard_negatives"] = [f"d{(i + 1) % n}".encode(), f"d{(i + 2) % n}".encode()]
    batch = next(pipeline.train_iterator(src, _inputs(tok, 3), 6, seed=SEED,
                                         num_hard_negatives=2))
    assert batch["n_ids"].shape == (6, 2, 3) and batch["n_doc_ids"].shape == (6, 2)
    q = batch["q_ids"][:, 0] - 1
    for j in range(2):
        np.testing.assert_array_equal(batch["n_ids"][:, j, 0] - 1 - n, (q + j + 1) % n)
    np.testing.assert_array_equal(batch["n_mask"], batch["n_ids"] != 0)
    with pytest.raises(ValueError, match="prepare it with data.hard_negatives"):
        next(pipeline.train_iterator(src, _inputs(tok, 3), 6, seed=SEED, num_hard_negatives=3))


def _indexed_source(n):
    """Records whose query is word q{i} and document word d{i}, and a tokenizer where
    q{i} -> id i + 1 and d{i} -> id n + i + 1."""
    src = [{"query": f"q{i}".encode(), "document": f"d{i}".encode()} for i in range(n)]
    vocab = tuple(f"q{i}" for i in range(n)) + tuple(f"d{i}" for i in range(n))
    return src, WordTokenizer(vocab=vocab, num_oov_buckets=0)


def test_epochs_are_reshuffled_permutations():
    n, batch = 24, 6
    src, tok = _indexed_source(n)
    it = pipeline.train_iterator(src, _inputs(tok, 3), batch, seed=SEED)
    epochs = []
    for _ in range(3):
        order = []
        for b in _take(it, n // batch):
            q = b["q_ids"][:, 0] - 1
            np.testing.assert_array_equal(b["d_ids"][:, 0] - 1 - n, q)  # pairs stay aligned
            order += q.tolist()
        assert sorted(order) == list(range(n))  # each record exactly once per epoch
        epochs.append(order)
    assert epochs[0] != list(range(n))  # shuffled at all
    assert epochs[1] != epochs[0] and epochs[2] != epochs[1] and epochs[2] != epochs[0]


def test_stream_reads_the_batches_of_grains_shuffle_repeat_batch():
    """`shuffle.stream` gives the batches grain's range(n).shuffle(seed).repeat().batch(b)
    gives (the order read before it, which old checkpoints' data positions index), across
    epochs and the seed's wrap-around; its `index_shuffle` is grain's element for element,
    at sizes where the cipher's block size changes."""
    import grain

    from dualjax.data import shuffle
    for n, b, seed in [(100, 32, 7), (24, 6, SEED), (5, 8, 2 ** 32 - 3)]:
        reference = grain.MapDataset.range(n).shuffle(seed=seed).repeat().batch(b)
        for k in range(2 * n // b + 3):
            np.testing.assert_array_equal(shuffle.stream(k * b, b, n, seed), reference[k])
    rng = np.random.default_rng(0)
    for n in (1, 32_768, 32_769, 65_536, 65_537, 262_145, 1_000_003):  # tiny n: above
        for seed in (0, 1, 2 ** 32 - 1):
            index = rng.integers(0, n, 50)
            expected = [grain.experimental.index_shuffle(int(i), max_index=n - 1, seed=seed,
                                                         rounds=4) for i in index]
            np.testing.assert_array_equal(shuffle.index_shuffle(index, n - 1, seed), expected)

def test_a_repeated_text_is_encoded_once_but_keeps_each_records_fields(monkeypatch):
    """A document of several pairs is tokenized and normalised once (`encode_records`),
    its rows the same ids and text id; the categorical fields stay each record's own."""
    src, tok = _indexed_source(4)
    for i, r in enumerate(src):
        r["document"] = b"d0" if i < 3 else b"d3"  # d0 three times, with three shops
        r["document_fields"] = json.dumps({"shop": f"s{i}"}).encode()
    shop = feature_lib.build_side([("shop", 4)], [{"shop": f"s{i}"} for i in range(4)], 10, 3)
    normalised = []
    normalize = pipeline.normalize
    monkeypatch.setattr(pipeline, "normalize", lambda t: normalised.append(t) or normalize(t))
    out = pipeline.encode_pairs(src, _inputs(tok, 3, doc_features=shop))
    assert sorted(normalised) == ["d0", "d3", "q0", "q1", "q2", "q3"]  # each text once
    np.testing.assert_array_equal(out["d_ids"][:, 0], [5, 5, 5, 8])
    assert out["doc_ids"][0] == out["doc_ids"][1] == out["doc_ids"][2] != out["doc_ids"][3]
    assert len(set(out["d_cats"][:, 0].tolist())) == 4  # each record's shop


def test_text_ids_match_exactly_the_texts_that_normalise_alike():
    ids = pipeline.text_ids(["How do I cook rice?", "how do i cook rice", "how do i cook pasta"])
    assert ids[0] == ids[1] != ids[2]
    assert (ids >= 0).all()



def test_pretokenized_batches_equal_the_records_encoded_per_batch(train_src, tokenizer):
    """The pairs are encoded once and a batch gathers rows; the arrays are those that
    encoding the batch's records would give."""
    inputs = _inputs(tokenizer, 7, 12)
    once = pipeline.ReadPairs(train_src, inputs)
    each = pipeline.ReadPairs(train_src, inputs, pretokenize=False)
    assert once._table is not None and each._table is None
    assert len(once._table["q_ids"]) == len(train_src)
    rng = np.random.default_rng(0)
    for _ in range(3):
        indices = rng.choice(len(train_src), 16, replace=False)
        _assert_same([once.map(indices)], [each.map(indices)])


def test_batches_read_while_the_table_is_made_are_encoded_and_equal_its_rows(
        train_src, tokenizer, monkeypatch):
    """A table still in the making (the run's tokenizing thread): the iterator's first
    batches are encoded from their records, the same arrays its rows will hold; once
    it is done, batches gather them; its error is raised where a batch is read."""
    import threading

    from dualjax.runtime.pipeline import Background
    inputs, gate = _inputs(tokenizer, 7, 12), threading.Event()
    pending = Background(lambda: gate.wait(30) and pipeline.pretokenized_pairs(
        train_src, inputs), "tokenize pairs")
    encoded = []
    each = pipeline.ReadPairs.map_records
    monkeypatch.setattr(pipeline.ReadPairs, "map_records",
                        lambda self, records: encoded.append(len(records)) or each(self, records))
    it = pipeline.train_iterator(train_src, inputs, 16, seed=SEED, table=pending,
                                 prefetch_batches=1)
    early = _take(it, 2)
    assert encoded and not pending.done()  # read while the table was pending
    gate.set()
    pending.result()
    encoded.clear()
    late = _take(it, 6)[-2:]  # (the prefetched ones past)
    assert not encoded  # gathered
    ready = _take(pipeline.train_iterator(train_src, inputs, 16, seed=SEED,
                                          table=pending.result()), 8)
    _assert_same(early + late, ready[:2] + ready[-2:])

    def fail():
        raise ValueError("4 hard negatives per pair asked for, but the data has fewer")
    failed = Background(fail, "tokenize pairs")
    with pytest.raises(ValueError, match="hard negatives"):
        failed.result()  # (done)
    with pytest.raises(ValueError, match="hard negatives"):
        pipeline.ReadPairs(train_src, inputs, table=failed).map(np.arange(4))


def test_encoded_pairs_are_kept_and_read_back_only_for_the_same_table_and_inputs(
        train_src, tokenizer, tmp_path, monkeypatch):
    """`keep_in` (data/token_cache.py): the arrays are kept in one folder per key and
    read back memory-mapped, nothing encoded, by a call that asks the same; another
    length or tokenizer encodes again and replaces them; a folder not written whole
    (killed) is not read; in-memory pairs are not kept."""
    keep = str(tmp_path / "tokenized")
    inputs = _inputs(tokenizer, 7, 12)
    first = pipeline.pretokenized_pairs(train_src, inputs, keep_in=keep, inputs_id="v1")
    assert len(os.listdir(keep)) == 1 and not isinstance(first["q_ids"], np.memmap)

    def encoded(*_):
        raise AssertionError("encoded again")
    with monkeypatch.context() as m:
        m.setattr(pipeline, "encode_pairs", encoded)
        again = pipeline.pretokenized_pairs(train_src, inputs, keep_in=keep, inputs_id="v1")
        assert all(isinstance(v, np.memmap) for v in again.values())
        _assert_same([first], [again])
        for other in (dict(inputs=_inputs(tokenizer, 7, 10)), dict(inputs_id="v2")):
            with pytest.raises(AssertionError, match="encoded again"):
                pipeline.pretokenized_pairs(train_src, **{"inputs": inputs,
                                                          "inputs_id": "v1", **other},
                                            keep_in=keep)
    shorter = pipeline.pretokenized_pairs(train_src, _inputs(tokenizer, 7, 10), keep_in=keep,
                                          inputs_id="v1")
    (folder,) = os.listdir(keep)  # the other key's arrays replaced
    assert shorter["d_ids"].shape[1] == 10
    os.remove(os.path.join(keep, folder, "arrays.json"))  # as if killed before the rename
    assert not isinstance(pipeline.pretokenized_pairs(
        train_src, _inputs(tokenizer, 7, 10), keep_in=keep, inputs_id="v1")["q_ids"], np.memmap)
    in_memory, _ = _indexed_source(4)
    pipeline.pretokenized_pairs(in_memory, inputs, keep_in=str(tmp_path / "none"))
    assert not os.path.exists(tmp_path / "none")


def test_worker_count_minus_one_chooses_from_the_cores_and_the_pretokenizing(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    assert pipeline.workers(-1, "the pairs are tokenized up front") == 0
    assert pipeline.workers(-1) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert pipeline.workers(-1) == pipeline.MAX_AUTO_WORKERS
    assert pipeline.workers(2, "tokenized") == 2 and pipeline.workers(0) == 0


@pytest.mark.slow
def test_worker_processes_give_the_same_batches_and_resume(train_src, tokenizer, monkeypatch):
    """A source too large to pretokenize (here: the limit set to 0) read by a grain worker
    process (data.worker_count=-1 on two cores): the batches of the main process alone,
    and a resumed iterator goes on with them; closed, it leaves no process behind."""
    monkeypatch.setattr(pipeline, "PRETOKENIZE_MAX_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    inputs = _inputs(tokenizer, 16)
    alone = _take(pipeline.train_iterator(train_src, inputs, 32, seed=SEED, worker_count=0), 5)
    it = pipeline.train_iterator(train_src, inputs, 32, seed=SEED, worker_count=-1)
    first = _take(it, 3)
    import multiprocessing
    assert len(multiprocessing.active_children()) == 1  # the worker
    state = it.get_state()
    _assert_same(first + _take(it, 2), alone)
    it.close()
    assert not multiprocessing.active_children()
    resumed = pipeline.train_iterator(train_src, inputs, 32, seed=SEED, worker_count=-1)
    resumed.set_state(state)
    _assert_same(_take(resumed, 2), alone[3:])
    resumed.close()
