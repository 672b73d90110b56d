"""Tests for dualjax.data.beir: loading a BEIR-format folder."""
import json

import numpy as np
import pytest
from helpers import CORPUS, EXPECTED_CORPUS, FILES, HEADER, QUERIES, _folder  # noqa: E402,F401

from dualjax.data import beir
from dualjax.data.beir import load_beir
from dualjax.errors import DataError


def _load(folder, skip=False):
    return load_beir({"path": folder, "skip_bad_lines": skip})


def test_happy_path(tmp_path):
    raw = _load(_folder(tmp_path))
    assert list(raw.tasks) == ["val", "test"]
    test, val = raw.tasks["test"], raw.tasks["val"]
    assert test.corpus == EXPECTED_CORPUS and val.corpus == EXPECTED_CORPUS
    assert test.queries == ["what is flax", "what is jax", "How do I learn jax?"]
    assert test.relevant == [frozenset({1}), frozenset({0, 4}), frozenset({2, 0})]
    # BEIR's evaluation never returns a document with the query's own id.
    np.testing.assert_array_equal(test.query_corpus_index, [-1, -1, 2])
    assert val.queries == ["How do I learn jax?", "what is jax"]
    assert val.relevant == [frozenset({2}), frozenset({1})]
    np.testing.assert_array_equal(val.query_corpus_index, [2, -1])
    assert raw.train_pairs == [("train query", "Orbax. Checkpoints."),
                               ("what is flax", "Flax builds on jax.")]
    # The judgements' grades are kept (nDCG's gains), and the data's own ids (run files).
    assert test.grades == [{1: 1}, {0: 2, 4: 1}, {2: 1, 0: 1}]
    assert test.query_keys == ["q2", "q1", "q3"] and test.corpus_keys == \
        ["d1", "d2", "q3", "d4", "d5"]


def test_queries_with_empty_text_are_warned_about(tmp_path, monkeypatch):
    messages = []
    monkeypatch.setattr(beir.logging, "warning", lambda msg, *a: messages.append(msg % a))
    queries = [dict(q, text="  ") if q["_id"] in ("q1", "q5") else q for q in QUERIES]
    folder = _folder(tmp_path, {"queries.jsonl": "".join(json.dumps(q) + "\n"
                                                          for q in queries)})
    raw = _load(folder)
    assert f"{folder}/qrels/test.tsv: 1 judged queries have empty text in queries.jsonl " \
        "(ids q1) and are scored as misses, as trec_eval scores an empty ranking" in messages
    assert any("(ids q5) and are left out of training" in m for m in messages)
    assert raw.train_pairs == [("what is flax", "Flax builds on jax.")]


def test_identical_ids_can_be_unrelated(tmp_path):
    # NPL numbers queries and documents 1, 2, ...: "query 1" and "document 1" are unrelated.
    raw = load_beir({"path": _folder(tmp_path), "ignore_identical_ids": False})
    test = raw.tasks["test"]
    assert test.relevant == [frozenset({1}), frozenset({0, 4}), frozenset({2, 0})]
    np.testing.assert_array_equal(test.query_corpus_index, [-1, -1, -1])


def test_document_text():
    assert beir.document_text("T", "body") == "T. body"
    assert beir.document_text(" ", "body") == "body"
    assert beir.document_text("T", "") == "T"


def test_crlf_bom_and_blank_lines(tmp_path):
    corpus = ("\ufeff" + FILES["corpus.jsonl"].replace("\n", "\r\n") + "\r\n\n").encode()
    raw = _load(_folder(tmp_path, {"corpus.jsonl": corpus}))
    assert raw.tasks["test"].corpus == EXPECTED_CORPUS


def test_headerless_qrels_and_repeated_rows(tmp_path):
    # Without a header line 1 is data; a repeated row overrides, as in BEIR.
    raw = _load(_folder(tmp_path, {"qrels/test.tsv": "q1\td1\t1\nq2\td2\t1\nq1\td1\t0\n"}))
    assert raw.tasks["test"].queries == ["what is flax"]


def test_missing_dev_and_train_is_fine(tmp_path):
    raw = _load(_folder(tmp_path, {"qrels/dev.tsv": None, "qrels/train.tsv": None,
                                   "qrels/other.tsv": HEADER + "bad"}))
    assert list(raw.tasks) == ["test"]
    assert raw.train_pairs == []


def test_skipped_queries_are_logged(tmp_path, monkeypatch):
    messages = []
    monkeypatch.setattr(beir.logging, "info", lambda msg, *args: messages.append(msg % args))
    folder = _folder(tmp_path)
    _load(folder)
    assert f"{folder}/qrels/test.tsv: 3 of 5 queries have relevant documents; skipped 2" \
        in messages, messages
    assert f"{folder}/qrels/dev.tsv: 2 of 5 queries have relevant documents; skipped 3" \
        in messages, messages


def _error(folder, skip=False) -> str:
    with pytest.raises(DataError) as excinfo:
        _load(folder, skip)
    return str(excinfo.value)


def test_missing_folder(tmp_path):
    assert _error(str(tmp_path / "none")).startswith(f"{tmp_path}/none: no such folder")
    (tmp_path / "file").write_text("x")
    assert _error(str(tmp_path / "file")).startswith(f"{tmp_path}/file: no such folder")


