"""Training and evaluation of a dual encoder, in named stages.

`train_and_evaluate(spec, workdir)` runs (`spec`: the run resolved once,
`config.run.resolve`): workdir and mesh → `_prepare_input` (tables,
vocabularies, the pretrained start) → `_build` (model, optimizer, the state's shapes and
shardings, update step: a frozen `Run` and its `Progress`, what moves as it trains) →
`_training_data` (`model_data`: what a model labels or scores first) → `_restore` (the
latest checkpoint, else the first state: the start's towers, the rest initialised) →
evaluators (built from its EvalSpec, `evaluators.py`; `selection.py`: eval.select_by and
early stopping) → `_train_loop` (train rows, val evaluations, checkpoints, preemption) →
`_final_evaluation` (`evaluation.py`). Everything it writes goes under `workdir`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import operator
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from dualjax import models, objectives, pretrained
from dualjax.config import run as run_lib
from dualjax.config.run import RunSpec
from dualjax.errors import ConfigError, Preempted, PretrainedError
from dualjax.eval import evaluators as evaluators_lib
from dualjax.eval.metrics_log import MetricsLog
from dualjax.objectives import optimizer
from dualjax.runtime import malloc, processes, sharding
from dualjax.runtime.pipeline import Background
from dualjax.runtime.signals import Signals
from dualjax.text import sides
from dualjax.train import (
    checkpoints,
    evaluation,
    lazy_rows,
    memory_plan,
    model_data,
    teacher,
    warm_start,
    weak_labels,
)
from dualjax.train import inputs as inputs_lib
from dualjax.train import step as step_lib
from dualjax.train import tasks as tasks_lib
from dualjax.train import workdir as workdir_lib
from dualjax.train.rows import TrainRows
from dualjax.train.selection import Selection

Hook = Callable[[int, dict], None]  # called after every step with (step, device metrics)


# ----------------------------------------------------------------------------- main
def train_and_evaluate(spec: RunSpec | Any, workdir: str,
                       hooks: Sequence[Hook] = ()) -> dict[str, dict]:
    """Trains (or resumes) and evaluates.

    A SIGTERM or SIGINT (Ctrl-C) during training saves a checkpoint at the end of the
    step and raises `Preempted`; running the same command again resumes from it. A
    second signal stops at once (KeyboardInterrupt), saving nothing more.

    Args:
      spec: the run, resolved (`config.run.resolve`); a config (configs/default.py's
        keys) is resolved here first, against `workdir`.
      workdir: where the run lives: config.json, data.json, checkpoints, metrics.jsonl,
        report.md. A workdir of another run, or whose data changed, is refused.
      hooks: each called after every step with (step, its device metrics).

    Returns:
      {"system [index]": metrics row} of the last evaluation split (test); with several
      tasks (`config.tasks`), keyed "task: system [index]".
    """
    if not isinstance(spec, RunSpec):
        spec = run_lib.resolve(spec, workdir)  # (checked there)
    mesh = sharding.make_mesh(spec.mesh.num_devices, spec.mesh.model_axis)
    malloc.for_tower(spec.tower)  # before the state is allocated
    with (workdir_lib.guard(workdir, spec.as_dict(), tasks_lib.data_files(spec.tasks)) as rebuilt,
          Signals() as signals,  # one run per workdir, on the data it was made from
          MetricsLog(workdir, tensorboard=True, writer=processes.is_main()) as log):
        return _train_and_evaluate(spec, workdir, mesh, hooks, signals, log, rebuilt)


@dataclasses.dataclass(frozen=True)
class Run:
    """What `_build` makes for one run: it does not change while the run trains (what
    does is its `Progress`)."""
    spec: RunSpec
    workdir: str
    mesh: jax.sharding.Mesh
    log: MetricsLog
    signals: Signals
    tasks: tuple[tasks_lib.Task, ...]
    splits: dict[str, tuple[str, ...]]       # each task's evaluation splits
    inputs: sides.Inputs
    origin: pretrained.Pretrained | None     # model.pretrained's start
    init_state: Callable[..., step_lib.State]  # (seed, given) -> the state, sharded (jitted)
    state_sharding: Any
    abstract: step_lib.State                 # the state's shapes, dtypes and shardings
    step_with: Callable[[int], step_lib.TrainStep]  # the step of K GradCache chunks
    encoders: tuple[Callable, Callable]      # (params, inputs) -> unit vectors, per side
    host_rows: Callable[[dict], dict] = dict  # lazy updates: lazy_rows.BatchRows

    @property
    def system(self) -> str:
        """The trained model's rows: "dual_encoder" or "pses"."""
        return self.spec.system

    def first_state(self) -> step_lib.State:
        """The state a run without a checkpoint starts from: its seed's initialisation
        with the start's towers (init_from's or model.pretrained's) in place of theirs,
        which are then never initialised at random (`step.make_init_state`)."""
        tree = warm_start.start_tree(self.spec.start.init_from, self.spec.as_dict("model"),
                                     self.origin, self.abstract["params"])
        return self.init_state(self.spec.schedule.seed,
                               warm_start.given(tree, self.state_sharding["params"]))

    def first_params(self) -> dict:
        """The towers the run starts from (init_from's, model.pretrained's or random)."""
        return self.first_state()["params"]

    def systems_of(self, systems: dict[str, Any]) -> evaluators_lib.Systems:
        """name -> params  to  name -> (encode_queries, encode_documents) with those params."""
        queries, documents = self.encoders
        return {name: (functools.partial(queries, p), functools.partial(documents, p))
                for name, p in systems.items()}


