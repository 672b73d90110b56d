"""The run's evaluations, as the trainer drives them: the val split during training, the
final evaluation of every split, and the results of a run that had already finished.

The evaluators (`eval.evaluators`) evaluate what they are given; what their val rows
decide (eval.select_by's best step, early stopping: `selection.Selection`) is decided
here. Nothing here reads the config or the train state: the loop hands over the
systems' params and an `encode` that turns {name: params} into encode functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from dualjax.eval import evaluators as evaluators_lib
from dualjax.eval import scoring
from dualjax.eval.metrics_log import MetricsLog
from dualjax.train.selection import Selection

Encode = Callable[[dict[str, Any]], evaluators_lib.Systems]  # {name: params} -> encoders


def validate(evaluators: Sequence[evaluators_lib.Evaluator], selection: Selection,
             encode: Encode, system: str, params: Any, step: int) -> None:
    """Every task's val split on the trained towers' `params` (the typo sweep waits for
    the end); the selecting evaluator's rows are offered to `selection`."""
    for ev in evaluators:
        rows = ev.run(encode({system: params}), step).get("val")
        if selection.best and ev is selection.evaluator:
            assert rows is not None, "the selecting evaluator has a val split"
            selection.offer(rows, step, params)


def final(evaluators: Sequence[evaluators_lib.Evaluator], selection: Selection,
          encode: Encode, system: str, systems: dict[str, Any], step: int,
          replicated: jax.sharding.Sharding) -> dict[str, dict]:
    """Every evaluator on `systems` ({name: params}: the trained towers under `system`
    first, then their start and what else is compared) at `step`. The selecting task's
    val split comes first: when eval.select_by's best val step is not `step`, its
    params join the systems as "<system>_best" from there on. Returns the results
    evaluators' last split's rows, `labelled`."""
    systems = dict(systems)
    params = systems[system]
    row_fields: dict[str, dict] = {}  # {"<system>_best": {"selected_step": its step}}
    out = {}
    for ev in evaluators:
        if not ev.results:  # the typo sweep, a registered evaluator: written, not returned
            ev.run(encode(systems), step, final=True)
            continue
        results = {}
        if ev is selection.evaluator:
            results = ev.run(encode(systems), step, final=True, splits=("val",))
            if selection.best:
                selection.offer(results["val"], step, params)
                best = selection.best.step
                if best is not None and best != step:
                    systems[f"{system}_best"] = jax.device_put(selection.best.params(),
                                                               replicated)
                    row_fields = {f"{system}_best": {"selected_step": best}}
        results.update(ev.run(encode(systems), step, final=True, row_fields=row_fields,
                              splits=[s for s in ev.splits if s not in results]))
        out.update(labelled(ev.task, results[ev.splits[-1]]))
    return out


def labelled(task: evaluators_lib.Task, rows: Iterable[dict]) -> dict[str, dict]:
    """{"[task: ]system [index]": row}, as `train_and_evaluate` returns a task's rows."""
    return {(f"{task.name}: " if task.name else "") + scoring.row_label(r): r for r in rows}


def finished_results(log: MetricsLog, tasks: Sequence[evaluators_lib.Task],
                     splits: dict[str, tuple[str, ...]], step: int) -> dict[str, dict] | None:
    """What `train_and_evaluate` returned when it finished at `step`, read back from
    metrics.jsonl; None if a task's final evaluation is not all there."""
    rows, out = log.read(), {}
    for task in (t for t in tasks if splits[t.name]):
        last = splits[task.name][-1]
        mine = [r for r in rows if r["step"] == step and r["split"] == last and "system" in r
                and "typo_p" not in r and r.get("task", "") == task.name]
        if not mine:
            return None
        out.update(labelled(task, mine))
    return out
