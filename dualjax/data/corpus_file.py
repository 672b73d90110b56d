"""A corpus to index (`python -m dualjax.index`): ids and texts from a file or a folder.

* a BEIR folder (holding corpus.jsonl) or a BEIR corpus.jsonl: `_id`, `text` and an
  optional `title`, read by `beir.py` (the text is "title. text");
* ``.jsonl`` / ``.json``: one object per line with a string `text` (and an optional
  `title`) or `document`, and an optional `_id` or `id` (default: the line number);
* ``.tsv`` / ``.txt``: `id<TAB>text` per line, or the text alone (its id: the line number).

`documents` streams one share of the file (a byte range, cut at line starts), so that
several processes each read only their own part and none holds the whole corpus.
Every problem is a `DataError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator

from dualjax.data import beir
from dualjax.errors import DataError

Document = tuple["Line", str, str]  # (line, id, text); int(line): its number
_CHUNK = 1 << 24  # bytes read at a time when counting lines


def corpus_path(path: str) -> str:
    """The file a corpus argument names: a BEIR folder's corpus.jsonl, or the file itself
    when its suffix is one the readers know; DataError otherwise."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "corpus.jsonl")):
            raise DataError(f"{path}: a folder without corpus.jsonl (a BEIR folder has one)")
        path = os.path.join(path, "corpus.jsonl")
    if not path.endswith((".jsonl", ".json", ".tsv", ".txt")):
        raise DataError(f"{path}: a corpus is a .jsonl, .json, .tsv or .txt file or a BEIR "
                        "folder")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    return path


def identity(path: str) -> dict[str, int | str]:
    """{"size", "digest"} of a corpus file: its size and a digest of its first and last
    MiB, which tells two copies of one file from two files without every process of a
    build reading all of a corpus of billions of bytes."""
    size = os.path.getsize(path)
    digest = hashlib.blake2b(str(size).encode(), digest_size=8)
    with open(path, "rb") as f:
        digest.update(f.read(_EDGE))
        if size > _EDGE:
            f.seek(max(_EDGE, size - _EDGE))
            digest.update(f.read(_EDGE))
    return {"size": size, "digest": digest.hexdigest()}


_EDGE = 1 << 20  # bytes of each end of a corpus file in its identity


def documents(path: str, share: int = 0, shares: int = 1) -> Iterator[Document]:
    """(line, id, text) of the documents in share `share` of `shares` of the corpus
    file at `path` (see `corpus_path`), in file order, streamed.

    The file is cut into `shares` byte ranges of about one size; a line belongs to the
    range holding its first byte, so the shares together hold every line once. Ids are
    not checked for duplicates here (an index checks them over every share).
    """
    path = corpus_path(path)
    parse = _jsonl if path.endswith((".jsonl", ".json")) else _tsv
    for lineno, line in _share_lines(path, share, shares):
        yield parse(path, lineno, line)


def read_corpus(path: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of the whole corpus at `path`, in file order; ids are unique."""
    seen: dict[str, int] = {}
    texts: list[str] = []
    for lineno, doc_id, text in documents(path):
        if doc_id in seen:
            raise DataError(f"{corpus_path(path)}:{int(lineno)}: duplicate id {doc_id!r} "
                            f"(first at line {seen[doc_id]})")
        seen[doc_id] = int(lineno)
        texts.append(text)
    if not texts:
        raise DataError(f"{corpus_path(path)}: no documents")
    return list(seen), texts


class Line:
    """A line's number in its file. A share counts its lines from its own first byte
    (`begin`); the lines before it are counted only when a number is asked for (a
    line's default id, an error), so a share that never needs one never reads the bytes
    before it."""

    def __init__(self, path: str, begin: int, relative: int,
                 before: list[int | None] | None = None):
        self.path, self.begin, self.relative = path, begin, relative
        # shared by a share's lines
        self._before: list[int | None] = before if before is not None else [None]

    def __int__(self) -> int:
        count = self._before[0]
        if count is None:
            count, left = 0, self.begin
            with open(self.path, "rb") as f:
                while left > 0:
                    chunk = f.read(min(_CHUNK, left))
                    count += chunk.count(b"\n")
                    left -= len(chunk)
            self._before[0] = count
        return count + self.relative


def _share_lines(path: str, share: int, shares: int) -> Iterator[tuple[Line, str]]:
    """(line, text) of the non-blank lines whose first byte lies in the share's range
    [size * share // shares, size * (share + 1) // shares)."""
    if not 0 <= share < shares:
        raise ValueError(f"share {share} of {shares}: give 0 <= share < shares")
    size = os.path.getsize(path)
    low, high = size * share // shares, size * (share + 1) // shares
    with open(path, "rb") as f:
        if low > 0:  # skip the end of the line that began in the share before
            f.seek(low - 1)
            f.readline()
        begin = at = f.tell()
        before: list = [0 if begin == 0 else None]
        relative = 0
        while at < high:
            raw = f.readline()
            if not raw:
                break
            first, at, relative = at == 0, at + len(raw), relative + 1
            line = Line(path, begin, relative, before)
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                text = raw.decode("utf-8-sig" if first else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{int(line)}: invalid UTF-8 (byte "
                                f"{raw[e.start:e.start + 1]!r} at column {e.start + 1})") from None
            if text.strip():
                yield line, text


def _jsonl(path: str, line: Line, text: str) -> Document:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{int(line)}: malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{int(line)}: expected a JSON object, got "
                        f"{type(obj).__name__}")
    key = "text" if "text" in obj else "document"
    body, title = obj.get(key), obj.get("title") or ""
    if not isinstance(body, str):
        raise DataError(f"{path}:{int(line)}: needs a string 'text' or 'document'")
    if not isinstance(title, str):
        raise DataError(f"{path}:{int(line)}: 'title' must be a string")
    doc_id = obj.get("_id", obj.get("id"))
    if doc_id is None:
        doc_id = int(line)
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise DataError(f"{path}:{int(line)}: the id must be a string or an integer")
    return line, str(doc_id), beir.document_text(title, body)


def _tsv(path: str, line: Line, text: str) -> Document:
    parts = text.split("\t")
    if len(parts) > 2:
        raise DataError(f"{path}:{int(line)}: {len(parts) - 1} tabs; a corpus line is "
                        "id<TAB>text or the text alone")
    doc_id, body = parts if len(parts) == 2 else (str(int(line)), parts[0])
    return line, doc_id.strip(), body.strip()