@dataclasses.dataclass
class Progress:
    """What moves as a run trains: the train state (its `Run.abstract` until `_restore`
    reads or makes it), the step function (`memory_plan` may choose another before the
    first step), each task's data iterator, the checkpointer (`_restore` opens it) and
    the step last saved."""
    state: step_lib.State
    train_step: step_lib.TrainStep
    data_iters: list = dataclasses.field(default_factory=list)  # one per task
    ckpt: checkpoints.Checkpointer | None = None
    last_saved: int | None = None

    def save(self, step: int, tasks: Sequence[tasks_lib.Task]) -> None:
        """A checkpoint of the state and the iterators' positions (one task: its own, as
        single-task checkpoints hold)."""
        positions = [it.get_state() for it in self.data_iters]
        assert self.ckpt is not None, "_restore opens the checkpointer"
        self.ckpt.save(step, self.state, positions[0] if len(tasks) == 1 else
                       {t.name: p for t, p in zip(tasks, positions, strict=True)})
        self.last_saved = step


def _train_and_evaluate(spec: RunSpec, workdir: str, mesh, hooks: Sequence[Hook],
                        signals: Signals, log: MetricsLog, rebuilt: Sequence[str] = ()
                        ) -> dict[str, dict]:
    tasks = tasks_lib.make_tasks(spec.tasks, spec.schedule.seed)
    prepared = processes.main_first(functools.partial(_prepare_input, spec, workdir, tasks,
                                                        rebuilt))
    spec = tasks_lib.capped_steps(spec, tasks)
    s = spec.schedule
    # The pairs are tokenized in a thread while the model is built and compiled, and
    # while the first steps train on batches encoded as they are read (`ReadPairs`).
    pairs = tasks if s.num_train_steps else ()
    tables = Background(functools.partial(tasks_lib.tokenized_pairs, pairs, prepared[1],
                                          workdir, processes.is_main()), "tokenize pairs")
    run, progress = _build(spec, workdir, mesh, log, signals, tasks, *prepared)
    if s.num_train_steps:
        progress.data_iters = _training_data(run, tables)
    _restore(run, progress)
    selection = Selection(spec.eval.select_by, s.early_stopping * s.eval_every_steps,
                          s.num_train_steps, workdir, run.system)
    start = int(progress.state["step"])
    finished = start >= s.num_train_steps or selection.stopped_early(start)
    if processes.agree(finished and not s.rerun):
        done = evaluation.finished_results(log, tasks, run.splits, start)
        if processes.agree(done is not None):
            print(f"{workdir} finished at step {start}; its results are in metrics.jsonl and "
                  "report.md. To evaluate it again: --config.eval.rerun=True")
            return done or {}  # (process 0's rows; another process may not read them)
    # Evaluators (evaluators.py): each task's retrieval evaluation, then the typo sweep.
    # They get encode functions; what their val rows decide (eval.select_by) is decided
    # in evaluation.py.
    evaluators = evaluators_lib.make(spec.eval, tasks, run.splits, run.inputs, mesh,
                                     workdir, log, main=processes.is_main())
    selection.choose(evaluators)
    if processes.agree(bool(
            selection.active and start and start < s.num_train_steps
            and s.eval_every_steps and start % s.eval_every_steps == 0
            and not any(r["step"] == start and r["split"] == "val" for r in log.read()))):
        # killed during the evaluation at its checkpoint: it decides what's best
        evaluation.validate(evaluators, selection, run.systems_of, run.system,
                            progress.state["params"], start)
    try:
        _train_loop(run, progress, evaluators, selection, hooks)
    finally:  # grain's worker processes and the batches they hold in shared memory
        for it in progress.data_iters:
            it.close()
    return _final_evaluation(run, progress, evaluators, selection)


