"""Tests for dualjax.data.reqa: ReQA sentence retrieval on SQuAD-format files."""
import json
import os

import numpy as np
import pytest

from dualjax.data import clusters, reqa
from dualjax.data.reqa import load_reqa_squad, read_squad
from dualjax.errors import DataError

REAL_SQUAD = "/work/shared/data/squad/dev-v1.1.json"


# Hand-split: each article's paragraphs with their sentences, and each question
# with the candidates (sentences) holding its answers, the first answer's first.
A0P0 = "Mr. Smith lives in Paris. He was born in 1950. His dog is called Rex."
A0P1 = "The city is large. It has a river."
A1P0 = "Water boils at 100 degrees. Ice melts at 0 degrees."
A1P1 = "It has a river. Fish swim there."
A2P0 = "Gamma rays are light. They are energetic."
CANDIDATES = [
    (0, "Mr. Smith lives in Paris."), (0, "He was born in 1950."), (0, "His dog is called Rex."),
    (0, "The city is large."), (0, "It has a river."),
    (1, "Water boils at 100 degrees."), (1, "Ice melts at 0 degrees."),
    (1, "It has a river."), (1, "Fish swim there."),
    (2, "Gamma rays are light."), (2, "They are energetic."),
]
PARAGRAPH_OF = [A0P0] * 3 + [A0P1] * 2 + [A1P0] * 2 + [A1P1] * 2 + [A2P0] * 2
QUESTIONS = [  # (article, question, relevant candidate ids)
    (0, "Where does Smith live?", [0]),
    (0, "When was he born?", [1]),
    (0, "What is the dog called?", [2, 1]),
    (0, "Is there a river?", [4]),
    (0, "How big is the city?", [3]),
    (1, "When does water boil?", [5]),
    (1, "What swims there?", [8]),
    (2, "What are gamma rays?", [9]),
]


def _qa(question: str, context: str, *answers: str | int) -> dict:
    """A SQuAD question; an answer is a substring of the context or a start."""
    return {"question": question, "id": question, "answers": [
        {"text": a if isinstance(a, str) else context[a:a + 3],
         "answer_start": context.index(a) if isinstance(a, str) else a} for a in answers]}


def _squad() -> dict:
    return {"version": "1.1", "data": [
        {"title": "Alpha", "paragraphs": [
            {"context": A0P0, "qas": [
                _qa("Where does Smith live?", A0P0, "Paris", "Paris", "in Paris"),
                _qa("When was he born?", A0P0, "1950", "born in 1950"),
                _qa("What is the dog called?", A0P0, "Rex", "1950"),
            ]},
            {"context": A0P1, "qas": [
                # Starts in the space between the sentences: the next one holds it.
                _qa("Is there a river?", A0P1, A0P1.index(" It has")),
                # Crosses the boundary: the sentence of its start.
                _qa("How big is the city?", A0P1, "large. It"),
            ]},
        ]},
        {"title": "Beta", "paragraphs": [
            {"context": A1P0, "qas": [_qa("When does water boil?", A1P0, "100")]},
            {"context": A1P1, "qas": [_qa("What swims there?", A1P1, "Fish")]},
        ]},
        {"title": "Gamma", "paragraphs": [
            {"context": A2P0, "qas": [
                _qa("What are gamma rays?", A2P0, "light"),
                {"question": "Unanswerable?", "id": "u", "answers": []},
            ]},
        ]},
    ]}


def _write(tmp_path, obj) -> str:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    return str(path)


def _load(path, **settings):
    return load_reqa_squad({"path": path, "seed": 0, "val_fraction": 1 / 3,
                            "test_fraction": 1 / 3, "candidates": "split",
                            "context": False, **settings})


def test_read_squad_candidates_and_relevant_sentences(tmp_path):
    squad = read_squad(_write(tmp_path, _squad()))
    assert squad.num_articles == 3
    assert squad.candidates == CANDIDATES
    assert squad.questions == [(a, q, rel) for a, q, rel in QUESTIONS]


def test_unanswered_questions_are_skipped_and_logged(tmp_path, monkeypatch):
    messages = []
    monkeypatch.setattr(reqa.logging, "info", lambda msg, *args: messages.append(msg % args))
    read_squad(_write(tmp_path, _squad()))
    assert any("skipped 1 question(s) without answers" in m for m in messages), messages


