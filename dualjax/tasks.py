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
import os

import ml_collections
import numpy as np

from dualjax.data import builders
from dualjax.data.clusters import RetrievalTask


@dataclasses.dataclass
class Task:
    """One dataset of the run: name ("" for the single task of `config.data`), its data
    group, its sampling weight and where its TFDS tables live."""

    name: str
    data: ml_collections.ConfigDict
    weight: float
    seed: int
    tfds_dir: str
    _eval: dict[str, RetrievalTask] = dataclasses.field(default_factory=dict)

    def splits(self) -> tuple[str, ...]:
        return builders.eval_splits(self.data, self.seed, self.tfds_dir)

    def train_source(self):
        return builders.train_source(self.data, self.seed, self.tfds_dir)

    def eval_task(self, split: str) -> RetrievalTask:
        """The retrieval task of a split, read once."""
        if split not in self._eval:
            self._eval[split] = builders.eval_task(self.data, self.seed, self.tfds_dir, split)
        return self._eval[split]

    def fields(self) -> dict[str, str]:
        """Extra fields of this task's metrics rows ({} for a single-task run)."""
        return {"task": self.name} if self.name else {}


def task_configs(config: ml_collections.ConfigDict
                 ) -> list[tuple[str, ml_collections.ConfigDict, float]]:
    """(name, data group, weight) per task: `config.tasks` in name order (ConfigDict keeps
    its keys sorted), else ("", config.data, 1.0)."""
    tasks = config.get("tasks") or {}
    if not tasks:
        return [("", config.data, 1.0)]
    return [(name, t.data, float(t.get("weight", 1.0))) for name, t in tasks.items()]


def make_tasks(config: ml_collections.ConfigDict, workdir: str) -> list[Task]:
    return [Task(name, data, weight, config.seed,
                 data.get("tfds_dir") or os.path.join(workdir, "tfds"))
            for name, data, weight in task_configs(config)]


def task_at_step(step: int, weights: list[float], seed: int) -> int:
    """The task whose batch trains at `step`: a draw ∝ weights, a function of (seed,
    step) only, so a resumed run continues the same sequence."""
    if len(weights) == 1:
        return 0
    p = np.asarray(weights, np.float64) / sum(weights)
    return int(np.random.default_rng([seed, step]).choice(len(weights), p=p))
