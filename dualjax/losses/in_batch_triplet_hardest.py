"""The loss in_batch_triplet_hardest: a hinge on each row's hardest negative (Gillick et al. 2018).

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register

MARGIN = 0.5  # Gillick et al. 2018


def reference(q, d, scale, bias, extras=None, *, margin=MARGIN,
              remove_accidental_hits=True):
    """Reference: mean over rows of max(0, margin - cos(q, d+) + max over negatives of
    cos(q, d-)) (Gillick et al. 2018); scale and bias are unused."""
    extras = extras or {}
    cos, _, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    hardest = jnp.max(jnp.where(neg, cos, -jnp.inf), axis=1)
    loss = jnp.mean(jax.nn.relu(margin - jnp.diagonal(cos) + hardest))
    return loss, {"in_batch_p@1": jnp.mean(matrix.p_at_1(cos, is_pos, neg))}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    return {"hardest": streaming.max_neg(blk.dots, blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    hardest = st["hardest"].value
    return streaming.row_sums(jax.nn.relu(opts["margin"] - pos.dots + hardest), pos.dots, hardest)


def resolve(opts: dict) -> dict:
    """A margin < 0 or None is Gillick et al.'s 0.5."""
    if opts["margin"] is None or opts["margin"] < 0:
        opts = {**opts, "margin": MARGIN}
    return opts


LOSS = register(Loss("in_batch_triplet_hardest", reference, stats, finish, resolve=resolve,
                     options={"margin": None, "remove_accidental_hits": True}))
