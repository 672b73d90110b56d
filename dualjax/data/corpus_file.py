"""A corpus to index (`python -m dualjax.index`): ids and texts from a file or a folder.

* a BEIR folder (holding corpus.jsonl) or a BEIR corpus.jsonl: `_id`, `text` and an
  optional `title`, read by `beir.py` (the text is "title. text");
* ``.jsonl`` / ``.json``: one object per line with a string `text` (and an optional
  `title`) or `document`, and an optional `_id` or `id` (default: the line number);
* ``.tsv`` / ``.txt``: `id<TAB>text` per line, or the text alone (its id: the line number).

Every problem is a `DataError` naming the file and line.
"""

from __future__ import annotations

import os

from dualjax.data import beir
from dualjax.data.pairs_file import DataError


def read_corpus(path: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of the corpus at `path`, in file order; ids are unique."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "corpus.jsonl")):
            raise DataError(f"{path}: a folder without corpus.jsonl (a BEIR folder has one)")
        path = os.path.join(path, "corpus.jsonl")
    if path.endswith((".jsonl", ".json")):
        return _read_jsonl(path)
    if path.endswith((".tsv", ".txt")):
        return _read_tsv(path)
    raise DataError(f"{path}: a corpus is a .jsonl, .json, .tsv or .txt file or a BEIR folder")


def _add(path: str, lineno: int, doc_id: str, text: str, seen: dict[str, int],
         texts: list[str]) -> None:
    if doc_id in seen:
        raise DataError(f"{path}:{lineno}: duplicate id {doc_id!r} (first at line "
                        f"{seen[doc_id]})")
    seen[doc_id] = lineno
    texts.append(text)


def _done(path: str, seen: dict[str, int], texts: list[str]) -> tuple[list[str], list[str]]:
    if not texts:
        raise DataError(f"{path}: no documents")
    return list(seen), texts


def _read_jsonl(path: str) -> tuple[list[str], list[str]]:
    seen: dict[str, int] = {}
    texts: list[str] = []
    for lineno, obj in beir.json_objects(path):
        key = "text" if "text" in obj else "document"
        text, title = obj.get(key), obj.get("title") or ""
        if not isinstance(text, str):
            raise DataError(f"{path}:{lineno}: needs a string 'text' or 'document'")
        if not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: 'title' must be a string")
        doc_id = obj.get("_id", obj.get("id", str(lineno)))
        if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
            raise DataError(f"{path}:{lineno}: the id must be a string or an integer")
        _add(path, lineno, str(doc_id), beir.document_text(title, text), seen, texts)
    return _done(path, seen, texts)


def _read_tsv(path: str) -> tuple[list[str], list[str]]:
    seen: dict[str, int] = {}
    texts: list[str] = []
    for lineno, line in beir._lines(path, beir._Skipper(path, skip=False)):
        parts = line.split("\t")
        if len(parts) > 2:
            raise DataError(f"{path}:{lineno}: {len(parts) - 1} tabs; a corpus line is "
                            "id<TAB>text or the text alone")
        doc_id, text = parts if len(parts) == 2 else (str(lineno), parts[0])
        _add(path, lineno, doc_id.strip(), text.strip(), seen, texts)
    return _done(path, seen, texts)
