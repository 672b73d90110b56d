"""Hybrid search: one ranking from a dense (dual encoder) and a lexical (BM25) one.

Two fusions, both over each system's top-K list per query:

* reciprocal rank fusion (`fuse_rrf`, Cormack et al. 2009): ranks only, no weight;
* score interpolation (`fuse_scores`): each list's scores min-max normalised per query to
  [0, 1] (a document missing from a list gets that list's minimum, 0), then
  w * dense + (1 - w) * lexical. The weight w is chosen on a validation split
  (`choose_weight`), as Ma et al. 2021 and Pyserini's hybrid runs do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dualjax.retrieval import metrics

WEIGHTS = tuple(np.round(np.linspace(0.0, 1.0, 11), 2))  # the grid `choose_weight` tries


def _top(fused: list[dict[int, float]], k: int, with_scores: bool):
    """Per query, the k ids of highest fused score (stable: insertion order on ties):
    int [nq, k] with -1 padding, and with `with_scores` their scores [nq, k] (-inf)."""
    ids = np.full((len(fused), k), metrics.PAD_ID, np.int64)
    scores = np.full((len(fused), k), -np.inf)
    for q, score in enumerate(fused):
        best = sorted(score, key=score.__getitem__, reverse=True)[:k]
        ids[q, :len(best)] = best
        scores[q, :len(best)] = [score[doc] for doc in best]
    return (ids, scores) if with_scores else ids


def fuse_rrf(rankings: Sequence[np.ndarray], k: int, rrf_k: float = 60.0,
             with_scores: bool = False):
    """Reciprocal rank fusion: each id's score is the sum over the rankings of
    1 / (rrf_k + its rank there), rank 1 first; an id absent from a ranking adds nothing.
    rankings: int [nq, K_i] each, -1 padding. Returns int [nq, k], best first, ties
    broken by the first ranking's order, then the next; -1 padding (with `with_scores`,
    also the fused scores [nq, k])."""
    fused = []
    for q in range(rankings[0].shape[0]):
        score: dict[int, float] = {}
        for ids in rankings:
            for rank, doc in enumerate(ids[q].tolist(), start=1):
                if doc >= 0:
                    score[doc] = score.get(doc, 0.0) + 1.0 / (rrf_k + rank)
        fused.append(score)
    return _top(fused, k, with_scores)


def _normalised(ids: np.ndarray, scores: np.ndarray) -> dict[int, float]:
    """{id: score min-max scaled to [0, 1]} of one query's list (-1 ids dropped); all
    equal scores map to 1."""
    keep = ids >= 0
    ids, scores = ids[keep].tolist(), scores[keep].astype(np.float64)
    if not ids:
        return {}
    low, span = scores.min(), scores.max() - scores.min()
    scaled = (scores - low) / span if span > 0 else np.ones_like(scores)
    return dict(zip(ids, scaled.tolist(), strict=True))


def fuse_scores(dense: tuple[np.ndarray, np.ndarray], lexical: tuple[np.ndarray, np.ndarray],
                weight: float, k: int, with_scores: bool = False):
    """Score interpolation of two (ids int [nq, K], scores [nq, K]) top-K lists:
    weight * dense + (1 - weight) * lexical, each min-max normalised per query over its
    own list (absent: 0). Returns int [nq, k], best first, ties by the dense list's
    order, then the lexical one's; -1 padding (with `with_scores`, also the fused
    scores [nq, k])."""
    (d_ids, d_scores), (l_ids, l_scores) = dense, lexical
    fused = []
    for q in range(len(d_ids)):
        d, lx = _normalised(d_ids[q], d_scores[q]), _normalised(l_ids[q], l_scores[q])
        fused.append({doc: weight * d.get(doc, 0.0) + (1 - weight) * lx.get(doc, 0.0)
                      for doc in list(d) + [x for x in lx if x not in d]})
    return _top(fused, k, with_scores)


def fuse(dense: tuple[np.ndarray, np.ndarray], lexical: tuple[np.ndarray, np.ndarray],
         k: int, weight: float | None = None, rrf_k: float = 60.0
         ) -> tuple[np.ndarray, np.ndarray]:
    """The one hybrid of a dense and a lexical (ids, scores) top-K, for evaluation and
    `dualjax.search` alike: (ids [nq, k], scores [nq, k]) by reciprocal rank fusion
    (`fuse_rrf`; scores: the RRF sums) or, with a `weight`, by score interpolation
    (`fuse_scores`; scores: the interpolated values)."""
    if weight is None:
        return fuse_rrf([dense[0], lexical[0]], k, rrf_k, with_scores=True)
    return fuse_scores(dense, lexical, weight, k, with_scores=True)


def choose_weight(dense: tuple[np.ndarray, np.ndarray], lexical: tuple[np.ndarray, np.ndarray],
                  relevant: Sequence[frozenset[int]], k: int, metric: str = "map@100",
                  weights: Sequence[float] = WEIGHTS,
                  grades: Sequence[dict[int, int]] | None = None) -> tuple[float, float]:
    """(weight, metric value): the dense weight of `fuse_scores` that scores best on these
    queries' relevance labels (a validation split; `grades`: their judgements' grades, as
    `metrics.retrieval_metrics` takes them), the first of `weights` on a tie."""
    best = (float(weights[0]), -np.inf)
    for w in weights:
        value = metrics.retrieval_metrics(fuse_scores(dense, lexical, w, k), relevant,
                                          grades=grades)[metric]
        if value > best[1]:
            best = (float(w), value)
    return best
