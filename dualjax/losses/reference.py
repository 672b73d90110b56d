"""The plain reference losses: each scores the whole matrix M [B, C] of the global batch
on one device, no shard_map, no streaming. They define what every loss means (see
`dualjax.losses` for M's layout and the extras); `streaming.py` computes the same on a
mesh, and tests/test_losses.py holds the two equal."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

Metrics = dict[str, jnp.ndarray]
Extras = dict[str, jnp.ndarray]
LossFn = Callable[..., tuple[jnp.ndarray, Metrics]]

DISTANCES = ("cosine", "euclidean", "squared_euclidean")
# triplet_margin's margin per distance: Mościcki 2022 (cosine), Bonadiman et al. 2019.
DEFAULT_MARGINS = {"cosine": 0.3, "euclidean": 0.5, "squared_euclidean": 0.5}
TRIPLET_HARDEST_MARGIN = 0.5  # Gillick et al. 2018
_EPS = 1e-12  # floor of a squared distance under the square root

SHARDED_EXTRAS = ("doc_ids", "query_ids", "cluster_ids", "hard_negatives", "hard_negative_ids",
                  "log_q_pos", "log_q_hard", "labels")
REPLICATED_EXTRAS = ("mixed_negatives", "mixed_negative_ids", "mixed_negative_clusters",
                     "log_q_mixed")
EXTRAS = SHARDED_EXTRAS + REPLICATED_EXTRAS


# ----------------------------------------------------------------------------- helpers
def _softplus(x):
    return jax.nn.softplus(x)


def _masked(x, mask, fill):
    return jnp.where(mask, x, fill)


def _sq_dist_from_dots(rows, cols, dots):
    """||r - c||^2 = ||r||^2 + ||c||^2 - 2 r.c, [rows, cols] (exact gradients too)."""
    return jnp.sum(rows * rows, -1)[:, None] + jnp.sum(cols * cols, -1)[None, :] - 2 * dots


def _distance(sq_dist, dots, kind):
    if kind == "cosine":
        return 1.0 - dots
    if kind == "euclidean":
        return jnp.sqrt(jnp.maximum(sq_dist, _EPS))
    return sq_dist


# ----------------------------------------------------------------------------- references
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
    col_ids = jnp.concatenate(ids) if with_ids and ids[0] is not None else None
    log_q = jnp.concatenate(lq) if lq[0] is not None else None
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


def _reference_matrix(q, d, extras, remove_hits):
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


def _reference_p_at_1(score, is_pos, neg):
    """Rows whose positive beats every unmasked negative, [B] bool."""
    s_pos = jnp.diagonal(score)
    return jnp.all(jnp.where(neg, score < s_pos[:, None], True), axis=1)


def in_batch_softmax(q, d, scale, bias, extras=None, *, symmetric=False,
                     remove_accidental_hits=True):
    """Reference: mean over rows of -log softmax(row of M)[positive], M = scale*cos + bias
    minus log q of the column when given. symmetric: averaged with the same loss over the
    B positives' columns (each document against every query)."""
    extras = extras or {}
    dots, _, is_pos, neg, log_q = _reference_matrix(q, d, extras, remove_accidental_hits)
    logits = scale * dots + bias
    z = logits if log_q is None else logits - log_q[None, :]
    if remove_accidental_hits and "doc_ids" in extras:
        z = _masked(z, is_pos | neg, -jnp.inf)
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
        col_logp = jax.nn.log_softmax(_masked(square, neg_t | jnp.eye(b, dtype=bool), -jnp.inf),
                                      axis=0)
        loss = 0.5 * (loss - jnp.mean(jnp.diagonal(col_logp)))
    return loss, {"in_batch_p@1": jnp.mean(_reference_p_at_1(logits, is_pos, neg))}


