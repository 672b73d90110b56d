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

from typing import Sequence

import numpy as np
from absl import logging

from dualjax import baselines
from dualjax.data import clusters
from dualjax.data.clusters import RetrievalTask
from dualjax.text import normalize


def mine_hard_negatives(pairs: Sequence[tuple[str, str]], k: int, seed: int,
                        depth: int = 0) -> list[list[str]]:
    """k negative documents per pair (texts, as spelled in the data), hardest first.

    depth: BM25 results looked at per query before falling back to random documents
    (0: 4k + 10).
    """
    if k <= 0:
        return [[] for _ in pairs]
    cluster_of = clusters.cluster_pairs([(normalize(q), normalize(d)) for q, d in pairs])
    docs, doc_cluster, seen = [], [], set()
    for _, d in pairs:  # the first spelling of each normalised document represents it
        key = normalize(d)
        if key not in seen:
            seen.add(key)
            docs.append(d)
            doc_cluster.append(cluster_of[key])
    doc_cluster = np.asarray(doc_cluster)
    queries = list(dict.fromkeys(q for q, _ in pairs))  # each distinct query once
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.full(len(queries), -1, np.int64))
    ranked = baselines.rank("bm25", task, min(len(docs), depth or 4 * k + 10))
    rng = np.random.default_rng(seed)
    mined, fallback = {}, 0
    for q, row in zip(queries, ranked):
        own = cluster_of[normalize(q)]
        row = row[row >= 0]
        picked = [int(j) for j in row[doc_cluster[row] != own][:k]]
        others = np.flatnonzero(doc_cluster != own)
        while len(picked) < k and len(others):
            j = int(rng.choice(others))
            if j not in picked or len(others) <= len(picked):
                picked.append(j)
                fallback += 1
        mined[q] = [docs[j] for j in picked]
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
    no word with the corpus has fewer (or no) pairs."""
    queries = list(dict.fromkeys(queries))
    docs = list(dict.fromkeys(corpus))
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.full(len(queries), -1, np.int64))
    ranked = baselines.rank("bm25", task, min(k, len(docs)))
    pairs, cluster = [], []
    for i, (q, row) in enumerate(zip(queries, ranked)):
        for j in row[row >= 0]:
            pairs.append((q, docs[int(j)]))
            cluster.append(i)
    short = int((ranked < 0).any(axis=1).sum())
    logging.info("Pseudo-labels: BM25's top %d of %d documents for %d queries: %d pairs%s",
                 k, len(docs), len(queries), len(pairs),
                 f" ({short} queries with fewer matches)" if short else "")
    return pairs, cluster
