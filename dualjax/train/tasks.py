"""Training tasks: one dataset each, one shared encoder (Gillick et al. 2018 §2).

A run trains on `config.data` alone, or, when `config.tasks` names several tasks
(`config.tasks.<name>.data`: a data group like `config.data`; `.weight`: its share), on
all of them: every step's batch comes from one task, drawn with probability weight / sum
of weights (uniform by default), so the expected loss is the weighted average of the
tasks' losses. Each task keeps its own learned similarity scale and bias
(`cosine_affine`), its own input iterator (saved in the checkpoint) and is evaluated on
its own splits; metrics rows carry a "task" field.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from absl import logging

from dualjax.config.run import RunSpec, TaskSpec
from dualjax.data import builders, documents, pipeline, pretraining, sources
from dualjax.data.pretraining import PRETRAIN
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime import files
from dualjax.text import features, sides
from dualjax.train import workdir as workdir_lib


@dataclasses.dataclass
class Task:
    """One dataset of the run: name ("" for the single task of `config.data`), its data
    group (read-only, today's keys: `config.run.TaskSpec`), its sampling weight and where
    its TFDS tables live."""

    name: str
    data: Mapping[str, Any]
    weight: float
    seed: int
    tfds_dir: str
    _eval: dict[str, RetrievalTask] = dataclasses.field(default_factory=dict)
    # data.tasks "pseudo": the pairs `weak_labels` made, set before `train_source` is read.
    pseudo_pairs: list[tuple[str, str]] | None = None
    # data.tasks "distill": the records `teacher` made, set before `train_source` is read.
    distill_records: list[dict] | None = None

    @property
    def pretraining(self) -> bool:
        return self.data["name"] == PRETRAIN

    @functools.cached_property
    def eval_data(self) -> Mapping[str, Any] | None:
        """The data group its evaluation reads: its own; for a pre-training collection
        that is a BEIR folder with judgements (qrels/), that folder read as
        data.name="beir" (adapt to a collection, evaluate on its queries); else None."""
        if not self.pretraining:
            return self.data
        path = os.path.expanduser(self.data["path"])
        if not os.path.isdir(os.path.join(path, "qrels")):
            return None
        return MappingProxyType({**self.data, "name": "beir"})

    @functools.cached_property
    def eval_dataset(self) -> builders.DatasetSpec | None:
        """`eval_data` as the builders take it (None: no evaluation)."""
        return (None if self.eval_data is None
                else builders.DatasetSpec.of(self.eval_data, self.seed))

    def splits(self) -> tuple[str, ...]:
        """Its evaluation splits ("val", "test"); none for a pre-training collection
        without judgements."""
        spec = self.eval_dataset
        return () if spec is None else builders.eval_splits(spec, self.tfds_dir)

    @functools.cached_property
    def train_source(self):
        """The training pairs: a TFDS table of records, or a pre-training `PairGenerator`."""
        if self.pretraining:
            d = self.data
            names = pretraining.parse_tasks(d["tasks"])
            if ("pseudo" in names and self.pseudo_pairs is None
                    or "distill" in names and self.distill_records is None):
                raise RuntimeError("data.tasks 'pseudo' / 'distill': the pairs are made "
                                   "(weak_labels, teacher) before the training pairs are read")
            return pretraining.PairGenerator(self.collection, names, self.seed,
                                             d["ict_mask_rate"], pretraining.QueryWords.of(d),
                                             self.pseudo_pairs, self.distill_records)
        return builders.train_source(builders.DatasetSpec.of(self.data, self.seed),
                                     self.tfds_dir)

    @functools.cached_property
    def collection(self) -> documents.Collection:
        """A pre-training task's documents (articles, passages, sentences)."""
        d = self.data
        return documents.read_collection(d["path"], self.tfds_dir, d["passage_words"],
                                         d["skip_bad_lines"])

    @property
    def needs_pseudo_labels(self) -> bool:
        return self.pretraining and "pseudo" in pretraining.parse_tasks(self.data["tasks"])

    @property
    def needs_teacher(self) -> bool:
        return self.pretraining and "distill" in pretraining.parse_tasks(self.data["tasks"])

    def train_texts(self) -> Iterable[str]:
        """The texts to build a vocabulary from."""
        if self.pretraining:  # every title and passage
            return itertools.chain(self.collection.titles, self.collection.passages)
        return pipeline.pair_texts(self.train_source)

    def train_fields(self) -> Iterable[tuple[features.Fields, features.Fields]]:
        """(query fields, document fields) of every training pair (none when generated)."""
        if self.pretraining:
            return iter(())
        return pipeline.pair_fields(self.train_source)

    def pretokenized_pairs(self, inputs: sides.Inputs, workdir: str = "", write: bool = True
                           ) -> dict[str, np.ndarray] | None:
        """Its training pairs encoded once (`pipeline.pretokenized_pairs`; None for a
        generated collection, or pairs too many to hold encoded), kept in (and read back
        from) WORKDIR/tokenized/<task> (`data.token_cache`; written where `write`)."""
        if self.pretraining:
            return None
        keep_in = os.path.join(workdir, "tokenized", self.name or "pairs") if workdir else ""
        return pipeline.pretokenized_pairs(self.train_source, inputs,
                                           self.data["hard_negatives"], keep_in,
                                           _inputs_id(workdir), write)

    def train_iterator(self, inputs: sides.Inputs, global_batch_size: int, seed: int,
                       num_mixed_negatives: int = 0,
                       table: pipeline.Table | pipeline.Pending | None = None):
        """An endless iterator of this process's share of each global training batch
        (`table`: its pairs already encoded, `pretokenized_pairs`, or being encoded)."""
        d = self.data
        if self.pretraining:
            return pipeline.generated_iterator(self.train_source, inputs, global_batch_size,
                                               d["worker_count"], d["prefetch_batches"])
        return pipeline.train_iterator(self.train_source, inputs, global_batch_size, seed,
                                       d["worker_count"], num_mixed_negatives,
                                       d["hard_negatives"], d["prefetch_batches"],
                                       table=table)

    def describe_training(self, global_batch_size: int) -> str:
        """How many training pairs (or what generates them), for the log; warns when a
        global batch is larger than the training pairs (each batch repeats some)."""
        src = self.train_source
        if self.pretraining:
            return ("pre-training pairs generated from " + self.data["path"] + " ("
                    + ", ".join(f"{t.upper()}: {src.num_items(t)} items" for t in src.tasks)
                    + ")")
        if len(src) < global_batch_size:
            logging.warning("%s: a global batch of %d is larger than the %d training pairs, "
                            "so every batch holds some pairs twice (as negatives of each "
                            "other they are masked); consider a smaller global_batch_size",
                            self.name or self.data["name"], global_batch_size, len(src))
        return f"training pairs: {len(src)}"

    def eval_task(self, split: str) -> RetrievalTask:
        """The retrieval task of a split, read once."""
        if split not in self._eval:
            spec = self.eval_dataset
            if spec is None:
                raise ValueError(f"{self.name or self.data['name']}: no evaluation data")
            self._eval[split] = builders.eval_task(spec, self.tfds_dir, split)
        return self._eval[split]

    def fields(self) -> dict[str, str]:
        """Extra fields of this task's metrics rows ({} for a single-task run)."""
        return {"task": self.name} if self.name else {}


def data_files(tasks: Sequence[TaskSpec]) -> list[workdir_lib.DataFile]:
    """Every input file the run's data groups read, as the workdir records them
    (`workdir.check_data`): a group's data.path (quora's and reqa_squad's default file
    when empty; for a BEIR folder, its corpus.jsonl, queries.jsonl and qrels/*.tsv) and
    its pseudo_label_queries (read with pseudo_labels); none for a source that reads no
    data.path (`sources.Source.reads_path`: synthetic_paraphrase). A group's changed files are
    accepted with its own `rebuild` or the run's `data.rebuild`."""
    out = []
    for task in tasks:
        data = task.data
        source = sources.SOURCES.get(data["name"])  # (None: a pre-training collection)
        named = [("path", data["path"] or (source.default_path if source else ""))]
        if data["pseudo_labels"]:
            named.append(("pseudo_label_queries", data["pseudo_label_queries"]))
        for key, path in named:
            if not path or (source and not source.reads_path):
                continue
            full = os.path.abspath(os.path.expanduser(path))
            out += [workdir_lib.DataFile(f"{task.key}.{key}", f, task.rebuild)
                    for f in _files_at(full)]
    return out


def _files_at(path: str) -> list[str]:
    """The files a data path stands for: itself, or a BEIR folder's that are read."""
    if not os.path.isdir(path):
        return [path]
    qrels = os.path.join(path, "qrels")
    judged = os.listdir(qrels) if os.path.isdir(qrels) else []
    return ([os.path.join(path, n) for n in ("corpus.jsonl", "queries.jsonl")
             if os.path.isfile(os.path.join(path, n))]
            + sorted(os.path.join(qrels, n) for n in judged if n.endswith(".tsv")))


def _inputs_id(workdir: str) -> str:
    """What names a workdir's tokenizer and categorical fields: their files' digests."""
    names = [n for n in ("vocab.json", "features.json")
             if workdir and os.path.isfile(os.path.join(workdir, n))]
    return json.dumps(files.file_digests(workdir, names)) if names else ""


def tokenized_pairs(tasks: Sequence[Task], inputs: sides.Inputs, workdir: str = "",
                    write: bool = True) -> dict[str, dict[str, np.ndarray] | None]:
    """Each task's training pairs encoded once, by task name (`Task.pretokenized_pairs`;
    None where a batch is encoded as it is read), kept in WORKDIR/tokenized (process 0
    writes: `write`) so that a resumed run reads them back. A run computes it in a thread
    while its model is built."""
    start, out = time.perf_counter(), {}
    for t in tasks:
        out[t.name] = arrays = t.pretokenized_pairs(inputs, workdir, write)
        if arrays is not None:
            kept = isinstance(next(iter(arrays.values())), np.memmap)
            logging.info("%s%s %d training pairs in %.1f s", f"Task {t.name}: " if t.name
                         else "", "read back the kept tokens of" if kept else "tokenized",
                         len(t.train_source), time.perf_counter() - start)
    return out


def capped_steps(spec: RunSpec, tasks: Sequence[Task]) -> RunSpec:
    """`spec` with num_train_steps cut to `max_epochs` passes over the training items
    (every task's pairs; a pre-training collection's passages, times
    distill.queries_per_passage for data.tasks "distill"), rounded up; as it is
    without max_epochs or when the cap is higher. Resuming computes the same cap."""
    s = spec.schedule
    if not s.max_epochs or not s.num_train_steps:
        return spec
    per_passage = lambda t: (spec.teacher.queries_per_passage
                             if t.needs_teacher and spec.teacher else 1)
    items = sum(len(t.collection.passages) * per_passage(t) if t.pretraining
                else len(t.train_source) for t in tasks)
    steps = max(1, math.ceil(s.max_epochs * items / s.global_batch_size))
    if steps >= s.num_train_steps:
        return spec
    logging.info("max_epochs=%g: %d training items at %d a step: %d steps, not %d",
                 s.max_epochs, items, s.global_batch_size, steps, s.num_train_steps)
    return spec.with_steps(steps)


def make_tasks(tasks: Sequence[TaskSpec], seed: int) -> list[Task]:
    """The run's tasks (`RunSpec.tasks`), each reading its tables where its spec says."""
    return [Task(t.name, t.data, t.weight, seed, t.tfds_dir) for t in tasks]


def task_at_step(step: int, weights: list[float], seed: int) -> int:
    """The task whose batch trains at `step`: a draw ∝ weights, a function of (seed,
    step) only, so a resumed run continues the same sequence."""
    if len(weights) == 1:
        return 0
    p = np.asarray(weights, np.float64) / sum(weights)
    return int(np.random.default_rng([seed, step]).choice(len(weights), p=p))