def in_batch_sigmoid(q, d, scale, bias, extras=None, *, remove_accidental_hits=True):
    """Reference: logistic loss on every unmasked entry of M = scale*cos + bias (label 1
    on the positives, 0 elsewhere), mean over those entries (Gillick et al. 2018)."""
    extras = extras or {}
    dots, _, is_pos, neg, _ = _reference_matrix(q, d, extras, remove_accidental_hits)
    logits = scale * dots + bias
    y = is_pos.astype(logits.dtype)
    per_entry = -(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
    valid = is_pos | neg
    loss = jnp.sum(jnp.where(valid, per_entry, 0.0)) / jnp.sum(valid)
    return loss, {"in_batch_p@1": jnp.mean(_reference_p_at_1(logits, is_pos, neg))}


def in_batch_triplet_hardest(q, d, scale, bias, extras=None, *, margin=TRIPLET_HARDEST_MARGIN,
                             remove_accidental_hits=True):
    """Reference: mean over rows of max(0, margin - cos(q, d+) + max over negatives of
    cos(q, d-)) (Gillick et al. 2018); scale and bias are unused."""
    extras = extras or {}
    cos, _, is_pos, neg, _ = _reference_matrix(q, d, extras, remove_accidental_hits)
    hardest = jnp.max(jnp.where(neg, cos, -jnp.inf), axis=1)
    loss = jnp.mean(jax.nn.relu(margin - jnp.diagonal(cos) + hardest))
    return loss, {"in_batch_p@1": jnp.mean(_reference_p_at_1(cos, is_pos, neg))}


def triplet_margin(q, d, scale, bias, extras=None, *, distance="cosine", margin=None,
                   hard=False, remove_accidental_hits=True):
    """Reference: per row, the mean over its negatives d- of max(0, D(q, d+) - D(q, d-) +
    margin) (Mościcki 2022 eq. 4.2; Bonadiman et al. 2019 TL(Rand)), or with `hard` the
    hardest negative only (TL(Hard)); mean over rows. D: 1 - cos, ||q - d|| or
    ||q - d||^2. scale and bias are unused."""
    extras = extras or {}
    margin = DEFAULT_MARGINS[distance] if margin is None or margin < 0 else margin
    cos, cols, is_pos, neg, _ = _reference_matrix(q, d, extras, remove_accidental_hits)
    sq = jnp.sum((q[:, None, :] - cols[None, :, :]) ** 2, axis=-1)
    dist = {"cosine": 1.0 - cos, "euclidean": jnp.sqrt(jnp.maximum(sq, _EPS)),
            "squared_euclidean": sq}[distance]
    d_pos = jnp.diagonal(dist)
    if hard:
        nearest = jnp.min(jnp.where(neg, dist, jnp.inf), axis=1)
        per_row = jax.nn.relu(d_pos - nearest + margin)
    else:
        hinge = jnp.where(neg, jax.nn.relu(d_pos[:, None] - dist + margin), 0.0)
        per_row = jnp.sum(hinge, axis=1) / jnp.maximum(jnp.sum(neg, axis=1), 1)
    return jnp.mean(per_row), {"in_batch_p@1": jnp.mean(_reference_p_at_1(-dist, is_pos, neg))}


def sdml(q, d, scale, bias, extras=None, *, label_smoothing=0.3, sdml_scale=1.0,
         remove_accidental_hits=True):
    """Reference (Bonadiman et al. 2019 eq. 2-3): logits = -sdml_scale * ||q - d||^2 (minus
    log q when given), target = 1 - eps + eps/N on the positive and eps/N on the other
    N - 1 unmasked columns, loss = mean over rows of KL(target || softmax(logits)).
    scale and bias are unused."""
    extras = extras or {}
    _, cols, is_pos, neg, log_q = _reference_matrix(q, d, extras, remove_accidental_hits)
    score = -sdml_scale * jnp.sum((q[:, None, :] - cols[None, :, :]) ** 2, axis=-1)
    z = score if log_q is None else score - log_q[None, :]
    valid = is_pos | neg
    logp = jnp.where(valid, jax.nn.log_softmax(_masked(z, valid, -jnp.inf), axis=1), 0.0)
    n = jnp.sum(valid, axis=1, keepdims=True)
    eps = label_smoothing
    target = jnp.where(is_pos, 1 - eps + eps / n, jnp.where(neg, eps / n, 0.0))
    kl = jnp.sum(xlogy(target, target) - target * logp, axis=1)
    return jnp.mean(kl), {"in_batch_p@1": jnp.mean(_reference_p_at_1(score, is_pos, neg))}


def pointwise_logistic(q, d, scale, bias, extras=None, *, remove_accidental_hits=True):
    """Reference: logistic loss of each pair's logit scale*cos(q_i, d_i) + bias against its
    0/1 label extras["labels"], mean over pairs. in_batch_p@1 is over the label-1 rows."""
    extras = extras or {}
    y = extras["labels"].astype(q.dtype)
    logit = scale * jnp.sum(q * d, axis=1) + bias
    loss = jnp.mean(y * _softplus(-logit) + (1 - y) * _softplus(logit))
    dots, _, is_pos, neg, _ = _reference_matrix(q, d, extras, remove_accidental_hits)
    hits = _reference_p_at_1(scale * dots + bias, is_pos, neg)
    return loss, {"in_batch_p@1": jnp.sum(hits * y) / jnp.maximum(jnp.sum(y), 1)}
