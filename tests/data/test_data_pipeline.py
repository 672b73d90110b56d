"""Tests for dualjax.data.builders (TFDS array_record tables) and dualjax.data.pipeline."""
import glob
import json
import os
import re

import numpy as np
import pytest
from conftest import load_config

from dualjax.config.specs import dataset_spec as spec
from dualjax.data import builders, clusters, pipeline, synthetic
from dualjax.errors import DataError
from dualjax.text import features as feature_lib
from dualjax.text.features import SideFeatures
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import WordTokenizer, build_word_tokenizer, normalize

VERSION = str(builders._RetrievalBuilder.VERSION)

SEED = 0


def _generate(data_cfg, seed=SEED):
    return synthetic.generate(seed=seed, num_train_clusters=data_cfg.num_train_clusters,
                              num_val_clusters=data_cfg.num_val_clusters,
                              num_test_clusters=data_cfg.num_test_clusters)


@pytest.fixture(scope="module")
def tiny_data():
    return load_config("tiny").data


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds_synthetic"))


@pytest.fixture(scope="module")
def train_src(tiny_data, synthetic_dir):
    return builders.train_source(spec(tiny_data, SEED), synthetic_dir)


# --- synthetic_paraphrase ----------------------------------------------------------------

def test_synthetic_array_record_files_exist(tiny_data, synthetic_dir, train_src):
    builders.eval_task(spec(tiny_data, SEED), synthetic_dir, "val")
    root = os.path.join(synthetic_dir, "synthetic_paraphrase")
    pairs = glob.glob(os.path.join(root, "pairs-*", VERSION, "*-train.array_record-*"))
    evals = [glob.glob(os.path.join(root, f"{table}-*", VERSION, f"*-{split}.array_record-*"))
             for table in ("corpus", "queries") for split in ("val", "test")]
    assert len(pairs) == 1 and all(len(files) == 1 for files in evals)
    assert all(os.path.getsize(f) > 0 for f in pairs + sum(evals, []))


def test_records_parsed_from_the_raw_bytes_equal_tfds_decoding(tiny_data, synthetic_dir,
                                                              train_src):
    """`builders.Records` parses each table's raw tf.Example bytes with protobuf's C
    parser instead of TFDS's per-feature Python: every record of every table and split
    equals TFDS's own decoding (an empty int sequence: an empty int64 array)."""
    import tensorflow_datasets as tfds
    builders.eval_task(spec(tiny_data, SEED), synthetic_dir, "val")
    tables = glob.glob(os.path.join(synthetic_dir, "synthetic_paraphrase", "*", VERSION))
    assert len(tables) == 3
    for folder in tables:
        builder = tfds.builder_from_directory(folder)
        table = os.path.basename(os.path.dirname(folder)).split("-")[0]
        for split in builder.info.splits:
            ours = builders.Records(builder, split, builders._FEATURES[table]())
            assert ours._raw is not None  # the fast path, not TFDS's own
            want = builder.as_data_source(split=split).__getitems__(range(len(ours)))
            got = ours.__getitems__(range(len(ours)))
            assert len(got) == len(want) > 10
            for a, b in zip(got, want, strict=True):
                assert a.keys() == b.keys()
                for key in a:
                    if isinstance(a[key], np.ndarray):
                        assert a[key].dtype == np.int64
                        np.testing.assert_array_equal(a[key], np.asarray(b[key], np.int64))
                    else:
                        assert type(a[key]) is type(b[key]) and a[key] == b[key], key


