"""TFDS builders: every dataset is written once as array_record and read back by index.

A dataset is three tables, each a TFDS builder config:
- `pairs`: split "train", one positive (query, document) pair per record, with each
  side's categorical fields as JSON (query_fields, document_fields; "" when none) and
  its BM25-mined hard negative documents (`data.hard_negatives`; [] when off);
- `corpus`: splits "val"/"test", the candidates {id, text, fields} of each evaluation
  split;
- `queries`: splits "val"/"test", {id, text, fields, relevant: corpus ids, self: the
  query's own corpus id or -1 (a query never retrieves itself)}.
Builders only implement `_load(settings) -> RawData`; writing and reading are shared.

The config name carries a hash of everything that shapes the data (sizes, seed, file
path and a hash of its contents), so a changed setting never reuses stale files.
Reading needs no TensorFlow: `builder.as_data_source(split)` gives a random-access
source for grain.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import importlib
import json
import os
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from dualjax.data import clusters, mining, pairs_file, sources, table_files
from dualjax.data.clusters import RawData, RetrievalTask
from dualjax.data.records import Records
from dualjax.errors import DataError, WorkdirError
from dualjax.runtime.files import DISK_ERRNOS
from dualjax.text.words import normalize

EVAL_SPLITS = clusters.EVAL_SPLITS
# dualjax's data sources, one module each, in the order they are listed: importing one
# registers it (sources.py); a source of your own registers itself the same way.
BUILT_IN = ("synthetic", "pairs_file", "beir", "reqa")
for _module in BUILT_IN:
    importlib.import_module(f"dualjax.data.{_module}")
sources.SOURCES.put_first(("synthetic_paraphrase", "pairs", "quora", "beir", "reqa_squad"))


@dataclasses.dataclass
class TableConfig(tfds.core.BuilderConfig):
    """A builder config: which table, and the data settings it was made from."""

    table: str = "pairs"  # "pairs" | "corpus" | "queries"
    settings: str = "{}"  # JSON of the data settings (sizes, seed, path, ...)


_FEATURES = {
    "pairs": lambda: {"query": tfds.features.Text(), "document": tfds.features.Text(),
                      "query_fields": tfds.features.Text(),
                      "document_fields": tfds.features.Text(),
                      "hard_negatives": tfds.features.Sequence(tfds.features.Text()),
                      "cluster": np.int64},
    "corpus": lambda: {"id": np.int64, "text": tfds.features.Text(),
                       "fields": tfds.features.Text(), "key": tfds.features.Text()},
    "queries": lambda: {"id": np.int64, "text": tfds.features.Text(),
                        "fields": tfds.features.Text(), "key": tfds.features.Text(),
                        "relevant": tfds.features.Sequence(np.int64),
                        "grades": tfds.features.Sequence(np.int64), "self": np.int64},
}
# The evaluation tables gained "key" (the data's own ids) and "grades" (the judgements'
# grades, beside "relevant") in 2026-11; their new names let a workdir made before
# build them once more from its data, while its pairs table (and so its training) stays.
_TABLE_NAMES = {"pairs": "pairs", "corpus": "corpus-keyed", "queries": "queries-keyed"}


def _json(fields: dict | None) -> str:
    """Categorical fields as stored: JSON, or "" for none."""
    return json.dumps(fields, sort_keys=True) if fields else ""


def _fields(raw: bytes) -> dict | None:
    return json.loads(raw.decode("utf-8")) if raw else None
_last_load: dict = {}  # one RawData, shared by the three tables of one dataset


class _RetrievalBuilder(tfds.core.GeneratorBasedBuilder):
    """Shared writing logic; subclasses implement `_load` from their settings."""

    # 2.1.0: categorical fields; 2.2.0: hard negatives; 2.3.0: each pair's cluster
    VERSION = tfds.core.Version("2.3.0")

    def _load(self, settings: dict) -> RawData:
        raise NotImplementedError

    def _loaded(self) -> RawData:
        key = (type(self).__name__, self.builder_config.settings)
        if key not in _last_load:
            _last_load.clear()
            settings = json.loads(self.builder_config.settings)
            data = self._load(settings)
            if settings.get("pseudo_labels", 0):
                data = pseudo_labelled(data, settings)
            k = settings.get("hard_negatives", 0)
            if k and data.train_pairs:
                data.train_negatives = mining.mine_hard_negatives(
                    data.train_pairs, k, settings["seed"])
                if any(len(n) < k for n in data.train_negatives):
                    raise DataError(f"data.hard_negatives={k}: the training pairs form fewer "
                                    "than two clusters, so there is nothing to mine from")
            _last_load[key] = data
        return _last_load[key]

    # TFDS prints "Downloading and preparing dataset Unknown size ..." for every table;
    # nothing is downloaded here, so say it in one log line instead.
    def _log_download_bytes(self) -> None:
        logging.info("Writing the %s table of %s to %s", self.builder_config.table, self.name,
                     self.data_dir)

    def _log_download_done(self) -> None:
        pass

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=self.builder_config.settings,
            features=tfds.features.FeaturesDict(_FEATURES[self.builder_config.table]()))

    def _generate_splits(self, dl_manager, download_config) -> list[tfds.core.SplitInfo]:
        """Each split written by `table_files.write_split` (not TFDS's own writer: several
        times faster, the same files and order)."""
        del download_config
        features = _FEATURES[self.builder_config.table]()
        return [table_files.write_split(rows, features, self._get_filename_template(split))
                for split, rows in self._split_generators(dl_manager).items()]

    def _generate_examples(self, rows: _Rows) -> Iterator[tuple[int, dict]]:
        """(TFDS's own writing path, which `_generate_splits` replaces.)"""
        yield from ((i, rows[i]) for i in range(len(rows)))

    def _split_generators(self, dl_manager) -> dict[str, _Rows]:
        """The table's splits, each a sequence of records built as they are read."""
        del dl_manager
        data, table = self._loaded(), self.builder_config.table
        if table == "pairs":
            if not data.train_pairs:
                raise DataError(f"{type(self).__name__}: no training pairs in this dataset")
            pairs, fields, negatives = data.train_pairs, data.train_fields, data.train_negatives
            # Clusters by transitive closure of the training pairs (normalised texts):
            # paraphrases for Quora-like data; a passage and its questions otherwise.
            pair_clusters = data.train_clusters
            if pair_clusters is None:
                cluster_of = clusters.cluster_pairs([(normalize(q), normalize(d))
                                                     for q, d in pairs])
                pair_clusters = [cluster_of[normalize(q)] for q, _ in pairs]

            def pair(i: int) -> dict:
                qf, df = fields[i] if fields else ({}, {})
                return {"query": pairs[i][0], "document": pairs[i][1],
                        "query_fields": _json(qf), "document_fields": _json(df),
                        "hard_negatives": negatives[i] if negatives else [],
                        "cluster": pair_clusters[i]}
            return {"train": _Rows(len(pairs), pair)}
        if table == "corpus":
            def corpus(task: RetrievalTask) -> _Rows:
                return _Rows(len(task.corpus), lambda i: {
                    "id": i, "text": task.corpus[i],
                    "fields": _json(task.corpus_fields[i] if task.corpus_fields else None),
                    "key": task.corpus_keys[i] if task.corpus_keys else ""})
            return {s: corpus(task) for s, task in data.tasks.items()}

        def queries(task: RetrievalTask) -> _Rows:
            def query(i: int) -> dict:
                rel = sorted(task.relevant[i])
                return {"id": i, "text": task.queries[i],
                        "fields": _json(task.query_fields[i] if task.query_fields else None),
                        "key": task.query_keys[i] if task.query_keys else "",
                        "relevant": rel,
                        "grades": [task.grades[i].get(j, 1) for j in rel] if task.grades else [],
                        "self": int(task.query_corpus_index[i])}
            return _Rows(len(task.queries), query)
        return {s: queries(task) for s, task in data.tasks.items()}


@dataclasses.dataclass(frozen=True)
class _Rows:
    """A split's records by index, each built when read."""
    n: int
    row: Callable[[int], dict]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return self.row(i)


def pseudo_labelled(data: RawData, settings: dict) -> RawData:
    """`data` with its training pairs replaced by BM25 pseudo-labels (weak supervision,
    `data.pseudo_labels` = k): the queries are the training pairs' queries (their
    documents, the labels, are not used) or the lines of `data.pseudo_label_queries`;
    the corpus is every document the dataset has: the training pairs' documents and the
    evaluation candidates (their texts, as BM25 indexes them; no evaluation query or
    label is read)."""
    if settings.get("pseudo_label_queries"):
        queries = pairs_file.read_lines(settings["pseudo_label_queries"]["path"])
    else:
        queries = [q for q, _ in data.train_pairs]
    corpus = [d for _, d in data.train_pairs] + [t for task in data.tasks.values()
                                                 for t in task.corpus]
    pairs, pair_clusters = mining.pseudo_label_pairs(queries, corpus, settings["pseudo_labels"])
    if not pairs:
        raise DataError(f"data.pseudo_labels: BM25 matched no document for any of the "
                        f"{len(set(queries))} queries")
    return dataclasses.replace(data, train_pairs=pairs, train_fields=None,
                               train_clusters=pair_clusters)


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A dataset as the builders take it: its name (a `sources.SOURCES` key) and the JSON of the
    settings that shape its tables (sizes, seed, file paths and digests, ...)."""
    name: str
    settings: str

    @classmethod
    def of(cls, data: Mapping[str, Any], seed: int) -> DatasetSpec:
        """A data group (data.name and its source's keys) as the builders take it;
        DataError naming the key or file that cannot work."""
        source = sources.SOURCES.named(data["name"])  # (DataError naming the known ones)
        return cls(data["name"], json.dumps(source.settings(data, seed), sort_keys=True))

    def loaded_settings(self) -> dict:
        return json.loads(self.settings)


@functools.cache
def _builder_class(source: sources.Source) -> type[_RetrievalBuilder]:
    """The TFDS builder of a source: its `load` as `_load`, its tables' name as `name`
    (not in TFDS's registry: dualjax opens its builders itself)."""
    def body(ns: dict) -> None:
        ns.update(name=source.table_name, __doc__=f"The tables of data.name={source.name!r}.",
                  _load=lambda self, settings: source.load(settings))
    camel = "".join(part.title() for part in source.table_name.split("_"))
    return types.new_class(camel, (_RetrievalBuilder,), {"skip_registration": True}, body)


def builder_class(name: str) -> type[_RetrievalBuilder]:
    """The TFDS builder of data source `name` (DataError naming the known ones)."""
    return _builder_class(sources.SOURCES.named(name))


def prepare(spec: DatasetSpec, tfds_dir: str, table: str) -> tfds.core.DatasetBuilder:
    """Writes the table (once) as array_record under `tfds_dir`; returns its builder."""
    digest = hashlib.sha1(spec.settings.encode()).hexdigest()[:12]
    config = TableConfig(name=f"{_TABLE_NAMES[table]}-{digest}", table=table,
                         settings=spec.settings)
    builder = builder_class(spec.name)(config=config, data_dir=tfds_dir)
    try:
        builder.download_and_prepare(file_format="array_record")
    except (OSError, RuntimeError) as e:
        trouble = _disk_trouble(e)
        if not trouble:
            raise
        hint = ("free some space" if trouble == errno.ENOSPC or trouble == errno.EDQUOT else
                "make it writable (or set data.tfds_dir to a folder that is)")
        reason = ("no space left on the device" if trouble == errno.ENOSPC
                  else os.strerror(trouble).lower())
        raise WorkdirError(f"{tfds_dir}: cannot write the data tables ({reason}); nothing was "
                           "lost (TFDS writes a table into a temporary folder and renames it "
                           f"only when whole, and removed this one): {hint} and run the same "
                           "command again to resume") from None
    return builder


def _disk_trouble(e: BaseException) -> int:
    """The errno of a write that the machine refused (a full disk, a quota, a read-only or
    unwritable folder), else 0. array_record raises RuntimeError with riegeli's message
    ("write() failed: No space left on device; writing FILE"), and TFDS re-raises errors
    of finishing a split with a prefix (an OSError as a new one, without its errno), so
    the message is read when there is no errno."""
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        return e.errno
    return next((n for n in DISK_ERRNOS if os.strerror(n) in str(e)), 0)


def train_source(spec: DatasetSpec, tfds_dir: str) -> Records:
    """Random-access source of training pairs: records {"query", "document": bytes,
    "query_fields", "document_fields": JSON bytes, b"" when none}."""
    return Records(prepare(spec, tfds_dir, "pairs"), "train", _FEATURES["pairs"]())


def eval_splits(spec: DatasetSpec, tfds_dir: str) -> tuple[str, ...]:
    """The evaluation splits this dataset has, in EVAL_SPLITS order."""
    have = prepare(spec, tfds_dir, "queries").info.splits
    return tuple(s for s in EVAL_SPLITS if s in have)


def _read_sorted(source) -> list[dict]:
    records = source.__getitems__(range(len(source)))
    records.sort(key=lambda r: r["id"])  # TFDS stores records in hashed-key order
    return records


def eval_task(spec: DatasetSpec, tfds_dir: str, split: str) -> RetrievalTask:
    """The retrieval task of an evaluation split ("val" or "test")."""
    corpus = _read_sorted(Records(prepare(spec, tfds_dir, "corpus"), split,
                                  _FEATURES["corpus"]()))
    queries = _read_sorted(Records(prepare(spec, tfds_dir, "queries"), split,
                                   _FEATURES["queries"]()))
    corpus_fields = [_fields(r["fields"]) for r in corpus]
    query_fields = [_fields(r["fields"]) for r in queries]
    keys = lambda records: ([r["key"].decode("utf-8") for r in records]
                            if any(r["key"] for r in records) else None)
    graded = any(len(r["grades"]) for r in queries)
    ids = lambda values: np.asarray(values, np.int64).tolist()  # (Python ints, made in C)
    return RetrievalTask(
        corpus=[r["text"].decode("utf-8") for r in corpus],
        queries=[r["text"].decode("utf-8") for r in queries],
        relevant=[frozenset(ids(r["relevant"])) for r in queries],
        query_corpus_index=np.asarray([int(r["self"]) for r in queries], np.int64),
        corpus_fields=corpus_fields if any(corpus_fields) else None,
        query_fields=query_fields if any(query_fields) else None,
        grades=[dict(zip(ids(r["relevant"]), ids(r["grades"]), strict=True))
                for r in queries]
        if graded else None,
        corpus_keys=keys(corpus), query_keys=keys(queries))
