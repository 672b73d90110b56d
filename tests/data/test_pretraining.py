"""Pre-training collections and pairs: ICT masking, BFS leads, WLP links, exact resume."""

import json
import os

import numpy as np
import pytest

from dualjax.data import documents, pipeline, pretraining
from dualjax.errors import DataError
from dualjax.text import sides
from dualjax.text import words as text

WIKISPEEDIA = "/work/shared/data/wikispeedia/articles.jsonl"

from helpers import ARTICLES  # noqa: E402  (shared with test_mlm, test_warm_start)


@pytest.fixture
def articles_path(tmp_path):
    path = tmp_path / "articles.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in ARTICLES))
    return str(path)


@pytest.fixture
def collection(articles_path):
    return documents.read_collection(articles_path)


def test_wikispeedia_layout(collection):
    c = collection
    assert c.titles == ["Moon", "Earth", "Sun"]
    assert list(c.article_start) == [0, 4, 6, 7]
    assert list(c.lead_end) == [2, 5, 7]          # the leading section-null paragraphs
    assert c.passage_sentences(1) == ["The Moon is the only natural satellite of Earth.",
                                      "It orbits the planet once every month or so."]
    # Links: the passages of B that mention A's title, else B's first passage.
    links = {(int(p), int(a)) for p, a in c.links}
    assert links == {(1, 1), (3, 1),              # Moon -> Earth: passages 1 and 3 say "Earth"
                     (4, 0),                      # Earth -> Moon: no mention, first passage
                     (4, 2)}                      # Earth -> Sun: "the Sun" in passage 4


def test_ict_masks_the_query_sentence_at_the_rate(collection):
    g = pretraining.PairGenerator(collection, ("ict",), seed=0, mask_rate=0.9)
    # Passages 0 and 3 have one sentence (nothing would be left): never ICT passages.
    assert sorted(g._items["ict"]) == [1, 2, 4, 5, 6]
    kept, n = 0, 2000
    for position in range(n):
        query, document, task = g.pair(position)
        assert task == "ict"
        title, _, passage = document.partition(". ")
        p = next(p for p in range(len(collection.passages))
                 if query in collection.passage_sentences(p))
        sentences = collection.passage_sentences(p)
        assert title == collection.titles[collection.passage_article[p]]
        if query in passage:
            kept += 1
            assert passage == collection.passages[p]
        else:  # removed: the other sentences, in order
            assert passage == " ".join(s for s in sentences if s != query)
    # Binomial(2000, 0.1): mean 200, sd 13.4.
    assert 150 < kept < 250


def test_ict_mask_rate_zero_and_one(collection):
    for rate, expect_in in ((0.0, True), (1.0, False)):
        g = pretraining.PairGenerator(collection, ("ict",), seed=3, mask_rate=rate)
        assert all((q in d) == expect_in for q, d, _ in map(g.pair, range(50)))


def test_bfs_queries_come_from_the_lead(collection):
    g = pretraining.PairGenerator(collection, ("bfs",), seed=0)
    lead_sentences = {a: {s for p in range(collection.article_start[a], collection.lead_end[a])
                          for s in collection.passage_sentences(p)} for a in range(3)}
    # Documents: passages after a lead (Moon 2, 3; Earth 5); the Sun has none.
    assert sorted(g._items["bfs"]) == [2, 3, 5]
    for q, d, _ in map(g.pair, range(200)):
        title = d.partition(". ")[0]
        a = collection.titles.index(title)
        assert q in lead_sentences[a]
        assert q != "Short caption here."                 # under min_query_words
        assert not any(s in d for s in lead_sentences[a])  # the document is outside the lead


def test_max_query_words_cuts_every_sentence_query(collection):
    """data.max_query_words: ICT, BFS and WLP queries and the pseudo-queries are their
    sentence's first words; the documents are as before; 0 leaves them whole."""
    from dualjax.train import weak_labels
    three = pretraining.QueryWords(max=3)
    assert three.cut("a  b c\td e") == "a b c"
    assert three.cut("a  b c") == "a  b c" == pretraining.QueryWords().cut("a  b c")
    tasks = ("ict", "bfs", "wlp")
    whole = pretraining.PairGenerator(collection, tasks, seed=0)
    cut = pretraining.PairGenerator(collection, tasks, seed=0,
                                   query_words=pretraining.QueryWords(max=5))
    sentences = set(collection.sentences)
    longest = 0
    for position in range(60):
        (q, d, task), (q5, d5, task5) = whole.pair(position), cut.pair(position)
        assert (d, task) == (d5, task5) and q in sentences
        assert q5 == " ".join(q.split()[:5])
        longest = max(longest, len(q.split()))
    assert longest > 5                                    # something was cut
    queries, _ = weak_labels.pseudo_queries(collection, 0)
    assert max(len(q.split()) for q in queries) > 5
    assert weak_labels.pseudo_queries(collection, 0, pretraining.QueryWords(max=5))[0] == [
        " ".join(q.split()[:5]) for q in queries]


