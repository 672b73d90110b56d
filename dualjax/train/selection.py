"""eval.select_by and eval.early_stopping: which training step's params are the best on
validation, and when training stops because the best is far enough behind.

The selecting task is the first with a val split; its rows of each validation offer the
trained system's exact `eval.select_by` value; `checkpoints.BestParams` keeps the best
step's params on disk so that a resumed run knows them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from absl import logging

from dualjax.train import checkpoints


class Selection:
    """The best val step so far (`best`, None without eval.select_by) and the evaluator
    whose val rows decide it."""

    def __init__(self, metric: str, patience: int, num_steps: int, workdir: str, system: str):
        """metric: eval.select_by ("": none); patience: the steps the best may be behind
        before training stops (eval.early_stopping evaluations; 0: never); num_steps:
        the run's last step; system: the trained system's rows."""
        self.metric, self.system = metric, system
        self.best = checkpoints.BestParams(workdir, self.metric) if self.metric else None
        self.patience = patience
        self.num_steps = num_steps
        self.evaluator: Any = None  # an evaluators.Evaluator whose rows are results

    def choose(self, evaluators: Sequence[Any]) -> None:
        """The first evaluator of results with a val split decides (none: the last step is
        used)."""
        self.evaluator = next((e for e in evaluators if e.results and "val" in e.splits), None)
        if self.best and self.evaluator is None:
            logging.warning("eval.select_by=%s: no task has a val split; the last step is "
                            "used", self.metric)

    @property
    def active(self) -> bool:
        return bool(self.best and self.evaluator)

    def stopped_early(self, step: int) -> bool:
        """eval.early_stopping: the best val step is that many evaluations behind."""
        return bool(self.patience and self.best and self.best.step is not None
                    and step < self.num_steps and step - self.best.step >= self.patience)

    def offer(self, rows: list[dict], step: int, params: Any) -> None:
        """The selecting task's val rows of `step` (with the params they scored)."""
        value = next(r[self.metric] for r in rows
                     if r["system"] == self.system and r["index"] == "exact")
        assert self.best is not None, "offer() is called only when active"
        if self.best.offer(step, value, params):
            logging.info("eval.select_by: step %d is the best so far (val %s %.4f)", step,
                         self.metric, value)
