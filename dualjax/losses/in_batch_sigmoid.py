"""The loss in_batch_sigmoid: a logistic loss on every entry of M (Gillick et al. 2018).

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register


def reference(q, d, scale, bias, extras=None, *, remove_accidental_hits=True):
    """Reference: logistic loss on every unmasked entry of M = scale*cos + bias (label 1
    on the positives, 0 elsewhere), mean over those entries (Gillick et al. 2018)."""
    extras = extras or {}
    dots, _, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    logits = scale * dots + bias
    y = is_pos.astype(logits.dtype)
    per_entry = -(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
    valid = is_pos | neg
    loss = jnp.sum(jnp.where(valid, per_entry, 0.0)) / jnp.sum(valid)
    return loss, {"in_batch_p@1": jnp.mean(matrix.p_at_1(logits, is_pos, neg))}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    logits = scale * blk.dots + bias
    return {"loss": streaming.sum_neg(matrix.softplus(logits), blk),
            "negs": streaming.count_neg(blk),
            "best": streaming.max_neg(jax.lax.stop_gradient(logits), blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    logit = scale * pos.dots + bias  # label 1 on the positive, 0 on every negative
    return streaming.Sums(jnp.sum(st["loss"].value + matrix.softplus(-logit)),
                jnp.sum((st["negs"].value + 1).astype(jnp.float32)),  # can pass 2^31
                *streaming.hit_sums(logit, st["best"].value))


LOSS = register(Loss("in_batch_sigmoid", reference, stats, finish,
                     options={"remove_accidental_hits": True}))
