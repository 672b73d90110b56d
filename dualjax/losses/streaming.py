"""The sharded core: per device, under `jax.shard_map` over the mesh's `data` axis, its
rows of M against every gathered column, streamed `column_block` columns at a time.

Each loss reduces a Block (scores and masks) to per-row statistics (`*_stats`: Sum, Max
or LogSumExp), merged block by block (`_stream`), which `*_finish` turns into per-device
sums; `device_body` adds them over the devices. See `dualjax.losses` for the contract.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from dualjax.losses.reference import (
    Extras,
    _distance,
    _masked,
    _softplus,
    _sq_dist_from_dots,
    other_hits,
)
from dualjax.runtime.sharding import DATA_AXIS


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


# Each loss's (stats, finish): a Block's per-row statistics and the merged ones' sums.
CORES = {
    "in_batch_softmax": (_softmax_stats, _softmax_finish),
    "in_batch_sigmoid": (_sigmoid_stats, _sigmoid_finish),
    "in_batch_triplet_hardest": (_triplet_hardest_stats, _triplet_hardest_finish),
    "triplet_margin": (_triplet_margin_stats, _triplet_margin_finish),
    "sdml": (_sdml_stats, _sdml_finish),
    "pointwise_logistic": (_pointwise_stats, _pointwise_finish),
}


def _positives(rows, partner, log_q=None) -> Positives:
    """Each row against its partner [b, dim] (its positive), as `local_block` scores it."""
    dots = jnp.sum(rows * partner, axis=1)
    sq = jnp.sum(rows * rows, axis=1) + jnp.sum(partner * partner, axis=1) - 2 * dots
    return Positives(dots, sq, log_q)


def device_body(loss, opts, column_block, q, d, scale, bias, extras):
    """Per device under shard_map: local rows of M, the loss's sums, psum over devices."""
    b = q.shape[0]
    pos = jax.lax.axis_index(DATA_AXIS) * b + jnp.arange(b)

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
