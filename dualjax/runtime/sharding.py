"""The device mesh and the shardings of state and batches.

Two mesh axes, `data` x `model` (`mesh.model_axis` devices on `model`, 1 by default).
The global batch is split over `data`. The train state (params and everything the
optimizer keeps per param) is replicated (`mesh.param_sharding = "replicated"`) or, with
"fsdp", every array of at least `FSDP_MIN_SIZE` elements is split over `data` along one
dimension (`fsdp_spec`: the first of the dimensions the towers name, in `FSDP_AXES`
order, that the devices divide, else the largest one they divide), so each device holds
and updates 1/n of the big tables and matrices, as big_vision's "fsdp" strategy. With a
`model` axis of m > 1 devices, every Transformer and BERT weight is also split m ways on
its attention heads or MLP columns (`model_spec`: tensor parallelism as Megatron, t5x
and big_vision cut it: the query, key and value projections and the MLP's first layer by
their output columns, the attention output and the MLP's second layer by their input
rows), so a tower too large for one device fits on m of them. Axes are `Auto` so that
plain jitted code (the towers) partitions itself from these shardings, gathering or
reducing where it needs to, while the in-batch loss does its gather over `data`
explicitly under `jax.shard_map` (see losses/streaming.py), the same on every `model`
device.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"
PARAM_SHARDINGS = ("replicated", "fsdp")
MEMORY_PLANS = ("auto", "compile", "off")  # mesh.memory_plan (train/memory_plan.py)
FSDP_MIN_SIZE = 2 ** 14  # elements: smaller arrays (biases, norms, scales) stay replicated
# Logical axis names (the towers of dualjax/models/) in the order FSDP prefers to split
# them: a table's rows first, then the MLP's and heads' wide dimensions, then the embedding width.
FSDP_AXES = ("vocab", "mlp", "heads", "position", "output", "embed", "kv")
# The logical axes the `model` axis splits (tensor parallelism): a weight's heads or MLP
# columns; a token table's rows when they divide (else it stays whole on `model`).
MODEL_AXES = ("heads", "mlp")


def make_mesh(num_devices: int = 0, model: int = 1) -> jax.sharding.Mesh:
    """A `data` x `model` mesh over the first `num_devices` devices (0: all of them),
    `model` of them on the model axis."""
    devices = jax.devices()
    n = num_devices or len(devices)
    if n > len(devices):
        raise ValueError(f"mesh.num_devices={n}, but only {len(devices)} device(s) exist "
                         f"({devices[0].platform}); 0 uses all of them")
    if model < 1 or n % model:
        raise ValueError(f"mesh.model_axis={model} must be at least 1 and divide the "
                         f"{n} devices of the mesh")
    return jax.make_mesh((n // model, model), (DATA_AXIS, MODEL_AXIS),
                         axis_types=(AxisType.Auto, AxisType.Auto), devices=devices[:n])


def data_size(mesh: jax.sharding.Mesh) -> int:
    """The devices on the `data` axis: the global batch is split this many ways."""
    return mesh.shape[DATA_AXIS]


def names_matter(mesh: jax.sharding.Mesh, strategy: str) -> bool:
    """Whether the params' logical axis names change any sharding of the state: a
    `model` axis splits what they name, and FSDP splits the dimension they prefer. On a
    data mesh with replicated params they do not (and finding them traces the model's
    initialisation once more)."""
    return strategy == "fsdp" or mesh.shape.get(MODEL_AXIS, 1) > 1


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


def fsdp_spec(shape: tuple[int, ...], n: int, names: tuple[str | None, ...] | None = None,
              taken: tuple[int, ...] = ()) -> P:
    """How FSDP splits an array of `shape` over n devices: P() when it is small or no
    dimension divides by n; else `data` on the dimension `fsdp` picks (see the module),
    never one of the `taken` dimensions (those the `model` axis splits)."""
    if n <= 1 or int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_SIZE:
        return P()
    fits = [i for i, size in enumerate(shape) if size % n == 0 and i not in taken]
    if not fits:
        return P()
    named = [i for name in FSDP_AXES for i in fits if names and i < len(names)
             and names[i] == name]
    axis = named[0] if named else max(fits, key=lambda i: shape[i])
    return P(*[DATA_AXIS if i == axis else None for i in range(len(shape))])


def model_dim(shape: tuple[int, ...], m: int, names: tuple[str | None, ...] | None,
              where: str = "") -> int | None:
    """The dimension the `model` axis (m devices) splits: the first named in
    `MODEL_AXES` order; a token table's rows ("vocab") when they divide by m; None for
    an array with neither (biases of the embedding width, norms, a bow tower).

    Raises ValueError naming the array (`where`) when its heads or MLP columns do not
    divide by m: such a tower cannot be split that many ways."""
    if m <= 1 or not names:
        return None
    for name in MODEL_AXES:
        if name in names:
            i = names.index(name)
            if shape[i] % m:
                raise ValueError(f"mesh.model_axis={m} does not divide the {shape[i]} "
                                 f"{name} of {where or 'a weight'} {shape}: choose a model "
                                 "axis that divides the towers' heads and MLP width")
            return i
    if "vocab" in names and shape[names.index("vocab")] % m == 0:
        return names.index("vocab")
    return None


def param_spec(shape: tuple[int, ...], mesh: jax.sharding.Mesh, strategy: str,
               names: tuple[str | None, ...] | None = None, where: str = "") -> P:
    """A train-state array's PartitionSpec: `model` on `model_dim`, and with "fsdp",
    `data` on the dimension `fsdp_spec` picks among the others."""
    axis = model_dim(shape, mesh.shape.get(MODEL_AXIS, 1), names, where)
    spec: list[str | None] = [None] * len(shape)
    if axis is not None:
        spec[axis] = MODEL_AXIS
    if strategy == "fsdp":
        fsdp = fsdp_spec(shape, data_size(mesh), names, () if axis is None else (axis,))
        spec = [a or b for a, b in zip(spec, tuple(fsdp) + (None,) * len(shape), strict=False)]
    return P(*spec) if any(spec) else P()


def check_model_axis(params: Any, param_axes: Any, m: int) -> None:
    """ValueError naming the first weight ("params/...") whose heads or MLP columns a
    `model` axis of m devices does not divide (`model_dim`). params: the params tree or
    its abstract shapes; param_axes: its logical names (`dual_encoder.logical_axes`)."""
    names = _names(param_axes)
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        keys = _keys(path)
        model_dim(tuple(x.shape), m, names.get(keys), "/".join(("params", *keys)))


def _names(param_axes: Any) -> dict[tuple[str, ...], tuple]:
    """{param path: its logical axis names}."""
    return {_keys(path): tuple(spec) for path, spec in jax.tree_util.tree_leaves_with_path(
        param_axes, is_leaf=lambda x: isinstance(x, P))} if param_axes is not None else {}


def state_shardings(abstract_state: Any, mesh: jax.sharding.Mesh, strategy: str,
                    param_axes: Any = None) -> Any:
    """The NamedSharding of every leaf of a train state (from `jax.eval_shape`):
    `param_spec` of its shape and logical names. `param_axes`: the params tree with a
    PartitionSpec of logical names per param (`dual_encoder.logical_axes`), whose names
    also apply to the optimizer's per-param arrays (matched by the end of their path)."""
    if strategy not in PARAM_SHARDINGS:
        raise ValueError(f"mesh.param_sharding={strategy!r} is not one of: "
                         f"{', '.join(PARAM_SHARDINGS)}")
    names = _names(param_axes)
    if isinstance(abstract_state, dict) and "params" in abstract_state:  # a weight named,
        # not the optimizer's copy of it (opt_state/.../mu/...)
        check_model_axis(abstract_state["params"], param_axes, mesh.shape.get(MODEL_AXIS, 1))

    def leaf(path, x) -> NamedSharding:
        keys = _keys(path)
        found = next((names[keys[i:]] for i in range(len(keys)) if keys[i:] in names), None)
        return NamedSharding(mesh, param_spec(tuple(x.shape), mesh, strategy, found,
                                              "/".join(keys)))

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
