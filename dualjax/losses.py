"""In-batch losses over the global batch, the same on one device and on many.

Every loss takes unit query and document embeddings q, d [B, dim] (row i of d is the
positive of row i of q), the similarity's scale and bias (model logits = scale * cos +
bias) and optional `extras`, and returns `(loss, metrics)`:

    fn = losses.sharded("sdml", mesh, label_smoothing=0.3)   # or losses.reference(...)
    loss, metrics = fn(q, d, scale, bias, extras)

All losses score one matrix M [B, C]: a row per query of the global batch, and the
columns [the B positives in batch order, then the B*k hard negatives in row order (row
0's k, row 1's k, ...), then the U mixed negatives]. Row i's positive is column i;
every other column is a negative of row i unless it is an accidental hit: a column
whose document id equals row i's positive's id, or (with "query_ids") row i's own query's
id, as when a pairs file holds both (a, b) and (b, a), or (with "cluster_ids") a positive
or mixed column of row i's cluster of paraphrases. Layout P P ... P N N ... N, never the
interleaved P N N P N N.

`extras` (every key optional; None values are dropped):
    "doc_ids"            [B] int      id of each row's positive document (sharded)
    "query_ids"          [B] int      id of each row's query text, in the ids' numbering
                                      (sharded; needs doc_ids)
    "cluster_ids"        [B] int      each pair's cluster (sharded; needs doc_ids); the
                                      hard negatives are of other clusters by construction
    "mixed_negative_clusters" [U] int the mixed negatives' clusters (replicated)
    "hard_negatives"     [B, k, dim]  k explicit negatives per query (sharded)
    "hard_negative_ids"  [B, k] int   their document ids (sharded)
    "mixed_negatives"    [U, dim]     extra negatives shared by every row (replicated),
                                      Yang et al. 2020's mixed negative sampling
    "mixed_negative_ids" [U] int      their document ids (replicated)
    "log_q_pos"          [B] float    log sampling probability of each positive's
                                      document (sharded), for the logQ correction
    "log_q_hard"         [B, k] float the same for the hard negatives (sharded)
    "log_q_mixed"        [U] float    the same for the mixed negatives (replicated)
    "labels"             [B] 0/1      pointwise_logistic only: is pair i relevant

Two implementations of every loss: `reference(name)` is a plain one on the full matrix
(no shard_map), and `sharded(name, mesh)` runs one per-device core under `jax.shard_map`
over the mesh's `data` axis: each device gathers every column and scores its b rows
against them (`local_block`: a Block of scores and masks), and each loss reduces a Block
to per-row statistics (`stats`: Sum, Max or LogSumExp, [b] each) that `finish` turns
into per-device sums. Each row's positive is scored directly against its partner on the
same device (d_i for q_i), so no statistic needs to find it among the columns.

`sharded(name, mesh, column_block=w)` streams the columns w at a time with
`jax.lax.scan`, merging the statistics row by row (online logsumexp for the softmaxes,
running maxima for the hardest negatives and the p@1 test, running sums and counts for
the rest); the last block is padded with columns that count for nothing, and
`jax.checkpoint` on each block makes the backward pass recompute its scores, so no
device holds more than [b, w] of them. With column_block=0 the one block is all C
columns. Every loss streams, the symmetric softmax's second direction (each local
document against all B queries) included. tests/test_losses.py shows both forms give
the reference's loss, p@1 and gradients on 8 devices.

`metrics["in_batch_p@1"]` is the fraction of rows whose positive scores strictly above
every unmasked negative (by the loss's own score, before any logQ correction).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from jax.scipy.special import xlogy
from jax.sharding import PartitionSpec as P

from dualjax.sharding import DATA_AXIS

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


# ----------------------------------------------------------------------------- the core
class Columns(NamedTuple):
    """Columns of M as one device sees them: all C of them, or one block."""
    vecs: jnp.ndarray               # [C, dim] the columns' embeddings
    index: jnp.ndarray              # [C] int, each column's index in M (-1: padding)
    ids: tuple[jnp.ndarray, ...]    # [C] int each, compared with the rows' ids of the same place
    log_q: jnp.ndarray | None       # [C] log sampling probability of each column, or None


class Block(NamedTuple):
    """This device's rows of M against some columns, with their masks."""
    dots: jnp.ndarray             # [rows, w] row . column (the cosine, for unit vectors)
    sq_dist: jnp.ndarray          # [rows, w] ||row - column||^2
    is_pos: jnp.ndarray           # [rows, w] bool, each row's positive
    neg: jnp.ndarray              # [rows, w] bool, the negatives that count
    log_q: jnp.ndarray | None     # [w] log sampling probability of each column, or None
    masked: bool                  # whether columns may be removed (else valid = all)

    @property
    def valid(self) -> jnp.ndarray:
        return self.is_pos | self.neg


