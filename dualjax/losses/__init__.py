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

Each loss is one module (in_batch_softmax.py, ..., registered in `registry.LOSSES`) with
two implementations: `reference(name)` is a plain one on the full matrix (no shard_map;
`matrix.py` builds M and its masks), and `sharded(name, mesh)` runs its per-device core
(`streaming.py` streams the columns) under `jax.shard_map`
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
document against all B queries) included. tests/losses/test_losses.py shows both forms give
the reference's loss, p@1 and gradients on 8 devices.

`metrics["in_batch_p@1"]` is the fraction of rows whose positive scores strictly above
every unmasked negative (by the loss's own score, before any logQ correction).
"""
from __future__ import annotations

import functools
import importlib

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from dualjax.losses import streaming
from dualjax.losses.distill import KINDS as DISTILL_KINDS  # noqa: F401
from dualjax.losses.distill import distillation  # noqa: F401
from dualjax.losses.matrix import (  # noqa: F401
    EXTRAS,
    REPLICATED_EXTRAS,
    SHARDED_EXTRAS,
    Extras,
    Metrics,
    reference_columns,
)
from dualjax.losses.registry import LOSSES, Loss, LossFn, register, resolve_options  # noqa: F401
from dualjax.losses.streaming import Sums, gather_columns  # noqa: F401
from dualjax.runtime.sharding import DATA_AXIS

# The losses of dualjax, one module each, in the order they are listed: importing one
# registers it. A loss of your own registers itself the same way (registry.py).
BUILT_IN = ("in_batch_softmax", "in_batch_sigmoid", "in_batch_triplet_hardest",
            "triplet_margin", "sdml", "pointwise_logistic")
for _name in BUILT_IN:
    importlib.import_module(f"dualjax.losses.{_name}")


def _check_extras(name: str, opts: dict, extras: Extras | None) -> Extras:
    """Drops None values and rejects extras that cannot work, with what would."""
    extras = {k: v for k, v in (extras or {}).items() if v is not None}
    unknown = sorted(set(extras) - set(EXTRAS))
    if unknown:
        raise ValueError(f"unknown extras {', '.join(unknown)}; known: {', '.join(EXTRAS)}")
    if LOSSES[name].needs_labels:
        if "labels" not in extras:
            raise ValueError(f"{name} needs extras['labels'] ([B] 0/1 per pair)")
        other = sorted(set(extras) - {"labels", "doc_ids", "query_ids", "cluster_ids"})
        if other:
            raise ValueError(f"{name} takes only labels and the ids, not {other}")
    elif "labels" in extras:
        labelled = ", ".join(n for n, spec in LOSSES.items() if spec.needs_labels)
        raise ValueError(f"extras['labels'] are for {labelled}, not {name}")
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
    body = functools.partial(streaming.device_body, LOSSES[name], opts, column_block)

    def fn(q, d, scale, bias, extras: Extras | None = None):
        extras = _check_extras(name, opts, extras)
        specs = {k: P(DATA_AXIS) if k in SHARDED_EXTRAS else P() for k in extras}
        return jax.shard_map(body, mesh=mesh,
                             in_specs=(P(DATA_AXIS), P(DATA_AXIS), P(), P(), specs),
                             out_specs=(P(), P()))(q, d, scale, bias, extras)

    return fn


# ----------------------------------------------------------------------------- Matryoshka
VECTOR_EXTRAS = ("hard_negatives", "mixed_negatives")  # extras that are embeddings


def prefix(x: jax.Array | np.ndarray, dim: int) -> jax.Array:
    """The first `dim` coordinates of unit vectors x [..., full], made unit again: what a
    Matryoshka embedding is read as at `dim` (Kusupati et al. 2022)."""
    head = jax.numpy.asarray(x)[..., :dim]
    return head * jax.lax.rsqrt(jax.numpy.maximum(
        jax.numpy.sum(head * head, axis=-1, keepdims=True), 1e-12))


def matryoshka(fn: LossFn, dims: tuple[int, ...]) -> LossFn:
    """`fn` summed over nested prefixes of the embeddings (MatryoshkaLoss of
    sentence-transformers, weight 1 each): the full vectors, then their first m
    coordinates, renormalised, for each m in `dims` (below the full width; query,
    document and negative vectors alike). Metrics are the full vectors', with
    "loss@m" for each prefix."""
    if not dims:
        return fn

    def wrapped(q, d, scale, bias, extras: Extras | None = None):
        total, metrics = fn(q, d, scale, bias, extras)
        metrics = dict(metrics)
        for m in dims:
            if m >= q.shape[-1]:
                raise ValueError(f"loss.matryoshka_dims: {m} is not below the embedding's "
                                 f"{q.shape[-1]} dimensions")
            cut = {k: prefix(v, m) if k in VECTOR_EXTRAS else v
                   for k, v in (extras or {}).items()}
            value, _ = fn(prefix(q, m), prefix(d, m), scale, bias, cut or None)
            metrics[f"loss@{m}"] = value
            total = total + value
        return total, metrics

    return wrapped