def test_several_pseudo_queries_of_a_passage(collection):
    """distill.queries_per_passage: up to n distinct long-enough sentences of each
    passage (one crop when it has none), the first the one a single query takes."""
    from dualjax.train import weak_labels
    one, own_one = weak_labels.pseudo_queries(collection, 0)
    three, own = weak_labels.pseudo_queries(collection, 0, per_passage=3)
    np.testing.assert_array_equal(own_one, np.arange(len(collection.passages)))
    assert len(three) > len(one) and np.all(np.diff(own) >= 0)
    for p in range(len(collection.passages)):
        mine = [q for q, o in zip(three, own, strict=True) if o == p]
        long = [s for s in collection.passage_sentences(p) if len(s.split()) >= 5]
        assert mine[0] == one[p] and len(mine) == max(1, min(3, len(long)))
        assert len(set(mine)) == len(mine) and (not long or set(mine) <= set(long))


def test_wlp_pairs_a_lead_sentence_with_a_linking_passage(collection):
    g = pretraining.PairGenerator(collection, ("wlp",), seed=0)
    seen = set()
    for q, d, _ in map(g.pair, range(200)):
        target = next(a for a in range(3) if q in " ".join(
            collection.passages[collection.article_start[a]:collection.lead_end[a]]))
        source = collection.titles.index(d.partition(". ")[0])
        assert source != target
        assert ARTICLES[target]["id"] in ARTICLES[source]["links"]
        seen.add((source, target))
    assert seen == {(0, 1), (1, 0), (1, 2)}


def test_mixture_interleaves_tasks_and_is_a_function_of_seed_and_position(collection):
    tasks = ("ict", "bfs", "wlp")
    g = pretraining.PairGenerator(collection, tasks, seed=7)
    pairs = [g.pair(p) for p in range(30)]
    assert [t for _, _, t in pairs] == list(tasks) * 10
    again = pretraining.PairGenerator(collection, tasks, seed=7)
    assert [again.pair(p) for p in reversed(range(30))] == pairs[::-1]  # any order
    other = pretraining.PairGenerator(collection, tasks, seed=8)
    assert [other.pair(p) for p in range(30)] != pairs
    # A passage coming round again (a later epoch) gets a fresh sentence draw.
    ict = pretraining.PairGenerator(collection, ("ict",), seed=0, mask_rate=0.0)
    per_passage = {}
    for q, d, _ in map(ict.pair, range(400)):
        per_passage.setdefault(d, set()).add(q)
    assert all(len(qs) == 2 for qs in per_passage.values())


def test_generated_iterator_resumes_exactly(collection):
    g = pretraining.PairGenerator(collection, ("ict", "bfs", "wlp"), seed=0)
    tok = text.build_word_tokenizer(g.texts(), vocab_size=100, num_oov_buckets=5)
    inputs = sides.Inputs(sides.Side(tok, 8), sides.Side(tok, 24))
    it = pipeline.generated_iterator(g, inputs, global_batch_size=4)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    resumed = pipeline.generated_iterator(g, inputs, global_batch_size=4)
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    # Batch b holds positions 4b .. 4b+3.
    q, _ = inputs.query.tokenizer.encode([g.pair(p)[0] for p in range(12, 16)], 8)
    np.testing.assert_array_equal(expected[0]["q_ids"], q)


def test_squad_collection_links_by_title_mentions(tmp_path):
    squad = {"data": [
        {"title": "Super_Bowl", "paragraphs": [
            {"context": "The Super Bowl is a game. It is played in Paris sometimes.", "qas": []},
            {"context": "Tickets are costly for the final. Fans travel very far.", "qas": []}]},
        {"title": "Paris", "paragraphs": [
            {"context": "Paris is a city in France. It hosted a Super Bowl party.", "qas": []}]},
    ]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(squad))
    c = documents.read_collection(str(path))
    assert c.titles == ["Super Bowl", "Paris"]
    assert list(c.lead_end) == [1, 3]             # the first paragraph is the lead
    assert {(int(p), int(a)) for p, a in c.links} == {(0, 1), (2, 0)}


