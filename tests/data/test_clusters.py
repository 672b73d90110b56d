"""Tests for dualjax.data.clusters: union-find clusters, splits, retrieval tasks."""
import numpy as np
import pytest

from dualjax.data import clusters
from dualjax.data.clusters import RetrievalTask, cluster_pairs, split_clusters, task_from_clusters


def test_cluster_pairs_transitive():
    ids = cluster_pairs([("a", "b"), ("b", "c"), ("d", "e")])
    assert ids == {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1}


def test_cluster_pairs_merges_later_and_ids_follow_first_appearance():
    # x~y and z~w start separate, then y~z joins them; q~r is a new cluster.
    pairs = [("q", "r"), ("x", "y"), ("z", "w"), ("y", "z"), ("s", "q")]
    ids = cluster_pairs(pairs)
    assert ids == {"q": 0, "r": 0, "x": 1, "y": 1, "z": 1, "w": 1, "s": 0}
    assert list(ids) == ["q", "r", "x", "y", "z", "w", "s"]


def test_cluster_pairs_deterministic_and_dense():
    rng = np.random.default_rng(0)
    pairs = [(f"t{a}", f"t{b}") for a, b in rng.integers(0, 300, size=(200, 2))]
    first = cluster_pairs(pairs)
    assert cluster_pairs(list(pairs)) == first
    assert set(first.values()) == set(range(max(first.values()) + 1))
    # Ids appear in increasing order of first appearance.
    seen = []
    for c in first.values():
        if c not in seen:
            seen.append(c)
    assert seen == sorted(seen)


def test_cluster_pairs_self_pair_is_singleton():
    ids = cluster_pairs([("a", "a"), ("b", "c")])
    assert ids == {"a": 0, "b": 1, "c": 1}


def test_cluster_pairs_exact_string_identity():
    ids = cluster_pairs([("Hello", "x"), ("hello", "y")])
    assert ids["Hello"] != ids["hello"]


def test_cluster_pairs_empty():
    assert cluster_pairs([]) == {}


def test_cluster_pairs_long_chain_is_fast():
    n = 200_000
    pairs = [(str(i + 1), str(i)) for i in range(n)]  # Worst case for naive linking.
    ids = cluster_pairs(pairs)
    assert len(ids) == n + 1
    assert set(ids.values()) == {0}


FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def test_split_clusters_fractions():
    split = split_clusters(1000, FRACTIONS, seed=3)
    assert split.shape == (1000,)
    assert np.issubdtype(split.dtype, np.integer)
    np.testing.assert_array_equal(np.bincount(split, minlength=3), [800, 100, 100])


def test_split_clusters_deterministic_and_seed_dependent():
    a = split_clusters(500, FRACTIONS, seed=7)
    np.testing.assert_array_equal(a, split_clusters(500, FRACTIONS, seed=7))
    assert not np.array_equal(a, split_clusters(500, FRACTIONS, seed=8))


def test_split_clusters_disjoint_and_covering():
    split = split_clusters(101, FRACTIONS, seed=0)
    groups = [set(np.flatnonzero(split == k)) for k in range(3)]
    assert sum(len(g) for g in groups) == 101
    assert set().union(*groups) == set(range(101))
    for i in range(3):
        for j in range(i + 1, 3):
            assert not groups[i] & groups[j]


def test_split_clusters_order_of_keys():
    split = split_clusters(10, {"test": 0.0, "train": 1.0}, seed=0)
    np.testing.assert_array_equal(split, np.ones(10))


@pytest.mark.parametrize("fractions", [
    {"train": 0.8, "val": 0.1},
    {"train": 0.9, "val": 0.2},
    {"train": 1.2, "val": -0.2},
    {},
])
def test_split_clusters_bad_fractions(fractions):
    with pytest.raises(ValueError):
        split_clusters(10, fractions, seed=0)


def test_task_from_clusters_hand_example():
    texts = ["a", "b", "c", "d", "e", "b", "f"]
    cluster_ids = [0, 0, 0, 1, 2, 0, 2]  # "d" is a singleton distractor.
    task = task_from_clusters(texts, cluster_ids)
    assert isinstance(task, RetrievalTask)
    assert task.corpus == ["a", "b", "c", "d", "e", "f"]
    assert task.queries == ["a", "b", "c", "e", "f"]
    assert task.relevant == [
        frozenset({1, 2}), frozenset({0, 2}), frozenset({0, 1}),
        frozenset({5}), frozenset({4}),
    ]
    np.testing.assert_array_equal(task.query_corpus_index, [0, 1, 2, 4, 5])
    for q, i, rel in zip(task.queries, task.query_corpus_index, task.relevant, strict=True):
        assert task.corpus[i] == q
        assert i not in rel


