"""Loading a retrieval dataset in the BEIR format (Thakur et al., 2021).

A BEIR folder holds:

* ``corpus.jsonl``: one JSON object per line, ``{"_id": str, "title": str,
  "text": str}``; ``title`` may be missing, null or empty, other fields are ignored.
* ``queries.jsonl``: one JSON object per line, ``{"_id": str, "text": str}``.
* ``qrels/<split>.tsv``: a header line (``query-id<TAB>corpus-id<TAB>score``),
  then one ``query-id<TAB>corpus-id<TAB>score`` row per judgement; the score is
  an integer and only a score > 0 marks the document relevant.

BEIR's ``dev`` split becomes our "val" task, ``test`` our "test" task (required)
and ``train`` gives the training pairs; other qrels files are ignored. A
document's text is ``title + ". " + text`` when its title is non-empty, else its
text. Blank lines are ignored everywhere. Problems are :class:`DataError`\\ s that
name the file and the (1-based) line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from absl import logging

from dualjax.data import sources
from dualjax.data.clusters import RawData, RetrievalTask
from dualjax.data.pairs_file import _read_bytes
from dualjax.errors import DataError
from dualjax.runtime import files as runtime_files

# BEIR qrels file name -> our split ("train" gives the training pairs).
SPLITS = {"dev.tsv": "val", "test.tsv": "test", "train.tsv": "train"}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_MAX_REPORTED_LINES = 10


class _Skipper:
    """Collects skipped bad lines of one file and logs them in one warning."""

    bad: list[tuple[int, str]]  # (line number, reason)

    def __init__(self, path: str, skip: bool):
        self.path, self.skip, self.bad = path, skip, []

    def reject(self, lineno: int, reason: str) -> None:
        """Raises a DataError for the line, or records it when skipping."""
        if not self.skip:
            raise DataError(f"{self.path}:{lineno}: {reason}")
        self.bad.append((lineno, reason))

    def log(self) -> None:
        if self.bad:
            shown = ", ".join(str(n) for n, _ in self.bad[:_MAX_REPORTED_LINES])
            more = "" if len(self.bad) <= _MAX_REPORTED_LINES else ", ..."
            logging.warning(
                "%s: skipped %d bad line(s) (lines %s%s); first problem: line %d: %s",
                self.path, len(self.bad), shown, more, self.bad[0][0], self.bad[0][1])


def _lines(path: str, skipper: _Skipper) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines, decoded as UTF-8."""
    raw_lines = _read_bytes(path).split(b"\n")
    for lineno, raw in enumerate(raw_lines, start=1):
        raw = raw.removesuffix(b"\r")
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            skipper.reject(lineno, f"invalid UTF-8 (byte {raw[e.start:e.start + 1]!r} "
                                   f"at column {e.start + 1})")
            continue
        if line.strip():
            yield lineno, line