def test_beir_corpus_is_one_passage_per_article_and_ict_only(tmp_path):
    folder = tmp_path / "beir"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text(
        json.dumps({"_id": "1", "title": "Waves", "text": "Waves carry energy in media. "
                                                          "They reflect at boundaries often."})
        + "\n" + json.dumps({"_id": "2", "text": "no punctuation here at all"}) + "\n")
    c = documents.read_collection(str(folder))
    assert c.titles == ["Waves", ""] and c.passages[1] == "no punctuation here at all"
    assert list(c.lead_end) == [0, 1] and len(c.links) == 0
    g = pretraining.PairGenerator(c, ("ict",), seed=0, mask_rate=1.0)
    assert g.pair(0)[1] in ("Waves. They reflect at boundaries often.",
                            "Waves. Waves carry energy in media.")
    with pytest.raises(DataError, match="BFS"):
        pretraining.PairGenerator(c, ("bfs",), seed=0)


def test_plain_text_articles_are_split_into_passages(tmp_path):
    path = tmp_path / "docs.jsonl"
    body = " ".join(f"Sentence number {i} has six words." for i in range(10))
    path.write_text(json.dumps({"title": "Doc", "text": body}) + "\n")
    c = documents.read_collection(str(path), passage_words=20)
    assert [len(text.words(p)) for p in c.passages] == [18, 18, 18, 6]  # 3 sentences each
    assert c.passages[0].startswith("Sentence number 0 has") and list(c.lead_end) == [1]


@pytest.mark.parametrize("line, fragment", [
    ("not json", "malformed JSON"),
    ('{"title": "x"}', 'needs "paragraphs"'),
    ('{"id": "a", "text": "x", "links": ["b"]}', "unknown article id 'b'"),
])
def test_bad_lines_name_the_line(tmp_path, line, fragment):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "ok", "text": "Fine text here."}\n' + line + "\n")
    with pytest.raises(DataError, match=f"docs.jsonl:2: .*{fragment}"):
        documents.read_collection(str(path))


def test_collection_is_cached(articles_path, tmp_path):
    first = documents.read_collection(articles_path, cache_dir=str(tmp_path / "cache"))
    [cached] = os.listdir(tmp_path / "cache")
    again = documents.read_collection(articles_path, cache_dir=str(tmp_path / "cache"))
    assert again.to_json() == first.to_json() and os.listdir(tmp_path / "cache") == [cached]


def test_parse_tasks():
    assert pretraining.parse_tasks(" ict , wlp") == ("ict", "wlp")
    for bad in ("", "ict,ict", "mlm2"):
        with pytest.raises(ValueError, match="data.tasks"):
            pretraining.parse_tasks(bad)


def _wikispeedia_head(tmp_path, n):
    """The first n Wikispeedia articles (links to articles outside them dropped)."""
    lines = []
    with open(WIKISPEEDIA) as f:
        for _ in range(n):
            lines.append(json.loads(f.readline()))
    ids = {a["id"] for a in lines}
    for a in lines:
        a["links"] = [x for x in a["links"] if x in ids]
    path = tmp_path / "wiki.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in lines))
    return documents.read_collection(str(path))


@pytest.mark.skipif(not os.path.exists(WIKISPEEDIA), reason="Wikispeedia articles absent")
def test_real_wikispeedia_lead_and_links(tmp_path):
    c = _wikispeedia_head(tmp_path, 200)
    assert c.num_articles == 200
    assert all(c.lead_end[a] > c.article_start[a] for a in range(200))  # every one has a lead
    g = pretraining.PairGenerator(c, ("ict", "bfs", "wlp"), seed=0)
    assert all(g.num_items(t) > 100 for t in g.tasks)
    assert all(len(q.split()) >= 5 for q, _, _ in map(g.pair, range(300)))


