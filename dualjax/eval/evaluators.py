"""Evaluators built from the run's `EvalSpec` (as big_vision's `evaluators/common.py`): each task's
retrieval evaluation, the typo sweep, and those `config.eval.evaluators` names from the
registry `EVALUATORS`.

An evaluator is given the systems to evaluate as {name: (encode_queries,
encode_documents)} (encode functions: `encoding.EncodeFn`; never params, the model or
the train state), the step, and whether this is the final evaluation. It evaluates,
writes its rows to the MetricsLog (and, in the final evaluation, its report files) and
returns them as {split: rows}. What to do with them (eval.select_by, early stopping) is
the trainer's decision.

An evaluator of your own is one module that registers a factory under its name:

    def make_mine(context: Context, task: Task, splits, options: dict) -> Evaluator:
        return Mine(...)   # run(systems, step, final, splits=None, row_fields=None)

    register("mine", make_mine)

`config.eval.evaluators = "mine"` then runs it on every task with evaluation splits,
after the task's retrieval evaluation, with `config.eval.mine` (a group, if the config
has one) as its options. tests/project/test_plugins.py registers one from a test file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax

from dualjax.eval import report, scoring
from dualjax.eval.metrics_log import MetricsLog
from dualjax.retrieval import encoding
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime.registry import Registry
from dualjax.text.sides import Inputs


class Task(Protocol):
    """What an evaluator reads of a training task (train/tasks.py's `Task`): its name, the
    retrieval task of each evaluation split, and the fields of its metrics rows."""
    name: str

    def eval_task(self, split: str) -> RetrievalTask: ...

    def fields(self) -> dict[str, str]: ...

Systems = dict[str, tuple[encoding.EncodeFn, encoding.EncodeFn]]  # name -> (queries, documents)


class Evaluator(Protocol):
    """What the trainer runs. Attributes: `task` and its `splits` it evaluates;
    `results`: whether its final rows are the run's results (`train_and_evaluate`
    returns the retrieval evaluators' last split; the others only write theirs)."""
    task: Task
    splits: tuple[str, ...]
    results: bool

    def run(self, systems: Systems, step: int, final: bool = False,
            splits: Sequence[str] | None = None,
            row_fields: dict[str, dict] | None = None) -> dict[str, list[dict]]:
        """{split: rows}: during training (not `final`) the val split at most (or
        nothing), at the end every split; each row {"system", "index", metrics...}."""
        ...


@dataclasses.dataclass(frozen=True)
class Context:
    """What every evaluator of a run is built from. `main`: this is process 0, which
    writes the files; `log`: the run's metrics.jsonl (and TensorBoard)."""
    spec: scoring.EvalSpec
    inputs: Inputs
    mesh: jax.sharding.Mesh
    workdir: str
    log: MetricsLog
    main: bool


Factory = Callable[[Context, Task, tuple[str, ...], Mapping[str, Any]], Evaluator]
EVALUATORS: Registry[Factory] = Registry(
    "evaluator", lambda name, known: ValueError(f"eval.evaluators: {name!r} is not one of: "
                                                f"{known or '(none registered)'}"))


def register(name: str, factory: Factory) -> Factory:
    """Adds `factory` as evaluator `name` (ValueError if the name is taken); returns it."""
    return EVALUATORS.add(name, factory)


class Retrieval:
    """One task's retrieval evaluation (`scoring.evaluate_split`) on its splits, in order.

    During training (not `final`) it evaluates the val split only, by exact search and
    without the baselines. The final evaluation adds the lexical baselines, an approximate
    index of the trained system (spec.system; spec.index = "scann" or "hnsw"; saved under
    WORKDIR/index/[TASK/]SPLIT)
    and, per split, report[_TASK].md with its recall plot; after the last split it prints
    that split's table. With spec.hybrid, the trained system's interpolation weight is
    chosen on val and carried to the task's later splits (and to a typo sweep of it).
    Only process 0 (`main`) writes files.
    """
    results = True

    def __init__(self, task: Task, splits: Sequence[str], inputs: Inputs,
                 spec: scoring.EvalSpec, mesh: jax.sharding.Mesh, workdir: str,
                 log: MetricsLog, *, main: bool = True):
        self.task, self.splits = task, tuple(splits)
        self.inputs, self.spec, self.mesh = inputs, spec, mesh
        self.workdir, self.log, self.main = workdir, log, main
        self.system = spec.system  # the trained model's rows: "dual_encoder" or "pses"
        self.baselines = spec.baselines
        self.hybrid_weights: dict[str, float] = {}  # system -> the weight val chose

    def run(self, systems: Systems, step: int, final: bool = False,
            splits: Sequence[str] | None = None,
            row_fields: dict[str, dict] | None = None) -> dict[str, list[dict]]:
        """{split: rows} of `splits` (None: all the task's splits when `final`, else its val
        split, if it has one), each row {"system", "index", metrics...} with
        `row_fields[system]` added to that system's rows."""
        if splits is None:
            splits = self.splits if final else tuple(s for s in self.splits if s == "val")
        return {split: self._evaluate(split, systems, step, final, row_fields or {})
                for split in splits}

    def _evaluate(self, split: str, systems: Systems, step: int, final: bool,
                  row_fields: dict[str, dict]) -> list[dict]:
        task, data = self.task, self.task.eval_task(split)
        if final:
            scoring.log_missing_fields(data, self.inputs)
        where = os.path.join(self.workdir, "index", *([task.name] if task.name else []), split)
        rows, ranked = scoring.evaluate_split(
            data, systems, self.inputs, self.spec, self.mesh,
            baselines=self.baselines if final else (),
            index_dir=where if final and self.main else None,
            ann_systems=(self.system,) if final else (), index_extra=f"step {step}",
            hybrid_systems=(self.system,),
            hybrid_weights=None if split == "val" else self.hybrid_weights)
        if split == "val":
            chosen = [r["hybrid_weight"] for r in rows if "hybrid_weight" in r]
            self.hybrid_weights = {self.system: chosen[-1]} if chosen else {}
        for row in rows:
            row.update(row_fields.get(row["system"], {}))
            self.log.write(step, split, row, **task.fields())
            scoring.log_metrics(f"eval {task.name + ' ' if task.name else ''}{split} step {step} "
                                 f"{scoring.row_label(row)} ({len(data.queries)} queries, "
                                 f"{len(data.corpus)} candidates)",
                                 {k: v for k, v in row.items() if k not in ("system", "index")})
        if final and self.main:
            report.write_report(self.workdir, split, step, rows, ranked, data.relevant,
                                len(data.corpus), task.name)
            report.write_runs(self.workdir, split, ranked, data.query_keys, data.corpus_keys,
                              task.name)
            if split == self.splits[-1]:
                name = f"task {task.name}, " if task.name else ""
                print(f"\n{name}{split} split, step {step} ({self.workdir}):\n"
                      + scoring.format_table(rows, report.KEYS)
                      + f"\nReport: {os.path.join(self.workdir, report.report_name(task.name))}")
        return rows


class TypoSweep:
    """Typo robustness (`scoring.typo_sweep`, spec.typo_probs) on the last split of a
    retrieval evaluator's task, with its settings and its val-chosen hybrid weight; final
    evaluation only. Writes its rows (each with "typo_p") and, on process 0,
    WORKDIR/typo_robustness.png."""
    results = False

    def __init__(self, retrieval: Retrieval, probs: Sequence[float], seed: int):
        self.retrieval, self.probs, self.seed = retrieval, tuple(probs), seed
        self.task, self.splits = retrieval.task, retrieval.splits[-1:]

    def run(self, systems: Systems, step: int, final: bool = False,
            splits: Sequence[str] | None = None,
            row_fields: dict[str, dict] | None = None) -> dict[str, list[dict]]:
        """{split: rows} of the sweep when `final`, else {} (nothing is evaluated)."""
        if not final:
            return {}
        r, (last,) = self.retrieval, self.splits
        rows = scoring.typo_sweep(self.task.eval_task(last), systems, r.inputs, r.spec,
                                   r.mesh, self.probs, self.seed, r.baselines, (r.system,),
                                   r.hybrid_weights)
        for row in rows:
            r.log.write(step, last, row, **self.task.fields())
            scoring.log_metrics(f"eval {last} typo_p={row['typo_p']} {scoring.row_label(row)}",
                                 {k: v for k, v in row.items()
                                  if k not in ("system", "index", "typo_p")})
        if r.main:
            name = f"task {self.task.name}, " if self.task.name else ""
            report.plot_typo_robustness(os.path.join(r.workdir, "typo_robustness.png"), rows,
                                        f"{name}{last} split, step {step}: queries with typos")
        return {last: rows}


def make(spec: scoring.EvalSpec, tasks: Sequence[Task], splits: dict[str, tuple[str, ...]],
         inputs: Inputs, mesh: jax.sharding.Mesh, workdir: str, log: MetricsLog, *,
         main: bool) -> list[Evaluator]:
    """The evaluators of a run, in the order they run: per task with evaluation splits
    (`splits[task.name]`; a pre-training collection has none), its `Retrieval` and then
    each of spec.evaluators (registered in EVALUATORS); last, when spec.typo_probs is set,
    the `TypoSweep` of the first task. `main`: this is process 0, which writes files."""
    context = Context(spec, inputs, mesh, workdir, log, main)
    retrievals = [Retrieval(t, splits[t.name], inputs, spec, mesh, workdir, log, main=main)
                  for t in tasks if splits[t.name]]
    evaluators: list[Evaluator] = []
    for r in retrievals:
        evaluators.append(r)
        evaluators += [EVALUATORS[name](context, r.task, r.splits, options)
                       for name, options in spec.evaluators]
    if spec.typo_probs and retrievals:
        evaluators.append(TypoSweep(retrievals[0], spec.typo_probs, spec.typo_seed))
    return evaluators