def test_synthetic_train_records_match_generate(tiny_data, train_src):
    data = _generate(tiny_data)
    assert len(train_src) == len(data.train_pairs) > 100
    records = [train_src[i] for i in range(len(train_src))]
    assert set(records[0]) == {"query", "document", "query_fields", "document_fields",
                               "hard_negatives", "cluster"}
    clusters = {}  # query's cluster by closure: the generator's paraphrase cluster
    for r in records:
        clusters.setdefault(int(r["cluster"]), set()).update((r["query"], r["document"]))
    assert sum(map(len, clusters.values())) == len(set().union(*clusters.values()))
    assert len(records[0]["hard_negatives"]) == 0  # not mined
    assert records[0]["query_fields"] == records[0]["document_fields"] == b""  # none
    got = sorted((r["query"].decode(), r["document"].decode()) for r in records)
    assert got == sorted(data.train_pairs)


@pytest.mark.parametrize("split", ["val", "test"])
def test_synthetic_eval_task_matches_generate(tiny_data, synthetic_dir, split):
    data = _generate(tiny_data)
    task = builders.eval_task(spec(tiny_data, SEED), synthetic_dir, split)
    cluster_of = {q.text: q.cluster for q in data.splits[split]}
    assert sorted(task.corpus) == sorted(cluster_of)
    assert len(task.corpus) == len(data.splits[split])
    sizes = {}
    for c in cluster_of.values():
        sizes[c] = sizes.get(c, 0) + 1
    assert len(task.queries) == sum(n for n in sizes.values() if n >= 2) > 0
    for q, rel, own in zip(task.queries, task.relevant, task.query_corpus_index, strict=True):
        assert task.corpus[own] == q
        assert rel  # every query has relevant items ...
        expected = {j for j, t in enumerate(task.corpus)
                    if cluster_of[t] == cluster_of[q] and t != q}
        assert rel == expected  # ... exactly the other members of its cluster


def test_synthetic_eval_texts_not_in_training(tiny_data, synthetic_dir, train_src):
    train_texts = set()
    for i in range(len(train_src)):
        r = train_src[i]
        train_texts |= {r["query"].decode(), r["document"].decode()}
    train_norm = {normalize(t) for t in train_texts}
    val = builders.eval_task(spec(tiny_data, SEED), synthetic_dir, "val").corpus
    test = builders.eval_task(spec(tiny_data, SEED), synthetic_dir, "test").corpus
    assert not set(val) & set(test)
    for text in val + test:
        assert text not in train_texts and normalize(text) not in train_norm


def test_changed_setting_makes_new_config_dir(tiny_data, tmp_path):
    tfds_dir = str(tmp_path)
    first = builders.prepare(spec(tiny_data, SEED), tfds_dir, "pairs")
    changed = tiny_data.copy_and_resolve_references()
    changed.num_train_clusters = 40
    second = builders.prepare(spec(changed, SEED), tfds_dir, "pairs")
    other_seed = builders.prepare(spec(tiny_data, SEED + 1), tfds_dir, "pairs")
    dirs = {first.data_dir, second.data_dir, other_seed.data_dir}
    assert len(dirs) == 3 and all(os.path.isdir(d) for d in dirs)
    assert len(second.as_data_source("train")) == len(_generate(changed).train_pairs)
    assert len(first.as_data_source("train")) == len(_generate(tiny_data).train_pairs)
    assert len(second.as_data_source("train")) < len(first.as_data_source("train"))
    # Same settings again: the same directory, reused.
    assert builders.prepare(spec(tiny_data, SEED), tfds_dir, "pairs").data_dir == first.data_dir