def _prepare_input(spec: RunSpec, workdir: str,
                   tasks: Sequence[tasks_lib.Task], rebuilt: Sequence[str] = ()
                   ) -> tuple[dict[str, tuple[str, ...]], sides.Inputs,
                              pretrained.Pretrained | None]:
    """The datasets' tables and one vocabulary over all tasks: (splits, inputs, start).
    With num_train_steps = 0 (evaluation only) no training pairs are needed and the
    vocabularies come from the test splits. `rebuilt`: input files that changed, accepted
    by data.rebuild (`workdir.check_data`): the pseudo-labelled pairs are made again, and
    a warning says how much of the new training text the kept vocabulary does not know.
    Process 0 runs it (`main_first`); the other processes of a multi-host run then read
    what it wrote."""
    if rebuilt and processes.is_main():
        for t in tasks:
            made = ([weak_labels.pairs_path(workdir, t.name)] if t.needs_pseudo_labels else []
                    ) + ([teacher.path(workdir, t.name)] if t.needs_teacher else [])
            for path in filter(os.path.exists, made):
                os.remove(path)
    splits = {t.name: t.splits() for t in tasks}
    for t in tasks:
        for split in splits[t.name]:
            t.eval_task(split)
        if spec.schedule.num_train_steps and not t.pretraining:
            t.train_source  # noqa: B018 (its table written here: by process 0 first)
    init_from = spec.start.init_from
    if init_from:  # pre-trained elsewhere: its vocabularies (later, its towers)
        warm_start.copy_vocabularies(init_from, workdir, spec.as_dict("model"))
    start = warm_start.resolve_start(spec.start, workdir)  # model.pretrained's, recorded
    if spec.schedule.num_train_steps:
        texts = lambda: itertools.chain.from_iterable(t.train_texts() for t in tasks)
        inputs = inputs_lib.load_inputs(
            spec.inputs, workdir, texts,
            lambda: itertools.chain.from_iterable(t.train_fields() for t in tasks), start)
        if rebuilt and processes.is_main() and spec.inputs.tokenizer != "hf":  # (hf's
            # vocabulary is not made from the data)
            unknown, total = inputs_lib.unknown_tokens(inputs.query.tokenizer, texts())
            logging.warning("data.rebuild: %d of the %d tokens (%.1f%%) of the new training "
                            "texts are out of the kept vocabulary (%s); a new --workdir "
                            "builds one from the new data", unknown, total,
                            100 * unknown / max(total, 1), os.path.join(workdir, "vocab.json"))
        return splits, inputs, start
    tests = [t.eval_task(splits[t.name][-1]) for t in tasks]
    return splits, inputs_lib.load_inputs(
        spec.inputs, workdir,
        lambda: [x for e in tests for x in e.corpus + e.queries],
        lambda: [f for e in tests for f in inputs_lib.eval_fields(e)], start), start


