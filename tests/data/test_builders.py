"""dualjax.data.builders: the TFDS array_record tables of the synthetic data and of a
pairs file (written once, read back by index, rebuilt when a setting or the file
changes), and their bad input."""
import glob
import os
import re

import numpy as np
import pytest
from conftest import SYNTHETIC_SEED, load_config

from dualjax.config.specs import dataset_spec as spec
from dualjax.data import builders, synthetic
from dualjax.errors import DataError
from dualjax.text.words import normalize

VERSION = str(builders._RetrievalBuilder.VERSION)

SEED = SYNTHETIC_SEED  # the seed of the `train_src` tables (conftest.py)


def _generate(data_cfg, seed=SEED):
    return synthetic.generate(seed=seed, num_train_clusters=data_cfg.num_train_clusters,
                              num_val_clusters=data_cfg.num_val_clusters,
                              num_test_clusters=data_cfg.num_test_clusters)


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


def test_records_parse_only_the_features_asked_for(train_src):
    """`Records.only`: the same records with only the named features (of those the table
    has) parsed, as the training pairs are read for encoding."""
    every = train_src.__getitems__(range(20))
    some = train_src.only(["query", "cluster", "not a feature"]).__getitems__(range(20))
    assert [set(r) for r in some] == [{"query", "cluster"}] * 20
    assert some == [{"query": r["query"], "cluster": r["cluster"]} for r in every]
    assert set(train_src[0]) > {"query", "cluster"}  # (the source itself unchanged)


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