class Positives(NamedTuple):
    """Each row's score against its own positive, [rows] each: the row's partner on this
    device (d_i for query i; q_i for document i in the symmetric direction)."""
    dots: jnp.ndarray
    sq_dist: jnp.ndarray
    log_q: jnp.ndarray | None


def _gather(x):
    return jax.lax.all_gather(x, DATA_AXIS, tiled=True)


def gather_columns(d: jnp.ndarray, extras: Extras, with_ids: bool
                   ) -> tuple[jnp.ndarray, jnp.ndarray | None, jnp.ndarray | None]:
    """Per device, under shard_map: every column of M [C, dim], ids [C], log q [C].

    Gathers the local positives d [b, dim] and hard negatives [b, k, dim] from every
    device (device order = batch order) and appends the replicated mixed negatives, so
    each device sees the same columns as `reference_columns` on the whole batch.
    """
    cols, ids, lq = [_gather(d)], [], []
    if with_ids:
        ids.append(_gather(extras["doc_ids"]))
    if "log_q_pos" in extras:
        lq.append(_gather(extras["log_q_pos"]))
    if "hard_negatives" in extras:
        h = _gather(extras["hard_negatives"])  # [B, k, dim], rows in batch order
        cols.append(h.reshape(-1, h.shape[-1]))
        if with_ids:
            ids.append(_gather(extras["hard_negative_ids"]).reshape(-1))
        if lq:
            lq.append(_gather(extras["log_q_hard"]).reshape(-1))
    if "mixed_negatives" in extras:
        cols.append(extras["mixed_negatives"])
        if with_ids:
            ids.append(extras["mixed_negative_ids"])
        if lq:
            lq.append(extras["log_q_mixed"])
    return (jnp.concatenate(cols), jnp.concatenate(ids) if ids else None,
            jnp.concatenate(lq) if lq else None)


def local_block(rows: jnp.ndarray, cols: Columns, pos: jnp.ndarray,
                row_ids: Sequence[jnp.ndarray] = (), masked: bool = False) -> Block:
    """The rows [b, dim] of M against the columns `cols` (w of them); row r's positive is
    column pos[r] of M. A column sharing the row's id in any (row_ids[i] [b], cols.ids[i]
    [w]) is not a negative; with `masked`, neither is a padding column (index -1)."""
    dots = rows @ cols.vecs.T
    is_pos = cols.index[None, :] == pos[:, None]
    neg = ~is_pos
    if masked:
        neg = neg & (cols.index >= 0)[None, :]
    for rows_of, cols_of in zip(row_ids, cols.ids):
        neg = neg & (cols_of[None, :] != rows_of[:, None])
    return Block(dots, _sq_dist_from_dots(rows, cols.vecs, dots), is_pos, neg, cols.log_q, masked)


def _softmax_logits(z, blk: Block):
    """z with the removed columns at -inf (skipped when nothing can be removed)."""
    return _masked(z, blk.valid, -jnp.inf) if blk.masked else z


# Per-row statistics of a block of columns, [rows] each, merged across blocks: a loss's
# `stats` maps a Block to a dict of them, its `finish` turns the merged dict into Sums.
class Sum(NamedTuple):
    value: jnp.ndarray

    def merge(self, other: "Sum") -> "Sum":
        return Sum(self.value + other.value)


class Max(NamedTuple):
    value: jnp.ndarray

    def merge(self, other: "Max") -> "Max":
        return Max(jnp.maximum(self.value, other.value))


class LogSumExp(NamedTuple):
    """Online logsumexp: log(sum_exp) + max; max is constant for gradients (-inf: none)."""
    max: jnp.ndarray
    sum_exp: jnp.ndarray

    @property
    def value(self) -> jnp.ndarray:
        return self.max + jnp.log(self.sum_exp)

    def merge(self, other: "LogSumExp") -> "LogSumExp":
        top = jnp.maximum(self.max, other.max)
        rescale = lambda s, m: s * jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - top))
        return LogSumExp(top, rescale(self.sum_exp, self.max) + rescale(other.sum_exp, other.max))


