"""Hand-computed checks for dualjax.retrieval.baselines (identity / TF-IDF cosine and BM25)."""
import math

import numpy as np
import pytest

from dualjax.data.clusters import RetrievalTask, task_from_clusters
from dualjax.retrieval import baselines
from dualjax.retrieval.metrics import retrieval_metrics
from dualjax.text.words import words

# Query "the cat" against a corpus where the common word "the" and the rare word "cat"
# pull in different directions.
CORPUS = ["the the the fish", "cat fish fish", "the dog", "the bird"]
QUERY = "The cat?"  # Normalised to "the cat".


def _task(corpus: list[str], queries: list[str], own: list[int] | None = None
          ) -> RetrievalTask:
    own = [-1] * len(queries) if own is None else own
    return RetrievalTask(corpus=corpus, queries=queries,
                         relevant=[frozenset({0})] * len(queries),
                         query_corpus_index=np.asarray(own, dtype=np.int64))


def test_identity_cosine_hand_computed():
    # Raw counts. q = (the 1, cat 1), |q| = sqrt(2).
    # d0 = (the 3, fish 1), |d0| = sqrt(10): dot 3 -> 3 / sqrt(20) = 0.67082
    # d1 = (cat 1, fish 2), |d1| = sqrt(5):  dot 1 -> 1 / sqrt(10) = 0.31623
    # d2 = (the 1, dog 1), |d2| = sqrt(2):   dot 1 -> 1 / 2        = 0.5
    # d3 = (the 1, bird 1): same as d2       -> 0.5 (exact tie; lower id first)
    expected = [3 / math.sqrt(20), 1 / math.sqrt(10), 0.5, 0.5]
    np.testing.assert_allclose(baselines.scores("identity", CORPUS, [QUERY])[0], expected)
    ranked = baselines.rank("identity", _task(CORPUS, [QUERY]), k=4)
    assert ranked.tolist() == [[0, 2, 3, 1]]
    assert ranked.dtype == np.int64


def test_tfidf_cosine_hand_computed():
    # N = 4; df: the 3, fish 2, cat 1, dog 1, bird 1. idf = ln((1 + N) / (1 + df)) + 1:
    #   the: ln(5/4) + 1 = 1.22314; fish: ln(5/3) + 1 = 1.51083; cat/dog/bird: ln(5/2) + 1 = 1.91629
    # q  = (the 1.22314, cat 1.91629),          |q|  = sqrt(1.49607 + 3.67217) = 2.27338
    # d0 = (the 3 * 1.22314, fish 1.51083),     |d0| = sqrt(13.4647 + 2.28261) = 3.96829
    #      dot = 1.22314 * 3.66943 = 4.48824 -> 4.48824 / (2.27338 * 3.96829) = 0.49751
    # d1 = (cat 1.91629, fish 2 * 1.51083),     |d1| = sqrt(3.67217 + 9.13043) = 3.57808
    #      dot = 1.91629^2 = 3.67217         -> 3.67217 / (2.27338 * 3.57808) = 0.45144
    # d2 = (the 1.22314, dog 1.91629), |d2| = |q|: dot 1.49607 -> 1.49607 / 5.16824 = 0.28947
    # d3: same as d2. The rare "cat" lifts d1 above d2 and d3 (identity ranks it last).
    idf = {w: math.log(5 / (1 + df)) + 1 for w, df in
           {"the": 3, "fish": 2, "cat": 1, "dog": 1}.items()}
    q_norm = math.hypot(idf["the"], idf["cat"])
    expected = [
            idf["the"] * 3 * idf["the"] / (q_norm * math.hypot(3 * idf["the"], idf["fish"])),
            idf["cat"] ** 2 / (q_norm * math.hypot(idf["cat"], 2 * idf["fish"])),
            idf["the"] ** 2 / q_norm ** 2,
            idf["the"] ** 2 / q_norm ** 2,
    ]
    got = baselines.scores("tfidf", CORPUS, [QUERY])[0]
    np.testing.assert_allclose(got, expected)
    np.testing.assert_allclose(got, [0.49751, 0.45144, 0.28947, 0.28947], atol=1e-5)
    assert baselines.rank("tfidf", _task(CORPUS, [QUERY]), k=4).tolist() == [[0, 1, 2, 3]]


