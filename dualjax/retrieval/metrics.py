"""Retrieval metrics over ranked corpus ids and per-query relevance sets (plain numpy).

All metrics are computed from one boolean hit matrix ``hits[q, j]`` (is the item at rank
``j + 1`` of query ``q`` relevant?).  A metric cutoff larger than the number of returned
results ``K`` simply uses all ``K`` results; the denominators (R for MAP/recall, the ideal
DCG for nDCG) still depend only on R and the nominal cutoff, so returning fewer results is
never rewarded.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

PAD_ID = -1


def _hits_and_counts(ranked: np.ndarray, relevant: Sequence[Collection[int]]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Builds the hit matrix.

    Args:
      ranked: int array [nq, K] of corpus ids, best first; ``-1`` is padding.
      relevant: length-nq sequence of relevant-id collections.

    Returns:
      hits: bool [nq, K]; True where the id is relevant (padding and repeats of an id
        already seen higher in the same row never count).
      num_rel: float [nq], R per query (number of distinct relevant ids).

    Raises:
      ValueError: on shape mismatch or a query with no relevant ids.
    """
    ranked = np.asarray(ranked)
    if ranked.ndim != 2:
        raise ValueError(f"ranked must be 2-D [num_queries, K], got shape {ranked.shape}")
    nq, k = ranked.shape
    if nq == 0:
        raise ValueError("no queries to score")
    if len(relevant) != nq:
        raise ValueError(f"ranked has {nq} queries but relevant has {len(relevant)}")
    hits = np.zeros((nq, k), dtype=bool)
    num_rel = np.zeros(nq, dtype=np.float64)
    for q, rel in enumerate(relevant):
        rel_set = {int(r) for r in rel}
        if not rel_set:
            raise ValueError(f"query {q} has no relevant items; drop it before scoring")
        num_rel[q] = len(rel_set)
        seen: set[int] = set()
        for j, doc in enumerate(ranked[q].tolist()):
            if doc != PAD_ID and doc in rel_set and doc not in seen:
                hits[q, j] = True
                seen.add(doc)
    return hits, num_rel


def _ranks(n: int) -> np.ndarray:
    """1-based ranks [n] as float64."""
    return np.arange(1, n + 1, dtype=np.float64)


_RECALL_KS, _SUCCESS_KS, _MAP_K, _MRR_K, _NDCG_KS, _PRECISION_KS = \
    (1, 5, 10, 50, 100), (1, 10), 100, 10, (10, 20), (10, 20)


def cutoffs() -> tuple[int, ...]:
    """Every cutoff `retrieval_metrics` reports by default (an evaluation that retrieves
    fewer results than the largest would cap the deeper metrics)."""
    return (*_RECALL_KS, *_SUCCESS_KS, _MAP_K, _MRR_K, *_NDCG_KS, *_PRECISION_KS)


