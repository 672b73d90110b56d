"""BM25 hard-negative mining for training pairs: never from the query's own cluster,
hardest first, exactly k per pair."""
import numpy as np

from dualjax.data import mining

PAIRS = [
    ("how do i bake bread", "bread baking at home"),
    ("bread baking at home", "home made bread recipe"),  # same cluster as pair 0
    ("how do i bake a cake", "easy cake recipe"),
    ("how do i fix a bike", "bike repair guide"),
    ("zebra stripes", "why zebras have stripes"),
]


def test_negatives_skip_the_own_cluster_and_rank_by_bm25():
    negatives = mining.mine_hard_negatives(PAIRS, k=2, seed=0)
    assert [len(n) for n in negatives] == [2] * len(PAIRS)
    bread_cluster = {"bread baking at home", "home made bread recipe"}
    for n in negatives[:2]:
        assert not bread_cluster & set(n)
    for (_q, d), n in zip(PAIRS, negatives, strict=True):
        assert d not in n


def test_bm25_order_and_fallback():
    pairs = [("red apple pie", "apple pie recipe"),
             ("green apple", "apple tart"),
             ("apple pie with cream", "pie with cream"),
             ("quantum physics", "physics of quanta")]
    negatives = mining.mine_hard_negatives(pairs, k=3, seed=1)
    # "red apple pie": other-cluster documents sharing words, best first: "apple tart"
    # (apple) and "pie with cream" (pie) beat "physics of quanta" (random fallback, last).
    first = negatives[0]
    assert set(first[:2]) == {"apple tart", "pie with cream"} and first[2] == "physics of quanta"
    # "quantum physics" shares only "physics" with its own document: all three are
    # fallback draws from the other clusters, each once.
    assert sorted(negatives[3]) == sorted(["apple pie recipe", "apple tart", "pie with cream"])
    again = mining.mine_hard_negatives(pairs, k=3, seed=1)
    assert again == negatives  # seeded
    assert mining.mine_hard_negatives(pairs, k=0, seed=1) == [[]] * 4
    assert np.all([len(n) == 3 for n in negatives])


# Four clusters of one query and one document each; every document has two words, every
# word is in two documents: equal lengths and idfs, so a document's BM25 score is the
# number of query-word occurrences it shares (ties: the lower corpus id, i.e. the order
# of the documents below). "to", "in", "near", "cheap" are in no document (ignored).
TRAVEL = [("cheap paris flights", "paris flights"),   # d0
          ("hotels in paris", "paris hotels"),        # d1
          ("flights to rome", "rome flights"),        # d2
          ("rome hotels near rome", "rome hotels")]   # d3


def test_hand_checked_ranking_and_the_one_document_left():
    # "cheap paris flights": d0 is its own; d1 (paris) and d2 (flights) tie, d1 first.
    # "rome hotels near rome": d2 shares "rome" twice, d1 "hotels" once.
    assert mining.mine_hard_negatives(TRAVEL, k=2, seed=0) == [
        ["paris hotels", "rome flights"], ["paris flights", "rome hotels"],
        ["paris flights", "rome hotels"], ["rome flights", "paris hotels"]]
    # k=3: the third is the random fallback, but only one other-cluster document is
    # left (each query matches two of the three), whatever the seed.
    for seed in range(5):
        assert mining.mine_hard_negatives(TRAVEL, k=3, seed=seed) == [
            ["paris hotels", "rome flights", "rome hotels"],
            ["paris flights", "rome hotels", "rome flights"],
            ["paris flights", "rome hotels", "paris hotels"],
            ["rome flights", "paris hotels", "paris flights"]]


# Cluster "alpha": three documents that hold every word of its queries; the three other
# clusters share no word with them, so BM25 finds nothing but the own cluster.
OWN_ONLY = [("alpha beta", "alpha one"), ("alpha one", "alpha two"),
            ("alpha two", "beta three"),
            ("gamma", "delta x"), ("epsilon", "zeta y"), ("eta", "theta z")]
ALPHA = {"alpha beta", "alpha one", "alpha two", "beta three"}
OTHERS = ["delta x", "theta z", "zeta y"]


