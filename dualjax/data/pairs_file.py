"""Reading the user's own positive (query, document) pairs from a file.

Two formats, chosen by the file extension:

* ``.tsv`` / ``.txt``: one pair per line, ``query<TAB>document`` (exactly one
    tab per line).
* ``.jsonl`` / ``.json``: one JSON object per line with string fields
    ``query`` and ``document``, and optionally objects ``query_fields`` and
    ``document_fields`` of categorical fields (``{"category": "shoes"}``; values
    are strings, numbers, booleans or null); other keys are ignored.

Every problem is reported as a :class:`DataError` whose message names the file
and the (1-based) line number, or, with ``skip_bad_lines=True``, the bad lines
are skipped and counted in a warning.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from absl import logging

from dualjax.data import clusters, sources
from dualjax.errors import DataError
from dualjax.text import words as text_lib
from dualjax.text.words import normalize

_TSV_SUFFIXES = (".tsv", ".txt")
_JSONL_SUFFIXES = (".jsonl", ".json")
# How many bad line numbers the skip warning lists.
_MAX_REPORTED_LINES = 10


class PairRecord(NamedTuple):
    """One line: the pair and each side's categorical fields ({} when none)."""
    query: str
    document: str
    query_fields: dict
    document_fields: dict


def _parse_fields(obj: dict, key: str) -> dict:
    value = obj.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"field {key!r} must be an object of categorical fields, got "
                         f"{type(value).__name__}")
    for name, v in value.items():
        if not (v is None or isinstance(v, (str, int, float, bool))):
            raise ValueError(f"{key}.{name} must be a string, number, boolean or null, got "
                             f"{type(v).__name__}")
    return value


def _parse_tsv_line(line: str) -> PairRecord:
    tabs = line.count("\t")
    if tabs == 0:
        raise ValueError("no tab: expected 'query<TAB>document'")
    if tabs > 1:
        raise ValueError(
                f"{tabs} tabs: expected exactly one tab between query and document")
    query, document = line.split("\t")
    return PairRecord(query, document, {}, {})


def _parse_jsonl_line(line: str) -> PairRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(
                f"expected a JSON object, got {type(obj).__name__}")
    sides = []
    for field in ("query", "document"):
        if field not in obj:
            raise ValueError(f"missing field {field!r}")
        value = obj[field]
        if not isinstance(value, str):
            raise ValueError(
                    f"field {field!r} must be a string, got {type(value).__name__}")
        sides.append(value)
    return PairRecord(sides[0], sides[1], _parse_fields(obj, "query_fields"),
                      _parse_fields(obj, "document_fields"))