def _split_of_articles(seed: int) -> list[str]:
    fractions = {"train": 1 / 3, "val": 1 / 3, "test": 1 / 3}
    return [list(fractions)[i] for i in clusters.split_clusters(3, fractions, seed)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_split_by_article_with_split_candidates(tmp_path, seed):
    raw = _load(_write(tmp_path, _squad()), seed=seed)
    split = _split_of_articles(seed)
    assert sorted(split) == ["test", "train", "val"]  # one article each
    train = [(q, CANDIDATES[rel[0]][1]) for a, q, rel in QUESTIONS if split[a] == "train"]
    assert raw.train_pairs == train
    assert set(raw.tasks) == {"val", "test"}
    for name, task in raw.tasks.items():
        (article,) = [a for a, s in enumerate(split) if s == name]
        assert task.corpus == [t for a, t in CANDIDATES if a == article]
        mine = [(q, rel) for a, q, rel in QUESTIONS if a == article]
        assert task.queries == [q for q, _ in mine]
        assert [{task.corpus[i] for i in r} for r in task.relevant] == [
            {CANDIDATES[c][1] for c in rel} for _, rel in mine]
        np.testing.assert_array_equal(task.query_corpus_index, [-1] * len(mine))


def test_all_candidates_merge_identical_texts(tmp_path):
    raw = _load(_write(tmp_path, _squad()), candidates="all", seed=0)
    texts = [t for _, t in CANDIDATES]
    merged = texts[:7] + texts[8:]  # the second "It has a river." is merged
    for _name, task in raw.tasks.items():
        assert task.corpus == merged
        for query, rel in zip(task.queries, task.relevant, strict=True):
            (expected,) = [r for _, q, r in QUESTIONS if q == query]
            assert rel == frozenset(merged.index(texts[c]) for c in expected)
    # The "all" tasks hold the same queries as the "split" tasks.
    split_raw = _load(_write(tmp_path, _squad()), candidates="split", seed=0)
    assert {n: t.queries for n, t in raw.tasks.items()} == {
        n: t.queries for n, t in split_raw.tasks.items()}


def test_context_option_appends_the_paragraph(tmp_path):
    raw = _load(_write(tmp_path, _squad()), candidates="all", context=True)
    with_context = [f"{t} {p}" for (_, t), p in zip(CANDIDATES, PARAGRAPH_OF, strict=True)]
    assert with_context[4] == "It has a river. The city is large. It has a river."
    for task in raw.tasks.values():  # no two (sentence, paragraph) alike: none merged
        assert task.corpus == with_context
    assert raw.train_pairs  # one article's questions
    for q, d in raw.train_pairs:
        (rel,) = [r for _, query, r in QUESTIONS if query == q]
        assert d == with_context[rel[0]]


@pytest.mark.parametrize("seed", [0, 1])
def test_split_by_question(tmp_path, seed):
    # Chang et al. / Ahmad et al.: questions split at random, every candidate everywhere.
    raw = _load(_write(tmp_path, _squad()), split_by="question", train_fraction=0.5,
                val_fraction=0.0, candidates="split", seed=seed)
    fractions = {"train": 0.5, "val": 0.0, "test": 0.5}
    split = [list(fractions)[i] for i in clusters.split_clusters(len(QUESTIONS), fractions, seed)]
    assert raw.train_pairs == [(q, CANDIDATES[rel[0]][1])
                               for (_, q, rel), s in zip(QUESTIONS, split, strict=True)
                               if s == "train"]
    assert set(raw.tasks) == {"test"}
    test = raw.tasks["test"]
    assert test.queries == [q for (_, q, _), s in zip(QUESTIONS, split, strict=True) if s == "test"]
    texts = [t for _, t in CANDIDATES]
    assert test.corpus == texts[:7] + texts[8:]  # all candidates (duplicates merged)
    assert len(raw.train_pairs) + len(test.queries) == len(QUESTIONS)


def test_split_by_question_shares_paragraphs_between_train_and_test(tmp_path):
    raw = _load(_write(tmp_path, _squad()), split_by="question", train_fraction=0.6,
                val_fraction=0.0)
    paragraph = dict(zip((t for _, t in CANDIDATES), PARAGRAPH_OF, strict=True))
    train = {paragraph[d] for _, d in raw.train_pairs}
    test = raw.tasks["test"]
    tested = {paragraph[test.corpus[i]] for rel in test.relevant for i in rel}
    assert train & tested  # the same paragraph answers training and test questions


def test_zero_val_fraction_gives_no_val_task(tmp_path):
    raw = _load(_write(tmp_path, _squad()), val_fraction=0.0, test_fraction=0.5)
    assert set(raw.tasks) == {"test"}
    assert len(raw.train_pairs) + len(raw.tasks["test"].queries) == len(QUESTIONS)


def _error(path, **settings) -> str:
    with pytest.raises(DataError) as excinfo:
        _load(path, **settings)
    return str(excinfo.value)


def test_missing_file(tmp_path):
    path = str(tmp_path / "none.json")
    assert _error(path) == f"{path}: no such file"


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"data": [\n  {"title": "x",, "paragraphs": []}]}\n')
    assert _error(str(path)).startswith(f"{path}:2:17: invalid JSON: ")


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"data": [\n{"title": "\xff"}]}')
    message = _error(str(path))
    assert message.startswith(f"{path}:2: invalid UTF-8"), message


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.pop("data"), "top level: missing key 'data'"),
    (lambda d: d["data"][1].pop("paragraphs"), "data[1] ('Beta'): missing key 'paragraphs'"),
    (lambda d: d["data"][1]["paragraphs"][1].pop("context"),
     "data[1] ('Beta') paragraphs[1]: missing key 'context'"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][1].pop("question"),
     "data[0] ('Alpha') paragraphs[1] qas[1]: missing key 'question'"),
    (lambda d: d["data"][2]["paragraphs"][0]["qas"][0].pop("answers"),
     "data[2] ('Gamma') paragraphs[0] qas[0]: missing key 'answers'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][2]["answers"][1].pop("answer_start"),
     "data[0] ('Alpha') paragraphs[0] qas[2] answers[1]: missing key 'answer_start'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start="3"),
     "answers[0]: 'answer_start' must be int, got str"),
    (lambda d: d["data"][1]["paragraphs"][0].update(qas={}),
     "data[1] ('Beta') paragraphs[0]: 'qas' must be list, got dict"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(
        answer_start=len(A0P1)),
     f"data[0] ('Alpha') paragraphs[1] qas[0] answers[0]: answer_start {len(A0P1)} "
     "is outside its context"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(answer_start=-1),
     "answer_start -1 is outside its context"),
])
def test_structure_errors_name_the_place(tmp_path, edit, fragment):
    squad = _squad()
    edit(squad)
    path = _write(tmp_path, squad)
    message = _error(path)
    assert message.startswith(f"{path}: "), message
    assert fragment in message, message


@pytest.mark.parametrize("settings, fragment", [
    ({"candidates": "some"}, "candidates='some' is not one of: split, all"),
    ({"test_fraction": 0.0}, "leave split 'test' empty"),
    ({"val_fraction": 0.9}, "bad train/val/test fractions"),
])
def test_bad_settings(tmp_path, settings, fragment):
    assert fragment in _error(_write(tmp_path, _squad()), **settings)


@pytest.mark.skipif(not os.path.exists(REAL_SQUAD), reason="real SQuAD dev file absent")
@pytest.mark.slow
def test_real_squad_dev():
    squad = read_squad(REAL_SQUAD)
    assert squad.num_articles == 48
    assert len(squad.questions) == 10_570
    assert 10_000 <= len(squad.candidates) <= 10_500  # ReQA reports 10,250
    raw = load_reqa_squad({"path": REAL_SQUAD, "seed": 0, "val_fraction": 0.1,
                           "test_fraction": 0.1, "candidates": "all", "context": False})
    num_eval = sum(len(t.queries) for t in raw.tasks.values())
    assert len(raw.train_pairs) + num_eval == 10_570
    for task in raw.tasks.values():
        assert all(r and max(r) < len(task.corpus) for r in task.relevant)