def _build(spec: RunSpec, workdir, mesh, log, signals, tasks, splits, inputs, origin
           ) -> tuple[Run, Progress]:
    """The model, the optimizer, the train state's shapes and shardings, how to make its
    first state, and the step."""
    model = models.make_model(spec.model, inputs.query.tokenizer.vocab_size,
                              inputs.feature_sizes(), num_tasks=len(tasks),
                              architecture=origin.architecture if origin else None)
    objective = objectives.make(spec.objective, model, mesh)
    seed = spec.schedule.seed
    tx, schedule = optimizer.make_optimizer(spec.optimizer, spec.schedule.num_train_steps)
    tx = objectives.restrict(tx, objective)  # params the objective keeps fixed get no update
    init_state = step_lib.make_init_state(objective, tx, spec.log_q_buckets)
    shapes = jax.eval_shape(init_state, seed)
    strategy = spec.mesh.param_sharding
    try:  # a model axis that does not divide the towers' heads: named in one line
        state_sharding = sharding.state_shardings(
            shapes, mesh, strategy, models.logical_axes(model, spec.inputs.max_lens)
            if sharding.names_matter(mesh, strategy) else None)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    # Nothing is computed yet: `_restore` reads the checkpoint into `abstract`, or makes
    # the first state (`Run.first_state`), the given start's weights donated to it.
    abstract = checkpoints.abstract_like(shapes, state_sharding)
    init_state = jax.jit(init_state, static_argnums=0, out_shardings=state_sharding,
                         donate_argnums=1)
    table_updates = spec.optimizer.table_updates

    def step_with(chunks: int) -> step_lib.TrainStep:  # (train.encode_chunks=-1 chooses)
        chunked = objective if chunks == spec.objective.encode_chunks else objectives.make(
            dataclasses.replace(spec.objective, encode_chunks=chunks), model, mesh)
        return step_lib.make_train_step(
            chunked, tx, schedule, state_sharding, sharding.batch_sharding(mesh),
            sharding.replicated(mesh), spec.log_q_alpha, table_updates)
    host_rows: Callable[[dict], dict] = dict
    if table_updates == "lazy" and jax.process_count() == 1:  # else the step finds the rows
        assert objective.tables is not None, "validated: lazy updates need token tables"
        host_rows = lazy_rows.BatchRows(objective.tables(abstract["params"]),
                                        abstract["params"])
    run = Run(spec, workdir, mesh, log, signals, tuple(tasks), splits, inputs, origin,
              init_state, state_sharding, abstract, step_with, models.make_encoders(model),
              host_rows)
    return run, Progress(abstract, step_with(spec.objective.encode_chunks))


def _training_data(run: Run, tables: Background[dict[str, dict[str, np.ndarray] | None]]
                   ) -> list:
    """Each task's iterator of this process's share of the training batches (`tables`:
    its pairs being tokenized, `tasks.tokenized_pairs`: until they are, a batch is
    encoded as it is read; data.tasks "pseudo": its pairs labelled by the start first;
    "distill": its candidates scored by the teacher first)."""
    spec, s = run.spec, run.spec.schedule
    model_data.prepare(spec, run.tasks, run.workdir, run.inputs, run.mesh, run.encoders,
                       run.first_params)
    iters = [t.train_iterator(run.inputs, s.global_batch_size, s.seed + i,
                              spec.num_mixed_negatives,
                              tables.then(operator.itemgetter(t.name)))
             for i, t in enumerate(run.tasks)]
    for t in run.tasks:
        logging.info("%s%s; global batch %d over %d devices of the data axis",
                     f"Task {t.name} (weight {t.weight}): " if t.name else "",
                     t.describe_training(s.global_batch_size),
                     s.global_batch_size, sharding.data_size(run.mesh))
    return iters


