"""The checkpointer's own behaviour: what a save costs and what a restore gives back."""
import collections

import jax
import numpy as np
import pytest
from jax import monitoring

from dualjax.runtime import sharding
from dualjax.train import checkpoints

TRACE = "/jax/core/compile/jaxpr_trace_duration"  # a program traced (before any cache)


def _state(mesh, width: int = 3) -> dict:
    """Replicated and sharded arrays of several shapes, as a train state holds."""
    rng = np.random.default_rng(0)
    rep, shard = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    return {"params": {f"w{i}": jax.device_put(rng.random((8 + i, width), np.float32), rep)
                       for i in range(4)},
            "rows": jax.device_put(rng.random((16, 2), np.float32), shard),
            "step": jax.device_put(np.int32(7), rep)}


@pytest.fixture
def traced():
    """How many events of each kind jax reports while the test runs."""
    seen: collections.Counter = collections.Counter()

    def listen(event, duration, **kw):
        seen[event] += 1
    monitoring.register_event_duration_secs_listener(listen)
    yield seen
    monitoring.unregister_event_duration_listener(listen)


def test_one_process_saves_without_compiling_and_restores_each_layout(tmp_path, traced):
    mesh = sharding.make_mesh(8)
    state = _state(mesh, width=5)  # (shapes no other test saves)
    ckpt = checkpoints.Checkpointer(str(tmp_path), 2)
    ckpt.save(3, state, {"position": 5})
    ckpt.wait()
    # Replica-parallel writing slices each replicated array with a program made per
    # shape: on one process it is off, so the first save makes no program.
    assert traced[TRACE] == 0
    got, data = ckpt.restore(3, checkpoints.abstract_like(state))
    ckpt.close()
    jax.tree.map(np.testing.assert_array_equal, got, state)
    assert data == {"position": 5}
    assert got["rows"].sharding == state["rows"].sharding


def test_replica_parallel_writes_files_either_reads(tmp_path):
    """Several processes write replica-parallel: one process reads their checkpoints,
    and they read its."""
    mesh = sharding.make_mesh(8)
    state = _state(mesh)
    for written, read in ((True, False), (False, True)):
        path = str(tmp_path / f"written_{written}")
        ckpt = checkpoints.Checkpointer(path, 2, replica_parallel=written)
        ckpt.save(1, state, {})
        ckpt.close()
        ckpt = checkpoints.Checkpointer(path, 2, replica_parallel=read)
        got, _ = ckpt.restore(1, checkpoints.abstract_like(state))
        ckpt.close()
        jax.tree.map(np.testing.assert_array_equal, got, state)
