"""A thin wrapper on Orbax's CheckpointManager: the train state plus the data position.

Layout: WORKDIR/checkpoints/<step>/{state,data}. Saves are asynchronous; `close()`
(or `wait()`) blocks until the last one is on disk.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath


class Checkpointer:
    def __init__(self, workdir: str, max_to_keep: int):
        self._manager = ocp.CheckpointManager(
            os.path.join(os.path.abspath(workdir), "checkpoints"),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=True, create=True),
            item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict) -> None:
        """Starts an asynchronous save of `state` (a pytree) and the iterator position."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state at `step`, laid out as `abstract_state` (ShapeDtypeStructs with
        shardings), and the data iterator position saved with it."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored["state"], restored["data"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing the arrays of `tree`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def latest_params(workdir: str) -> tuple[int, Any]:
    """(step, params) of the latest checkpoint of another run's `workdir`, as numpy arrays
    (whatever mesh saved them; no optimizer state is kept). FileNotFoundError if the
    workdir has no checkpoint."""
    root = os.path.join(os.path.abspath(workdir), "checkpoints")
    steps = ocp.utils.checkpoint_steps(root) if os.path.isdir(root) else []
    if not steps:
        raise FileNotFoundError(f"{workdir}: no checkpoint in {root}")
    step = max(steps)
    path = os.path.join(root, str(step), "state")
    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    state = ocp.PyTreeCheckpointer().restore(
        path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    return step, state["params"]