def _lse(z) -> LogSumExp:
    """LogSumExp of each row of z [rows, w] (-inf entries count for nothing)."""
    top = jax.lax.stop_gradient(jnp.max(z, axis=1))
    shift = jnp.where(top == -jnp.inf, 0.0, top)
    return LogSumExp(top, jnp.sum(jnp.exp(z - shift[:, None]), axis=1))


def _max_neg(score, blk: Block) -> Max:
    return Max(jnp.max(_masked(score, blk.neg, -jnp.inf), axis=1))


def _sum_neg(x, blk: Block) -> Sum:
    return Sum(jnp.sum(jnp.where(blk.neg, x, 0.0), axis=1))


def _count_neg(blk: Block) -> Sum:
    return Sum(jnp.sum(blk.neg, axis=1, dtype=jnp.int32))


def _merge(a: dict, b: dict) -> dict:
    return {k: a[k].merge(b[k]) for k in a}


class Sums(NamedTuple):
    """Per-device sums; the loss is psum(loss_sum) / psum(count)."""
    loss_sum: jnp.ndarray
    count: jnp.ndarray
    hits: jnp.ndarray
    hit_count: jnp.ndarray


def _hits(pos_score, best_neg, weight=None):
    """Rows whose positive beats their best negative: (hits, rows), or weighted sums."""
    hit = (jax.lax.stop_gradient(pos_score)
           > jax.lax.stop_gradient(best_neg)).astype(jnp.float32)
    if weight is None:
        return jnp.sum(hit), jnp.float32(hit.shape[0])
    return jnp.sum(hit * weight), jnp.sum(weight)


def _rows(per_row, pos_score, best_neg) -> Sums:
    return Sums(jnp.sum(per_row), jnp.float32(per_row.shape[0]), *_hits(pos_score, best_neg))


def _softmax_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    logits = scale * blk.dots + bias
    z = logits if blk.log_q is None else logits - blk.log_q[None, :]
    return {"lse": _lse(_softmax_logits(z, blk)),
            "best": _max_neg(jax.lax.stop_gradient(logits), blk)}


def _softmax_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    logit = scale * pos.dots + bias
    z = logit if pos.log_q is None else logit - pos.log_q
    return _rows(st["lse"].value - z, logit, st["best"].value)


def _sigmoid_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    logits = scale * blk.dots + bias
    return {"loss": _sum_neg(_softplus(logits), blk), "negs": _count_neg(blk),
            "best": _max_neg(jax.lax.stop_gradient(logits), blk)}


def _sigmoid_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    logit = scale * pos.dots + bias  # label 1 on the positive, 0 on every negative
    return Sums(jnp.sum(st["loss"].value + _softplus(-logit)),
                jnp.sum((st["negs"].value + 1).astype(jnp.float32)),  # can pass 2^31
                *_hits(logit, st["best"].value))


def _triplet_hardest_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    return {"hardest": _max_neg(blk.dots, blk)}


def _triplet_hardest_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    hardest = st["hardest"].value
    return _rows(jax.nn.relu(opts["margin"] - pos.dots + hardest), pos.dots, hardest)


def _triplet_margin_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    dist = _distance(blk.sq_dist, blk.dots, opts["distance"])
    if opts["hard"]:
        return {"nearest": _max_neg(-dist, blk)}  # minus the nearest negative's distance
    d_pos = _distance(pos.sq_dist, pos.dots, opts["distance"])
    return {"hinge": _sum_neg(jax.nn.relu(d_pos[:, None] - dist + opts["margin"]), blk),
            "negs": _count_neg(blk), "nearest": _max_neg(jax.lax.stop_gradient(-dist), blk)}


def _triplet_margin_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    d_pos = _distance(pos.sq_dist, pos.dots, opts["distance"])
    nearest = st["nearest"].value
    if opts["hard"]:
        per_row = jax.nn.relu(d_pos + nearest + opts["margin"])
    else:
        per_row = st["hinge"].value / jnp.maximum(st["negs"].value, 1)
    return _rows(per_row, -d_pos, nearest)


