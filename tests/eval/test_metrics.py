"""Hand-computed checks for dualjax.retrieval.metrics."""
import math
import os

import numpy as np
import pytest

from dualjax.retrieval.metrics import recall_curve, retrieval_metrics

KEYS = {"map@100", "recall@1", "recall@5", "recall@10", "recall@50", "recall@100", "mrr@10",
        "success@1", "success@10", "ndcg@10", "ndcg@20", "p@10", "p@20", "num_queries"}


def test_single_query_hand_computed():
    # ranked [5,3,9,1], relevant {3,1,7}: hits [0,1,0,1], R = 3.
    m = retrieval_metrics(np.array([[5, 3, 9, 1]]), [{3, 1, 7}])
    assert set(m) == KEYS
    assert m["num_queries"] == 1 and isinstance(m["num_queries"], int)
    # P@2 = 1/2, P@4 = 2/4 -> AP = (0.5 + 0.5) / 3 = 1/3 (divide by R, not found count).
    assert m["map@100"] == pytest.approx(1 / 3)
    assert m["recall@1"] == pytest.approx(0.0)          # top1 = [5]
    assert m["recall@5"] == pytest.approx(2 / 3)        # 3 at rank 2, 1 at rank 4
    assert m["recall@10"] == pytest.approx(2 / 3)       # found 3 and 1 out of 3
    assert m["recall@50"] == pytest.approx(2 / 3)
    assert m["recall@100"] == pytest.approx(2 / 3)
    assert m["mrr@10"] == pytest.approx(1 / 2)          # first hit at rank 2
    assert m["success@1"] == pytest.approx(0.0)
    assert m["success@10"] == pytest.approx(1.0)
    # DCG = 1/log2(3) + 1/log2(5); IDCG over min(R=3, 10) = 3: 1 + 1/log2(3) + 1/log2(4).
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    assert all(isinstance(v, float) for k, v in m.items() if k != "num_queries")


