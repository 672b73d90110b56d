"""Retrieval tasks from pairwise data (Gillick et al., 2018, section 3.3).

Positive pairs are merged transitively into clusters (a~b and b~c put a, b and
c together); clusters, not pairs, are split into train/val/test so that no
paraphrase crosses a split; and a retrieval task is built from each split in
which every text of a multi-member cluster is a query whose relevant items are
the other members of its cluster, and singletons are distractors only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

import numpy as np

from dualjax.retrieval.task import RetrievalTask  # noqa: F401 (what this builds)
from dualjax.text.words import normalize, words


def cluster_pairs(pairs: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Groups the texts of `pairs` into connected components (union-find).

    Texts are compared by exact string identity; callers may normalise them
    beforehand.

    Args:
        pairs: (text, text) positive pairs.

    Returns:
        text -> cluster id, for every text in `pairs`. Cluster ids are dense,
        0..C-1, assigned in the order in which each cluster's first text first
        appears in `pairs` (so the result is deterministic). The dict itself is in
        order of first appearance of the texts.
    """
    index: dict[str, int] = {}
    parent: list[int] = []

    def node(s: str) -> int:
        i = index.get(s)
        if i is None:
            i = index[s] = len(parent)
            parent.append(i)
        return i

    def find(i: int) -> int:
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:  # Path compression.
            parent[i], i = root, parent[i]
        return root

    for a, b in pairs:
        ra, rb = find(node(a)), find(node(b))
        if ra != rb:
            # Attach the later root under the earlier one; with path compression
            # this keeps the trees shallow and makes roots the first-seen member.
            if ra < rb:
                parent[rb] = ra
            else:
                parent[ra] = rb

    root_to_cluster: dict[int, int] = {}
    result: dict[str, int] = {}
    for s, i in index.items():
        root = find(i)
        cluster = root_to_cluster.get(root)
        if cluster is None:
            cluster = root_to_cluster[root] = len(root_to_cluster)
        result[s] = cluster
    return result


def split_clusters(
        num_clusters: int, fractions: dict[str, float], seed: int
) -> np.ndarray:
    """Assigns each cluster id to a split by a seeded random permutation.

    Args:
        num_clusters: number of clusters, ids 0..num_clusters-1.
        fractions: split name -> fraction of the clusters, e.g.
            ``{"train": 0.8, "val": 0.1, "test": 0.1}``; must be non-negative and
            sum to 1.
        seed: seed of the permutation; equal seeds give equal splits.

    Returns:
        int array [num_clusters]: the split index of each cluster, in the order of
        the keys of `fractions`. Split sizes are the fractions times num_clusters,
        rounded at the cumulative boundaries (so they add up to num_clusters).

    Raises:
        ValueError: bad `num_clusters` or `fractions`.
    """
    if num_clusters < 0:
        raise ValueError(f"num_clusters must be >= 0, got {num_clusters}")
    if not fractions:
        raise ValueError("fractions must name at least one split")
    values = [float(v) for v in fractions.values()]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"fractions must be finite and >= 0, got {fractions}")
    total = math.fsum(values)
    if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-6):
        raise ValueError(f"fractions must sum to 1, got {total} from {fractions}")

    permutation = np.random.default_rng(seed).permutation(num_clusters)
    cumulative = np.cumsum(values) / total
    bounds = np.rint(cumulative * num_clusters).astype(np.int64)
    bounds[-1] = num_clusters
    assignment = np.empty(num_clusters, dtype=np.int32)
    start = 0
    for split, end in enumerate(bounds):
        end = max(int(end), start)
        assignment[permutation[start:end]] = split
        start = end
    return assignment


def cluster_coherence(token_sets: Sequence[set[str]]) -> float:
    """Bonadiman et al. 2019, eq. 4-5: the mean Jaccard overlap of each member's token
    set with the union of the cluster's tokens (1.0 when all members share all words).

    Jaccard(T_i, U) = |T_i & U| / |T_i | U| = |T_i| / |U| since T_i is inside U.
    """
    union = set().union(*token_sets)
    if not union:
        return 0.0
    return sum(len(t) for t in token_sets) / (len(token_sets) * len(union))