def json_objects(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSONL file's non-blank lines; DataError naming the file
    and line for bad UTF-8, bad JSON or a line that is not an object."""
    for lineno, line in _lines(path, _Skipper(path, skip=False)):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: malformed JSON: {e}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def _read_jsonl(path: str, fields: tuple[str, ...], skip_bad_lines: bool
                ) -> tuple[list[str], list[dict]]:
    """Ids and records of a corpus or queries file, in file order.

    Every record has a string ``_id`` and ``text``; a ``title`` field, if present
    in `fields`, may be missing or null (read as "") but must otherwise be a
    string. Duplicate ids are always an error, naming both lines.
    """
    skipper = _Skipper(path, skip_bad_lines)
    first_line: dict[str, int] = {}
    records: list[dict] = []
    for lineno, line in _lines(path, skipper):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            skipper.reject(lineno, f"malformed JSON: {e}")
            continue
        if not isinstance(obj, dict):
            skipper.reject(lineno, f"expected a JSON object, got {type(obj).__name__}")
            continue
        record: dict
        record, problem = {}, None
        for field in ("_id", "text") + fields:
            value = obj.get(field)
            if value is None and field not in ("_id", "text"):
                value = ""
            if value is None:
                problem = f"missing or null field {field!r}"
            elif not isinstance(value, str):
                problem = f"field {field!r} must be a string, got {type(value).__name__}"
            if problem:
                break
            record[field] = value
        if problem:
            skipper.reject(lineno, problem)
            continue
        if record["_id"] in first_line:
            raise DataError(f"{path}:{lineno}: duplicate _id {record['_id']!r} "
                            f"(first at line {first_line[record['_id']]})")
        first_line[record["_id"]] = lineno
        records.append(record)
    skipper.log()
    if not records:
        raise DataError(f"{path}: no records")
    return list(first_line), records


def document_text(title: str, text: str) -> str:
    """A document's text: ``title + ". " + text``, or either part alone if the
    other is empty (blank)."""
    if not title.strip():
        return text
    if not text.strip():
        return title
    return f"{title}. {text}"


def _read_qrels(path: str, query_ids: set[str], corpus_ids: set[str],
                skip_bad_lines: bool) -> dict[str, dict[str, int]]:
    """query id -> {corpus id: score}, queries in order of first appearance.

    The first line is the header when its score column is not an integer. A
    repeated (query, document) row overrides the earlier score, as in BEIR.
    """
    skipper = _Skipper(path, skip_bad_lines)
    qrels: dict[str, dict[str, int]] = {}
    unknown = 0
    for lineno, line in _lines(path, skipper):
        fields = line.split("\t")
        if len(fields) != 3:
            skipper.reject(lineno, f"{len(fields)} column(s): expected "
                                   "query-id<TAB>corpus-id<TAB>score")
            continue
        query_id, corpus_id, score = (f.strip() for f in fields)
        if not _INTEGER.fullmatch(score):
            if lineno == 1:
                continue  # the header
            skipper.reject(lineno, f"score {score!r} is not an integer")
            continue
        for kind, key, known in (("query", query_id, query_ids),
                                 ("corpus", corpus_id, corpus_ids)):
            if key not in known:
                if not skip_bad_lines:
                    raise DataError(f"{path}:{lineno}: unknown {kind} id {key!r}")
                unknown += 1
                break
        else:
            qrels.setdefault(query_id, {})[corpus_id] = int(score)
    skipper.log()
    if unknown:
        logging.warning("%s: skipped %d row(s) naming an unknown query or corpus id",
                        path, unknown)
    if not any(s > 0 for docs in qrels.values() for s in docs.values()):
        raise DataError(f"{path}: no relevant judgement (no row with score > 0)")
    return qrels


def _qrels_files(folder: str) -> tuple[str, list[str]]:
    """(the qrels folder, its .tsv names); DataError without a folder or test qrels."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such folder (expected a BEIR dataset)")
    qrels_dir = os.path.join(folder, "qrels")
    names = sorted(os.listdir(qrels_dir)) if os.path.isdir(qrels_dir) else []
    names = [n for n in names if n.endswith(".tsv")]
    if not names:
        raise DataError(f"{qrels_dir}: no qrels/*.tsv files")
    if "test.tsv" not in names:
        raise DataError(f"{os.path.join(qrels_dir, 'test.tsv')}: no such file "
                        "(a BEIR dataset needs test qrels)")
    if "dev.tsv" not in names:
        logging.warning("%s: no dev.tsv, so no validation split: nothing is evaluated during "
                        "training, only the test split at the end", qrels_dir)
    ignored = [n for n in names if n not in SPLITS]
    if ignored:
        logging.info("%s: ignoring qrels files %s", qrels_dir, ", ".join(ignored))
    return qrels_dir, names


