"""The device mesh and the shardings of state and batches.

One mesh axis, `data`: the global batch is split over it. The train state (params and
everything the optimizer keeps per param) is replicated (`mesh.param_sharding =
"replicated"`) or, with "fsdp", every array of at least `FSDP_MIN_SIZE` elements is
split over `data` along one dimension (`fsdp_spec`: the first of the dimensions the
towers name, in `FSDP_AXES` order, that the devices divide, else the largest one they
divide), so each device holds and updates 1/n of the big tables and matrices, as
big_vision's "fsdp" strategy. Axes are `Auto` so that plain jitted code (the towers)
partitions itself from these shardings, gathering a weight where it needs it, while the
in-batch loss does its gather explicitly under `jax.shard_map` (see losses/streaming.py).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
PARAM_SHARDINGS = ("replicated", "fsdp")
FSDP_MIN_SIZE = 2 ** 14  # elements: smaller arrays (biases, norms, scales) stay replicated
# Logical axis names (towers.py) in the order FSDP prefers to split them: a table's rows
# first, then the MLP's and heads' wide dimensions, then the embedding width.
FSDP_AXES = ("vocab", "mlp", "heads", "position", "output", "embed", "kv")


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


def fsdp_spec(shape: tuple[int, ...], n: int, names: tuple[str | None, ...] | None = None) -> P:
    """How FSDP splits an array of `shape` over n devices: P() when it is small or no
    dimension divides by n; else `data` on the dimension `fsdp` picks (see the module)."""
    if n <= 1 or int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_SIZE:
        return P()
    fits = [i for i, size in enumerate(shape) if size % n == 0]
    if not fits:
        return P()
    named = [i for name in FSDP_AXES for i in fits if names and i < len(names)
             and names[i] == name]
    axis = named[0] if named else max(fits, key=lambda i: shape[i])
    return P(*[DATA_AXIS if i == axis else None for i in range(len(shape))])


def state_shardings(abstract_state: Any, mesh: jax.sharding.Mesh, strategy: str,
                    param_axes: Any = None) -> Any:
    """The NamedSharding of every leaf of a train state (from `jax.eval_shape`):
    replicated, or `fsdp_spec` of its shape. `param_axes`: the params tree with a
    PartitionSpec of logical names per param (`dual_encoder.logical_axes`), whose names
    also apply to the optimizer's per-param arrays (matched by the end of their path)."""
    if strategy not in PARAM_SHARDINGS:
        raise ValueError(f"mesh.param_sharding={strategy!r} is not one of: "
                         f"{', '.join(PARAM_SHARDINGS)}")
    if strategy == "replicated":
        return jax.tree.map(lambda _: replicated(mesh), abstract_state)
    names = {}
    if param_axes is not None:
        for path, spec in jax.tree_util.tree_leaves_with_path(
                param_axes, is_leaf=lambda x: isinstance(x, P)):
            names[_keys(path)] = tuple(spec)

    def leaf(path, x) -> NamedSharding:
        keys = _keys(path)
        found = next((names[keys[i:]] for i in range(len(keys)) if keys[i:] in names), None)
        return NamedSharding(mesh, fsdp_spec(tuple(x.shape), mesh.devices.size, found))

    return jax.tree_util.tree_map_with_path(leaf, abstract_state)


def _keys(path) -> tuple[str, ...]:
    """The dict keys of a pytree path (optax's namedtuple fields and indices dropped)."""
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def to_host(tree: Any) -> Any:
    """Numpy copies of a tree of (possibly sharded) global arrays, in every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)
