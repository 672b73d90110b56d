"""Tests for the synthetic paraphrase-cluster dataset."""
import collections

import numpy as np
import pytest
import scipy.sparse

from dualjax.data import synthetic
from dualjax.text.words import normalize


@pytest.fixture(scope="module")
def data():
    return synthetic.generate(seed=0)


def _clusters(questions):
    groups = collections.defaultdict(list)
    for q in questions:
        groups[q.cluster].append(q.text)
    return groups


@pytest.mark.slow
def test_deterministic(data):
    assert synthetic.generate(seed=0) == data
    assert synthetic.generate(seed=1) != data
    small = dict(num_train_clusters=50, num_val_clusters=10, num_test_clusters=20)
    assert synthetic.generate(seed=3, **small) == synthetic.generate(seed=3, **small)


def test_default_sizes(data):
    assert set(data.splits) == {"val", "test"}
    # ~3.5 members/cluster: ~5 pairs per train cluster, ~4.5 questions per eval cluster.
    assert 12_000 < len(data.train_pairs) < 18_000
    assert 700 < len(data.splits["val"]) < 1100
    assert 1800 < len(data.splits["test"]) < 2700


def test_lexicon_surface_forms_unique():
    forms = [f for slot in (synthetic.ACTIONS, synthetic.OBJECTS, synthetic.CONTEXTS)
             for group in slot for f in group]
    assert len(forms) == len(set(forms))
    for slot in (synthetic.ACTIONS, synthetic.OBJECTS, synthetic.CONTEXTS):
        assert len(slot) >= 20 and all(2 <= len(g) <= 4 for g in slot)


def test_splits_disjoint(data):
    val, test = (data.splits[k] for k in ("val", "test"))
    val_text = {normalize(q.text) for q in val}
    test_text = {normalize(q.text) for q in test}
    train_text = {normalize(t) for pair in data.train_pairs for t in pair}
    assert len(val_text) == len(val) and len(test_text) == len(test)  # no duplicates
    assert not val_text & test_text
    assert not train_text & (val_text | test_text)
    assert not {q.cluster for q in val} & {q.cluster for q in test}


def test_cluster_sizes_and_distractors(data):
    for name, n_clusters in (("val", 200), ("test", 500)):
        groups = _clusters(data.splits[name])
        sizes = collections.Counter(len(v) for v in groups.values())
        assert set(sizes) <= {1, 2, 3, 4, 5}, sizes
        assert sum(c for s, c in sizes.items() if s >= 2) == n_clusters
        assert sizes[1] == n_clusters  # distractors_per_cluster=1.0, all singletons


def test_train_pairs_are_paraphrase_pairs(data):
    assert all(a != b for a, b in data.train_pairs)
    assert len(set(data.train_pairs)) == len(data.train_pairs)


def test_questions_normalise_non_empty(data):
    texts = [t for pair in data.train_pairs for t in pair]
    texts += [q.text for qs in data.splits.values() for q in qs]
    assert all(normalize(t) for t in texts)
    assert all(t.isascii() for t in texts)


def test_eval_vocabulary_seen_in_training(data):
    train_vocab = {w for pair in data.train_pairs for t in pair for w in normalize(t).split()}
    test_tokens = [w for q in data.splits["test"] for w in normalize(q.text).split()]
    seen = sum(w in train_vocab for w in test_tokens) / len(test_tokens)
    assert seen > 0.98, seen  # only typos should be out of vocabulary


def test_cluster_size_range_parameter():
    d = synthetic.generate(seed=2, num_train_clusters=20, num_val_clusters=10,
                           num_test_clusters=10, cluster_size=(3, 3), distractors_per_cluster=0.5)
    assert len(d.train_pairs) == 20 * 3
    for qs in d.splits.values():
        sizes = collections.Counter(len(v) for v in _clusters(qs).values())
        assert sizes == {3: 10, 1: 5}


def jaccard(rows: list[set], cols: list[set]) -> np.ndarray:
    """The word-Jaccard similarity of every set of `rows` with every set of `cols`
    [len(rows), len(cols)]: the intersections of one sparse product, each value the
    same division as len(a & b) / len(a | b)."""
    vocab = {w: i for i, w in enumerate(set().union(*rows, *cols))}

    def matrix(sets):
        indices = [vocab[w] for s in sets for w in s]
        indptr = np.cumsum([0] + [len(s) for s in sets])
        return scipy.sparse.csr_matrix((np.ones(len(indices)), indices, indptr),
                                       shape=(len(sets), len(vocab)))
    inter = (matrix(rows) @ matrix(cols).T).toarray()
    sizes = lambda sets: np.array([len(s) for s in sets], np.float64)
    return inter / (sizes(rows)[:, None] + sizes(cols)[None, :] - inter)


def test_jaccard_is_the_sets_own():
    rows, cols = [{"a", "b"}, {"c"}], [{"b", "c", "d"}, {"a", "b"}, {"e"}]
    np.testing.assert_array_equal(jaccard(rows, cols), [
        [len(r & c) / len(r | c) for c in cols] for r in rows])


def test_word_overlap_is_not_enough(data):
    """Word-Jaccard nearest neighbour on the test split: well above chance, well below 1."""
    questions = data.splits["test"]
    words = [set(normalize(q.text).split()) for q in questions]
    sizes = collections.Counter(q.cluster for q in questions)
    scores = jaccard(words, words)
    np.fill_diagonal(scores, -1.0)  # (not itself)
    best = scores.argmax(1)  # the first of the best, as a scan keeping the first would
    asked = [i for i, q in enumerate(questions) if sizes[q.cluster] >= 2]
    success = np.mean([questions[best[i]].cluster == questions[i].cluster for i in asked])
    chance = np.mean([(sizes[questions[i].cluster] - 1) / (len(questions) - 1)
                      for i in asked])
    print(f"\nlexical (word-Jaccard) success@1 on test: {success:.3f} "
          f"({len(asked)} queries, chance {chance:.4f})")
    assert max(0.05, 10 * chance) < success < 0.8


def test_distractors_are_lexically_close(data):
    """Each distractor shares most of its words with some question of a real cluster."""
    questions = data.splits["test"]
    sizes = collections.Counter(q.cluster for q in questions)
    members = [set(normalize(q.text).split()) for q in questions if sizes[q.cluster] > 1]
    distractors = [set(normalize(q.text).split()) for q in questions if sizes[q.cluster] == 1]
    close = jaccard(distractors, members).max(1) >= 0.5
    assert close.mean() > 0.9
