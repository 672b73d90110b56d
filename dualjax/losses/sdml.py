"""The loss sdml: smoothed deep metric learning: KL to a label-smoothed target over each row's
softmax of negative squared distances (Bonadiman et al. 2019).

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register


def reference(q, d, scale, bias, extras=None, *, label_smoothing=0.3, sdml_scale=1.0,
              remove_accidental_hits=True):
    """Reference (Bonadiman et al. 2019 eq. 2-3): logits = -sdml_scale * ||q - d||^2 (minus
    log q when given), target = 1 - eps + eps/N on the positive and eps/N on the other
    N - 1 unmasked columns, loss = mean over rows of KL(target || softmax(logits)).
    scale and bias are unused."""
    extras = extras or {}
    _, cols, is_pos, neg, log_q = matrix.full(q, d, extras, remove_accidental_hits)
    score = -sdml_scale * jnp.sum((q[:, None, :] - cols[None, :, :]) ** 2, axis=-1)
    z = score if log_q is None else score - log_q[None, :]
    valid = is_pos | neg
    logp = jnp.where(valid, jax.nn.log_softmax(matrix.masked(z, valid, -jnp.inf), axis=1), 0.0)
    n = jnp.sum(valid, axis=1, keepdims=True)
    eps = label_smoothing
    target = jnp.where(is_pos, 1 - eps + eps / n, jnp.where(neg, eps / n, 0.0))
    kl = jnp.sum(xlogy(target, target) - target * logp, axis=1)
    return jnp.mean(kl), {"in_batch_p@1": jnp.mean(matrix.p_at_1(score, is_pos, neg))}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    score = -opts["sdml_scale"] * blk.sq_dist
    z = score if blk.log_q is None else score - blk.log_q[None, :]
    return {"lse": streaming.lse(streaming.softmax_logits(z, blk)),
            "neg_z": streaming.sum_neg(z, blk), "negs": streaming.count_neg(blk),
            "best": streaming.max_neg(jax.lax.stop_gradient(score), blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    score = -opts["sdml_scale"] * pos.sq_dist
    z = score if pos.log_q is None else score - pos.log_q
    lse, negs, eps = st["lse"].value, st["negs"].value.astype(jnp.float32), opts["label_smoothing"]
    n = negs + 1  # columns in the row's softmax
    t_pos, t_neg = 1 - eps + eps / n, eps / n
    # KL = sum_j t_j log t_j - sum_j t_j log p_j, written per row in closed form.
    entropy_part = xlogy(t_pos, t_pos) + negs * xlogy(t_neg, t_neg)
    cross = t_pos * (z - lse) + t_neg * (st["neg_z"].value - negs * lse)
    return streaming.row_sums(entropy_part - cross, score, st["best"].value)


def resolve(opts: dict) -> dict:
    """ValueError for a label smoothing outside [0, 1) or a scale that is not positive."""
    if not 0 <= opts["label_smoothing"] < 1:
        raise ValueError(f"label_smoothing={opts['label_smoothing']} must be in [0, 1)")
    if opts["sdml_scale"] <= 0:
        raise ValueError(f"sdml_scale={opts['sdml_scale']} must be > 0")
    return opts


LOSS = register(Loss("sdml", reference, stats, finish, uses_log_q=True, resolve=resolve,
                     options={"label_smoothing": 0.3, "sdml_scale": 1.0,
                              "remove_accidental_hits": True}))
