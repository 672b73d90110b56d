"""The tables' own writer (data/table_files.py) against TFDS's: the same records, in the
same order, the same split info."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from array_record.python.array_record_data_source import ArrayRecordDataSource
from tensorflow_datasets.core import example_serializer, file_adapters, hashing, naming
from tensorflow_datasets.core import writer as writer_lib
from tensorflow_datasets.proto import tf_example_pb2

from dualjax.data import builders, table_files

LONG = "word " * 4000  # 20,000 bytes: lengths past two varint bytes


def _records(table: str, n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    texts = ["what is a bike?", "Café Über — 北京", "", LONG, "x" * 127, "y" * 128]
    if table == "pairs":
        return [{"query": texts[i % 6], "document": texts[(i + 1) % 6],
                 "query_fields": "" if i % 2 else '{"a": 1}', "document_fields": "",
                 "hard_negatives": [texts[j % 6] for j in range(i % 3)],
                 "cluster": int(rng.integers(0, 2 ** 40))} for i in range(n)]
    return [{"id": i, "text": texts[i % 6].encode() if i % 2 else texts[i % 6],
             "fields": "", "key": f"q{i}",
             "relevant": sorted(rng.choice(10 ** 6, i % 4, replace=False).tolist()),
             "grades": [], "self": -1 if i % 3 else i} for i in range(n)]


def _template(folder, split: str) -> naming.ShardedFileTemplate:
    return naming.ShardedFileTemplate(data_dir=folder, dataset_name="t", split=split,
                                      filetype_suffix="array_record")


def _read(info: tfds.core.SplitInfo, template) -> list[bytes]:
    paths = [str(template.sharded_filepath(shard_index=k, num_shards=len(info.shard_lengths)))
             for k in range(len(info.shard_lengths))]
    source = ArrayRecordDataSource(paths)
    return source.__getitems__(range(len(source)))


@pytest.mark.parametrize("table", ["pairs", "queries"])
def test_the_tables_written_equal_tfds_own_writer(tmp_path, table):
    """The same split through TFDS's Writer (its serializer, its shuffle) and through
    write_split: record i of one parses to record i of the other, and the split infos
    (shard lengths, bytes) are equal."""
    features = builders._FEATURES[table]()
    records = _records(table, 300)
    ours_dir, tfds_dir = tmp_path / "ours", tmp_path / "tfds"
    ours_dir.mkdir()
    tfds_dir.mkdir()
    ours = table_files.write_split(records, features, _template(ours_dir, "train"))

    spec = tfds.features.FeaturesDict(features)
    theirs_template = _template(tfds_dir, "train")
    writer = writer_lib.Writer(
        serializer=example_serializer.ExampleSerializer(spec.get_serialized_info()),
        filename_template=theirs_template, hash_salt="train", disable_shuffling=False,
        example_writer=writer_lib.ExampleWriter(file_adapters.FileFormat.ARRAY_RECORD))
    for i, r in enumerate(records):
        writer.write(i, spec.encode_example(r))
    lengths, size = writer.finalize()

    assert (ours.shard_lengths, ours.num_bytes) == (lengths, size)
    a, b = _read(ours, _template(ours_dir, "train")), _read(ours, theirs_template)
    parse = tf_example_pb2.Example.FromString
    assert [parse(x) for x in a] == [parse(x) for x in b]


def test_the_order_is_tfds_hashed_order():
    hasher = hashing.Hasher("val")
    expected = sorted(range(1000), key=hasher.hash_key)
    assert table_files.tfds_order(1000, "val").tolist() == expected


def test_a_split_past_the_shard_size_is_several_shards_read_in_order(tmp_path):
    features = builders._FEATURES["pairs"]()
    records = _records("pairs", 200)
    info = table_files.write_split(records, features, _template(tmp_path, "train"),
                                   shard_bytes=60_000)
    assert len(info.shard_lengths) > 2 and sum(info.shard_lengths) == 200
    got = _read(info, _template(tmp_path, "train"))
    encode = table_files.encoder(table_files.kinds(features))
    order = table_files.tfds_order(200, "train")
    assert got == [encode(records[i]) for i in order]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"t-train.array_record-{k:05d}-of-{len(info.shard_lengths):05d}"
        for k in range(len(info.shard_lengths))]  # (no temporary file left)


def test_a_split_written_by_worker_processes_is_the_same_split(tmp_path, monkeypatch):
    """Two spawned workers, a shard of 70 records each: the records, their order and the
    bytes are those of the split written here; no temporary file is left."""
    features = builders._FEATURES["pairs"]()
    records = _records("pairs", 200)
    (tmp_path / "here").mkdir()
    (tmp_path / "workers").mkdir()
    here = table_files.write_split(records, features, _template(tmp_path / "here", "train"))
    monkeypatch.setattr(table_files, "TASK_RECORDS", 70)
    there = table_files.write_split(records, features, _template(tmp_path / "workers", "train"),
                                    workers=2)
    assert there.shard_lengths == [70, 70, 60] and there.num_bytes == here.num_bytes
    assert (_read(there, _template(tmp_path / "workers", "train"))
            == _read(here, _template(tmp_path / "here", "train")))
    assert len(list((tmp_path / "workers").iterdir())) == 3


def test_a_worker_that_dies_is_one_line_and_the_table_is_not_kept(tmp_path, monkeypatch):
    """A table writer process that dies mid-task (here: it exits on its first task): one
    WorkdirError line; TFDS removes the temporary folder, so nothing a rerun would take
    for a finished table is left, and the rerun writes it whole."""
    import sys

    from conftest import load_config

    from dualjax.config.specs import dataset_spec
    from dualjax.errors import WorkdirError

    data = dataset_spec(load_config("tiny").data, 0)
    tfds_dir = str(tmp_path / "tfds")
    monkeypatch.setattr(table_files, "TASK_RECORDS", 100)
    monkeypatch.setattr(table_files, "_default_workers", lambda n: 2)
    command, env = table_files._worker_command()
    with monkeypatch.context() as m:
        m.setattr(table_files, "_worker_command", lambda: (
            [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"], env))
        with pytest.raises(WorkdirError, match=r"^a process writing the data tables \(pid "
                           r"\d+\) ended with exit code 3 before its shard was whole; nothing "
                           r"was kept .*run the same command again$"):
            builders.prepare(data, tfds_dir, "pairs")
    import os
    left = [os.path.join(r, n) for r, dirs, files in os.walk(tfds_dir) for n in dirs + files]
    assert not [p for p in left if "incomplete" in p or p.endswith("2.3.0")], left
    again = builders.prepare(data, tfds_dir, "pairs")
    info = again.info.splits["train"]
    assert len(info.shard_lengths) > 1 and len(again.as_data_source("train")) == info.num_examples


@pytest.mark.parametrize("coherence", [0.0, 0.4])  # (0.4 drops some clusters)
def test_a_pairs_file_clusters_its_training_pairs_as_the_closure_of_them(tmp_path, coherence):
    """pairs_file hands the builders each training pair's cluster from its own joining of
    all pairs; numbered densely in order of first appearance, they are exactly what the
    builders computed before (`cluster_pairs` of the training pairs alone), also after
    the coherence filter drops clusters."""
    import random

    from dualjax.data import clusters, sources
    from dualjax.text.words import normalize

    rng = random.Random(1)
    words = "bike chain brake bread flour oven river boat fish garden".split()
    lines = []
    for c in range(60):  # chains a~b~c of 2-4 texts sharing some words, shuffled
        texts = [f"{' '.join(rng.sample(words, 3))} {c} v{j}" for j in range(rng.randint(2, 4))]
        lines += [f"{a}\t{b}" for a, b in zip(texts, texts[1:], strict=False)]
    rng.shuffle(lines)
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    settings = {"path": str(path), "sha256": "", "seed": 0, "val_fraction": 0.2,
                "test_fraction": 0.2, "skip_bad_lines": False, "candidates": "split",
                "min_cluster_coherence": coherence}
    data = sources.SOURCES.named("pairs").load(settings)
    closure = clusters.cluster_pairs([(normalize(q), normalize(d)) for q, d in data.train_pairs])
    assert data.train_clusters == [closure[normalize(q)] for q, _ in data.train_pairs]
    assert len(set(data.train_clusters)) > 10