def load_beir(settings: dict) -> RawData:
    """Training pairs and "val"/"test" retrieval tasks from a BEIR folder.

    Args:
        settings: ``{"path": the folder, "skip_bad_lines": bool,
            "ignore_identical_ids": bool}``. With ``skip_bad_lines``, malformed
            lines (bad UTF-8 or JSON, missing or non-string fields, bad qrels
            rows) and qrels rows naming an unknown id are skipped and counted in
            a warning; duplicate ids stay errors. With ``ignore_identical_ids``
            (the default, as BEIR's evaluation), a document with the query's own
            id (BEIR's quora: the same question) is never retrieved for it; turn
            it off where the two numberings are unrelated (NPL).

    Returns:
        RawData whose tasks share the full corpus (all documents, file order).
        A split's queries are those with a relevant document in its qrels, in
        order of first appearance there; the qrels are kept as they are. A
        document with the query's own id is its ``query_corpus_index`` when
        identical ids are ignored. Training pairs are the (query text, document
        text) of each relevant ``train.tsv`` row.

    Raises:
        DataError: a missing folder or file, no ``qrels/test.tsv``, bad input.
    """
    folder = os.path.expanduser(settings["path"])
    skip = bool(settings.get("skip_bad_lines", False))
    ignore_identical = bool(settings.get("ignore_identical_ids", True))
    qrels_dir, names = _qrels_files(folder)
    corpus_ids, docs = _read_jsonl(os.path.join(folder, "corpus.jsonl"), ("title",), skip)
    query_ids, queries = _read_jsonl(os.path.join(folder, "queries.jsonl"), (), skip)
    corpus = [document_text(d["title"], d["text"]) for d in docs]
    corpus_index = {d: i for i, d in enumerate(corpus_ids)}
    query_text = {q: r["text"] for q, r in zip(query_ids, queries, strict=True)}

    known_queries, known_docs = set(query_ids), set(corpus_ids)
    train_pairs: list[tuple[str, str]] = []
    tasks: dict[str, RetrievalTask] = {}
    for name in (n for n in names if n in SPLITS):
        path = os.path.join(qrels_dir, name)
        qrels = _read_qrels(path, known_queries, known_docs, skip)
        relevant = {q: [corpus_index[d] for d, s in judged.items() if s > 0]
                    for q, judged in qrels.items()}
        relevant = {q: r for q, r in relevant.items() if r}
        logging.info("%s: %d of %d queries have relevant documents; skipped %d",
                     path, len(relevant), len(query_ids), len(query_ids) - len(relevant))
        if not relevant:
            raise DataError(f"{path}: no query has a relevant document")
        empty = [q for q in relevant if not query_text[q].strip()]
        if empty:  # nothing to search with: each such query scores as a miss
            logging.warning("%s: %d judged queries have empty text in queries.jsonl (ids %s) "
                            "and are %s", path, len(empty), ", ".join(empty[:5]),
                            "left out of training" if SPLITS[name] == "train"
                            else "scored as misses, as trec_eval scores an empty ranking")
        if SPLITS[name] == "train":
            train_pairs = [(query_text[q], corpus[i]) for q, r in relevant.items() for i in r
                           if query_text[q].strip()]
            continue
        tasks[SPLITS[name]] = RetrievalTask(
            corpus=corpus,
            queries=[query_text[q] for q in relevant],
            relevant=[frozenset(r) for r in relevant.values()],
            query_corpus_index=np.asarray(
                [corpus_index.get(q, -1) if ignore_identical else -1 for q in relevant],
                dtype=np.int64),
            grades=[{corpus_index[d]: s for d, s in qrels[q].items() if s > 0}
                    for q in relevant],
            corpus_keys=list(corpus_ids), query_keys=list(relevant))
    return RawData(train_pairs=train_pairs, tasks={s: tasks[s] for s in ("val", "test")
                                                   if s in tasks})


# ----------------------------------------------------------------------------- the source
def _settings(data: Mapping[str, Any], seed: int) -> dict:
    """The folder and a digest of the files read (corpus, queries, qrels)."""
    path = data["path"]
    if not path or not os.path.isdir(path):
        raise DataError(f"{path or '(empty)'}: data.path must be a BEIR folder "
                        "(corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    folder = os.path.abspath(os.path.expanduser(path))
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if name.endswith((".jsonl", ".tsv")):
                digest.update(name.encode() + bytes.fromhex(
                    runtime_files.sha256_of(os.path.join(root, name))))
    return {"seed": seed, "path": folder, "sha256": digest.hexdigest(),
            "skip_bad_lines": data["skip_bad_lines"], **sources.negatives_settings(data),
            **({} if data.get("ignore_identical_ids", True) else {"ignore_identical_ids": False})}


# Any BEIR-format folder: corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv.
sources.register(sources.Source("beir", load_beir, _settings))