def test_tfidf_sublinear_tf():
    # tf -> 1 + ln(tf): "the" in d0 weighs (1 + ln 3) * 1.22314 = 2.56689, "fish" in d1
    # (1 + ln 2) * 1.51083 = 2.55806.
    # d0: dot 1.22314 * 2.56689 = 3.13967, |d0| = sqrt(6.58893 + 2.28261) = 2.97851 -> 0.46368
    # d1: dot 3.67217, |d1| = sqrt(3.67217 + 6.54367) = 3.19622               -> 0.50538
    # so d1 now beats d0.
    got = baselines.scores("tfidf", CORPUS, [QUERY], sublinear=True)[0]
    np.testing.assert_allclose(got, [0.46368, 0.50538, 0.28947, 0.28947], atol=1e-5)
    ranked = baselines.rank("tfidf", _task(CORPUS, [QUERY]), k=4, sublinear=True)
    assert ranked.tolist() == [[1, 0, 2, 3]]


def _bm25_direct(corpus: list, query, k1: float, b: float) -> np.ndarray:
    """BM25 scores [len(corpus)] as bm25s "lucene" defines them (no (k1 + 1) factor);
    texts are split into words, lists of terms taken as they are."""
    split = lambda x: x if isinstance(x, list) else words(x)
    docs = [split(d) for d in corpus]
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = np.zeros(n)
    for t in split(query):  # Repeated query words count again.
        df = sum(t in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(t)
            out[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return out


PLAIN = {"k1": 1.2, "b": 0.75, "stemmer": ""}  # dualjax's BM25 before 2026-11


def test_analyze_as_lucenes_english_analyzer():
    """Lowercased words, possessives cut, Lucene's English stopwords out, stemmed; every
    script's letters kept, CJK ideographs one term each."""
    assert baselines.analyze("The runner's shoes were RUNNING, and it rained.") == \
        ["runner", "shoe", "were", "run", "rain"]
    assert baselines.analyze("The runner's shoes", "porter") == ["runner", "shoe"]
    assert baselines.analyze("don't stop 3.5 km") == ["don't", "stop", "3.5", "km"]
    assert baselines.analyze("Привет мир, 東京 café") == ["привет", "мир", "東", "京", "café"]
    assert baselines.analyze("The runner's shoes", "") == ["the", "runner", "s", "shoes"]
    assert baselines.analyze("the and of") == []


def test_bm25_defaults_are_pyserinis_beir_flat():
    """k1 0.9, b 0.4 over stemmed, stopworded terms: a query finds a document by its stem,
    and stopwords neither match nor count towards the length."""
    corpus = ["cats running in the gardens", "a dog", "the the the the of of of of cat"]
    want = _bm25_direct([["cat", "run", "garden"], ["dog"], ["cat"]], ["cat", "garden"],
                        0.9, 0.4)
    np.testing.assert_allclose(baselines.scores("bm25", corpus, ["The cat's garden"])[0], want,
                               rtol=1e-12)
    # The plain form matches neither word in document 0 ("cats", "gardens").
    assert baselines.scores("bm25", corpus, ["cat garden"], **PLAIN)[0][0] == 0
    assert baselines.scores("bm25", corpus, ["cat garden"])[0][0] > 0
    with pytest.raises(ValueError, match="unknown stemmer"):
        baselines.scores("bm25", corpus, ["cat"], stemmer="lancaster")


def test_bm25_hand_computed():
    corpus = ["cat sat mat", "cat cat", "dog sat", "bird"]
    # N = 4, avgdl = 8 / 4 = 2; df(cat) = df(sat) = 2 -> idf = ln(1 + 2.5 / 2.5) = ln 2.
    # d0: |d| = 3, K = 1.2 * (0.25 + 0.75 * 3/2) = 1.65; cat, sat tf 1: 2 * ln2 / 2.65 = 0.523130
    # d1: |d| = 2, K = 1.2;  cat tf 2: ln2 * 2 / 3.2 = 0.433217
    # d2: |d| = 2, K = 1.2;  sat tf 1: ln2 / 2.2     = 0.315067
    # d3: no shared word -> 0, never returned.
    ln2 = math.log(2)
    expected = [2 * ln2 / 2.65, ln2 * 2 / 3.2, ln2 / 2.2, 0.0]
    got = baselines.scores("bm25", corpus, ["cat sat"], **PLAIN)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(got, _bm25_direct(corpus, "cat sat", 1.2, 0.75), rtol=1e-12)
    assert baselines.rank("bm25", _task(corpus, ["cat sat"]), k=4, **PLAIN).tolist() == \
        [[0, 1, 2, -1]]


def test_bm25_matches_direct_formula_with_options():
    corpus = ["a b c d e f", "a a b", "c", "b b b b c", "e f g", "a c e g g"]
    queries = ["a b", "c c e", "g a f", "b"]
    for k1, b in [(1.2, 0.75), (2.0, 0.3), (0.5, 1.0)]:
        got = baselines.scores("bm25", corpus, queries, k1=k1, b=b, stemmer="")
        want = np.stack([_bm25_direct(corpus, q, k1, b) for q in queries])
        np.testing.assert_allclose(got, want, rtol=1e-12)
        ranked = baselines.rank("bm25", _task(corpus, queries), k=len(corpus), k1=k1, b=b,
                                stemmer="")
        for row, w in zip(ranked, want, strict=True):
            positive = np.flatnonzero(w > 0)
            # Best first, ties by lower id (stable sort of -score).
            ref = positive[np.argsort(-w[positive], kind="stable")]
            assert row[:len(ref)].tolist() == ref.tolist()
            assert (row[len(ref):] == -1).all()
    # b = 0 ignores length: "c" (|d| = 1) and "b b b b c" (|d| = 5) score the same on "c".
    s = baselines.scores("bm25", corpus, ["c"], b=0.0, stemmer="")[0]
    assert s[2] == pytest.approx(s[3]) and s[2] > 0
    s = baselines.scores("bm25", corpus, ["c"], **PLAIN)[0]
    assert s[2] > s[3]


def test_bm25_agrees_with_bm25s_retrieve():
    bm25s = pytest.importorskip("bm25s")
    corpus = ["the quick brown fox", "a quick dog jumps high", "brown dogs and foxes",
              "slow brown fox sleeps", "dog", "quick quick fox"]
    queries = ["quick fox", "brown dog", "sleeps"]
    model = bm25s.BM25(k1=1.2, b=0.75)
    model.index([words(d) for d in corpus], show_progress=False)
    docs, scores = model.retrieve([words(q) for q in queries], k=len(corpus),
                                  show_progress=False)
    ours = baselines.rank("bm25", _task(corpus, queries), k=len(corpus), **PLAIN)
    ours_scores = baselines.scores("bm25", corpus, queries, **PLAIN)
    for q in range(len(queries)):
        positive = scores[q] > 0  # bm25s also returns zero-score documents; we do not.
        assert positive.any()
        assert ours[q, :positive.sum()].tolist() == docs[q][positive].tolist()
        assert (ours[q, positive.sum():] == -1).all()
        np.testing.assert_allclose(ours_scores[q, docs[q]], scores[q], rtol=1e-5)


@pytest.mark.parametrize("system", baselines.BASELINES)
def test_never_retrieves_itself(system):
    # Each query is a corpus text; its own entry would score highest.
    corpus = ["red apple pie", "red apple", "apple", "blue sky", "sky blue today", "red"]
    own = [0, 1, 3, 5]
    task = _task(corpus, [corpus[i] for i in own], own)
    ranked = baselines.rank(system, task, k=len(corpus))
    for row, i in zip(ranked, own, strict=True):
        assert i not in row.tolist()
    # Without exclusion each query would rank itself first.
    s = baselines.scores(system, corpus, task.queries)
    assert [int(np.argmax(r)) for r in s] == own
    # The remaining order: "red apple pie" -> "red apple" first; "red" -> the red texts.
    assert ranked[0, 0] == 1
    assert sorted(ranked[3][ranked[3] >= 0].tolist()) == [0, 1]


@pytest.mark.parametrize("system", baselines.BASELINES)
def test_padding_and_unknown_words(system):
    corpus = ["cat", "cat dog", "", "fish"]
    task = _task(corpus, ["cat", "zebra!!", "", "cat"], own=[0, -1, -1, -1])
    ranked = baselines.rank(system, task, k=6)
    assert ranked.shape == (4, 6)
    # Query 0 is corpus 0: only "cat dog" remains; the empty and "fish" docs never match.
    assert ranked[0].tolist() == [1, -1, -1, -1, -1, -1]
    # No word in the corpus vocabulary (or no word at all): nothing is returned.
    assert (ranked[1] == -1).all() and (ranked[2] == -1).all()
    assert ranked[3].tolist() == [0, 1, -1, -1, -1, -1]


@pytest.mark.parametrize("system", baselines.BASELINES)
def test_ties_broken_by_lower_id(system):
    corpus = ["x y"] * 5 + ["y x", "z"]  # Identical bags of words: exact score ties.
    task = _task(corpus, ["x", "y x", "x"], own=[-1, 5, 2])
    ranked = baselines.rank(system, task, k=4)
    assert ranked.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 3, 4]]
    assert (baselines.rank(system, task, k=4) == ranked).all()


