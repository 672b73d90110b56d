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
    for (q, d), n in zip(PAIRS, negatives):
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
