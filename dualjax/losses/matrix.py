"""The matrix M [B, C] of the global batch, whole on one device: its columns, its
positive and negative masks, and the helpers the losses' reference forms share (each
loss's own reference form is in its module; `streaming.py` computes the same per device
on a mesh, and tests/losses/test_losses.py holds the two equal).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import jax
import jax.numpy as jnp

Metrics = dict[str, jnp.ndarray]
Extras = dict[str, jnp.ndarray]
LossFn = Callable[..., tuple[jnp.ndarray, Metrics]]

DISTANCES = ("cosine", "euclidean", "squared_euclidean")  # `distance`'s kinds
EPS = 1e-12  # floor of a squared distance under the square root

SHARDED_EXTRAS = ("doc_ids", "query_ids", "cluster_ids", "hard_negatives", "hard_negative_ids",
                  "log_q_pos", "log_q_hard", "labels")
REPLICATED_EXTRAS = ("mixed_negatives", "mixed_negative_ids", "mixed_negative_clusters",
                     "log_q_mixed")
EXTRAS = SHARDED_EXTRAS + REPLICATED_EXTRAS


# ----------------------------------------------------------------------------- helpers
def softplus(x):
    return jax.nn.softplus(x)


def masked(x, mask, fill):
    return jnp.where(mask, x, fill)


def sq_dist_from_dots(rows, cols, dots):
    """||r - c||^2 = ||r||^2 + ||c||^2 - 2 r.c, [rows, cols] (exact gradients too)."""
    return jnp.sum(rows * rows, -1)[:, None] + jnp.sum(cols * cols, -1)[None, :] - 2 * dots


def distance(sq_dist, dots, kind):
    if kind == "cosine":
        return 1.0 - dots
    if kind == "euclidean":
        return jnp.sqrt(jnp.maximum(sq_dist, EPS))
    return sq_dist


# ----------------------------------------------------------------------------- M
def reference_columns(d: jnp.ndarray, extras: Extras, with_ids: bool
                      ) -> tuple[jnp.ndarray, jnp.ndarray | None, jnp.ndarray | None]:
    """The columns of M for the whole batch: [C, dim], their ids [C] and log q [C].

    C = B + B*k + U: all positives, then the hard negatives in row order, then the mixed
    negatives. Ids (when `with_ids`) and log q are None when not given.
    """
    cols, ids, lq = [d], [extras.get("doc_ids")], [extras.get("log_q_pos")]
    if "hard_negatives" in extras:
        h = extras["hard_negatives"]
        cols.append(h.reshape(h.shape[0] * h.shape[1], h.shape[2]))
        ids.append(extras["hard_negative_ids"].reshape(-1) if with_ids else None)
        lq.append(extras["log_q_hard"].reshape(-1) if lq[0] is not None else None)
    if "mixed_negatives" in extras:
        cols.append(extras["mixed_negatives"])
        ids.append(extras.get("mixed_negative_ids"))
        lq.append(extras.get("log_q_mixed"))
    # Every part has ids (log-q terms) when the first has.
    col_ids = (jnp.concatenate(cast(list[jnp.ndarray], ids)) if with_ids and ids[0] is not None
               else None)
    log_q = jnp.concatenate(cast(list[jnp.ndarray], lq)) if lq[0] is not None else None
    return jnp.concatenate(cols), col_ids, log_q


def column_clusters(cluster_ids, extras) -> jnp.ndarray:
    """The clusters of the columns [C] from the clusters of all B positives: theirs, -1
    for the B*k hard negatives (of other clusters by construction) and the mixed
    negatives' (-1 when not given)."""
    k = extras["hard_negatives"].shape[1] if "hard_negatives" in extras else 0
    parts = [cluster_ids, jnp.full((cluster_ids.shape[0] * k,), -1, cluster_ids.dtype)]
    if "mixed_negatives" in extras:
        u = extras["mixed_negatives"].shape[0]
        parts.append(extras.get("mixed_negative_clusters",
                                jnp.full((u,), -1, cluster_ids.dtype)))
    return jnp.concatenate(parts)


def other_hits(extras, col_ids, all_clusters) -> list[tuple[jnp.ndarray, jnp.ndarray]]:
    """(row ids, column ids) pairs beyond the positives' ids that remove a column from a
    row's negatives: the row's own query text, the row's cluster (`all_clusters`: the
    clusters of every positive of the batch)."""
    hits = []
    if "query_ids" in extras:
        hits.append((extras["query_ids"], col_ids))
    if "cluster_ids" in extras:
        hits.append((extras["cluster_ids"], column_clusters(all_clusters, extras)))
    return hits


def full(q, d, extras, remove_hits):
    """Full M pieces: dots [B, C], columns [C, dim], positive and negative masks, log q."""
    with_ids = remove_hits and "doc_ids" in extras
    cols, col_ids, log_q = reference_columns(d, extras, with_ids)
    b, c = q.shape[0], cols.shape[0]
    is_pos = jnp.eye(b, c, dtype=bool)
    neg = ~is_pos
    if with_ids:
        hits = [(extras["doc_ids"], col_ids),
                *other_hits(extras, col_ids, extras.get("cluster_ids"))]
        for rows_of, cols_of in hits:
            neg = neg & (rows_of[:, None] != cols_of[None, :])
    return q @ cols.T, cols, is_pos, neg, log_q


def p_at_1(score, is_pos, neg):
    """Rows whose positive beats every unmasked negative, [B] bool."""
    s_pos = jnp.diagonal(score)
    return jnp.all(jnp.where(neg, score < s_pos[:, None], True), axis=1)












