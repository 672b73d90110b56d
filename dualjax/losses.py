"""In-batch losses over the global batch.

Every loss takes unit query and document embeddings q, d [batch, dim] (row i of d is
the positive of row i of q) and the similarity's scale and bias, and returns
`(loss, metrics)`. `sharded(loss_name, mesh)` runs the same loss under `jax.shard_map`
over the mesh's `data` axis: each device gathers every document of the global batch,
so each query still sees all the other documents as negatives, and the result equals
the single-device reference (tests/test_losses.py proves it on 8 devices).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dualjax.sharding import DATA_AXIS

Metrics = dict[str, jnp.ndarray]


def _softmax_rows(q, d, scale, bias, label_offset):
    """Sums of the softmax loss and of top-1 hits over the rows of q.

    q [rows, dim] against every column of d [cols, dim]; the positive of row i is
    column label_offset + i.
    """
    logits = scale * (q @ d.T) + bias
    labels = label_offset + jnp.arange(q.shape[0])
    positive = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    loss_sum = jnp.sum(jax.nn.logsumexp(logits, axis=1) - positive)
    hits = jnp.sum(jnp.argmax(logits, axis=1) == labels)
    return loss_sum, hits


def in_batch_softmax(q: jnp.ndarray, d: jnp.ndarray, scale: jnp.ndarray,
                                          bias: jnp.ndarray) -> tuple[jnp.ndarray, Metrics]:
    """Sampled softmax with in-batch negatives; the single-device reference.

    Returns the mean over rows of -log softmax(scale * q @ d.T + bias)[i, i], and
    `in_batch_p@1`, the fraction of rows whose top column is their positive.
    """
    loss_sum, hits = _softmax_rows(q, d, scale, bias, 0)
    n = q.shape[0]
    return loss_sum / n, {"in_batch_p@1": hits / n}


def _in_batch_softmax_local(q, d, scale, bias):
    """Per-device body: gathers all documents, offsets labels by this shard's position."""
    local = q.shape[0]
    d_all = jax.lax.all_gather(d, DATA_AXIS, tiled=True)
    offset = jax.lax.axis_index(DATA_AXIS) * local
    loss_sum, hits = _softmax_rows(q, d_all, scale, bias, offset)
    n = d_all.shape[0]
    return (jax.lax.psum(loss_sum, DATA_AXIS) / n,
                    {"in_batch_p@1": jax.lax.psum(hits, DATA_AXIS) / n})


LossFn = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray], tuple[jnp.ndarray, Metrics]]

# name -> (single-device reference, per-device body run under shard_map)
LOSSES: dict[str, tuple[LossFn, LossFn]] = {
        "in_batch_softmax": (in_batch_softmax, _in_batch_softmax_local),
}


def reference(name: str) -> LossFn:
    return LOSSES[name][0]


def sharded(name: str, mesh: jax.sharding.Mesh) -> LossFn:
    """The loss `name` over the global batch, split over the mesh's `data` axis.

    q and d are [global_batch, dim] arrays sharded (or shardable) over `data`; scale and
    bias are replicated. Gradients flow back through the all-gather.
    """
    body = LOSSES[name][1]
    return jax.shard_map(body, mesh=mesh,
                                              in_specs=(P(DATA_AXIS), P(DATA_AXIS), P(), P()),
                                              out_specs=(P(), P()))
