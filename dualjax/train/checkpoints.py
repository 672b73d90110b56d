"""A thin wrapper on Orbax's CheckpointManager: the train state plus the data position.

Layout: WORKDIR/checkpoints/<step>/{state,data}. Saves are asynchronous; `close()`
(or `wait()`) blocks until the last one is on disk. With eval.select_by, WORKDIR/best/
holds the params of the best validation step (`BestParams`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import serialization

from dualjax.errors import SaveError, WorkdirError  # noqa: F401 (SaveError: raised here)
from dualjax.runtime.files import DISK_ERRNOS, DISK_STATUS, atomic_write
from dualjax.runtime.processes import is_main
from dualjax.runtime.sharding import to_host


def _is_disk_error(e: BaseException) -> bool:
    return ((isinstance(e, OSError) and e.errno in DISK_ERRNOS)
            or any(status in str(e) for status in DISK_STATUS))


def state_handler(replica_parallel: bool) -> ocp.PyTreeCheckpointHandler:
    """The handler of the train state's item: Orbax's own, with its arrays' replica-parallel
    writing (each replica of a replicated array writes a slice of it) only where asked.

    Replica-parallel writing spreads a replicated array's bytes over the replicas, which
    on several hosts spreads the writing over them. Its slices are programs compiled
    per array shape when a process first saves: within one process they bought nothing
    and cost seconds before the first checkpoint (BENCHMARKS.md, "The first checkpoint").
    The files are the same either way, and either reads the other's."""
    h = ocp.type_handlers
    scalar = h.ScalarHandler()
    registry = h.create_type_handler_registry(
        (int, scalar), (float, scalar), (np.number, scalar), (np.ndarray, h.NumpyHandler()),
        (jax.Array, h.ArrayHandler(use_replica_parallel=replica_parallel)),
        (str, h.StringHandler()))
    return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


class Checkpointer:
    def __init__(self, workdir: str, max_to_keep: int, replica_parallel: bool | None = None):
        """replica_parallel: `state_handler`'s; None: with more than one process."""
        if replica_parallel is None:
            replica_parallel = jax.process_count() > 1
        self._root = os.path.join(os.path.abspath(workdir), "checkpoints")
        self._manager = ocp.CheckpointManager(
            self._root,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=True, create=True,
                cleanup_tmp_directories=True),  # what a failed save left behind
            item_handlers={"state": state_handler(replica_parallel),
                           "data": ocp.JsonCheckpointHandler()})
        self._saving: int | None = None  # the step of the save in flight

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    @contextlib.contextmanager
    def _disk_errors(self):
        """A save that fails for lack of disk (or permission) ends as one SaveError line."""
        try:
            yield
        except Exception as e:
            if not _is_disk_error(e):
                raise
            kept = [s for s in self._manager.all_steps() if s != self._saving]
            text = str(e)
            reason = ("no space left on the device" if "RESOURCE_EXHAUSTED" in text
                      or "No space left" in text or getattr(e, "errno", 0) == errno.ENOSPC
                      else text.splitlines()[0][:200])
            raise SaveError(
                f"{self._root}: cannot save the checkpoint of step {self._saving} "
                f"({reason}); "
                + (f"the checkpoint of step {kept[0]} is kept; " if len(kept) == 1 else
                   f"the checkpoints of steps {', '.join(map(str, sorted(kept)))} are kept; "
                   if kept else "no checkpoint was saved before; ")
                + "free some space and run the same command again to resume") from None

    def save(self, step: int, state: Any, data_state: dict) -> None:
        """Starts an asynchronous save of `state` (a pytree) and the iterator position
        (waiting for the previous save first)."""
        with self._disk_errors():
            self._manager.wait_until_finished()  # the previous save's errors are its own
            self._saving = step
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data_state)))

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state at `step`, laid out as `abstract_state` (ShapeDtypeStructs with
        shardings), and the data iterator position saved with it."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(abstract_state, restore_args=(
                ocp.checkpoint_utils.construct_restore_args(abstract_state))),
            data=ocp.args.JsonRestore()))
        return restored["state"], restored["data"]

    def wait(self) -> None:
        with self._disk_errors():
            self._manager.wait_until_finished()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()


def abstract_like(tree: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs describing the arrays (or shapes) of `tree`, each with its
    sharding in `shardings` (a tree like it), else its own."""
    if shardings is None:
        shardings = jax.tree.map(lambda x: x.sharding, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _restore_numpy(path: str) -> Any:
    """The pytree saved at `path`, as numpy arrays (whatever mesh saved it)."""
    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
        restore_args=as_numpy))


def latest_params(workdir: str) -> tuple[int, Any]:
    """(step, params) of the latest checkpoint of another run's `workdir`, as numpy arrays
    (whatever mesh saved them; no optimizer state is kept). FileNotFoundError if the
    workdir has no checkpoint."""
    root = os.path.join(os.path.abspath(workdir), "checkpoints")
    steps = ocp.utils.checkpoint_steps(root) if os.path.isdir(root) else []
    if not steps:
        raise FileNotFoundError(f"{workdir}: no checkpoint in {root}")
    step = max(steps)
    return step, _restore_numpy(os.path.join(root, str(step), "state"))["params"]


class BestParams:
    """The params of the step whose validation metric was highest so far (eval.select_by):
    WORKDIR/best/<step>.msgpack (params only, flax msgpack) and WORKDIR/best/best.json
    ({"metric", "step", "value"}), replaced when a later step does better (a tie keeps
    the earlier step). best.json is written after the params are on disk, so it never
    points at a half-written step. Every process of a multi-host run follows the best
    step; process 0 writes the files."""

    def __init__(self, workdir: str, metric: str):
        self.root, self.metric = os.path.join(os.path.abspath(workdir), "best"), metric
        self.step: int | None = None
        self.value = -float("inf")
        meta = os.path.join(self.root, "best.json")
        if os.path.exists(meta):
            try:
                with open(meta) as f:
                    saved = json.load(f)
                kept = saved["metric"], int(saved["step"]), float(saved["value"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise WorkdirError(f"{meta}: unreadable ({e}); it names the best step so "
                                   f"far: remove {self.root} to choose again from the next "
                                   "evaluations") from None
            if kept[0] == metric:
                self.step, self.value = kept[1:]

    def offer(self, step: int, value: float, params: Any) -> bool:
        """Keeps `params` if `value` beats the best so far; returns whether it did."""
        if not value > self.value:
            return False
        params = to_host(params)  # every process takes part (FSDP across hosts)
        if is_main():
            os.makedirs(self.root, exist_ok=True)
            path = os.path.join(self.root, f"{step}.msgpack")
            with open(f"{path}.tmp{os.getpid()}", "wb") as f:
                f.write(serialization.msgpack_serialize(jax.tree.map(np.asarray, params)))
            os.replace(f"{path}.tmp{os.getpid()}", path)
            atomic_write(os.path.join(self.root, "best.json"), json.dumps(
                {"metric": self.metric, "step": step, "value": value}) + "\n")
            for old in os.listdir(self.root):
                if old.endswith(".msgpack") and old != f"{step}.msgpack":
                    os.remove(os.path.join(self.root, old))
        self.step, self.value = step, value
        return True

    def params(self) -> Any:
        """The best step's params, as numpy arrays."""
        with open(os.path.join(self.root, f"{self.step}.msgpack"), "rb") as f:
            return serialization.msgpack_restore(f.read())
