"""The sharded core: per device, under `jax.shard_map` over the mesh's `data` axis, its
rows of M against every gathered column, streamed `column_block` columns at a time.

Each loss reduces a Block (scores and masks) to per-row statistics (`*_stats`: Sum, Max
or LogSumExp), merged block by block (`_stream`), which `*_finish` turns into per-device
sums; `device_body` adds them over the devices. See `dualjax.losses` for the contract.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dualjax.losses.matrix import (
    Extras,
    masked,
    other_hits,
    sq_dist_from_dots,
)
from dualjax.runtime.sharding import DATA_AXIS


# ----------------------------------------------------------------------------- the core
class Columns(NamedTuple):
    """Columns of M as one device sees them: all C of them, or one block."""
    vecs: jnp.ndarray               # [C, dim] the columns' embeddings
    position: jnp.ndarray           # [C] int, each column's index in M (-1: padding)
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
    is_pos = cols.position[None, :] == pos[:, None]
    neg = ~is_pos
    if masked:
        neg = neg & (cols.position >= 0)[None, :]
    for rows_of, cols_of in zip(row_ids, cols.ids, strict=True):
        neg = neg & (cols_of[None, :] != rows_of[:, None])
    return Block(dots, sq_dist_from_dots(rows, cols.vecs, dots), is_pos, neg, cols.log_q, masked)


def softmax_logits(z, blk: Block):
    """z with the removed columns at -inf (skipped when nothing can be removed)."""
    return masked(z, blk.valid, -jnp.inf) if blk.masked else z


# Per-row statistics of a block of columns, [rows] each, merged across blocks: a loss's
# `stats` maps a Block to a dict of them, its `finish` turns the merged dict into Sums.
class Sum(NamedTuple):
    value: jnp.ndarray

    def merge(self, other: Sum) -> Sum:
        return Sum(self.value + other.value)


class Max(NamedTuple):
    value: jnp.ndarray

    def merge(self, other: Max) -> Max:
        return Max(jnp.maximum(self.value, other.value))


class LogSumExp(NamedTuple):
    """Online logsumexp: log(sum_exp) + max; max is constant for gradients (-inf: none)."""
    max: jnp.ndarray
    sum_exp: jnp.ndarray

    @property
    def value(self) -> jnp.ndarray:
        return self.max + jnp.log(self.sum_exp)

    def merge(self, other: LogSumExp) -> LogSumExp:
        top = jnp.maximum(self.max, other.max)
        rescale = lambda s, m: s * jnp.exp(jnp.where(m == -jnp.inf, -jnp.inf, m - top))
        return LogSumExp(top, rescale(self.sum_exp, self.max) + rescale(other.sum_exp, other.max))


def lse(z) -> LogSumExp:
    """LogSumExp of each row of z [rows, w] (-inf entries count for nothing)."""
    top = jax.lax.stop_gradient(jnp.max(z, axis=1))
    shift = jnp.where(top == -jnp.inf, 0.0, top)
    return LogSumExp(top, jnp.sum(jnp.exp(z - shift[:, None]), axis=1))


def max_neg(score, blk: Block) -> Max:
    return Max(jnp.max(masked(score, blk.neg, -jnp.inf), axis=1))


def sum_neg(x, blk: Block) -> Sum:
    return Sum(jnp.sum(jnp.where(blk.neg, x, 0.0), axis=1))


def count_neg(blk: Block) -> Sum:
    return Sum(jnp.sum(blk.neg, axis=1, dtype=jnp.int32))


def _merge(a: dict, b: dict) -> dict:
    return {k: a[k].merge(b[k]) for k in a}


class Sums(NamedTuple):
    """Per-device sums; the loss is psum(loss_sum) / psum(row_count)."""
    loss_sum: jnp.ndarray
    row_count: jnp.ndarray
    hits: jnp.ndarray
    hit_count: jnp.ndarray


def hit_sums(pos_score, best_neg, weight=None):
    """Rows whose positive beats their best negative: (hits, rows), or weighted sums."""
    hit = (jax.lax.stop_gradient(pos_score)
           > jax.lax.stop_gradient(best_neg)).astype(jnp.float32)
    if weight is None:
        return jnp.sum(hit), jnp.float32(hit.shape[0])
    return jnp.sum(hit * weight), jnp.sum(weight)


def row_sums(per_row, pos_score, best_neg) -> Sums:
    return Sums(jnp.sum(per_row), jnp.float32(per_row.shape[0]), *hit_sums(pos_score, best_neg))


























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
    padded = jax.tree.map(pad, cols)._replace(position=jnp.where(index < c, index, -1))
    blocks = jax.tree.map(lambda x: x.reshape(n, width, *x.shape[1:]), padded)
    stats = jax.checkpoint(block_stats)
    first = stats(jax.tree.map(lambda x: x[0], blocks))
    merged, _ = jax.lax.scan(lambda acc, blk: (_merge(acc, stats(blk)), None), first,
                             jax.tree.map(lambda x: x[1:], blocks))
    return merged


# Each loss's (stats, finish): a Block's per-row statistics and the merged ones' sums.


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
    loss_value = sum(total(p.loss_sum) / total(p.row_count) for p in parts) / len(parts)
    p_at_1 = total(parts[0].hits) / jnp.maximum(total(parts[0].hit_count), 1)
    return loss_value, {"in_batch_p@1": p_at_1}
