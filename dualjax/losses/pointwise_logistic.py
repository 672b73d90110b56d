"""The loss pointwise_logistic: a logistic loss on each pair's own 0/1 label (no in-batch
negatives).

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register


def reference(q, d, scale, bias, extras=None, *, remove_accidental_hits=True):
    """Reference: logistic loss of each pair's logit scale*cos(q_i, d_i) + bias against its
    0/1 label extras["labels"], mean over pairs. in_batch_p@1 is over the label-1 rows."""
    extras = extras or {}
    y = extras["labels"].astype(q.dtype)
    logit = scale * jnp.sum(q * d, axis=1) + bias
    loss = jnp.mean(y * matrix.softplus(-logit) + (1 - y) * matrix.softplus(logit))
    dots, _, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    hits = matrix.p_at_1(scale * dots + bias, is_pos, neg)
    return loss, {"in_batch_p@1": jnp.sum(hits * y) / jnp.maximum(jnp.sum(y), 1)}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    return {"best": streaming.max_neg(jax.lax.stop_gradient(scale * blk.dots + bias), blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    y = labels.astype(jnp.float32)
    logit = scale * pos.dots + bias
    per_row = y * matrix.softplus(-logit) + (1 - y) * matrix.softplus(logit)
    return streaming.Sums(jnp.sum(per_row), jnp.float32(y.shape[0]),
                *streaming.hit_sums(logit, st["best"].value, weight=y))


LOSS = register(Loss("pointwise_logistic", reference, stats, finish,
                     options={"remove_accidental_hits": True},
                     needs_labels=True))