def retrieval_metrics(ranked: np.ndarray, relevant: Sequence[Collection[int]],
                      ks_recall: Sequence[int] = _RECALL_KS,
                      ks_success: Sequence[int] = _SUCCESS_KS,
                      map_k: int = _MAP_K, mrr_k: int = _MRR_K,
                      ndcg_ks: Sequence[int] = _NDCG_KS,
                      ks_precision: Sequence[int] = _PRECISION_KS,
                      grades: Sequence[Mapping[int, float]] | None = None) -> dict[str, float]:
    """Mean retrieval metrics over queries.

    Args:
      ranked: int array [nq, K] of corpus ids, best first; ``-1`` means "no result".
      relevant: per query, the relevant corpus ids (must be non-empty).
      ks_recall, ks_success, map_k, mrr_k, ndcg_ks, ks_precision: metric cutoffs.
      grades: per query, {relevant id: its judgement's grade (> 0)}: nDCG's gains, as
        trec_eval's ndcg_cut takes them (the ideal DCG from the grades sorted, highest
        first); a relevant id missing there has gain 1. None: every relevant id gains 1.

    Returns:
      Dict with keys ``map@{map_k}``, ``recall@{k}``, ``mrr@{mrr_k}``, ``success@{k}``,
      ``ndcg@{k}``, ``p@{k}`` (Python floats, means over queries) and ``num_queries``
      (int). P@k = relevant in the top k / k (trec_eval's P_k: a query with fewer than k
      relevant items cannot reach 1).
    """
    hits, num_rel = _hits_and_counts(ranked, relevant)
    nq, k_avail = hits.shape
    h = hits.astype(np.float64)
    cum = np.cumsum(h, axis=1)                                   # [nq, K] hits in top j
    cum0 = np.concatenate([np.zeros((nq, 1)), cum], axis=1)      # [nq, K+1]; col k = top k

    def top(k: int) -> int:
        if k < 1:
            raise ValueError(f"cutoffs must be >= 1, got {k}")
        return min(k, k_avail)

    out: dict[str, float] = {}
    # MAP@K (Gillick et al. 2018): sum_j P@j * rel_j / R.
    n = top(map_k)
    prec = cum[:, :n] / _ranks(n)
    out[f"map@{map_k}"] = float(np.mean((prec * h[:, :n]).sum(axis=1) / num_rel))
    for k in ks_recall:
        out[f"recall@{k}"] = float(np.mean(cum0[:, top(k)] / num_rel))
    # MRR@K: 1 / rank of first hit within top K.
    n = top(mrr_k)
    first = np.argmax(hits[:, :n], axis=1) if n else np.zeros(nq, dtype=int)
    found = hits[:, :n].any(axis=1)
    out[f"mrr@{mrr_k}"] = float(np.mean(np.where(found, 1.0 / (first + 1), 0.0)))
    for k in ks_success:
        out[f"success@{k}"] = float(np.mean(cum0[:, top(k)] > 0))
    # nDCG@K: gains are the grades (1 without them); the ideal DCG puts the query's
    # highest grades first, over the nominal cutoff K.
    gain, ideal = _gains(ranked, hits, num_rel, relevant, grades)
    for ndcg_k in ndcg_ks:
        n = top(ndcg_k)
        dcg = (gain[:, :n] / np.log2(_ranks(n) + 1)).sum(axis=1)
        m = min(ndcg_k, ideal.shape[1])
        idcg = (ideal[:, :m] / np.log2(_ranks(m) + 1)).sum(axis=1)
        out[f"ndcg@{ndcg_k}"] = float(np.mean(dcg / idcg))
    for k in ks_precision:  # the nominal k: fewer results than k are not rewarded
        out[f"p@{k}"] = float(np.mean(cum0[:, top(k)] / k))
    out["num_queries"] = int(nq)
    return out


def _gains(ranked: np.ndarray, hits: np.ndarray, num_rel: np.ndarray,
           relevant: Sequence[Collection[int]], grades: Sequence[Mapping[int, float]] | None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(gain [nq, K] of each ranked item: its grade where it is a hit, else 0; ideal
    [nq, max R]: each query's relevant grades, highest first, 0-padded)."""
    if grades is None:
        width = int(num_rel.max())
        return hits.astype(np.float64), (np.arange(width) < num_rel[:, None]).astype(np.float64)
    if len(grades) != len(relevant):
        raise ValueError(f"{len(relevant)} queries but {len(grades)} grade maps")
    ranked = np.asarray(ranked)
    gain = np.zeros(hits.shape)
    ideal_rows = []
    for q, (rel, g) in enumerate(zip(relevant, grades, strict=True)):
        rows = np.flatnonzero(hits[q])
        gain[q, rows] = [float(g.get(int(d), 1.0)) for d in ranked[q, rows].tolist()]
        ideal_rows.append(sorted((float(g.get(int(d), 1.0)) for d in set(rel)), reverse=True))
    ideal = np.zeros((len(relevant), max(map(len, ideal_rows))))
    for q, row in enumerate(ideal_rows):
        ideal[q, :len(row)] = row
    return gain, ideal


def recall_curve(ranked: np.ndarray, relevant: Sequence[Collection[int]],
                 max_k: int = 100) -> np.ndarray:
    """Mean recall@k for k = 1..max_k.

    Args:
      ranked: int array [nq, K]; ``-1`` is padding.
      relevant: per query, the relevant corpus ids (non-empty).
      max_k: last cutoff; cutoffs beyond K repeat recall@K.

    Returns:
      float64 array [max_k]; entry ``k - 1`` equals ``retrieval_metrics(...)["recall@k"]``.
    """
    hits, num_rel = _hits_and_counts(ranked, relevant)
    nq, k_avail = hits.shape
    cum0 = np.concatenate([np.zeros((nq, 1)), np.cumsum(hits, axis=1)], axis=1)
    cols = np.minimum(np.arange(1, max_k + 1), k_avail)
    return (cum0[:, cols] / num_rel[:, None]).mean(axis=0)