def test_multiple_queries_average():
    ranked = np.array([
        [5, 3, 9, 1],   # q0: as above.
        [2, 4, 6, 8],   # q1: relevant {2}: hit at rank 1 -> everything 1.0.
        [7, 7, 0, 0],   # q2: relevant {1}: no hit -> everything 0.
    ])
    m = retrieval_metrics(ranked, [{3, 1, 7}, {2}, {1}])
    assert m["num_queries"] == 3
    ndcg0 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3) + 0.5)
    assert m["map@100"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["recall@10"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["success@1"] == pytest.approx(1 / 3)
    assert m["success@10"] == pytest.approx(2 / 3)
    assert m["ndcg@10"] == pytest.approx((ndcg0 + 1 + 0) / 3)
    # P@k over the nominal k, hits counted in the top k: 2, 1 and 0 hits in the top 10.
    assert m["p@10"] == pytest.approx((2 / 10 + 1 / 10 + 0) / 3)
    assert m["p@20"] == pytest.approx((2 / 20 + 1 / 20 + 0) / 3)
    assert m["ndcg@20"] == pytest.approx(m["ndcg@10"])  # no relevant item past rank 10


def test_custom_cutoffs_and_truncation():
    # hits [0,1,0,1], R = 3; cutoff 2 sees only [0,1].
    m = retrieval_metrics(np.array([[5, 3, 9, 1]]), [{3, 1, 7}], ks_recall=(2, 3),
                          ks_success=(2,), map_k=2, mrr_k=1, ndcg_ks=(2,), ks_precision=(2, 3))
    assert set(m) == {"map@2", "recall@2", "recall@3", "mrr@1", "success@2",
                      "ndcg@2", "p@2", "p@3", "num_queries"}
    assert m["p@2"] == pytest.approx(1 / 2) and m["p@3"] == pytest.approx(1 / 3)
    assert m["map@2"] == pytest.approx(0.5 / 3)         # P@2 * 1 / R
    assert m["recall@2"] == pytest.approx(1 / 3)
    assert m["recall@3"] == pytest.approx(1 / 3)        # rank 3 is a miss
    assert m["mrr@1"] == pytest.approx(0.0)             # first hit at rank 2 > 1
    assert m["success@2"] == pytest.approx(1.0)
    # DCG@2 = 1/log2(3); IDCG over min(3, 2) = 2: 1 + 1/log2(3).
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_padding_never_counts():
    # -1 is padding even if -1 is (wrongly) listed as relevant; hits [0,1,0,0].
    m = retrieval_metrics(np.array([[-1, 4, -1, -1]]), [{4, -1}])
    # R = 2 (the set has two entries); AP = P@2 / 2 = (1/2) / 2.
    assert m["map@100"] == pytest.approx(0.25)
    assert m["recall@10"] == pytest.approx(0.5)
    assert m["mrr@10"] == pytest.approx(0.5)
    assert m["success@1"] == pytest.approx(0.0)
    # All padding: nothing found.
    m = retrieval_metrics(np.array([[-1, -1]]), [{1}])
    assert m["map@100"] == m["recall@100"] == m["mrr@10"] == m["ndcg@10"] == 0.0


def test_k_shorter_than_cutoff():
    # K = 2 < every cutoff >= 10; relevant {8, 9, 10}, ranked [8, 9] -> hits [1,1], R = 3.
    m = retrieval_metrics(np.array([[8, 9]]), [{8, 9, 10}])
    assert m["recall@1"] == pytest.approx(1 / 3)
    assert m["recall@10"] == pytest.approx(2 / 3)
    assert m["recall@100"] == pytest.approx(2 / 3)
    assert m["map@100"] == pytest.approx((1 + 1) / 3)   # P@1 = P@2 = 1, / R = 3
    assert m["mrr@10"] == pytest.approx(1.0)
    # IDCG still uses min(R=3, 10) = 3 positions: returning fewer results is not rewarded.
    dcg = 1 + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx(dcg / (dcg + 0.5))


def test_perfect_ranking_is_one():
    ranked = np.array([[1, 2, 3, -1], [7, 0, 0, 0], [4, 5, 6, 9]])
    relevant = [{1, 2, 3}, {7}, {4, 5, 6, 9}]
    m = retrieval_metrics(ranked, relevant, ks_recall=(4, 10, 100))
    for key, value in m.items():
        if key != "num_queries" and not key.startswith("p@"):  # P@k: R / k at best
            assert value == pytest.approx(1.0), key
    assert m["p@10"] == pytest.approx((3 / 10 + 1 / 10 + 4 / 10) / 3)


def test_repeated_id_counts_once():
    # ranked [3, 3], relevant {3, 4}: only the first 3 is a hit -> recall 1/2, not 1.
    m = retrieval_metrics(np.array([[3, 3]]), [{3, 4}])
    assert m["recall@10"] == pytest.approx(0.5)
    assert m["map@100"] == pytest.approx(0.5)           # P@1 * 1 / 2


def test_empty_relevant_raises_with_index():
    with pytest.raises(ValueError, match="query 1"):
        retrieval_metrics(np.array([[1, 2], [3, 4]]), [{1}, set()])
    with pytest.raises(ValueError, match="query 0"):
        recall_curve(np.array([[1, 2]]), [[]])


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        retrieval_metrics(np.array([[1, 2]]), [{1}, {2}])
    with pytest.raises(ValueError):
        retrieval_metrics(np.array([1, 2]), [{1}])


def test_recall_curve_matches_recall_at_k():
    rng = np.random.default_rng(0)
    ranked = np.stack([rng.permutation(50)[:30] for _ in range(6)])
    ranked[0, 20:] = -1
    relevant = [set(rng.choice(50, size=int(rng.integers(1, 8)), replace=False).tolist())
                for _ in range(6)]
    curve = recall_curve(ranked, relevant, max_k=40)
    assert curve.shape == (40,)
    assert np.all(np.diff(curve) >= 0)
    assert np.all(curve[30:] == curve[29])              # flat past K = 30
    for k in (1, 2, 5, 10, 17, 30, 40):
        m = retrieval_metrics(ranked, relevant, ks_recall=(k,))
        assert curve[k - 1] == pytest.approx(m[f"recall@{k}"])


def test_recall_curve_hand_computed():
    # hits [0,1,0,1], R = 3 -> recall@k = 0, 1/3, 1/3, 2/3, 2/3.
    curve = recall_curve(np.array([[5, 3, 9, 1]]), [{3, 1, 7}], max_k=5)
    assert curve == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 2 / 3])