def _read_bytes(path: str | os.PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


def read_pairs(
        path: str | os.PathLike, skip_bad_lines: bool = False
) -> list[tuple[str, str]]:
    """The positive (query, document) pairs of `read_pair_records`."""
    return [(r.query, r.document) for r in read_pair_records(path, skip_bad_lines)]


def _parse_line(raw: bytes, lineno: int, parse) -> PairRecord:
    """One line's record; ValueError saying what is wrong with it."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"invalid UTF-8 (byte {raw[e.start:e.start + 1]!r} at column "
                         f"{e.start + 1})") from None
    if not line.strip():
        raise ValueError("empty line")
    record = parse(line)
    for side, value in (("query", record.query), ("document", record.document)):
        if not text_lib.has_word(value):
            raise ValueError(f"{side} has no letter or digit (of any script): {value!r}")
    return record


def read_pair_records(
        path: str | os.PathLike, skip_bad_lines: bool = False
) -> list[PairRecord]:
    """Reads positive (query, document) pairs, with any categorical fields, from a TSV or
    JSONL file.

    Args:
        path: the file; its extension picks the format (see the module docstring).
        skip_bad_lines: if True, bad lines are skipped (and their count logged)
            instead of raising.

    Returns:
        The records in file order, each side as written in the file (a trailing
        carriage return of a CRLF line ending is removed).

    Raises:
        DataError: the file is missing, unreadable, of an unknown type, has a bad
            line (unless ``skip_bad_lines``), or yields no pairs at all.
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix in _TSV_SUFFIXES:
        parse = _parse_tsv_line
    elif suffix in _JSONL_SUFFIXES:
        parse = _parse_jsonl_line
    else:
        raise DataError(
                f"{path}: unsupported file extension {suffix!r}; expected one of "
                f"{', '.join(_TSV_SUFFIXES + _JSONL_SUFFIXES)}")

    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory, expected a file")
    data = _read_bytes(path)

    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        # A trailing newline at EOF ends the last line; it is not an empty line.
        raw_lines.pop()

    del data  # (the lines hold their own bytes)
    pairs: list[PairRecord] = []
    bad: list[tuple[int, str]] = []  # (line number, reason)
    same: dict[str, str] = {}  # one object per distinct text: pairs repeat their documents
    for lineno, raw in enumerate(raw_lines, start=1):
        raw_lines[lineno - 1] = b""  # each line's bytes go once it is read
        try:
            record = _parse_line(raw, lineno, parse)
        except ValueError as e:
            if not skip_bad_lines:
                raise DataError(f"{path}:{lineno}: {e}") from None
            bad.append((lineno, str(e)))
            continue
        q, d = record.query, record.document
        pairs.append(PairRecord(same.setdefault(q, q), same.setdefault(d, d),
                                record.query_fields, record.document_fields))

    if bad:
        shown = ", ".join(str(n) for n, _ in bad[:_MAX_REPORTED_LINES])
        more = "" if len(bad) <= _MAX_REPORTED_LINES else ", ..."
        logging.warning(
                "%s: skipped %d bad line(s) (lines %s%s); first problem: line %d: %s",
                path, len(bad), shown, more, bad[0][0], bad[0][1])
    if not pairs:
        if bad:
            raise DataError(
                    f"{path}: no usable pairs: all {len(bad)} line(s) are bad "
                    f"(first: line {bad[0][0]}: {bad[0][1]})")
        raise DataError(f"{path}: no pairs: the file is empty")
    return pairs


def read_lines(path: str | os.PathLike) -> list[str]:
    """The non-blank lines of a UTF-8 text file (one query per line), stripped;
    DataError naming the file and line for bad UTF-8, or for a file with none."""
    lines = []
    for lineno, raw in enumerate(_read_bytes(path).split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{lineno}: invalid UTF-8 (byte "
                            f"{raw[e.start:e.start + 1]!r} at column {e.start + 1})") from None
        if line:
            lines.append(line)
    if not lines:
        raise DataError(f"{path}: no queries: the file has no non-blank line")
    return lines


# ----------------------------------------------------------------------------- the sources
QUORA_PATH = os.path.join("..", "shared", "data", "quora", "pairs.tsv")  # "quora"'s default


def _settings(data: Mapping[str, Any], seed: int, default_path: str = "") -> dict:
    return {**sources.clustered_settings(data, seed),
            **sources.file_settings(data["path"] or default_path,
                                    "a TSV or JSONL file of positive pairs"),
            "skip_bad_lines": data["skip_bad_lines"], "val_fraction": data["val_fraction"],
            "test_fraction": data["test_fraction"]}


def _load(settings: dict) -> clusters.RawData:
    """The user's own positive pairs (TSV or JSONL), split by cluster.

    Pairs are joined transitively into clusters of normalised text (so two spellings
    the tokenizer cannot tell apart, "How?" and "how", are one node) and whole clusters
    go to train, val or test: no text is in two splits."""
    records = read_pair_records(settings["path"], skip_bad_lines=settings["skip_bad_lines"])
    pairs = [(r.query, r.document) for r in records]
    normal = [(normalize(q), normalize(d)) for q, d in pairs]  # (each text once: at corpus
    # scale normalize's cache keeps the repeated texts, not the many distinct ones)
    cluster_of = clusters.cluster_pairs(normal)
    fractions = {"train": 1.0 - settings["val_fraction"] - settings["test_fraction"],
                 "val": settings["val_fraction"], "test": settings["test_fraction"]}
    split_of = clusters.split_clusters(max(cluster_of.values()) + 1, fractions,
                                       settings["seed"])
    names = list(fractions)
    counts = {name: int((split_of == i).sum()) for i, name in enumerate(names)}
    for name in names:
        if not counts[name]:
            raise DataError(
                f"{settings['path']}: {len(split_of)} clusters of pairs leave split "
                f"{name!r} empty ({counts}); give more pairs or adjust "
                "data.val_fraction / data.test_fraction")
    train, train_fields, train_clusters, items, seen = [], [], [], [], set()
    fields_of: dict[str, dict] = {"query": {}, "document": {}}  # first fields per text, side
    for r, (nq, nd) in zip(records, normal, strict=True):
        q, d = r.query, r.document
        c = cluster_of[nq]
        split = names[split_of[c]]
        if split == "train":
            train.append((q, d))
            train_fields.append((r.query_fields, r.document_fields))
            train_clusters.append(c)
        for t, n in ((q, nq), (d, nd)):  # the first spelling of each normalised text
            if n not in seen:  # represents it
                seen.add(n)
                items.append((t, c, split))
        for side, n, f in (("query", nq, r.query_fields), ("document", nd, r.document_fields)):
            if f:
                fields_of[side].setdefault(n, f)
    has_fields = any(fields_of.values())
    return clusters.cluster_raw(train, items, settings, train_fields if has_fields else None,
                                fields_of if has_fields else None, train_clusters)


sources.register(sources.Source("pairs", _load, _settings, table="pairs_file"))
# Quora duplicate questions (positive pairs only), split by cluster as "pairs".
sources.register(sources.Source(
    "quora", _load, lambda data, seed: _settings(data, seed, default_path=QUORA_PATH),
    default_path=QUORA_PATH))