def _sdml_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    score = -opts["sdml_scale"] * blk.sq_dist
    z = score if blk.log_q is None else score - blk.log_q[None, :]
    return {"lse": _lse(_softmax_logits(z, blk)), "neg_z": _sum_neg(z, blk),
            "negs": _count_neg(blk), "best": _max_neg(jax.lax.stop_gradient(score), blk)}


def _sdml_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    score = -opts["sdml_scale"] * pos.sq_dist
    z = score if pos.log_q is None else score - pos.log_q
    lse, negs, eps = st["lse"].value, st["negs"].value.astype(jnp.float32), opts["label_smoothing"]
    n = negs + 1  # columns in the row's softmax
    t_pos, t_neg = 1 - eps + eps / n, eps / n
    # KL = sum_j t_j log t_j - sum_j t_j log p_j, written per row in closed form.
    entropy_part = xlogy(t_pos, t_pos) + negs * xlogy(t_neg, t_neg)
    cross = t_pos * (z - lse) + t_neg * (st["neg_z"].value - negs * lse)
    return _rows(entropy_part - cross, score, st["best"].value)


def _pointwise_stats(blk: Block, pos: Positives, scale, bias, opts) -> dict:
    return {"best": _max_neg(jax.lax.stop_gradient(scale * blk.dots + bias), blk)}


def _pointwise_finish(st: dict, pos: Positives, scale, bias, opts, labels) -> Sums:
    y = labels.astype(jnp.float32)
    logit = scale * pos.dots + bias
    per_row = y * _softplus(-logit) + (1 - y) * _softplus(logit)
    return Sums(jnp.sum(per_row), jnp.float32(y.shape[0]),
                *_hits(logit, st["best"].value, weight=y))


