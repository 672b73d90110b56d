"""The loss in_batch_softmax: the softmax over each row of M, every other document of the
global batch a negative (Henderson et al. 2017, Gillick et al. 2018); optionally
symmetric.

Its reference form on the whole matrix M, its per-device core (`stats` of a block of
columns, `finish` of the merged statistics) and its options, as `registry.py` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses import matrix, streaming
from dualjax.losses.registry import Loss, register


def reference(q, d, scale, bias, extras=None, *, symmetric=False,
              remove_accidental_hits=True):
    """Reference: mean over rows of -log softmax(row of M)[positive], M = scale*cos + bias
    minus log q of the column when given. symmetric: averaged with the same loss over the
    B positives' columns (each document against every query)."""
    extras = extras or {}
    dots, _, is_pos, neg, log_q = matrix.full(q, d, extras, remove_accidental_hits)
    logits = scale * dots + bias
    z = logits if log_q is None else logits - log_q[None, :]
    if remove_accidental_hits and "doc_ids" in extras:
        z = matrix.masked(z, is_pos | neg, -jnp.inf)
    loss = -jnp.mean(jnp.diagonal(jax.nn.log_softmax(z, axis=1)))
    if symmetric:
        b = q.shape[0]
        square = logits[:, :b]  # [queries, positive documents]
        neg_t = ~jnp.eye(b, dtype=bool)
        if remove_accidental_hits and "doc_ids" in extras:
            ids = extras["doc_ids"]
            neg_t = neg_t & (ids[:, None] != ids[None, :])
            if "query_ids" in extras:  # query i is document j's own text
                neg_t = neg_t & (extras["query_ids"][:, None] != ids[None, :])
            if "cluster_ids" in extras:
                c = extras["cluster_ids"]
                neg_t = neg_t & (c[:, None] != c[None, :])
        kept = neg_t | jnp.eye(b, dtype=bool)
        col_logp = jax.nn.log_softmax(matrix.masked(square, kept, -jnp.inf), axis=0)
        loss = 0.5 * (loss - jnp.mean(jnp.diagonal(col_logp)))
    return loss, {"in_batch_p@1": jnp.mean(matrix.p_at_1(logits, is_pos, neg))}


def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
    logits = scale * blk.dots + bias
    z = logits if blk.log_q is None else logits - blk.log_q[None, :]
    return {"lse": streaming.lse(streaming.softmax_logits(z, blk)),
            "best": streaming.max_neg(jax.lax.stop_gradient(logits), blk)}


def finish(st: dict, pos: streaming.Positives, scale, bias, opts, labels) -> streaming.Sums:
    logit = scale * pos.dots + bias
    z = logit if pos.log_q is None else logit - pos.log_q
    return streaming.row_sums(st["lse"].value - z, logit, st["best"].value)


LOSS = register(Loss("in_batch_softmax", reference, stats, finish,
                     options={"symmetric": False, "remove_accidental_hits": True},
                     uses_log_q=True))