@pytest.mark.parametrize("error", ["array_record", "os"])
def test_a_full_disk_while_writing_the_tables_is_one_line_and_leaves_nothing(
        tiny_data, tmp_path, monkeypatch, error):
    """The disk fills while a table is written: one WorkdirError line naming the folder,
    saying nothing was lost and how to go on; no half-written table is left (TFDS has
    it written into incomplete.* and removes that), and the next run prepares the table
    whole. array_record raises riegeli's status as a RuntimeError, the file system an
    OSError."""
    import errno
    import types

    from dualjax.data import table_files
    from dualjax.errors import WorkdirError

    class FullDisk:  # array_record_module.ArrayRecordWriter, on a full disk
        def __init__(self, path, options=""):
            open(path, "wb").close()  # FdWriter opens (creates) the file first
            self.path = path

        def write(self, record):
            if error == "array_record":  # array_record_module.cc: status().message()
                raise RuntimeError(f"write() failed: {os.strerror(errno.ENOSPC)}; writing "
                                   f"{self.path}")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    tfds_dir = str(tmp_path / "tfds")
    with monkeypatch.context() as m:
        m.setattr(table_files, "array_record_module",
                  types.SimpleNamespace(ArrayRecordWriter=FullDisk))
        with pytest.raises(WorkdirError) as err:
            builders.prepare(spec(tiny_data, SEED), tfds_dir, "pairs")
    assert str(err.value) == (
        f"{tfds_dir}: cannot write the data tables (no space left on the device); nothing "
        "was lost (TFDS writes a table into a temporary folder and renames it only when "
        "whole, and removed this one): free some space and run the same command again to "
        "resume")
    left = [os.path.join(root, n) for root, dirs, files in os.walk(tfds_dir)
            for n in dirs + files]
    assert not [p for p in left if "incomplete" in p or p.endswith(VERSION)], left
    again = builders.prepare(spec(tiny_data, SEED), tfds_dir, "pairs")
    assert len(again.as_data_source("train")) == len(_generate(tiny_data).train_pairs)


# --- pairs file ----------------------------------------------------------------------------

NUM_CLUSTERS = 20


def _members(c):
    return [f"topic {c} question {m}" for m in ("one", "two", "three")]