@pytest.mark.parametrize("missing, message", [
    ("corpus.jsonl", "corpus.jsonl: no such file"),
    ("queries.jsonl", "queries.jsonl: no such file"),
    ("qrels/test.tsv", "qrels/test.tsv: no such file (a BEIR dataset needs test qrels)"),
])
def test_missing_files(tmp_path, missing, message):
    folder = _folder(tmp_path, {missing: None})
    assert _error(folder) == f"{folder}/{message}"


def test_no_qrels_at_all(tmp_path):
    folder = _folder(tmp_path, {"qrels/test.tsv": None, "qrels/dev.tsv": None,
                                "qrels/train.tsv": None, "qrels/notes.txt": "x"})
    assert _error(folder) == f"{folder}/qrels: no qrels/*.tsv files"
    (tmp_path / "beir" / "qrels" / "notes.txt").unlink()
    (tmp_path / "beir" / "qrels").rmdir()
    assert _error(folder) == f"{folder}/qrels: no qrels/*.tsv files"


def _lines(objs) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


@pytest.mark.parametrize("file, content, lineno, fragment", [
    ("corpus.jsonl", _lines(CORPUS[:2] + ['{"_id": "d9", "text": ']), 3, "malformed JSON"),
    ("corpus.jsonl", _lines(CORPUS[:1] + [[1, 2]]), 2, "expected a JSON object, got list"),
    ("corpus.jsonl", _lines([{"text": "no id"}]), 1, "missing or null field '_id'"),
    ("corpus.jsonl", _lines([{"_id": 7, "text": "int id"}]), 1,
     "field '_id' must be a string, got int"),
    ("corpus.jsonl", _lines(CORPUS[:3] + [{"_id": "d4", "title": 3, "text": "x"}]), 4,
     "field 'title' must be a string, got int"),
    ("queries.jsonl", _lines(QUERIES[:1] + [{"_id": "q2"}]), 2, "missing or null field 'text'"),
    ("queries.jsonl", _lines(QUERIES[:1] + [{"_id": "q2", "text": ["a"]}]), 2,
     "field 'text' must be a string, got list"),
    ("corpus.jsonl", _lines(CORPUS) + _lines([CORPUS[0]]), 6,
     "duplicate _id 'd1' (first at line 1)"),
    ("queries.jsonl", _lines(QUERIES[:2]) + "\n" + _lines([QUERIES[1]]), 4,
     "duplicate _id 'q2' (first at line 2)"),
    ("queries.jsonl", _lines(QUERIES[:1]).encode() + b'{"_id": "q2", "text": "\xe9"}\n', 2,
     "invalid UTF-8 (byte b'\\xe9' at column 24)"),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\nq2\td2\n", 3, "2 column(s)"),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\tx\n", 2, "4 column(s)"),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\nq2\td2\t1.5\n", 3, "score '1.5' is not an integer"),
    ("qrels/dev.tsv", HEADER + "q1\td1\t1\nq9\td2\t1\n", 3, "unknown query id 'q9'"),
    ("qrels/train.tsv", HEADER + "q1\td9\t1\n", 2, "unknown corpus id 'd9'"),
])
def test_bad_lines_name_file_and_line(tmp_path, file, content, lineno, fragment):
    folder = _folder(tmp_path, {file: content})
    message = _error(folder)
    assert message.startswith(f"{folder}/{file}:{lineno}: "), message
    assert fragment in message, message


@pytest.mark.parametrize("qrels, fragment", [
    (HEADER + "q1\td1\t0\nq2\td2\t-1\n", "no relevant judgement (no row with score > 0)"),
    (HEADER, "no relevant judgement (no row with score > 0)"),
])
def test_qrels_without_relevant_rows(tmp_path, qrels, fragment):
    folder = _folder(tmp_path, {"qrels/test.tsv": qrels})
    assert _error(folder) == f"{folder}/qrels/test.tsv: {fragment}"


def test_skip_bad_lines_skips_and_logs(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(beir.logging, "warning", lambda msg, *a: warnings.append(msg % a))
    corpus = FILES["corpus.jsonl"] + '{"_id": "d6", "text": \n' + '{"_id": "d7"}\n'
    test_qrels = FILES["qrels/test.tsv"] + "q1\td6\t1\nq2\td1\tone\nq9\td1\t1\nq1\n"
    folder = _folder(tmp_path, {"corpus.jsonl": corpus, "qrels/test.tsv": test_qrels})
    raw = _load(folder, skip=True)
    assert raw.tasks["test"].corpus == EXPECTED_CORPUS
    assert raw.tasks["test"].relevant == [frozenset({1}), frozenset({0, 4}), frozenset({0, 2})]
    assert any(w.startswith(f"{folder}/corpus.jsonl: skipped 2 bad line(s) (lines 6, 7); "
                            "first problem: line 6: malformed JSON") for w in warnings), warnings
    assert any(w.startswith(f"{folder}/qrels/test.tsv: skipped 2 bad line(s) (lines 9, 11); "
                          "first problem: line 9: score 'one' is not an integer")
               for w in warnings), warnings
    # d6 (a skipped document) and q9 (never a query) are unknown ids.
    assert f"{folder}/qrels/test.tsv: skipped 2 row(s) naming an unknown query or corpus id" \
        in warnings, warnings
    assert len(warnings) == 3


def test_duplicates_stay_errors_with_skip_bad_lines(tmp_path):
    folder = _folder(tmp_path, {"queries.jsonl": _lines(QUERIES + [QUERIES[0]])})
    assert _error(folder, skip=True) == (
        f"{folder}/queries.jsonl:6: duplicate _id 'q1' (first at line 1)")
