"""BM25 over the training data: hard negatives for pairs that come without labelled
ones (`mine_hard_negatives`), and pseudo-labels for queries without any labels
(`pseudo_label_pairs`, weak supervision).

Hard negatives:
For each training pair, the k documents of the training set that BM25 (the `bm25s`
weights of `baselines`) ranks highest for its query, skipping every document of the
query's own cluster: pairs joined by transitive closure (a~b, b~c) are positives of one
another, so a "negative" from the same cluster would be a false one. A query sharing no
word with enough other-cluster documents gets the rest drawn at random (seeded) from the
other clusters, so every pair has exactly k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from absl import logging

from dualjax.data import clusters
from dualjax.retrieval import baselines
from dualjax.retrieval.task import RetrievalTask
from dualjax.text.words import normalize


class _OtherClusters:
    """The documents outside one cluster, indexed without listing them.

    `nth(cluster, u)` is the u-th document (ascending corpus id) of every cluster but
    `cluster`, so `nth(c, rng.choice(size(c)))` is the draw `rng.choice(others)` would
    make from `others = np.flatnonzero(doc_cluster != c)`, in O(log s) for a cluster of
    s documents instead of O(n) per query. Built once in O(n log n).
    """

    def __init__(self, doc_cluster: np.ndarray):
        self._order = np.argsort(doc_cluster, kind="stable")  # by cluster, then by id
        self._sorted = doc_cluster[self._order]
        self._n = len(doc_cluster)
        # gaps[p]: documents of other clusters before the document at position p of
        # `_order`, within its cluster's run: order[p] - (p - start of the run).
        starts = np.searchsorted(self._sorted, self._sorted, side="left")
        self._gaps = self._order - (np.arange(self._n) - starts)

    def _run(self, cluster: int) -> tuple[int, int]:
        """[start, stop) of `cluster`'s documents in `_order`."""
        return (int(np.searchsorted(self._sorted, cluster, side="left")),
                int(np.searchsorted(self._sorted, cluster, side="right")))

    def size(self, cluster: int) -> int:
        """Documents outside `cluster`."""
        start, stop = self._run(cluster)
        return self._n - (stop - start)

    def nth(self, cluster: int, u: int) -> int:
        """The corpus id of the u-th document (0-based, ascending id) outside `cluster`:
        u plus the documents of `cluster` before it (those whose gap is <= u)."""
        start, stop = self._run(cluster)
        return u + int(np.searchsorted(self._gaps[start:stop], u, side="right"))


def mine_hard_negatives(pairs: Sequence[tuple[str, str]], k: int, seed: int,
                        depth: int = 0) -> list[list[str]]:
    """k negative documents per pair (texts, as spelled in the data), hardest first.

    depth: BM25 results looked at per query before falling back to random documents
    (0: 4k + 10).

    Cost beyond BM25's batched ranking (`baselines.rank`): O(depth) per query to drop
    the own cluster's candidates (vectorised over all queries), and, for the few queries
    left with fewer than k, O(log s) per random draw (s: documents of the own cluster);
    no query lists the corpus. A draw is uniform over the other clusters' m documents
    (the own cluster is skipped by index arithmetic, not rejected) and is redrawn only
    if already picked, unless all m are: then repeats fill the k. With m >= 2k a draw
    is new with probability >= 1/2; below, the expected number of draws per query is at
    most m * H(m) (coupon collector). The draws are those of `rng.choice` over the
    listed other-cluster documents, seed for seed, so the negatives are the same as
    when each query listed them.
    """
    if k <= 0:
        return [[] for _ in pairs]
    if not pairs:
        return []
    keys = [(normalize(q), normalize(d)) for q, d in pairs]  # each text normalised once
    cluster_of = clusters.cluster_pairs(keys)
    docs, doc_cluster_list, seen = [], [], set()
    # A document's first spelling represents it.
    for (_, d), (_, key) in zip(pairs, keys, strict=True):
        if key not in seen:
            seen.add(key)
            docs.append(d)
            doc_cluster_list.append(cluster_of[key])
    doc_cluster = np.asarray(doc_cluster_list, np.int64)
    query_cluster = {q: cluster_of[key] for (q, _), (key, _) in zip(pairs, keys, strict=True)}
    queries = list(query_cluster)  # each distinct query once, in order of appearance
    own = np.asarray([query_cluster[q] for q in queries], np.int64)
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.full(len(queries), -1, np.int64))
    ranked = baselines.rank("bm25", task, min(len(docs), depth or 4 * k + 10))
    # Each query's first k other-cluster candidates, in BM25 order: a stable sort of
    # "is not one" puts them first in each row.
    usable = (ranked >= 0) & (doc_cluster[np.maximum(ranked, 0)] != own[:, None])
    first = np.argsort(~usable, axis=1, kind="stable")[:, :k]
    picked_ids = np.take_along_axis(ranked, first, axis=1)
    found = np.minimum(usable.sum(axis=1), k)
    picked = [row[:n] for row, n in zip(picked_ids.tolist(), found.tolist(), strict=True)]
    short = np.flatnonzero(found < k)
    fallback = 0
    if len(short):
        others = _OtherClusters(doc_cluster)
        rng = np.random.default_rng(seed)
        for i in short.tolist():  # in query order: the draws are seeded
            row, cluster = picked[i], int(own[i])
            size = others.size(cluster)
            while len(row) < k and size:
                j = others.nth(cluster, int(rng.choice(size)))
                if j not in row or size <= len(row):
                    row.append(j)
                    fallback += 1
    mined = {q: [docs[j] for j in row] for q, row in zip(queries, picked, strict=True)}
    if fallback:
        logging.info("Hard negatives: %d of %d drawn at random (too few BM25 matches)",
                     fallback, k * len(queries))
    return [mined[q] for q, _ in pairs]


def pseudo_label_pairs(queries: Sequence[str], corpus: Sequence[str], k: int
                       ) -> tuple[list[tuple[str, str]], list[int]]:
    """Weak supervision (Dehghani et al. 2017; Li & Jia 2018): each query's k documents
    of `corpus` that BM25 ranks highest are its positives; the batch's other documents
    are its negatives. Returns the (query, document) pairs, best first per query, and
    each pair's cluster: the index of its query among the distinct `queries` (so a query
    twice in a batch does not count its other document as a negative). A query sharing
    no word with the corpus has fewer (or no) pairs; a query that is itself one of the
    documents (question-to-question candidates) is never its own positive."""
    queries = list(dict.fromkeys(queries))
    docs = list(dict.fromkeys(corpus))
    position = {d: i for i, d in enumerate(docs)}
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.array([position.get(q, -1) for q in queries],
                                                     np.int64))
    ranked = baselines.rank("bm25", task, min(k, len(docs)))
    pairs, cluster = [], []
    for i, (q, row) in enumerate(zip(queries, ranked, strict=True)):
        for j in row[row >= 0]:
            pairs.append((q, docs[int(j)]))
            cluster.append(i)
    short = int((ranked < 0).any(axis=1).sum())
    logging.info("Pseudo-labels: BM25's top %d of %d documents for %d queries: %d pairs%s",
                 k, len(docs), len(queries), len(pairs),
                 f" ({short} queries with fewer matches)" if short else "")
    return pairs, cluster
