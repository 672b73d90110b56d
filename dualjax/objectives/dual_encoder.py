"""The dual encoder's objective: both towers, then an in-batch loss of `losses` over the
global batch (with mixed and mined hard negatives, accidental-hit ids and logQ when the
batch and the step's extras carry them). Every run that pairs queries with documents
without `model.name="pses"` uses it."""

from __future__ import annotations

from dualjax.models import dual_encoder
from dualjax.objectives.core import Objective


def objective(model: dual_encoder.DualEncoder, loss_fn, max_len: int,
              remove_query_hits: bool = True, remove_cluster_hits: bool = True) -> Objective:
    """The towers and an in-batch loss (`losses.sharded(...)`) over the global batch; a
    column holding the row's own query, or a document of the row's cluster, is not a
    negative unless `remove_query_hits` / `remove_cluster_hits` is off."""

    def loss(params, batch, rng, extras):
        # A batch comes from one task (batch["task"]: its index on every row), whose own
        # scale and bias turn cosines into logits.
        task = batch["task"][0] if "task" in batch else None
        q, d, scale, bias = model.apply({"params": params}, batch["q_ids"], batch["q_mask"],
                                        batch["d_ids"], batch["d_mask"], batch.get("q_cats"),
                                        batch.get("d_cats"), task, rngs={"dropout": rng})
        more = hit_extras(batch, extras, remove_query_hits, remove_cluster_hits)
        if "m_ids" in batch:  # mixed negatives: uniformly drawn documents, same tower
            more["mixed_negatives"] = model.apply(
                {"params": params}, batch["m_ids"], batch["m_mask"], batch.get("m_cats"),
                method="encode_documents")
            more["mixed_negative_ids"] = batch["m_doc_ids"]
        if "n_ids" in batch:  # each pair's mined hard negatives [B, k, ...], same tower
            b, k, length = batch["n_ids"].shape
            h = model.apply({"params": params}, batch["n_ids"].reshape(b * k, length),
                            batch["n_mask"].reshape(b * k, length), method="encode_documents")
            more["hard_negatives"] = h.reshape(b, k, -1)
            more["hard_negative_ids"] = batch["n_doc_ids"]
        value, aux = loss_fn(q, d, scale, bias, {**extras, **more} or None)
        return value, {**aux, "scale": scale}

    return Objective(lambda rng: dual_encoder.init_params(model, rng, max_len), loss)


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
