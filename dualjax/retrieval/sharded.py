"""Search over an index cut into shards: each shard searched alone, the top k merged.

A corpus indexed by several processes is several searchers (exact, ScaNN, HNSW or
quantized, one per shard, each over its own rows 0..n_s - 1). `ShardedSearcher` keeps
`ExactIndex.search`'s contract over all of them: row ids are global (shard s's row r is
offsets[s] + r) and the k best of the shards' k best are the k best overall, as faiss'
`IndexShards` and Tevatron's merged search do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def merge_top_k(scores: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """The k best of several rankings of the same queries.

    Args:
      scores, ids: per shard, [nq, k_s] best first, ids already global, -inf / -1 padded.
      k: results kept per query.

    Returns:
      (scores [nq, k] float32, ids [nq, k] int32), best first; a tie keeps the earlier
      shard's row first (the lower global id), as one search over the whole corpus would.
    """
    all_scores = np.concatenate([np.asarray(s, np.float32) for s in scores], axis=1)
    all_ids = np.concatenate([np.asarray(i, np.int64) for i in ids], axis=1)
    order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
    top_s = np.take_along_axis(all_scores, order, 1)
    top_i = np.take_along_axis(all_ids, order, 1)
    top_i[~np.isfinite(top_s)] = -1
    out_s = np.full((len(top_s), k), -np.inf, np.float32)
    out_i = np.full((len(top_s), k), -1, np.int32)
    out_s[:, :top_s.shape[1]], out_i[:, :top_i.shape[1]] = top_s, top_i
    return out_s, out_i


class ShardedSearcher:
    """Searchers over consecutive parts of one corpus, answering as one."""

    def __init__(self, shards: Sequence[Any], sizes: Sequence[int]):
        """shards[s] searches sizes[s] rows (a shard of no rows may be None)."""
        if len(shards) != len(sizes):
            raise ValueError(f"{len(shards)} searchers for {len(sizes)} shard sizes")
        self.shards, self.sizes = list(shards), [int(n) for n in sizes]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])[:-1]
        self.n = int(sum(self.sizes))

    @property
    def settings(self) -> dict:
        """The first non-empty shard's knobs (every shard is built with the same ones)."""
        return next(dict(s.settings) for s, n in zip(self.shards, self.sizes, strict=True) if n)

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               **knobs) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k] float32, ids [nq, k] int32) over every shard, best first,
        -inf / -1 padded; exclude [nq]: a global row each query must not retrieve (-1:
        none); knobs (leaves_to_search, ef_search, ...) go to every shard's search."""
        scores, ids = [], []
        for shard, size, offset in zip(self.shards, self.sizes, self.offsets, strict=True):
            if not size:
                continue
            local = None
            if exclude is not None:  # a global row, as this shard numbers it (else -1)
                ex = np.asarray(exclude, np.int64) - offset
                local = np.where((ex >= 0) & (ex < size), ex, -1).astype(np.int32)
            s, i = shard.search(queries, min(k, size), local, **knobs)
            scores.append(s)
            ids.append(np.where(i >= 0, i.astype(np.int64) + offset, -1))
        return merge_top_k(scores, ids, k)
