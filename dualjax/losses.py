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
(no shard_map), and `sharded(name, mesh)` runs one per-device core (`local_block`: this
device's rows of M and their masks, after gathering every column) under `jax.shard_map`
over the mesh's `data` axis, with a small per-loss reduction on top. tests/test_losses.py
shows both give the same loss and gradients on 8 devices.

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
class Block(NamedTuple):
    """This device's rows of the global matrix M and their masks (C global columns)."""
    dots: jnp.ndarray             # [rows, C] row . column (the cosine, for unit vectors)
    sq_dist: jnp.ndarray          # [rows, C] ||row - column||^2
    is_pos: jnp.ndarray           # [rows, C] bool, each row's positive
    neg: jnp.ndarray              # [rows, C] bool, the negatives that count
    log_q: jnp.ndarray | None     # [C] log sampling probability of each column, or None
    masked: bool                  # whether ids may have removed columns (else valid = all)

    @property
    def valid(self) -> jnp.ndarray:
        return self.is_pos | self.neg


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


def local_block(rows: jnp.ndarray, cols: jnp.ndarray, pos: jnp.ndarray,
                row_ids: jnp.ndarray | None = None, col_ids: jnp.ndarray | None = None,
                log_q: jnp.ndarray | None = None,
                more_ids: Sequence[tuple[jnp.ndarray, jnp.ndarray]] = ()) -> Block:
    """The rows [b, dim] of M against all columns [C, dim]; row r's positive is column
    pos[r]. With ids ([b], [C]), a column sharing the row's id is not a negative; nor,
    for each (row ids [b], column ids [C]) of `more_ids`, one sharing the row's id there."""
    dots = rows @ cols.T
    is_pos = jnp.arange(cols.shape[0])[None, :] == pos[:, None]
    neg = ~is_pos
    if row_ids is not None:
        neg = neg & (col_ids[None, :] != row_ids[:, None])
        for rows_of, cols_of in more_ids:
            neg = neg & (cols_of[None, :] != rows_of[:, None])
    return Block(dots, _sq_dist_from_dots(rows, cols, dots), is_pos, neg, log_q,
                 masked=row_ids is not None)


def _softmax_logits(z, blk: Block):
    """z with the removed columns at -inf (skipped when nothing can be removed)."""
    return _masked(z, blk.valid, -jnp.inf) if blk.masked else z


class Sums(NamedTuple):
    """Per-device sums; the loss is psum(loss_sum) / psum(count)."""
    loss_sum: jnp.ndarray
    count: jnp.ndarray
    hits: jnp.ndarray
    hit_count: jnp.ndarray


def _pick(x, mask):
    """The entry of each row where mask is True, [rows]."""
    return jnp.sum(jnp.where(mask, x, 0.0), axis=1)


def _hits(score, blk: Block, weight=None):
    score = jax.lax.stop_gradient(score)
    best_neg = jnp.max(jnp.where(blk.neg, score, -jnp.inf), axis=1)
    hit = (_pick(score, blk.is_pos) > best_neg).astype(jnp.float32)
    if weight is None:
        return jnp.sum(hit), jnp.float32(hit.shape[0])
    return jnp.sum(hit * weight), jnp.sum(weight)


def _rows(per_row, score, blk):
    return Sums(jnp.sum(per_row), jnp.float32(per_row.shape[0]), *_hits(score, blk))


def _softmax_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    logits = scale * blk.dots + bias
    z = _softmax_logits(logits if blk.log_q is None else logits - blk.log_q[None, :], blk)
    return _rows(jax.nn.logsumexp(z, axis=1) - _pick(z, blk.is_pos), logits, blk)


def _sigmoid_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    logits = scale * blk.dots + bias
    per_entry = jnp.where(blk.is_pos, _softplus(-logits), _softplus(logits))
    return Sums(jnp.sum(jnp.where(blk.valid, per_entry, 0.0)),
                jnp.sum(blk.valid).astype(jnp.float32), *_hits(logits, blk))


def _triplet_hardest_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    hardest = jnp.max(_masked(blk.dots, blk.neg, -jnp.inf), axis=1)
    per_row = jax.nn.relu(opts["margin"] - _pick(blk.dots, blk.is_pos) + hardest)
    return _rows(per_row, blk.dots, blk)


def _triplet_margin_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    dist = _distance(blk.sq_dist, blk.dots, opts["distance"])
    d_pos = _pick(dist, blk.is_pos)
    if opts["hard"]:
        per_row = jax.nn.relu(d_pos - jnp.min(_masked(dist, blk.neg, jnp.inf), axis=1)
                              + opts["margin"])
    else:
        hinge = jax.nn.relu(d_pos[:, None] - dist + opts["margin"])
        per_row = (jnp.sum(jnp.where(blk.neg, hinge, 0.0), axis=1)
                   / jnp.maximum(jnp.sum(blk.neg, axis=1), 1))
    return _rows(per_row, -dist, blk)


def _sdml_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    score = -opts["sdml_scale"] * blk.sq_dist
    z = score if blk.log_q is None else score - blk.log_q[None, :]
    logp = z - jax.nn.logsumexp(_softmax_logits(z, blk), axis=1, keepdims=True)
    eps = opts["label_smoothing"]
    n = jnp.sum(blk.valid, axis=1).astype(jnp.float32)  # columns in the row's softmax
    t_pos, t_neg = 1 - eps + eps / n, eps / n
    # KL = sum_j t_j log t_j - sum_j t_j log p_j, written per row in closed form.
    entropy_part = xlogy(t_pos, t_pos) + (n - 1) * xlogy(t_neg, t_neg)
    cross = t_pos * _pick(logp, blk.is_pos) + t_neg * _pick(logp, blk.neg)
    return _rows(entropy_part - cross, score, blk)


def _pointwise_sums(blk: Block, scale, bias, opts, labels) -> Sums:
    y = labels.astype(jnp.float32)
    logit = scale * _pick(blk.dots, blk.is_pos) + bias
    per_row = y * _softplus(-logit) + (1 - y) * _softplus(logit)
    return Sums(jnp.sum(per_row), jnp.float32(y.shape[0]),
                *_hits(scale * blk.dots + bias, blk, weight=y))


# ----------------------------------------------------------------------------- registry
class Loss(NamedTuple):
    reference: LossFn                 # plain single-device implementation
    sums: Callable[..., Sums]         # per-device reduction of a Block
    options: dict                     # option -> default (None: resolved from others)
    uses_log_q: bool                  # whether log_q_* extras apply


_HITS = {"remove_accidental_hits": True}
LOSSES: dict[str, Loss] = {
    "in_batch_softmax": Loss(in_batch_softmax, _softmax_sums, {"symmetric": False, **_HITS}, True),
    "in_batch_sigmoid": Loss(in_batch_sigmoid, _sigmoid_sums, dict(_HITS), False),
    "in_batch_triplet_hardest": Loss(in_batch_triplet_hardest, _triplet_hardest_sums,
                                     {"margin": None, **_HITS}, False),
    "triplet_margin": Loss(triplet_margin, _triplet_margin_sums,
                           {"distance": "cosine", "margin": None, "hard": False, **_HITS}, False),
    "sdml": Loss(sdml, _sdml_sums, {"label_smoothing": 0.3, "sdml_scale": 1.0, **_HITS}, True),
    "pointwise_logistic": Loss(pointwise_logistic, _pointwise_sums, dict(_HITS), False),
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


def _device_body(name, opts, q, d, scale, bias, extras):
    """Per device under shard_map: local rows of M, the loss's sums, psum over devices."""
    b = q.shape[0]
    pos = jax.lax.axis_index(DATA_AXIS) * b + jnp.arange(b)
    with_ids = opts.get("remove_accidental_hits", False) and "doc_ids" in extras
    row_ids = extras["doc_ids"] if with_ids else None
    cols, col_ids, log_q = gather_columns(d, extras, with_ids)
    all_clusters = _gather(extras["cluster_ids"]) if "cluster_ids" in extras else None
    more = other_hits(extras, col_ids, all_clusters) if with_ids else []
    more_t = []  # the symmetric direction: a document row against every query column
    if with_ids and "query_ids" in extras:  # a query that is the row's document's text
        more_t.append((row_ids, _gather(extras["query_ids"])))
    if with_ids and all_clusters is not None:
        more_t.append((extras["cluster_ids"], all_clusters))
    sums = LOSSES[name].sums
    parts = [sums(local_block(q, cols, pos, row_ids, col_ids, log_q, more),
                  scale, bias, opts, extras.get("labels"))]
    if opts.get("symmetric"):  # each local document against every query of the batch
        all_ids = _gather(row_ids) if with_ids else None
        parts.append(sums(local_block(d, _gather(q), pos, row_ids, all_ids, None, more_t),
                          scale, bias, opts, None))
    total = lambda x: jax.lax.psum(x, DATA_AXIS)
    loss = sum(total(p.loss_sum) / total(p.count) for p in parts) / len(parts)
    p_at_1 = total(parts[0].hits) / jnp.maximum(total(parts[0].hit_count), 1)
    return loss, {"in_batch_p@1": p_at_1}


def sharded(name: str, mesh: jax.sharding.Mesh, **options) -> LossFn:
    """The loss `name` over the global batch, split over the mesh's `data` axis.

    Returns fn(q, d, scale, bias, extras=None): q, d [B, dim] and the sharded extras are
    split (or splittable) over `data`, scale, bias and the replicated extras are
    replicated. Gradients flow back through the all-gathers.
    """
    opts = resolve_options(name, options)
    body = functools.partial(_device_body, name, opts)

    def fn(q, d, scale, bias, extras: Extras | None = None):
        extras = _check_extras(name, opts, extras)
        specs = {k: P(DATA_AXIS) if k in SHARDED_EXTRAS else P() for k in extras}
        return jax.shard_map(body, mesh=mesh,
                             in_specs=(P(DATA_AXIS), P(DATA_AXIS), P(), P(), specs),
                             out_specs=(P(), P()))(q, d, scale, bias, extras)

    return fn
