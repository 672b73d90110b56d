"""Row-wise ("lazy") updates of the token tables: `optimizer.table_updates="lazy"`.

A dense step differentiates and updates every row of every token table, whatever the
batch read. With lazy updates a step instead:

1. finds, per token table, the distinct ids its batch reads (the fields the objective
   names for that table, pads included), as a sorted list padded to a static length
   with an id past the table's end. On one process the host lists them as it hands the
   batch over (`BatchRows`: the batch's field `rows_field(table)`), padded to the next of
   the sizes of `row_count` (at most 1/8 more), so the step works on about as many rows
   as the batch reads (a new size compiles the step once more); else the step finds
   them itself (`touched`), padded to the most a batch could read;
2. gathers those rows, and runs the loss with every read of the table
   (`towers.TokenTable.source`) answered from them (`reading`), so the table's gradient
   is [rows, dim], one row per distinct id;
3. runs the optimizer (any elementwise optax transformation: sgd, adam, adamw, with
   global-norm clipping) on the tree where each table and each of its optimizer slots
   (Adam's moments, the momentum) are those rows, then writes the rows back (`update`).

Rows a batch does not read keep their values and their slots. That is TensorFlow's
LazyAdam, not Adam: with Adam an untouched row still moves (its first moment is not
zero) and its moments decay every step; AdamW's decay also reaches only touched rows.
The step count, the learning-rate schedule and the bias correction stay global. The
gradient-norm clipping is exact: the rows are distinct and the padding rows' gradients
are zero.
The optimizer state has the dense run's layout, so a checkpoint resumes either way.

Each table's rows move with one gather and one in-place scatter (the state is donated).
Row lists are CHUNK-aligned, so that a run compiles its step for a few lengths only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualjax.models.towers import TokenTable

CHUNK = 1024  # row lists are a multiple of this long
Path = tuple[str, ...]  # a TokenTable's module path in the params tree


def rows_field(path: Path) -> str:
    """The batch field in which `BatchRows` lists the distinct ids of table `path`."""
    return "rows:" + "/".join(path)


def row_count(n: int, rows: int) -> int:
    """The static length of a list of n distinct ids of a `rows`-row table: the least of
    CHUNK x (1, 2, ..., 15, 16, 18, ..., 30, 32, 36, ...) that holds n (steps of at most
    1/8 past 8 x CHUNK), at most `rows` rounded up to CHUNK. Every row of the padding is
    gathered and updated like a real one (the scatter drops it), so the steps are fine;
    each length a run reaches compiles the step once more, and a run's batches reach few."""
    cap = -(-rows // CHUNK) * CHUNK
    k = max(1, -(-min(n, cap) // CHUNK))
    step = 1 << max(0, k.bit_length() - 4)
    return min(-(-k // step) * step * CHUNK, cap)


class BatchRows:
    """The host's part of a lazy step on one process: adds to a batch (numpy, as the
    input pipeline hands it over), per token table, the sorted distinct ids its fields
    read, padded with the table's row count to `row_count`. A table's length never
    shrinks during a run, so the step compiles once per size the batches reach."""

    def __init__(self, tables: Mapping[Path, tuple[str, ...]], params: dict):
        self.tables = dict(tables)
        self.sizes = {path: _get(params, path)["embedding"].shape[0] for path in tables}
        self.lengths = {path: 0 for path in self.tables}

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(batch)
        for path, prefixes in self.tables.items():
            rows = self.sizes[path]
            present = np.zeros(rows, bool)
            for p in prefixes:
                if f"{p}_ids" in batch:
                    present[batch[f"{p}_ids"]] = True
            ids = np.flatnonzero(present).astype(np.int32)
            n = self.lengths[path] = max(self.lengths[path], row_count(len(ids), rows))
            out[rows_field(path)] = np.concatenate([ids, np.full(n - len(ids), rows, np.int32)])
        return out


def touched(params: dict, batch: Mapping[str, jax.Array], tables: Mapping[Path, tuple[str, ...]]
            ) -> dict[Path, tuple[jax.Array, jax.Array]]:
    """{table path: (ids [U] int32, position [rows] int32)}: the distinct ids the batch
    reads from each table (`tables`: path -> prefixes of the batch's "<prefix>_ids" fields
    that index it), ascending, then `rows` (past the end) up to U; position[i]: where id i
    is in that list. The batch's `rows_field` where it has one (`BatchRows`); else found
    here, with U a multiple of CHUNK at least min(ids read, rows)."""
    out = {}
    for path, prefixes in tables.items():
        rows = _get(params, path)["embedding"].shape[0]
        if rows_field(path) in batch:
            unique = batch[rows_field(path)]
            position = jnp.zeros((rows,), jnp.int32).at[unique].set(
                jnp.arange(unique.shape[0], dtype=jnp.int32), mode="drop", unique_indices=True)
            out[path] = (unique, position)
            continue
        ids = jnp.concatenate([batch[f"{p}_ids"].reshape(-1) for p in prefixes
                               if f"{p}_ids" in batch])
        present = jnp.zeros((rows,), bool).at[ids].set(True)
        size = -(-min(ids.shape[0], rows) // CHUNK) * CHUNK
        (unique,) = jnp.nonzero(present, size=size, fill_value=rows)
        out[path] = (unique.astype(jnp.int32), jnp.cumsum(present, dtype=jnp.int32) - 1)
    return out


def gather(x: jax.Array, ids: jax.Array) -> jax.Array:
    """x[ids] ([U, ...]). An id past x's end (the padding) reads x's last row: the loss
    never reads those rows, and `scatter` drops them. (mode="fill" would give zeros, but
    its bounds mask makes the gather slower: BENCHMARKS.md, "Figures behind design
    choices".)"""
    return x.at[ids].get(mode="clip", indices_are_sorted=True, unique_indices=True)


def scatter(x: jax.Array, ids: jax.Array, rows: jax.Array) -> jax.Array:
    """x with x[ids] = rows (ids sorted and distinct; those past x's end dropped)."""
    return x.at[ids].set(rows, mode="drop", indices_are_sorted=True, unique_indices=True)


@contextlib.contextmanager
def reading(rows: Mapping[Path, jax.Array],
            touched_rows: Mapping[Path, tuple[jax.Array, jax.Array]]):
    """Within: every TokenTable in `rows` reads its gathered rows (ids mapped to their
    positions) instead of its table."""

    def intercept(next_fun, args, kwargs, context):
        path = tuple(context.module.path)
        if (context.method_name == "source" and isinstance(context.module, TokenTable)
                and path in rows):
            (ids,) = args
            return rows[path], touched_rows[path][1][ids]
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(intercept):
        yield


def value_and_grad(loss: Callable, params: dict, batch: dict, rng: jax.Array, extras: dict,
                   tables: Mapping[Path, tuple[str, ...]]):
    """((loss, aux), row grads, touched_rows): the loss and the gradient w.r.t. the params, with
    each table's gradient [U, dim] over its touched rows (the table leaves of the params
    tree replaced by them), and `touched`'s rows."""
    touched_rows = touched(params, batch, tables)
    rows = {p: gather(_get(params, p)["embedding"], ids) for p, (ids, _) in touched_rows.items()}

    def with_rows(params, rows):
        with reading(rows, touched_rows):
            return loss(params, batch, rng, extras)

    (value, aux), (grads, row_grads) = jax.value_and_grad(with_rows, argnums=(0, 1),
                                                          has_aux=True)(params, rows)
    for path, g in row_grads.items():  # the tables' own gradients are zero: never read
        grads = _set(grads, path + ("embedding",), g)
    return (value, aux), grads, touched_rows


def update(tx: optax.GradientTransformation, grads: dict, opt_state: Any, params: dict,
           touched_rows: Mapping[Path, tuple[jax.Array, jax.Array]]) -> tuple[dict, Any]:
    """(new params, new optimizer state): `tx` on the touched rows of each table and its
    slots (`grads` from `value_and_grad`), and on every other param as usual."""
    slot = _slots(opt_state, params, touched_rows)
    row_params = params
    for path, (ids, _) in touched_rows.items():
        row_params = _set(row_params, path + ("embedding",),
                          gather(_get(params, path)["embedding"], ids))
    row_state = jax.tree_util.tree_map_with_path(
        lambda kp, x: gather(x, touched_rows[slot[kp]][0]) if kp in slot else x, opt_state)
    updates, row_state = tx.update(grads, row_state, row_params)
    row_params = optax.apply_updates(row_params, updates)
    new_params = row_params
    for path, (ids, _) in touched_rows.items():
        new_params = _set(new_params, path + ("embedding",),
                          scatter(_get(params, path)["embedding"], ids,
                                  _get(row_params, path)["embedding"]))
    old = dict(jax.tree_util.tree_flatten_with_path(opt_state)[0])
    new_state = jax.tree_util.tree_map_with_path(
        lambda kp, x: scatter(old[kp], touched_rows[slot[kp]][0], x) if kp in slot else x,
        row_state)
    return new_params, new_state


def _slots(opt_state: Any, params: dict, touched_rows: Mapping[Path, Any]) -> dict:
    """{key path of an optimizer-state leaf: table path} for the leaves that are a
    table's slot: their key path ends with the table's param path, and their shape is
    the table's."""
    slots = {}
    for kp, x in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        keys = tuple(getattr(k, "key", None) for k in kp)
        for path in touched_rows:
            full = path + ("embedding",)
            if keys[-len(full):] == full and x.shape == _get(params, full).shape:
                slots[kp] = path
    return slots


def _get(tree: dict, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: Path, value: Any) -> dict:
    return value if not path else {**tree, path[0]: _set(tree[path[0]], path[1:], value)}
