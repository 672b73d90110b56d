"""TFDS builders: every dataset is written once as array_record and read back by index.

A dataset has two tables, each a TFDS builder config:
- `pairs`: the training split, one positive (query, document) pair per record;
- `questions`: the "val" and "test" splits, one (text, cluster) record per question,
  from clusters disjoint from training; `clusters.task_from_clusters` turns a split
  into a retrieval task.

The config name carries a hash of everything that shapes the data (sizes, seed, file
path and a hash of its contents), so a changed setting never reuses stale files.
Reading needs no TensorFlow: `builder.as_data_source(split)` gives a random-access
source for grain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Iterator

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from dualjax.data import clusters, pairs_file, synthetic
from dualjax.data.pairs_file import DataError
from dualjax.text import normalize

EVAL_SPLITS = ("val", "test")


@dataclasses.dataclass
class TableConfig(tfds.core.BuilderConfig):
    """A builder config: which table, and the data settings it was made from."""

    table: str = "pairs"  # "pairs" | "questions"
    settings: str = "{}"  # JSON of the data settings (sizes, seed, path, ...)


class _RetrievalBuilder(tfds.core.GeneratorBasedBuilder):
    """Shared writing logic; subclasses implement `_load` from their settings."""

    VERSION = tfds.core.Version("1.0.0")

    def _load(self, settings: dict) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, int]]]]:
        """Returns (training pairs, {eval split: [(text, cluster id)]})."""
        raise NotImplementedError

    def _info(self) -> tfds.core.DatasetInfo:
        if self.builder_config.table == "pairs":
            features = {"query": tfds.features.Text(), "document": tfds.features.Text()}
        else:
            features = {"text": tfds.features.Text(), "cluster": tfds.features.Scalar(dtype=np.int64)}
        return tfds.core.DatasetInfo(
            builder=self, description=self.builder_config.settings,
            features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        del dl_manager
        train, evals = self._load(json.loads(self.builder_config.settings))
        if self.builder_config.table == "pairs":
            return {"train": self._generate_examples(
                {"query": q, "document": d} for q, d in train)}
        return {split: self._generate_examples({"text": t, "cluster": c} for t, c in evals[split])
                for split in EVAL_SPLITS}

    def _generate_examples(self, records) -> Iterator[tuple[int, dict]]:
        yield from enumerate(records)


class SyntheticParaphrase(_RetrievalBuilder):
    """The embedded default: seeded question-paraphrase clusters (see synthetic.py)."""

    def _load(self, settings):
        data = synthetic.generate(
            seed=settings["seed"], num_train_clusters=settings["num_train_clusters"],
            num_val_clusters=settings["num_val_clusters"],
            num_test_clusters=settings["num_test_clusters"])
        evals = {s: [(q.text, q.cluster) for q in data.splits[s]] for s in EVAL_SPLITS}
        return data.train_pairs, evals


class PairsFile(_RetrievalBuilder):
    """The user's own positive pairs (TSV or JSONL), split by cluster.

    Pairs are joined transitively into clusters and whole clusters go to train, val or
    test, so no text is in two splits.
    """

    def _load(self, settings):
        pairs = pairs_file.read_pairs(settings["path"], skip_bad_lines=settings["skip_bad_lines"])
        # Cluster on the normalised text, so two spellings the tokenizer cannot tell apart
        # ("How?" and "how") can never sit on both sides of a split.
        cluster_of = clusters.cluster_pairs([(normalize(q), normalize(d)) for q, d in pairs])
        fractions = {"train": 1.0 - settings["val_fraction"] - settings["test_fraction"],
                     "val": settings["val_fraction"], "test": settings["test_fraction"]}
        split_of = clusters.split_clusters(max(cluster_of.values()) + 1, fractions, settings["seed"])
        names = list(fractions)
        train, evals, seen = [], {s: [] for s in EVAL_SPLITS}, set()
        for q, d in pairs:
            c = cluster_of[normalize(q)]
            if names[split_of[c]] == "train":
                train.append((q, d))
                continue
            for t in (q, d):  # the first spelling of each normalised text represents it
                if normalize(t) not in seen:
                    seen.add(normalize(t))
                    evals[names[split_of[c]]].append((t, c))
        counts = {name: int((split_of == i).sum()) for i, name in enumerate(names)}
        for name in names:
            if not counts[name]:
                raise DataError(
                    f"{settings['path']}: {len(split_of)} clusters of pairs leave split "
                    f"{name!r} empty ({counts}); give more pairs or adjust "
                    "data.val_fraction / data.test_fraction")
        return train, evals


def _synthetic_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    return {"seed": seed, "num_train_clusters": cfg.num_train_clusters,
            "num_val_clusters": cfg.num_val_clusters, "num_test_clusters": cfg.num_test_clusters}


def _pairs_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    if not cfg.path:
        raise DataError("data.name='pairs' needs data.path: a TSV or JSONL file of positive pairs")
    path = os.path.abspath(os.path.expanduser(cfg.path))
    if not os.path.isfile(path):
        raise DataError(f"{cfg.path}: no such file (data.path)")
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"path": path, "sha256": digest, "seed": seed,
            "skip_bad_lines": cfg.skip_bad_lines, "val_fraction": cfg.val_fraction,
            "test_fraction": cfg.test_fraction}


# data.name -> (builder class, settings from the data config and the run's seed)
DATASETS = {
    "synthetic_paraphrase": (SyntheticParaphrase, _synthetic_settings),
    "pairs": (PairsFile, _pairs_settings),
}


def prepare(data_cfg: ml_collections.ConfigDict, seed: int, tfds_dir: str, table: str
            ) -> tfds.core.DatasetBuilder:
    """Writes the table (once) as array_record under `tfds_dir`; returns its builder."""
    if data_cfg.name not in DATASETS:
        raise DataError(f"unknown dataset data.name={data_cfg.name!r}; known: {', '.join(DATASETS)}")
    builder_cls, make_settings = DATASETS[data_cfg.name]
    settings = json.dumps(make_settings(data_cfg, seed), sort_keys=True)
    digest = hashlib.sha1(settings.encode()).hexdigest()[:12]
    config = TableConfig(name=f"{table}-{digest}", table=table, settings=settings)
    builder = builder_cls(config=config, data_dir=tfds_dir)
    builder.download_and_prepare(file_format="array_record")
    return builder


def train_source(data_cfg, seed: int, tfds_dir: str):
    """Random-access source of training pairs: records {"query": bytes, "document": bytes}."""
    return prepare(data_cfg, seed, tfds_dir, "pairs").as_data_source(split="train")


def eval_task(data_cfg, seed: int, tfds_dir: str, split: str) -> clusters.RetrievalTask:
    """The retrieval task of an evaluation split ("val" or "test")."""
    source = prepare(data_cfg, seed, tfds_dir, "questions").as_data_source(split=split)
    records = [source[i] for i in range(len(source))]
    records.sort(key=lambda r: (r["cluster"], r["text"]))  # TFDS stores records hashed
    return clusters.task_from_clusters([r["text"].decode() for r in records],
                                       [int(r["cluster"]) for r in records])