def task_from_clusters(
        texts: Sequence[str], cluster_ids: Sequence[int],
        query_clusters: Collection[int] | None = None,
) -> RetrievalTask:
    """Builds a retrieval task from texts labelled with cluster ids.

    The corpus is all texts, deduplicated (first occurrence wins, order kept).
    Every text whose cluster has at least two distinct members is a query (in
    corpus order); its relevant items are the other members of its cluster.
    Texts of singleton clusters are in the corpus only, as distractors. With
    `query_clusters`, only members of those clusters are queries (the others are
    candidates only: e.g. every question of the dataset as the candidate pool of
    one split's queries).

    Args:
        texts: the texts; duplicates are allowed but must carry the same id.
        cluster_ids: the cluster id of each text, aligned with `texts`.

    Raises:
        ValueError: `texts` and `cluster_ids` differ in length, or one text is
            given two different cluster ids.
    """
    if len(texts) != len(cluster_ids):
        raise ValueError(
                f"{len(texts)} texts but {len(cluster_ids)} cluster ids")
    corpus_index: dict[str, int] = {}
    corpus: list[str] = []
    corpus_cluster: list[int] = []
    for s, cluster in zip(texts, cluster_ids, strict=True):
        cluster = int(cluster)
        i = corpus_index.get(s)
        if i is None:
            corpus_index[s] = len(corpus)
            corpus.append(s)
            corpus_cluster.append(cluster)
        elif corpus_cluster[i] != cluster:
            raise ValueError(
                    f"text {s!r} has two cluster ids: {corpus_cluster[i]} and {cluster}")

    members: dict[int, list[int]] = {}
    for i, cluster in enumerate(corpus_cluster):
        members.setdefault(cluster, []).append(i)

    queries: list[str] = []
    relevant: list[frozenset[int]] = []
    query_corpus_index: list[int] = []
    for i, cluster in enumerate(corpus_cluster):
        group = members[cluster]
        if len(group) < 2 or (query_clusters is not None and cluster not in query_clusters):
            continue
        queries.append(corpus[i])
        relevant.append(frozenset(j for j in group if j != i))
        query_corpus_index.append(i)
    return RetrievalTask(
            corpus=corpus,
            queries=queries,
            relevant=relevant,
            query_corpus_index=np.asarray(query_corpus_index, dtype=np.int64),
    )


@dataclasses.dataclass
class RawData:
    """What a dataset builder loads: training pairs and one retrieval task per
    evaluation split ("val", "test"; a split may be missing)."""

    train_pairs: list[tuple[str, str]]  # positive (query, document) pairs
    tasks: dict[str, RetrievalTask]
    # Per training pair, the (query, document) categorical fields, when the data has any.
    train_fields: list[tuple[dict, dict]] | None = None
    # Per training pair, its hard negative documents (data.hard_negatives), when mined.
    train_negatives: list[list[str]] | None = None
    # Per training pair, its cluster, when given (pseudo-labels: its query); else the
    # transitive closure of the training pairs.
    train_clusters: list[int] | None = None


# ----------------------------------------------------------------------------- clustered sources
EVAL_SPLITS = ("val", "test")


def cluster_tasks(items: list[tuple[str, int, str]], candidates: str) -> dict[str, RetrievalTask]:
    """Retrieval tasks from questions labelled (text, cluster, split).

    Each question of an eval-split cluster with >= 2 members is a query; its relevant
    items are the other members. Candidates are the split's own questions ("split") or
    every question of the dataset, training ones included ("all": harder, realistic).
    """
    tasks = {}
    for split in EVAL_SPLITS:
        mine = [(t, c) for t, c, s in items if s == split]
        if candidates == "split":
            tasks[split] = task_from_clusters([t for t, _ in mine], [c for _, c in mine])
        else:
            tasks[split] = task_from_clusters(
                [t for t, _, _ in items], [c for _, c, _ in items],
                query_clusters={c for _, c in mine})
    return tasks


def drop_incoherent(items: list[tuple[str, int, str]], min_coherence: float) -> set[int]:
    """Clusters whose coherence (Bonadiman et al. eq. 4-5) is below `min_coherence`."""
    if min_coherence <= 0:
        return set()
    members: dict[int, list[set[str]]] = {}
    for text, c, _ in items:
        members.setdefault(c, []).append(set(words(text)))
    return {c for c, sets in members.items() if cluster_coherence(sets) < min_coherence}


def cluster_raw(train_pairs, items, settings, train_fields=None, fields_of=None,
                train_clusters=None) -> RawData:
    """RawData from clustered questions, after the optional coherence filter.

    fields_of: {"query": {normalised text: fields}, "document": ...}: the categorical
    fields a text had where it was that side of a pair; evaluation queries take the query
    side's, candidates the document side's (missing where the text never was that side).
    train_clusters: each training pair's cluster (the ids of `items`), when known: kept
    numbered as `cluster_pairs` numbers the training pairs (so the builders need not
    join them again).
    """
    dropped = drop_incoherent(items, settings["min_cluster_coherence"])
    if dropped:
        cluster_of = {normalize(t): c for t, c, _ in items}  # items hold one spelling
        keep = [cluster_of[normalize(q)] not in dropped for q, _ in train_pairs]
        train_pairs = [p for p, k in zip(train_pairs, keep, strict=True) if k]
        train_fields = train_fields and [f for f, k in zip(train_fields, keep, strict=True) if k]
        train_clusters = train_clusters and [c for c, k in zip(train_clusters, keep, strict=True)
                                             if k]
        items = [it for it in items if it[1] not in dropped]
    tasks = cluster_tasks(items, settings["candidates"])
    if fields_of:
        for split, task in tasks.items():
            tasks[split] = dataclasses.replace(
                task, corpus_fields=[fields_of["document"].get(normalize(t), {})
                                     for t in task.corpus],
                query_fields=[fields_of["query"].get(normalize(t), {}) for t in task.queries])
    if train_clusters is not None:  # dense, in order of first appearance
        dense: dict[int, int] = {}
        train_clusters = [dense.setdefault(c, len(dense)) for c in train_clusters]
    return RawData(train_pairs, tasks, train_fields, train_clusters=train_clusters)