def test_task_from_clusters_with_cluster_pairs():
    pairs = [("a", "b"), ("b", "c"), ("d", "d")]
    ids = cluster_pairs(pairs)
    task = task_from_clusters(list(ids), list(ids.values()))
    assert task.corpus == ["a", "b", "c", "d"]
    assert task.queries == ["a", "b", "c"]  # "d" (self-pair) is only a distractor.
    np.testing.assert_array_equal(task.query_corpus_index, [0, 1, 2])


def test_task_from_clusters_errors():
    with pytest.raises(ValueError):
        task_from_clusters(["a", "b"], [0])
    with pytest.raises(ValueError):
        task_from_clusters(["a", "a"], [0, 1])


def test_cluster_coherence_bonadiman_eq_4_5():
    # Members {a b c}, {a b}, {a b d}: union {a b c d} (4 words).
    # Jaccard with the union: 3/4, 2/4, 3/4 -> mean 8/12 = 2/3.
    assert clusters.cluster_coherence([{"a", "b", "c"}, {"a", "b"}, {"a", "b", "d"}]) == \
        pytest.approx(2 / 3)
    assert clusters.cluster_coherence([{"x", "y"}, {"y", "x"}]) == 1.0
    assert clusters.cluster_coherence([set(), set()]) == 0.0


def test_query_clusters_limit_queries_not_candidates():
    texts = ["a1", "a2", "b1", "b2", "b3", "s"]
    ids = [0, 0, 1, 1, 1, 2]
    task = clusters.task_from_clusters(texts, ids, query_clusters={1})
    assert task.corpus == texts
    assert task.queries == ["b1", "b2", "b3"]
    assert task.relevant == [frozenset({3, 4}), frozenset({2, 4}), frozenset({2, 3})]
    assert task.query_corpus_index.tolist() == [2, 3, 4]


# --- retrieval tasks from a hand-made pair graph ---------------------------------------------

def test_cluster_tasks_from_a_pair_graph_split_and_all_candidates():
    # Pairs: a~b, b~c (transitive: {a, b, c}), d~e, f~g, h~i; and one train pair x~y.
    pairs = [("a", "b"), ("b", "c"), ("d", "e"), ("f", "g"), ("h", "i"), ("x", "y")]
    cluster_of = clusters.cluster_pairs(pairs)
    assert cluster_of["a"] == cluster_of["b"] == cluster_of["c"] != cluster_of["d"]
    split = {"a": "test", "d": "test", "f": "val", "h": "val", "x": "train"}
    root = {t: next(r for r in split if cluster_of[r] == cluster_of[t]) for t in cluster_of}
    items = [(t, cluster_of[t], split[root[t]]) for t in cluster_of] + [("z", 99, "test")]

    by_split = clusters.cluster_tasks(items, "split")
    test = by_split["test"]
    assert test.corpus == ["a", "b", "c", "d", "e", "z"]  # z: a singleton distractor
    assert test.queries == ["a", "b", "c", "d", "e"]
    rel = {q: {test.corpus[j] for j in r} for q, r in zip(test.queries, test.relevant, strict=True)}
    assert rel == {"a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}, "d": {"e"}, "e": {"d"}}
    assert [test.corpus[i] for i in test.query_corpus_index] == test.queries
    assert by_split["val"].corpus == ["f", "g", "h", "i"]

    everything = clusters.cluster_tasks(items, "all")["test"]
    assert sorted(everything.corpus) == sorted(cluster_of) + ["z"]  # train and val too
    assert everything.queries == ["a", "b", "c", "d", "e"]
    rel_all = {q: {everything.corpus[j] for j in r}
               for q, r in zip(everything.queries, everything.relevant, strict=True)}
    assert rel_all == rel


def test_incoherent_clusters_are_dropped():
    items = [("how to cook rice", 0, "test"), ("how to cook rice fast", 0, "test"),
             ("what is love", 1, "test"), ("best pizza in town", 1, "test")]
    # Cluster 0: {how to cook rice} and {how to cook rice fast}: 4/5 and 5/5 -> 0.9.
    # Cluster 1: 3 and 4 words, disjoint: 3/7 and 4/7 -> 0.5.
    assert clusters.drop_incoherent(items, 0.6) == {1}
    assert clusters.drop_incoherent(items, 0.0) == set()