def test_fallback_when_bm25_finds_only_the_own_cluster():
    for seed in range(10):
        negatives = mining.mine_hard_negatives(OWN_ONLY, k=3, seed=seed)
        assert [len(n) for n in negatives] == [3] * len(OWN_ONLY)
        for n in negatives[:3]:  # all drawn at random: each other-cluster document once
            assert sorted(n) == OTHERS
        for (q, d), n in zip(OWN_ONLY, negatives, strict=True):
            assert d not in n and q not in n
        # k above the other clusters' documents: all of them, then repeats, never "alpha".
        negatives = mining.mine_hard_negatives(OWN_ONLY, k=5, seed=seed)
        for n in negatives[:3]:
            assert len(n) == 5 and sorted(set(n)) == OTHERS and not ALPHA & set(n)


def test_seeded():
    runs = [mining.mine_hard_negatives(OWN_ONLY, k=2, seed=s) for s in range(8)]
    assert runs == [mining.mine_hard_negatives(OWN_ONLY, k=2, seed=s) for s in range(8)]
    assert len({str(r) for r in runs}) > 1  # the seed picks the fallback documents
    # Only the fallback depends on it: BM25's picks are the same for every seed.
    assert len({str(mining.mine_hard_negatives(TRAVEL, k=2, seed=s)) for s in range(8)}) == 1


def test_other_clusters_index_without_listing():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        doc_cluster = rng.integers(0, max(1, n // 3), n)
        others = mining._OtherClusters(doc_cluster)
        for c in (*np.unique(doc_cluster).tolist(), -1, n):
            listed = np.flatnonzero(doc_cluster != c)
            assert others.size(c) == len(listed)
            assert [others.nth(c, u) for u in range(len(listed))] == listed.tolist()


def _whole_corpus_reference(pairs, k, seed, depth):
    """The scan this module replaced: per query, lists every other-cluster document."""
    from dualjax.data import clusters
    from dualjax.retrieval import baselines
    from dualjax.retrieval.task import RetrievalTask
    from dualjax.text.words import normalize
    cluster_of = clusters.cluster_pairs([(normalize(q), normalize(d)) for q, d in pairs])
    docs, doc_cluster, seen = [], [], set()
    for _, d in pairs:
        if normalize(d) not in seen:
            seen.add(normalize(d))
            docs.append(d)
            doc_cluster.append(cluster_of[normalize(d)])
    doc_cluster = np.asarray(doc_cluster)
    queries = list(dict.fromkeys(q for q, _ in pairs))
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.full(len(queries), -1, np.int64))
    ranked = baselines.rank("bm25", task, min(len(docs), depth or 4 * k + 10))
    rng, mined = np.random.default_rng(seed), {}
    for q, row in zip(queries, ranked, strict=True):
        own = cluster_of[normalize(q)]
        row = row[row >= 0]
        picked = [int(j) for j in row[doc_cluster[row] != own][:k]]
        others = np.flatnonzero(doc_cluster != own)
        while len(picked) < k and len(others):
            j = int(rng.choice(others))
            if j not in picked or len(others) <= len(picked):
                picked.append(j)
        mined[q] = [docs[j] for j in picked]
    return [mined[q] for q, _ in pairs]


def test_same_draws_as_the_whole_corpus_scan():
    """Stored datasets keep their negatives: every pick and every seeded draw as before."""
    rng = np.random.default_rng(1)
    words = "apple pie cake bread bike red green tart cream fix bake zebra".split()
    for _ in range(40):
        texts = [" ".join(rng.choice(words, rng.integers(1, 4))) + f" n{rng.integers(30)}"
                 for _ in range(rng.integers(2, 20))]
        pairs = [(str(rng.choice(texts)), str(rng.choice(texts)))
                 for _ in range(rng.integers(1, 16))]
        k, seed, depth = int(rng.integers(1, 6)), int(rng.integers(5)), int(rng.choice([0, 1, 3]))
        assert (mining.mine_hard_negatives(pairs, k, seed, depth)
                == _whole_corpus_reference(pairs, k, seed, depth))


def test_a_query_that_is_a_document_is_not_its_own_pseudo_label():
    pairs, clusters = mining.pseudo_label_pairs(
        ["engine oil", "cake recipe"], ["engine oil", "engine oil change", "a cake recipe"], 1)
    assert pairs == [("engine oil", "engine oil change"), ("cake recipe", "a cake recipe")]
    assert clusters == [0, 1]