def test_top_k_block_matches_stable_sort(monkeypatch):
    # Integer scores give many ties, zeros, negatives and -inf; a small subsample minimum
    # makes the strided lower-bound threshold path run with stride > 1.
    monkeypatch.setattr(baselines, "_SUBSAMPLE_MIN", 4)
    rng = np.random.default_rng(0)
    block = rng.integers(-2, 6, size=(30, 97)).astype(np.float64)
    block[rng.random(block.shape) < 0.05] = -np.inf
    block[3] = 0.0  # No positive score at all.
    for k in (1, 3, 10, 50, 97, 120):
        got = baselines._top_k_block(block, k)
        assert got.shape == (30, k)
        for row, out in zip(block, got, strict=True):
            ref = [j for j in np.argsort(-row, kind="stable") if row[j] > 0][:k]
            assert out.tolist() == ref + [-1] * (k - len(ref))


def test_chunked_and_threaded_equals_single_block(monkeypatch):
    rng = np.random.default_rng(1)
    vocab = [f"w{i}" for i in range(12)]
    corpus = [" ".join(rng.choice(vocab, size=rng.integers(1, 6))) for _ in range(40)]
    own = rng.integers(-1, 40, size=25)
    task = _task(corpus, [corpus[i] if i >= 0 else "w1 w2" for i in own], own.tolist())
    for system in baselines.BASELINES:
        whole = baselines.rank(system, task, k=7)
        monkeypatch.setattr(baselines, "_BLOCK_ELEMENTS", 3 * len(corpus))  # 3 queries/block.
        monkeypatch.setattr(baselines, "_SUBSAMPLE_MIN", 4)
        monkeypatch.setattr(baselines.os, "cpu_count", lambda: 4)
        chunked = baselines.rank(system, task, k=7)
        monkeypatch.undo()
        assert (chunked == whole).all()
        assert not (whole == own[:, None]).any()
        assert (whole[:, 0] >= 0).all()