def _stream(block_stats: Callable[[Columns], dict], cols: Columns, width: int) -> dict:
    """`block_stats` over the columns in blocks of `width` (the last padded with columns of
    index -1), merged row by row; one call on all columns when width is 0 or >= C.

    The blocks go through `jax.lax.scan` under `jax.checkpoint`, so the backward pass
    recomputes each block's [rows, width] scores instead of keeping [rows, C] of them.
    """
    c = cols.vecs.shape[0]
    if not 0 < width < c:
        return block_stats(cols)
    n = -(-c // width)
    pad = lambda x: jnp.pad(x, [(0, n * width - c)] + [(0, 0)] * (x.ndim - 1))
    index = jnp.arange(n * width)
    padded = jax.tree.map(pad, cols)._replace(index=jnp.where(index < c, index, -1))
    blocks = jax.tree.map(lambda x: x.reshape(n, width, *x.shape[1:]), padded)
    stats = jax.checkpoint(block_stats)
    first = stats(jax.tree.map(lambda x: x[0], blocks))
    merged, _ = jax.lax.scan(lambda acc, blk: (_merge(acc, stats(blk)), None), first,
                             jax.tree.map(lambda x: x[1:], blocks))
    return merged


# ----------------------------------------------------------------------------- registry
class Loss(NamedTuple):
    reference: LossFn                 # plain single-device implementation
    stats: Callable[..., dict]        # a Block's per-row statistics (Sum, Max, LogSumExp)
    finish: Callable[..., Sums]       # the merged statistics' per-device sums
    options: dict                     # option -> default (None: resolved from others)
    uses_log_q: bool                  # whether log_q_* extras apply


_HITS = {"remove_accidental_hits": True}
LOSSES: dict[str, Loss] = {
    "in_batch_softmax": Loss(in_batch_softmax, _softmax_stats, _softmax_finish,
                             {"symmetric": False, **_HITS}, True),
    "in_batch_sigmoid": Loss(in_batch_sigmoid, _sigmoid_stats, _sigmoid_finish, dict(_HITS),
                             False),
    "in_batch_triplet_hardest": Loss(in_batch_triplet_hardest, _triplet_hardest_stats,
                                     _triplet_hardest_finish, {"margin": None, **_HITS}, False),
    "triplet_margin": Loss(triplet_margin, _triplet_margin_stats, _triplet_margin_finish,
                           {"distance": "cosine", "margin": None, "hard": False, **_HITS}, False),
    "sdml": Loss(sdml, _sdml_stats, _sdml_finish,
                 {"label_smoothing": 0.3, "sdml_scale": 1.0, **_HITS}, True),
    "pointwise_logistic": Loss(pointwise_logistic, _pointwise_stats, _pointwise_finish,
                               dict(_HITS), False),
}


def resolve_options(name: str, options: dict) -> dict:
    """The loss's full options: defaults filled in, margin < 0 or None -> the source's."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; one of: {', '.join(LOSSES)}")
    defaults = LOSSES[name].options
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"loss {name!r} has no option {', '.join(unknown)}; its options: "
                         f"{', '.join(defaults) or 'none'}")
    opts = {**defaults, **options}
    if "distance" in opts and opts["distance"] not in DISTANCES:
        raise ValueError(f"distance={opts['distance']!r} is not one of: {', '.join(DISTANCES)}")
    if "margin" in opts and (opts["margin"] is None or opts["margin"] < 0):
        opts["margin"] = (DEFAULT_MARGINS[opts["distance"]] if name == "triplet_margin"
                          else TRIPLET_HARDEST_MARGIN)
    if "label_smoothing" in opts and not 0 <= opts["label_smoothing"] < 1:
        raise ValueError(f"label_smoothing={opts['label_smoothing']} must be in [0, 1)")
    return opts


def config_options(loss_config: ml_collections.ConfigDict) -> dict:
    """The options of loss `loss_config.name` from `config.loss` (fields = option names)."""
    return {k: loss_config[k] for k in LOSSES[loss_config.name].options}


def _check_extras(name: str, opts: dict, extras: Extras | None) -> Extras:
    """Drops None values and rejects extras that cannot work, with what would."""
    extras = {k: v for k, v in (extras or {}).items() if v is not None}
    unknown = sorted(set(extras) - set(EXTRAS))
    if unknown:
        raise ValueError(f"unknown extras {', '.join(unknown)}; known: {', '.join(EXTRAS)}")
    if name == "pointwise_logistic":
        if "labels" not in extras:
            raise ValueError("pointwise_logistic needs extras['labels'] ([B] 0/1 per pair)")
        other = sorted(set(extras) - {"labels", "doc_ids", "query_ids", "cluster_ids"})
        if other:
            raise ValueError(f"pointwise_logistic takes only labels and the ids, not {other}")
    elif "labels" in extras:
        raise ValueError(f"extras['labels'] are for pointwise_logistic, not {name}")
    for key in ("query_ids", "cluster_ids"):
        if key in extras and "doc_ids" not in extras:
            raise ValueError(f"extras[{key!r}] need extras['doc_ids'] (the columns' ids)")
    if "mixed_negative_clusters" in extras and "cluster_ids" not in extras:
        raise ValueError("extras['mixed_negative_clusters'] need extras['cluster_ids']")
    for group, ids, lq in (("hard_negatives", "hard_negative_ids", "log_q_hard"),
                           ("mixed_negatives", "mixed_negative_ids", "log_q_mixed")):
        for key in (ids, lq):
            if key in extras and group not in extras:
                raise ValueError(f"extras[{key!r}] given without extras[{group!r}]")
        if ids in extras and "doc_ids" not in extras:
            raise ValueError(f"extras[{ids!r}] need extras['doc_ids'] (the rows' ids)")
        if (group in extras and "doc_ids" in extras and ids not in extras
                and opts.get("remove_accidental_hits")):
            raise ValueError(f"extras[{group!r}] need extras[{ids!r}] when doc_ids are given, "
                             "to remove accidental hits (or set remove_accidental_hits=False)")
    log_q_keys = [k for k in ("log_q_pos", "log_q_hard", "log_q_mixed") if k in extras]
    if log_q_keys:
        if not LOSSES[name].uses_log_q:
            users = [n for n, spec in LOSSES.items() if spec.uses_log_q]
            raise ValueError(f"the logQ correction ({', '.join(log_q_keys)}) applies to "
                             f"{', '.join(users)}, not {name}")
        for group, key in (("hard_negatives", "log_q_hard"), ("mixed_negatives", "log_q_mixed")):
            if "log_q_pos" not in extras or (group in extras and key not in extras):
                raise ValueError("the logQ correction needs log q for every column: log_q_pos, "
                                 "plus log_q_hard / log_q_mixed with hard / mixed negatives")
    return extras


def reference(name: str, **options) -> LossFn:
    """The plain single-device loss `name`: fn(q, d, scale, bias, extras=None)."""
    opts = resolve_options(name, options)
    ref = LOSSES[name].reference

    def fn(q, d, scale, bias, extras: Extras | None = None):
        return ref(q, d, scale, bias, _check_extras(name, opts, extras), **opts)

    return fn


def _positives(rows, partner, log_q=None) -> Positives:
    """Each row against its partner [b, dim] (its positive), as `local_block` scores it."""
    dots = jnp.sum(rows * partner, axis=1)
    sq = jnp.sum(rows * rows, axis=1) + jnp.sum(partner * partner, axis=1) - 2 * dots
    return Positives(dots, sq, log_q)


def _device_body(name, opts, column_block, q, d, scale, bias, extras):
    """Per device under shard_map: local rows of M, the loss's sums, psum over devices."""
    b = q.shape[0]
    pos = jax.lax.axis_index(DATA_AXIS) * b + jnp.arange(b)
    loss = LOSSES[name]

    def sums(rows, partner, vecs, hits, log_q, log_q_pos, labels) -> Sums:
        """rows [b, dim] against the columns vecs [C, dim], streamed in column blocks;
        hits: (row ids [b], column ids [C]) pairs that remove a column from a row."""
        cols = Columns(vecs, jnp.arange(vecs.shape[0]), tuple(c for _, c in hits), log_q)
        width = column_block if 0 < column_block < vecs.shape[0] else vecs.shape[0]
        masked = bool(hits) or vecs.shape[0] % width != 0
        row_ids = tuple(r for r, _ in hits)
        positives = _positives(rows, partner, log_q_pos)
        stats = lambda block: loss.stats(local_block(rows, block, pos, row_ids, masked),
                                         positives, scale, bias, opts)
        return loss.finish(_stream(stats, cols, width), positives, scale, bias, opts, labels)

    with_ids = opts.get("remove_accidental_hits", False) and "doc_ids" in extras
    cols, col_ids, log_q = gather_columns(d, extras, with_ids)
    hits, hits_t = [], []  # hits_t: the symmetric direction, a document against the queries
    if with_ids:
        row_ids, all_ids = extras["doc_ids"], _gather(extras["doc_ids"])
        all_clusters = _gather(extras["cluster_ids"]) if "cluster_ids" in extras else None
        hits = [(row_ids, col_ids), *other_hits(extras, col_ids, all_clusters)]
        hits_t = [(row_ids, all_ids)]
        if "query_ids" in extras:  # a query that is the row's document's text
            hits_t.append((row_ids, _gather(extras["query_ids"])))
        if all_clusters is not None:
            hits_t.append((extras["cluster_ids"], all_clusters))
    parts = [sums(q, d, cols, hits, log_q, extras.get("log_q_pos"), extras.get("labels"))]
    if opts.get("symmetric"):  # each local document against every query of the batch
        parts.append(sums(d, q, _gather(q), hits_t, None, None, None))
    total = lambda x: jax.lax.psum(x, DATA_AXIS)
    loss_value = sum(total(p.loss_sum) / total(p.count) for p in parts) / len(parts)
    p_at_1 = total(parts[0].hits) / jnp.maximum(total(parts[0].hit_count), 1)
    return loss_value, {"in_batch_p@1": p_at_1}


def sharded(name: str, mesh: jax.sharding.Mesh, column_block: int = 0, **options) -> LossFn:
    """The loss `name` over the global batch, split over the mesh's `data` axis.

    Returns fn(q, d, scale, bias, extras=None): q, d [B, dim] and the sharded extras are
    split (or splittable) over `data`, scale, bias and the replicated extras are
    replicated. Gradients flow back through the all-gathers. column_block > 0: each
    device scores its b rows against the C gathered columns `column_block` at a time
    (never more than [b, column_block] scores, forward or backward); 0: all at once.
    """
    if isinstance(column_block, bool) or not isinstance(column_block, int) or column_block < 0:
        raise ValueError(f"column_block={column_block!r} must be an int >= 0 (0: all columns)")
    opts = resolve_options(name, options)
    body = functools.partial(_device_body, name, opts, column_block)

    def fn(q, d, scale, bias, extras: Extras | None = None):
        extras = _check_extras(name, opts, extras)
        specs = {k: P(DATA_AXIS) if k in SHARDED_EXTRAS else P() for k in extras}
        return jax.shard_map(body, mesh=mesh,
                             in_specs=(P(DATA_AXIS), P(DATA_AXIS), P(), P(), specs),
                             out_specs=(P(), P()))(q, d, scale, bias, extras)

    return fn