@pytest.mark.skipif(not os.path.exists(WIKISPEEDIA), reason="Wikispeedia articles absent")
@pytest.mark.slow
def test_real_wikispeedia_ict_removes_every_occurrence_of_the_query(tmp_path):
    # Wikipedia repeats image captions ("X Enlarge X"), sentences, and captions the
    # splitter cuts differently, so a query's text can be elsewhere in its passage: as
    # another sentence, inside one, or across two joined by a space.
    c = _wikispeedia_head(tmp_path, 300)
    g = pretraining.PairGenerator(c, ("ict",), seed=0, mask_rate=1.0)
    n = g.num_items("ict")  # 8,723 passages
    pairs = [g.pair(p) for p in range(n)]
    # The same queries with nothing removed: whole passages, ~3% holding theirs twice.
    whole = pretraining.PairGenerator(c, ("ict",), seed=0, mask_rate=0.0)
    assert sum(d.count(q) > 1 for q, d, _ in map(whole.pair, range(n))) > 200
    assert [q for q, d, _ in pairs if q in d] == []
    # Kept at the rate (ORQA): Binomial(n, 0.1) has sd 0.0032 as a fraction.
    g = pretraining.PairGenerator(c, ("ict",), seed=0, mask_rate=0.9)
    kept = np.mean([q in d for q, d, _ in map(g.pair, range(n))])
    assert abs(kept - 0.1) < 0.015


def test_remove_text_removes_every_occurrence_and_those_a_removal_joins():
    q = "Map of the old town."
    assert pretraining.remove_text(f"{q} Enlarge {q} It is old.", q) == "Enlarge It is old."
    assert pretraining.remove_text("Map of the old", q) == "Map of the old"
    assert pretraining.remove_text("x x y y", "x y") == ""   # "x  y" is left after one pass


def _plain_text_file(tmp_path, rows):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# docs/pretraining.md: a .jsonl of articles "with a plain "text" (and optional "title")": no ids, no
# links. Long enough for two passages at passage_words=20 (a lead and one for BFS).
PLAIN = [{"text": " ".join(f"Topic {k} sentence number {i} has seven words." for i in range(5))}
         for k in range(3)]


def test_plain_text_documents_need_no_title_or_id(tmp_path):
    rows = [*PLAIN, {"_id": "d1", "text": "A BEIR style line with its own id here."},
            {"title": "Same", "text": "One of two lines with the same title here."},
            {"title": "Same", "text": "The other of two lines with that title here."}]
    c = documents.read_collection(_plain_text_file(tmp_path, rows), passage_words=20)
    assert c.titles == ["", "", "", "", "Same", "Same"] and len(c.links) == 0
    assert list(c.article_start) == [0, 3, 6, 9, 10, 11, 12]  # 3 passages of <= 20 words
    g = pretraining.PairGenerator(c, ("ict", "bfs"), seed=0)
    assert g.num_items("bfs") == 6 and all(q for q, _, _ in map(g.pair, range(10)))


@pytest.mark.parametrize("rows, fragment", [
    ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "2: duplicate article id 'a'"),
    ([{"_id": "a", "text": "x"}, {"_id": "a", "text": "y"}], "2: duplicate article id 'a'"),
    ([{"title": "T", "text": "x"}, {"title": "T", "text": "y"},
      {"id": "b", "text": "z", "links": ["T"]}], "3: \"links\" names 'T', the title of lines 1"),
])
def test_duplicate_ids_and_ambiguous_links_name_the_line(tmp_path, rows, fragment):
    with pytest.raises(DataError, match=f"docs.jsonl:{fragment}"):
        documents.read_collection(_plain_text_file(tmp_path, rows))


def test_plain_text_pretraining_as_the_readme_says(tmp_path):
    """configs/pretrain.py on plain "text" lines: its default tasks need links (WLP),
    and the error says which tasks the collection does have pairs for."""
    from conftest import load_config, tasks_of

    from dualjax.config import validation as config_lib
    cfg = load_config("pretrain")
    cfg.data.path = _plain_text_file(tmp_path, PLAIN)
    cfg.data.passage_words = 20
    config_lib.validate(cfg, 1)
    [task] = tasks_of(cfg, str(tmp_path / "run"))
    with pytest.raises(DataError, match=r"nothing to make WLP pairs from \(links.*; it has "
                                        r"pairs for ict, bfs, crop: use e\.g\. "
                                        r"--config\.data\.tasks=ict,bfs$"):
        _ = task.train_source
    cfg.data.tasks = "ict,bfs"
    [task] = tasks_of(cfg, str(tmp_path / "run"))
    assert [t for _, _, t in map(task.train_source.pair, range(4))] == ["ict", "bfs"] * 2
