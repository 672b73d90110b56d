"""Tests for dualjax.data.pairs_file: reading the user's own positive pairs."""
import json

import pytest
from absl import logging

from dualjax import errors
from dualjax.data import pairs_file
from dualjax.data.pairs_file import read_pairs
from dualjax.errors import DataError


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _jsonl(*objs) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objs).encode("utf-8")


def test_tsv_happy_path(tmp_path):
    path = _write(tmp_path / "pairs.tsv",
                  "How old are you?\tWhat is your age?\nCafé Über\tthe café\n".encode())
    assert read_pairs(path) == [
        ("How old are you?", "What is your age?"),
        ("Café Über", "the café"),
    ]


def test_txt_without_trailing_newline_and_crlf(tmp_path):
    path = _write(tmp_path / "pairs.txt", b"a b\tc d\r\ne f\tg h")
    assert read_pairs(str(path)) == [("a b", "c d"), ("e f", "g h")]


def test_jsonl_happy_path_ignores_other_fields(tmp_path):
    path = _write(tmp_path / "pairs.jsonl", _jsonl(
        {"query": "what is jax", "document": "jax is a library", "score": 1},
        {"document": "second doc", "query": "second query", "id": "x"},
    ))
    assert read_pairs(path) == [
        ("what is jax", "jax is a library"),
        ("second query", "second doc"),
    ]


def test_jsonl_categorical_fields(tmp_path):
    path = _write(tmp_path / "pairs.jsonl", _jsonl(
        {"query": "red shoes", "document": "nike air", "document_fields":
            {"category": "shoes", "year": 2020, "sale": True, "brand": None}},
        {"query": "pan", "document": "frying pan", "query_fields": {"country": "pl"},
         "document_fields": None},
    ))
    records = pairs_file.read_pair_records(path)
    assert records[0] == ("red shoes", "nike air", {},
                          {"category": "shoes", "year": 2020, "sale": True, "brand": None})
    assert records[1].query_fields == {"country": "pl"} and records[1].document_fields == {}
    assert read_pairs(path) == [("red shoes", "nike air"), ("pan", "frying pan")]


def test_a_repeated_text_is_held_once(tmp_path):
    """Pairs repeat their documents (a passage answers many queries): each distinct text
    is one object in memory, however many lines carry it."""
    passage = "a long passage that many questions are asked about " * 20
    lines = [f"question {i}\t{passage}\n" for i in (0, 1, 2, 0)]
    path = _write(tmp_path / "pairs.tsv", "".join(lines).encode())
    records = pairs_file.read_pair_records(path)
    assert [r.document for r in records] == [passage] * 4
    assert len({id(r.document) for r in records}) == 1
    assert records[3].query is records[0].query and records[1].query == "question 1"


@pytest.mark.parametrize("fields,fragment", [
    ({"document_fields": ["shoes"]}, "'document_fields' must be an object"),
    ({"query_fields": {"tags": ["a", "b"]}}, "query_fields.tags must be a string"),
])
def test_bad_categorical_fields_name_the_line(tmp_path, fields, fragment):
    path = _write(tmp_path / "pairs.jsonl", _jsonl({"query": "q", "document": "d"},
                                                   {"query": "q", "document": "d", **fields}))
    _assert_error(path, 2, fragment)


def test_json_extension_is_jsonl(tmp_path):
    path = _write(tmp_path / "pairs.json", _jsonl({"query": "q", "document": "d"}))
    assert read_pairs(path) == [("q", "d")]


def _assert_error(path, lineno, fragment):
    with pytest.raises(DataError) as excinfo:
        read_pairs(path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}:{lineno}: "), message
    assert fragment in message
    return message


def test_empty_line_reports_line_3(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\nc\td\n\ne\tf\n")
    _assert_error(path, 3, "empty line")


def test_missing_tab(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\nno tab here\n")
    _assert_error(path, 2, "no tab")


def test_extra_tab(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\tc\n")
    _assert_error(path, 1, "2 tabs")


def test_invalid_utf8(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\nc\td\n\xff\xfe\tx\n")
    _assert_error(path, 3, "invalid UTF-8")


def test_json_missing_field(tmp_path):
    path = _write(tmp_path / "p.jsonl",
                  _jsonl({"query": "q", "document": "d"}, {"query": "only query"}))
    _assert_error(path, 2, "missing field 'document'")


def test_json_non_string_field(tmp_path):
    path = _write(tmp_path / "p.jsonl", _jsonl({"query": 3, "document": "d"}))
    _assert_error(path, 1, "'query' must be a string")


def test_malformed_json(tmp_path):
    path = _write(tmp_path / "p.jsonl", b'{"query": "q", "document": "d"}\n{"query": \n')
    _assert_error(path, 2, "malformed JSON")


def test_json_not_an_object(tmp_path):
    path = _write(tmp_path / "p.jsonl", b'["q", "d"]\n')
    _assert_error(path, 1, "expected a JSON object")


def test_only_punctuation_is_empty_after_normalize(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\nreal text\t?!\n")
    _assert_error(path, 2, "document has no letter or digit")


def test_only_punctuation_jsonl(tmp_path):
    path = _write(tmp_path / "p.jsonl",
                  _jsonl({"query": "q", "document": "d"}, {"query": "?!", "document": "d"}))
    _assert_error(path, 2, "query has no letter or digit")


def test_skip_bad_lines_returns_good_pairs_and_logs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(logging, "warning", lambda msg, *args: calls.append(msg % args))
    path = _write(tmp_path / "p.tsv",
                  b"a\tb\nc\td\n\nno tab\n\xff\xfe\tx\n?!\tq\ne\tf\n")
    assert read_pairs(path, skip_bad_lines=True) == [("a", "b"), ("c", "d"), ("e", "f")]
    assert len(calls) == 1
    assert "skipped 4 bad line(s)" in calls[0]
    assert "lines 3, 4, 5, 6" in calls[0]
    assert str(path) in calls[0]


def test_no_warning_when_nothing_skipped(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(logging, "warning", lambda msg, *args: calls.append(msg % args))
    path = _write(tmp_path / "p.tsv", b"a\tb\n")
    assert read_pairs(path, skip_bad_lines=True) == [("a", "b")]
    assert calls == []


def test_all_lines_bad_with_skip_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(logging, "warning", lambda *a: None)
    path = _write(tmp_path / "p.tsv", b"no tab\n\n")
    with pytest.raises(DataError, match="no usable pairs"):
        read_pairs(path, skip_bad_lines=True)


def test_empty_file_is_an_error(tmp_path):
    path = _write(tmp_path / "p.tsv", b"")
    with pytest.raises(DataError, match="empty"):
        read_pairs(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tsv"
    with pytest.raises(DataError) as excinfo:
        read_pairs(path)
    assert str(excinfo.value) == f"{path}: no such file"


def test_directory(tmp_path):
    path = tmp_path / "dir.tsv"
    path.mkdir()
    with pytest.raises(DataError, match="is a directory"):
        read_pairs(path)


def test_unknown_extension(tmp_path):
    path = _write(tmp_path / "p.csv", b"a,b\n")
    with pytest.raises(DataError, match="unsupported file extension"):
        read_pairs(path)


def test_data_error_is_value_error():
    assert issubclass(errors.DataError, ValueError)