def test_retrieval_metrics_on_identity_ranking():
    texts = ["red apple", "apple red fruit salad", "red apple pie", "blue sky",
             "sky blue today"]
    task = task_from_clusters(texts, [0, 0, 1, 2, 2])
    assert task.queries == ["red apple", "apple red fruit salad", "blue sky", "sky blue today"]
    ranked = baselines.rank("identity", task, k=10)
    # q0 "red apple": pie 2 / (sqrt2 sqrt3) = 0.8165 > salad 2 / (sqrt2 * 2) = 0.7071.
    # q1 "apple red fruit salad": "red apple" 0.7071 > pie 2 / (2 sqrt3) = 0.5774.
    # q2 / q3: each other, 2 / (sqrt2 sqrt3) = 0.8165; nothing else shares a word.
    assert ranked[:, :3].tolist() == [[2, 1, -1], [0, 2, -1], [4, -1, -1], [3, -1, -1]]
    m = retrieval_metrics(ranked, task.relevant)
    # One relevant item each; q0 finds it at rank 2, the others at rank 1.
    assert m["num_queries"] == 4
    assert m["recall@1"] == pytest.approx(3 / 4)
    assert m["recall@10"] == pytest.approx(1.0)
    assert m["success@1"] == pytest.approx(3 / 4)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 3) / 4)
    assert m["map@100"] == pytest.approx((1 / 2 + 3) / 4)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3) + 3) / 4)


def test_bad_arguments():
    task = _task(CORPUS, [QUERY])
    with pytest.raises(ValueError, match="unknown baseline"):
        baselines.rank("dense", task, k=3)
    with pytest.raises(ValueError, match="unknown options"):
        baselines.rank("identity", task, k=3, sublinear=True)
    with pytest.raises(ValueError, match="unknown options"):
        baselines.rank("bm25", task, k=3, k3=1.0)
    with pytest.raises(ValueError, match="k must be"):
        baselines.rank("tfidf", task, k=0)
