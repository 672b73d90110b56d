"""Training data that a model makes before the first step, for the pre-training tasks that
need it: data.tasks "pseudo" (pairs labelled by the run's start fused with BM25,
`weak_labels`) and "distill" (candidates mined and scored by a teacher, `teacher`). Each is
made once and kept in the workdir, so a resumed run reads it back and loads no model."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np

from dualjax.config.run import RunSpec
from dualjax.data.pretraining import QueryWords
from dualjax.retrieval import encoding
from dualjax.runtime import processes
from dualjax.text import sides
from dualjax.train import teacher, weak_labels
from dualjax.train.tasks import Task


def prepare(spec: RunSpec, tasks: Sequence[Task], workdir: str,
            inputs: sides.Inputs, mesh: jax.sharding.Mesh, encoders: tuple[Callable, Callable],
            first_params: Callable[[], dict]) -> None:
    """Sets each task's `pseudo_pairs` / `distill_records` where its data.tasks asks."""
    bm25, seed, batch = dict(spec.eval.bm25), spec.schedule.seed, spec.eval.batch_size
    for t in tasks:
        words = QueryWords.of(t.data)
        if t.needs_pseudo_labels:
            t.pseudo_pairs = weak_labels.load_or_make(
                workdir, t.collection, seed, words, t.data["pseudo_weight"],
                *_start_encoders(batch, inputs, mesh, encoders, first_params),
                main=processes.is_main(), name=t.name, bm25=bm25)
        if t.needs_teacher:
            assert spec.teacher is not None, "resolved with data.tasks 'distill'"
            t.distill_records = teacher.load_or_make(
                workdir, t.collection, seed, words, spec.teacher,
                functools.partial(teacher.encoders, spec.model, spec.teacher, batch, mesh),
                main=processes.is_main(), name=t.name, bm25=bm25)


def _start_encoders(batch_size: int, inputs: sides.Inputs, mesh,
                    encoders: tuple[Callable, Callable], first_params: Callable[[], dict]
                    ) -> tuple[weak_labels.Encode, weak_labels.Encode]:
    """(encode queries, encode documents) with the towers the run starts from, read once
    and only when the first text is encoded (not at all when the pairs are saved)."""
    params: list[dict] = []

    def encode(side: int, texts: list[str]) -> np.ndarray:
        if not params:
            params.append(first_params())
        fn = functools.partial(encoders[side], params[0])
        return encoding.encode_texts(fn, texts, (inputs.query, inputs.document)[side],
                                     batch_size, mesh, desc="pseudo-labels")

    return functools.partial(encode, 0), functools.partial(encode, 1)
