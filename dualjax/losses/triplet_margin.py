"""The loss triplet_margin: the triplet hinge on a distance, over every negative or the
hardest (Mościcki 2022; Bonadiman et al. 2019's TL(Rand) and TL(Hard)).

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register

# The margin per distance: Mościcki 2022 (cosine), Bonadiman et al. 2019.
DEFAULT_MARGINS = {"cosine": 0.3, "euclidean": 0.5, "squared_euclidean": 0.5}


def reference(q, d, scale, bias, extras=None, *, distance="cosine", margin=None,
              hard=False, remove_accidental_hits=True):
    """Reference: per row, the mean over its negatives d- of max(0, D(q, d+) - D(q, d-) +
    margin) (Mościcki 2022 eq. 4.2; Bonadiman et al. 2019 TL(Rand)), or with `hard` the
    hardest negative only (TL(Hard)); mean over rows. D: 1 - cos, ||q - d|| or
    ||q - d||^2. scale and bias are unused."""
    extras = extras or {}
    margin = DEFAULT_MARGINS[distance] if margin is None or margin < 0 else margin
    cos, cols, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    sq = jnp.sum((q[:, None, :] - cols[None, :, :]) ** 2, axis=-1)
    dist = {"cosine": 1.0 - cos, "euclidean": jnp.sqrt(jnp.maximum(sq, matrix.EPS)),
            "squared_euclidean": sq}[distance]
    d_pos = jnp.diagonal(dist)
    if hard:
        nearest = jnp.min(jnp.where(neg, dist, jnp.inf), axis=1)
        per_row = jax.nn.relu(d_pos - nearest + margin)
    else:
        hinge = jnp.where(neg, jax.nn.relu(d_pos[:, None] - dist + margin), 0.0)
        per_row = jnp.sum(hinge, axis=1) / jnp.maximum(jnp.sum(neg, axis=1), 1)
    return jnp.mean(per_row), {"in_batch_p@1": jnp.mean(matrix.p_at_1(-dist, is_pos, neg))}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    dist = matrix.distance(blk.sq_dist, blk.dots, opts["distance"])
    if opts["hard"]:
        return {"nearest": streaming.max_neg(-dist, blk)}  # minus the nearest negative's distance
    d_pos = matrix.distance(pos.sq_dist, pos.dots, opts["distance"])
    return {"hinge": streaming.sum_neg(jax.nn.relu(d_pos[:, None] - dist + opts["margin"]), blk),
            "negs": streaming.count_neg(blk),
            "nearest": streaming.max_neg(jax.lax.stop_gradient(-dist), blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    d_pos = matrix.distance(pos.sq_dist, pos.dots, opts["distance"])
    nearest = st["nearest"].value
    if opts["hard"]:
        per_row = jax.nn.relu(d_pos + nearest + opts["margin"])
    else:
        per_row = st["hinge"].value / jnp.maximum(st["negs"].value, 1)
    return streaming.row_sums(per_row, -d_pos, nearest)


def resolve(opts: dict) -> dict:
    """The distance checked; a margin < 0 or None is the distance's default."""
    if opts["distance"] not in matrix.DISTANCES:
        raise ValueError(f"distance={opts['distance']!r} is not one of: "
                         f"{', '.join(matrix.DISTANCES)}")
    if opts["margin"] is None or opts["margin"] < 0:
        opts = {**opts, "margin": DEFAULT_MARGINS[opts["distance"]]}
    return opts


LOSS = register(Loss("triplet_margin", reference, stats, finish, resolve=resolve,
                     options={"distance": "cosine", "margin": None, "hard": False,
                              "remove_accidental_hits": True}))