def test_graded_metrics_and_run_files_equal_pytrec_eval(tmp_path):
    """nDCG with the judgements' grades as gains, MAP, recall and MRR equal trec_eval's
    (pytrec_eval) on graded qrels, scored from the TREC run file `report.write_runs`
    writes; with the grades dropped, nDCG differs (the binary gains of before)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    from urllib.parse import unquote

    from dualjax.eval import report
    from dualjax.eval.scoring import Ranking

    rng = np.random.default_rng(0)
    nq, n, k = 40, 60, 30
    # Ids with whitespace (BEIR allows them) gave 7-column lines: escaped, read back.
    corpus_keys = [f"doc-{j}" if j % 7 else f"doc {j}%" for j in range(n)]
    query_keys = [f"q{i}" if i % 5 else f"q\t{i}" for i in range(nq)]
    grades = [{int(j): int(rng.integers(1, 4)) for j in rng.choice(n, rng.integers(1, 8),
                                                                replace=False)}
              for _ in range(nq)]
    ids = np.stack([rng.permutation(n)[:k] for _ in range(nq)])
    ids[3, 20:] = -1  # a short list
    scores = np.where(ids >= 0, -np.arange(k, dtype=np.float64)[None, :], -np.inf)
    folder = report.write_runs(str(tmp_path), "test", {"sys [exact]": Ranking(ids, scores)},
                               query_keys, corpus_keys)
    path = os.path.join(folder, "test_sys.trec")
    run: dict[str, dict[str, float]] = {}
    with open(path) as f:
        for line in f:
            qid, q0, doc, rank, score, tag = line.split()  # 6 columns
            assert q0 == "Q0" and tag == "sys"
            run.setdefault(unquote(qid), {})[unquote(doc)] = float(score)
    assert len(run["q3"]) == 20 and "q\t5" in run
    assert any(" " in doc for ranked in run.values() for doc in ranked)
    assert (report.trec_id("doc 1"), report.trec_id("50%off"), report.trec_id("a b%\u3000")) \
        == ("doc%201", "50%off", "a%20b%25%E3%80%80")
    qrels = {query_keys[i]: {corpus_keys[j]: g for j, g in grades[i].items()}
             for i in range(nq)}
    measures = {"ndcg_cut.10", "ndcg_cut.20", "map_cut.100", "recall.10", "recall.100",
                "recip_rank"}
    ref = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    mean = lambda key: np.mean([ref[q][key] for q in query_keys])
    relevant = [frozenset(g) for g in grades]
    ours = retrieval_metrics(ids, relevant, grades=grades, mrr_k=k)
    assert ours["ndcg@10"] == pytest.approx(mean("ndcg_cut_10"), abs=1e-12)
    assert ours["ndcg@20"] == pytest.approx(mean("ndcg_cut_20"), abs=1e-12)
    assert ours["map@100"] == pytest.approx(mean("map_cut_100"), abs=1e-12)
    assert ours["recall@10"] == pytest.approx(mean("recall_10"), abs=1e-12)
    assert ours["recall@100"] == pytest.approx(mean("recall_100"), abs=1e-12)
    assert ours[f"mrr@{k}"] == pytest.approx(mean("recip_rank"), abs=1e-12)
    binary = retrieval_metrics(ids, relevant)["ndcg@10"]
    assert abs(binary - ours["ndcg@10"]) > 1e-3