def _restore(run: Run, progress: Progress) -> None:
    """The latest checkpoint's state and iterator positions, if there is one; else the
    start's towers (init_from's, model.pretrained's, or the initialisation as is)."""
    steps = run.spec.schedule.num_train_steps
    ckpt = progress.ckpt = checkpoints.Checkpointer(run.workdir,
                                                    run.spec.schedule.keep_checkpoints)
    last = progress.last_saved = ckpt.latest_step()
    if last is not None:
        progress.state, saved_data = ckpt.restore(last, run.abstract)
        for t, it in zip(run.tasks, progress.data_iters, strict=True):
            it.set_state(saved_data if len(run.tasks) == 1 else saved_data[t.name])
        logging.info("Resumed from %s at step %d", os.path.join(run.workdir, "checkpoints"),
                     last)
        if last > steps:  # nothing is undone: say what is evaluated
            logging.warning("num_train_steps=%d is below the checkpoint's step %d: nothing "
                            "more is trained, and step %d is what is evaluated (a run to "
                            "%d steps needs a new --workdir)", steps, last, last, steps)
        run.signals.stage = f"before training; the checkpoint of step {last} is kept"
    else:
        progress.state = run.first_state()
    run.log.truncate_after(last or 0)  # rows of steps this run will do (again)
    run.log.start_events((last or 0) + 1, json.dumps(
        run.spec.as_dict(), indent=2, default=str))


def _cadence(s: run_lib.Schedule, step: int, patience: int) -> tuple[bool, bool, bool]:
    """(is_eval, is_ckpt, is_log) of `step`: a val evaluation (never at the last step),
    a checkpoint (the last step, every checkpoint_every_steps, and an evaluation that may
    end training) and a train row (also every log_every_steps)."""
    is_last = step == s.num_train_steps
    is_eval = bool(s.eval_every_steps and step % s.eval_every_steps == 0 and not is_last)
    is_ckpt = bool(is_last or (s.checkpoint_every_steps
                               and step % s.checkpoint_every_steps == 0)
                   or (patience and is_eval))
    return is_eval, is_ckpt, is_ckpt or step % max(s.log_every_steps, 1) == 0