def _write_pairs(path):
    """Clusters of three texts joined transitively: a~b first, c~b later in the file."""
    lines = [f"{_members(c)[0]}\t{_members(c)[1]}" for c in range(NUM_CLUSTERS)]
    lines += [f"{_members(c)[2]}\t{_members(c)[1]}" for c in range(NUM_CLUSTERS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pairs_cfg(path, **overrides):
    cfg = load_config("tiny").data
    cfg.name, cfg.path = "pairs", str(path)
    cfg.val_fraction, cfg.test_fraction = 0.2, 0.2
    cfg.update(overrides)
    return cfg


def test_coherence_filter_with_two_spellings_of_one_text(tmp_path):
    # "How do I cook rice?" and "how do i cook rice" normalise alike: one node, stored
    # under its first spelling; the filter looked clusters up by the raw text (KeyError).
    lines = ["How do I cook rice?\thow do i cook rice", "how do i cook rice\tcooking rice",
             "alpha beta gamma\tdelta epsilon zeta"]  # coherence 0.5: dropped
    lines += [f"what is topic {i}\twhat is topic {i} about" for i in range(30)]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    trained_rice = 0
    for seed in range(4):  # the rice cluster lands in train for some seeds
        src = builders.train_source(spec(_pairs_cfg(path, min_cluster_coherence=0.55), seed),
                                    str(tmp_path / "tfds"))
        queries = {src[i]["query"].decode() for i in range(len(src))}
        assert "alpha beta gamma" not in queries and len(src) > 10
        trained_rice += "how do i cook rice" in queries
    assert trained_rice


def test_pairs_builder_splits_by_cluster(tmp_path):
    cfg = _pairs_cfg(_write_pairs(tmp_path / "pairs.tsv"))
    tfds_dir = str(tmp_path / "tfds")
    src = builders.train_source(spec(cfg, SEED), tfds_dir)
    assert glob.glob(os.path.join(tfds_dir, "pairs_file", "pairs-*", VERSION,
                                  "*-train.array_record-*"))
    train = [(src[i]["query"].decode(), src[i]["document"].decode()) for i in range(len(src))]
    tasks = {s: builders.eval_task(spec(cfg, SEED), tfds_dir, s) for s in ("val", "test")}

    cluster = {t: c for c in range(NUM_CLUSTERS) for t in _members(c)}
    texts = {"train": {t for pair in train for t in pair},
             "val": set(tasks["val"].corpus), "test": set(tasks["test"].corpus)}
    # 20 clusters, fractions 0.6/0.2/0.2: 12 train, 4 val, 4 test clusters.
    assert len(train) == 12 * 2
    assert len(texts["train"]) == 12 * 3
    assert len(texts["val"]) == len(texts["test"]) == 4 * 3
    # No text in two splits; together the splits hold every text.
    assert not texts["train"] & texts["val"]
    assert not texts["train"] & texts["test"]
    assert not texts["val"] & texts["test"]
    assert texts["train"] | texts["val"] | texts["test"] == set(cluster)
    # Cluster members stay together (both pairs of a train cluster are in train).
    for split, split_texts in texts.items():
        for c in {cluster[t] for t in split_texts}:
            assert set(_members(c)) <= split_texts, (split, c)
    for q, d in train:
        assert cluster[q] == cluster[d]
    # Eval queries retrieve the other two members of their cluster.
    for task in tasks.values():
        assert len(task.queries) == 12
        for q, rel in zip(task.queries, task.relevant, strict=True):
            assert {task.corpus[j] for j in rel} == set(_members(cluster[q])) - {q}


def _all_texts(cfg, tfds_dir):
    src = builders.train_source(spec(cfg, SEED), tfds_dir)
    texts = {src[i][k].decode() for i in range(len(src)) for k in ("query", "document")}
    for split in ("val", "test"):
        texts |= set(builders.eval_task(spec(cfg, SEED), tfds_dir, split).corpus)
    return texts


def test_pairs_changed_file_is_rebuilt(tmp_path):
    path = _write_pairs(tmp_path / "pairs.tsv")
    cfg = _pairs_cfg(path)
    tfds_dir = str(tmp_path / "tfds")
    assert "brand new query" not in _all_texts(cfg, tfds_dir)
    with open(path, "a") as f:
        f.write("brand new query\tbrand new document\n")
    assert {"brand new query", "brand new document"} <= _all_texts(cfg, tfds_dir)


def test_pairs_clustered_on_normalised_text(tmp_path):
    # "How are you?" and "how are you" encode identically, so they are one node: the
    # two pairs form one cluster and cannot land in different splits.
    path = tmp_path / "pairs.tsv"
    lines = [f"{_members(c)[0]}\t{_members(c)[1]}" for c in range(NUM_CLUSTERS)]
    lines += ["How are you?\tHow do you do?", "how are you\thow are things going"]
    path.write_text("\n".join(lines) + "\n")
    cfg, tfds_dir = _pairs_cfg(path), str(tmp_path / "tfds")
    src = builders.train_source(spec(cfg, SEED), tfds_dir)
    where = {"train": {normalize(src[i][k].decode()) for i in range(len(src))
                       for k in ("query", "document")}}
    for split in ("val", "test"):
        where[split] = {normalize(t)
                        for t in builders.eval_task(spec(cfg, SEED), tfds_dir, split).corpus}
    splits = [name for name, texts in where.items() if "how are you" in texts]
    assert len(splits) == 1
    assert {"how do you do", "how are things going"} <= where[splits[0]]
    if splits[0] != "train":  # one corpus entry for the two spellings
        task = builders.eval_task(spec(cfg, SEED), tfds_dir, splits[0])
        assert sum(normalize(t) == "how are you" for t in task.corpus) == 1


def test_pairs_too_few_clusters_for_a_split_is_a_clear_error(tmp_path):
    path = tmp_path / "few.tsv"
    path.write_text("a b\tc d\ne f\tg h\ni j\tk l\n")  # 3 clusters, fractions 0.9/0.05/0.05
    with pytest.raises(DataError, match=re.escape(f"{path}: 3 clusters of pairs leave split")):
        builders.train_source(spec(_pairs_cfg(path, val_fraction=0.05, test_fraction=0.05),
                                   SEED), str(tmp_path / "tfds"))


def test_unknown_dataset_name_raises(tmp_path):
    cfg = load_config("tiny").data
    cfg.name = "no_such_data"
    with pytest.raises(DataError, match="no_such_data") as err:
        builders.train_source(spec(cfg, SEED), str(tmp_path))
    assert "known: synthetic_paraphrase, pairs" in str(err.value)


def test_missing_pairs_file_raises(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(DataError, match=re.escape(f"{missing}: no such file")):
        builders.train_source(spec(_pairs_cfg(missing), SEED), str(tmp_path / "tfds"))
    with pytest.raises(DataError, match="data.path"):
        builders.train_source(spec(_pairs_cfg(""), SEED), str(tmp_path / "tfds"))


def test_bad_pairs_line_raises_on_prepare(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a query\ta doc\nno tab on this line\nq\td\n")
    with pytest.raises(DataError) as err:
        builders.train_source(spec(_pairs_cfg(path), SEED), str(tmp_path / "tfds"))
    assert f"{path}:2:" in str(err.value)
    # skip_bad_lines is a different setting: it prepares, without line 2.
    good = _write_pairs(tmp_path / "good.tsv").read_text().splitlines()
    path.write_text("\n".join(good[:1] + ["no tab on this line"] + good[1:]) + "\n")
    texts = _all_texts(_pairs_cfg(path, skip_bad_lines=True), str(tmp_path / "tfds"))
    assert texts == {t for line in good for t in line.split("\t")}


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

# --- retrieval tasks from a hand-made pair graph ---------------------------------------------

def test_cluster_tasks_from_a_pair_graph_split_and_all_candidates():
    from dualjax.data import clusters
    # Pairs: a~b, b~c (transitive: {a, b, c}), d~e, f~g, h~i; and one train pair x~y.
    pairs = [("a", "b"), ("b", "c"), ("d", "e"), ("f", "g"), ("h", "i"), ("x", "y")]
    cluster_of = clusters.cluster_pairs(pairs)
    assert cluster_of["a"] == cluster_of["b"] == cluster_of["c"] != cluster_of["d"]
    split = {"a": "test", "d": "test", "f": "val", "h": "val", "x": "train"}
    root = {t: next(r for r in split if cluster_of[r] == cluster_of[t]) for t in cluster_of}
    items = [(t, cluster_of[t], split[root[t]]) for t in cluster_of] + [("z", 99, "test")]

    by_split = clusters.cluster_tasks(items, "split")
    test = by_split["test"]
    assert test.corpus == ["a", "b", "c", "d", "e", "z"]  # z: a singleton distractor
    assert test.queries == ["a", "b", "c", "d", "e"]
    rel = {q: {test.corpus[j] for j in r} for q, r in zip(test.queries, test.relevant, strict=True)}
    assert rel == {"a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}, "d": {"e"}, "e": {"d"}}
    assert [test.corpus[i] for i in test.query_corpus_index] == test.queries
    assert by_split["val"].corpus == ["f", "g", "h", "i"]

    everything = clusters.cluster_tasks(items, "all")["test"]
    assert sorted(everything.corpus) == sorted(cluster_of) + ["z"]  # train and val too
    assert everything.queries == ["a", "b", "c", "d", "e"]
    rel_all = {q: {everything.corpus[j] for j in r}
               for q, r in zip(everything.queries, everything.relevant, strict=True)}
    assert rel_all == rel


def test_incoherent_clusters_are_dropped():
    items = [("how to cook rice", 0, "test"), ("how to cook rice fast", 0, "test"),
             ("what is love", 1, "test"), ("best pizza in town", 1, "test")]
    # Cluster 0: {how to cook rice} and {how to cook rice fast}: 4/5 and 5/5 -> 0.9.
    # Cluster 1: 3 and 4 words, disjoint: 3/7 and 4/7 -> 0.5.
    assert clusters.drop_incoherent(items, 0.6) == {1}
    assert clusters.drop_incoherent(items, 0.0) == set()


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
