"""The device mesh and the shardings of state and batches.

One mesh axis, `data`: the global batch is split over it and the train state is
replicated. Axes are `Auto` so that plain jitted code (the towers) partitions itself
from the batch sharding, while the in-batch loss does its gather explicitly under
`jax.shard_map` (see losses.py).
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
    """A 1-D mesh over the first `num_devices` devices (0: all of them)."""
    devices = jax.devices()
    n = num_devices or len(devices)
    if n > len(devices):
        raise ValueError(f"mesh.num_devices={n}, but only {len(devices)} device(s) exist "
                         f"({devices[0].platform}); 0 uses all of them")
    return jax.make_mesh((n,), (DATA_AXIS,), axis_types=(AxisType.Auto,),
                                              devices=devices[:n])


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Leading (batch) dimension split over the `data` axis."""
    return NamedSharding(mesh, P(DATA_AXIS))


def put_global_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Places this process's slice of the global batch on the mesh.

    Each array's leading dimension is this host's share of the global batch; the result
    is one global array per key, sharded over `data` (multi-host ready).
    """
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