def _train_loop(run: Run, progress: Progress, evaluators, selection: Selection,
                hooks: Sequence[Hook]) -> None:
    """Steps from the state's to num_train_steps (or early stopping): train rows, val
    evaluations, checkpoints; a signal saves at the end of its step and raises Preempted."""
    s, signals = run.spec.schedule, run.signals
    start = int(progress.state["step"])
    weights = [t.weight for t in run.tasks]
    trim = (jax.process_count() == 1 and run.system == "dual_encoder"
            and run.spec.objective.kind != "mlm")
    rows = TrainRows(s.num_train_steps, start, s.global_batch_size, run.log)
    last = s.num_train_steps if not selection.stopped_early(start) else start
    signals.deferring = True  # a signal now saves at the end of the step
    try:
        for step in range(start + 1, last + 1):
            t = tasks_lib.task_at_step(step, weights, s.seed)
            local = next(progress.data_iters[t])
            local["task"] = np.full(len(local["q_ids"]), t, np.int32)
            if step == start + 1:  # before the first step: its memory, at full length
                progress.train_step = memory_plan.before_first_step(
                    run.spec, run.mesh, progress.train_step, progress.state,
                    _placed(run, local), run.step_with)
            if trim:  # each process's share must keep one shape: one process only
                local = sides.trim_padding(local)
            is_eval, is_ckpt, is_log = _cadence(s, step, selection.patience)
            progress.state, step_metrics = progress.train_step(
                progress.state, sharding.put_global_batch(run.host_rows(local), run.mesh),
                norms=is_log or bool(signals.received))
            rows.add(step, step_metrics)
            for hook in hooks:
                hook(step, step_metrics)
            stop = signals.received
            if jax.process_count() > 1:  # all processes stop at one step, agreed as they log
                stop = ((stop or "a signal to another process")
                        if is_log and processes.any_process(bool(stop)) else None)
            if is_log or is_ckpt or stop:
                rows.write(run.tasks[t].fields(), progress.state["params"], progress.last_saved)
            if is_ckpt or stop:
                progress.save(step, run.tasks)
            if stop:
                raise Preempted(f"{stop}: saved a checkpoint at step {step} in "
                                f"{run.workdir}; run the same command again to resume")
            if is_eval and _evaluate_during_training(run, progress, evaluators, selection,
                                                     rows, step):
                break
        # A signal that came after the last step's check (while its row or checkpoint
        # was written): that step is saved, and the final evaluation would ignore it.
        # From here a signal stops the run at once.
        signals.stage = f"after step {progress.last_saved}, which is saved"
        signals.deferring = False
        late = signals.received
        if jax.process_count() > 1:
            late = (late or "a signal to another process") if processes.any_process(
                bool(late)) else None
        if late:
            raise Preempted(f"{late}: saved a checkpoint at step {progress.last_saved} in "
                            f"{run.workdir}; run the same command again to resume")
    finally:  # also on errors: the saves already started finish before we leave
        signals.deferring = False
        rows.close()
        if progress.ckpt is not None:
            progress.ckpt.close()


def _placed(run: Run, local: dict) -> Callable[[], dict]:
    """The global batch of this process's `local` share, placed, when called."""
    return lambda: sharding.put_global_batch(run.host_rows(local), run.mesh)


def _evaluate_during_training(run: Run, progress: Progress, evaluators,
                              selection: Selection, rows, step: int) -> bool:
    """The val evaluation of `step`; whether early stopping ends training there."""
    signals = run.signals
    signals.deferring = False  # evaluation stops at once: nothing to lose
    signals.stage = (f"during the evaluation at step {step}; the checkpoint of step "
                     f"{progress.last_saved} is kept" if progress.last_saved is not None else
                     f"during the evaluation at step {step}; nothing was saved")
    evaluation.validate(evaluators, selection, run.systems_of, run.system,
                        progress.state["params"], step)
    rows.since = (step, time.perf_counter())  # evaluation time is not training time
    signals.deferring = True
    if not selection.stopped_early(step):
        return False
    assert selection.best is not None  # it stopped early
    logging.info("eval.early_stopping: val %s has not improved on step %d for %d "
                 "evaluations; training stops at step %d", selection.metric,
                 selection.best.step, run.spec.schedule.early_stopping, step)
    return True  # saved: a rerun finds it finished


def _final_evaluation(run: Run, progress: Progress, evaluators, selection: Selection
                      ) -> dict[str, dict]:
    """Every evaluator (`evaluation.final`) on the trained towers, their start
    (eval.untrained) and the baselines."""
    step = int(progress.state["step"])  # num_train_steps, or where early stopping ended
    run.signals.stage = (f"during the final evaluation; training is finished and saved at "
                         f"step {step}, and running again evaluates it")
    systems = {run.system: progress.state["params"]}
    if run.spec.schedule.untrained:  # "start": init_from's or model.pretrained's towers
        name = "start" if run.spec.start.init_from or run.origin else "untrained"
        try:
            systems[name] = run.first_params()
        except PretrainedError as e:  # resumed without the start's folder
            logging.warning("the final evaluation has no %r row: %s", name, e)
    return evaluation.final(evaluators, selection, run.systems_of, run.system, systems, step,
                            sharding.replicated(run.mesh))
