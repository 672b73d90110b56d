"""The dual encoder's objective: both towers, then an in-batch loss of `losses` over the
global batch (with mixed and mined hard negatives, accidental-hit ids and logQ when the
batch and the step's extras carry them). Every run that pairs queries with documents
without `model.name="pses"` uses it.

With `encode_chunks` K > 1 (config.train.encode_chunks) the towers encode the batch K chunks
at a time (`encode_in_chunks`), so that only one chunk's activations are alive, in the
forward and in the backward pass, while the loss still sees the whole global batch's
embeddings (cached tower gradients, GradCache: Gao et al. 2021)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.models import dual_encoder
from dualjax.objectives.core import Objective

# The batch's texts the towers encode: key prefix, the model's method, and what the
# loss calls the embeddings (None: the pairs' own q and d).
ENCODED = (("q", "encode_queries", None), ("d", "encode_documents", None),
           ("m", "encode_documents", "mixed_negatives"),
           ("n", "encode_documents", "hard_negatives"))


def objective(model: dual_encoder.DualEncoder, loss_fn, max_len: int,
              remove_query_hits: bool = True, remove_cluster_hits: bool = True,
              encode_chunks: int = 0, rematerialise: bool = True) -> Objective:
    """The towers and an in-batch loss (`losses.sharded(...)`) over the global batch; a
    column holding the row's own query, or a document of the row's cluster, is not a
    negative unless `remove_query_hits` / `remove_cluster_hits` is off.

    `encode_chunks` K > 1: every encoded text (queries, documents, mixed and hard
    negatives) goes through the towers in K chunks (`encode_in_chunks`); the loss and
    every gradient are those of K = 1 up to float rounding (dropout draws other masks).
    `rematerialise=False` keeps every chunk's activations instead (for tests: the same
    computation without the memory saving)."""

    def loss(params, batch, rng, extras):
        # A batch comes from one task (batch["task"]: its index on every row), whose own
        # scale and bias turn cosines into logits.
        task = batch["task"][0] if "task" in batch else None
        more = hit_extras(batch, extras, remove_query_hits, remove_cluster_hits)
        if encode_chunks > 1:
            q, d, negatives = encode_in_chunks(model, params, batch, rng, encode_chunks,
                                               rematerialise)
            scale, bias = model.apply({"params": params}, task, method="scale_and_bias")
            more.update(negatives)
        else:
            q, d, scale, bias = model.apply({"params": params}, batch["q_ids"], batch["q_mask"],
                                            batch["d_ids"], batch["d_mask"], batch.get("q_cats"),
                                            batch.get("d_cats"), task, rngs={"dropout": rng})
            if "m_ids" in batch:  # mixed negatives: uniformly drawn documents, same tower
                more["mixed_negatives"] = model.apply(
                    {"params": params}, batch["m_ids"], batch["m_mask"], batch.get("m_cats"),
                    method="encode_documents")
            if "n_ids" in batch:  # each pair's mined hard negatives [B, k, ...], same tower
                b, k, length = batch["n_ids"].shape
                h = model.apply({"params": params}, batch["n_ids"].reshape(b * k, length),
                                batch["n_mask"].reshape(b * k, length), method="encode_documents")
                more["hard_negatives"] = h.reshape(b, k, -1)
        if "m_ids" in batch:
            more["mixed_negative_ids"] = batch["m_doc_ids"]
        if "n_ids" in batch:
            more["hard_negative_ids"] = batch["n_doc_ids"]
        if "teacher" in batch:  # a teacher's scores of [positive, negatives] (distillation)
            more["teacher_scores"] = batch["teacher"]
        value, aux = loss_fn(q, d, scale, bias, {**extras, **more} or None)
        return value, {**aux, "scale": scale}

    return Objective(lambda rng: dual_encoder.init_params(model, rng, max_len), loss,
                     tables=dual_encoder.token_tables)


def encode_in_chunks(model: dual_encoder.DualEncoder, params: dict, batch: dict,
                     rng: jax.Array, chunks: int, rematerialise: bool = True
                     ) -> tuple[jax.Array, jax.Array, dict]:
    """(q [B, dim], d [B, dim], {"mixed_negatives": [U, dim], "hard_negatives": [B, k,
    dim]} for those the batch carries), each side encoded `chunks` chunks at a time.

    Each side is a `jax.lax.map` over its chunks of a `jax.checkpoint`-ed encode, so the
    forward pass keeps only each chunk's inputs and output embeddings, and the backward
    pass re-runs one chunk's forward at a time from its inputs and pulls the loss's
    gradient w.r.t. that chunk's embeddings back through it. That is GradCache (Gao et al.
    2021): (1) embed every chunk, keeping no activations; (2) the loss over the whole
    batch's embeddings and its gradient w.r.t. them (the "cache"); (3) per chunk, a second
    forward and the backward of (2)'s embedding gradient, summed into the parameter
    gradient. Here rematerialisation does (1) and (3) and autodiff does (2): by the chain
    rule the parameter gradient is the sum over chunks of each chunk's vector-Jacobian
    product with its embeddings' gradient, exactly what the unchunked backward computes,
    with the activations of one chunk (of one side) alive at a time: the same memory
    behaviour, for one extra forward pass of the towers.

    Chunk j holds rows j, j + K, j + 2K, ... ([B] as [B/K, K] then K first), so with the
    batch split over the `data` axis and B/K a multiple of the devices, every chunk is
    split evenly over the devices and no data moves between them; the embeddings come
    back in the batch's row order. Dropout: chunk j of side s uses
    fold_in(fold_in(rng, s), j), an input of the checkpointed function, so the
    recomputation draws the very masks of the forward pass.
    """
    out = {}
    for side, (key, method, name) in enumerate(ENCODED):
        if f"{key}_ids" not in batch:
            continue
        inputs = (batch[f"{key}_ids"], batch[f"{key}_mask"], batch.get(f"{key}_cats"))

        def encode(params, inputs, rng, method=method):
            ids, mask, cats = inputs  # [b, len] (hard negatives: [b, k, len])
            lead, length = ids.shape[:-1], ids.shape[-1]
            vectors = model.apply({"params": params}, ids.reshape(-1, length),
                                  mask.reshape(-1, length), cats, method=method,
                                  rngs={"dropout": rng})
            return vectors.reshape(*lead, vectors.shape[-1])

        out[name or key] = map_chunks(encode, params, inputs, jax.random.fold_in(rng, side),
                                      chunks, rematerialise)
    q, d = out.pop("q"), out.pop("d")
    return q, d, out


def map_chunks(f, params, inputs, rng: jax.Array, chunks: int, rematerialise: bool = True):
    """f(params, chunk of inputs, fold_in(rng, j)) for chunks j = 0..K-1 of the leading
    axis (chunk j: rows j, j + K, ...), one after another, under `jax.checkpoint` unless
    `rematerialise` is off; the outputs stacked back in row order."""
    rows = jax.tree.leaves(inputs)[0].shape[0]
    if rows % chunks:
        raise ValueError(f"encode_chunks={chunks} must divide the {rows} rows to encode")
    # [B, ...] -> [B/K, K, ...] -> [K, B/K, ...]: row r is chunk r % K, position r // K.
    split = lambda x: jnp.swapaxes(x.reshape(rows // chunks, chunks, *x.shape[1:]), 0, 1)
    body = jax.checkpoint(f, prevent_cse=False) if rematerialise else f
    stacked = jax.lax.map(lambda a: body(params, a[1], jax.random.fold_in(rng, a[0])),
                          (jnp.arange(chunks), jax.tree.map(split, inputs)))
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape(rows, *y.shape[2:]), stacked)


def hit_extras(batch: dict, extras: dict, remove_query_hits: bool,
               remove_cluster_hits: bool) -> dict:
    """The loss extras that mark accidental hits beyond a repeated document: the rows'
    own queries and clusters (when the batch carries them and the step has doc ids)."""
    more = {}
    if remove_query_hits and "query_ids" in batch and "doc_ids" in extras:
        more["query_ids"] = batch["query_ids"]
    if remove_cluster_hits and "cluster_ids" in batch and "doc_ids" in extras:
        more["cluster_ids"] = batch["cluster_ids"]
        if "m_cluster_ids" in batch:
            more["mixed_negative_clusters"] = batch["m_cluster_ids"]
    return more
