"""Document collections for pre-training: articles -> passages -> sentences, plus links.

`read_collection(path)` tells the layout by the path:
- a folder: a BEIR folder's `corpus.jsonl` (title + text per document; each document is
  one article of one passage, with no lead and no links: only ICT applies);
- a `.json` file: SQuAD v1.1 (articles with paragraphs in order; the first paragraph is
  the lead; no hyperlinks, so an article B "links" to A when a paragraph of B mentions
  A's title);
- a `.jsonl` file: one article per line, either in the Wikispeedia layout (`"title"`,
  `"paragraphs": [{"section": null for the lead, "text"}]`, `"links": [article ids]`,
  optionally `"id"` and `"title_in_text"`) or with a plain `"text"` (and optional
  `"title"`), split into passages of whole sentences of at most `passage_words` words
  (Chang et al. 2020: 288 tokens for title + passage); the first passage is the lead.
  Links name an article by its `"id"` (or BEIR's `"_id"`), which must be unique, or by
  the title of an article without one; an article with neither needs no name.

Sentences come from `text.sentence_spans` (sentencex, Wikimedia's rule-based segmenter);
text without any sentence punctuation is cut into pseudo-sentences of about 12 words
(`split_sentences`), so ICT applies to stripped abstracts too.
The parsed collection is cached as JSON under `cache_dir`, keyed by the file's contents
and the reading settings, since splitting a Wikipedia-sized collection takes a while.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable

import numpy as np
from absl import logging

from dualjax.data import beir, reqa
from dualjax.errors import DataError
from dualjax.runtime import files as runtime_files
from dualjax.text.words import sentence_spans, words

FORMAT = 2  # of the cache file; bump when reading or splitting changes


PSEUDO_SENTENCE_WORDS = 12
_SENTENCE_END = re.compile(r"[.!?]")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (`text.sentence_spans`), in order. A text with no sentence
    punctuation at all (lowercased, stripped abstracts such as NPL's) is cut into pseudo-
    sentences: ceil(n / PSEUDO_SENTENCE_WORDS) runs of nearly equal numbers of words."""
    if _SENTENCE_END.search(text):
        return [text[s:e] for s, e in sentence_spans(text)]
    tokens = text.split()
    pieces = -(-len(tokens) // PSEUDO_SENTENCE_WORDS)
    return [" ".join(chunk) for chunk in np.array_split(np.asarray(tokens, object), pieces)
            if len(chunk)] if tokens else []


@dataclasses.dataclass
class Collection:
    """Articles as flat arrays (cheap to index from a data pipeline).

    titles[a]: article a's title ("" when it has none).
    passages[p]: passage p's text; passage_article[p]: its article.
    article_start[a]..article_start[a+1]: the passages of article a, in order;
    lead_end[a]: its lead passages are article_start[a]..lead_end[a] (none when equal).
    sentences[s]: sentence s's text; passage_sent_start[p]..passage_sent_start[p+1]: the
    sentences of passage p, in order.
    links [L, 2]: (passage of article B, article A) for each place where B links to A.
    """

    titles: list[str]
    passages: list[str]
    passage_article: np.ndarray
    article_start: np.ndarray
    lead_end: np.ndarray
    sentences: list[str]
    passage_sent_start: np.ndarray
    links: np.ndarray

    @property
    def num_articles(self) -> int:
        return len(self.titles)

    def passage_sentences(self, p: int) -> list[str]:
        return self.sentences[self.passage_sent_start[p]:self.passage_sent_start[p + 1]]

    def to_json(self) -> dict:
        return {"format": FORMAT, **{k: (v.tolist() if isinstance(v, np.ndarray) else v)
                                     for k, v in dataclasses.asdict(self).items()}}

    @classmethod
    def from_json(cls, data: dict) -> Collection:
        arrays = {k: np.asarray(data[k], np.int32) for k in
                  ("passage_article", "article_start", "lead_end", "passage_sent_start")}
        links = np.asarray(data["links"], np.int32).reshape(-1, 2)
        return cls(data["titles"], data["passages"], sentences=data["sentences"], links=links,
                   **arrays)


@dataclasses.dataclass
class _Article:
    title: str
    passages: list[str]
    num_lead: int
    links: list[int] = dataclasses.field(default_factory=list)  # article indices it links to


def _build(articles: list[_Article], mention_links: bool) -> Collection:
    """Flattens articles and splits every passage into sentences. Article-level links
    become (passage of B, A) for each passage of B that mentions A's title (as written,
    whole words), or, when none does, B's first passage; with `mention_links` (no
    hyperlinks in the source), B links to A wherever a passage of B mentions A's title."""
    passages: list[str]
    passages, passage_article, article_start, lead_end = [], [], [0], []
    for a, art in enumerate(articles):
        lead_end.append(len(passages) + art.num_lead)
        passages.extend(art.passages)
        passage_article.extend([a] * len(art.passages))
        article_start.append(len(passages))
    sentences: list[str]
    sentences, sent_start = [], [0]
    for p in passages:
        sentences.extend(split_sentences(p))
        sent_start.append(len(sentences))
    # A mention: the title as written, as whole words ("Force" is not in "forced").
    keys = [re.compile(r"(?<!\w)" + re.escape(art.title.strip()) + r"(?!\w)")
            if art.title.strip() else None for art in articles]
    links: list[tuple[int, int]] = []
    for b, art in enumerate(articles):
        first, end = article_start[b], article_start[b + 1]
        targets = (range(len(articles)) if mention_links else art.links)
        for a in targets:
            if a == b or (key := keys[a]) is None:
                continue
            title = articles[a].title.strip()  # a plain substring test first: fast
            found = [p for p in range(first, end)
                     if title in passages[p] and key.search(passages[p])]
            if not found and not mention_links and end > first:
                found = [first]
            links.extend((p, a) for p in found)
    return Collection(
        titles=[art.title for art in articles], passages=passages,
        passage_article=np.asarray(passage_article, np.int32),
        article_start=np.asarray(article_start, np.int32),
        lead_end=np.asarray(lead_end, np.int32), sentences=sentences,
        passage_sent_start=np.asarray(sent_start, np.int32),
        links=np.asarray(links, np.int32).reshape(-1, 2))


def _clean(text: str) -> str:
    """Runs of whitespace as one space, trimmed."""
    return " ".join(text.split())


def _squad_articles(path: str) -> list[_Article]:
    data = reqa._get(reqa._read_json(path), "data", list, "top level", path)
    out = []
    for a, article in enumerate(data):
        where = f"data[{a}]"
        title = reqa._get(article, "title", str, where, path).replace("_", " ")
        paragraphs = [_clean(reqa._get(p, "context", str, f"{where} paragraphs[{i}]", path))
                      for i, p in enumerate(reqa._get(article, "paragraphs", list, where, path))]
        paragraphs = [p for p in paragraphs if p]
        out.append(_Article(title, paragraphs, num_lead=min(1, len(paragraphs))))
    return out


def _beir_articles(folder: str, skip_bad_lines: bool) -> list[_Article]:
    _, records = beir._read_jsonl(os.path.join(folder, "corpus.jsonl"), ("title",),
                                  skip_bad_lines)
    return [_Article(_clean(r["title"]), [_clean(r["text"])], num_lead=0)
            for r in records if r["text"].strip()]


def chunk_sentences(sentences: Iterable[str], max_words: int) -> list[str]:
    """Consecutive sentences joined into passages of at most `max_words` words (a longer
    sentence is a passage of its own)."""
    out: list[str]
    current: list[str]
    out, current, count = [], [], 0
    for s in sentences:
        n = len(words(s))
        if current and count + n > max_words:
            out.append(" ".join(current))
            current, count = [], 0
        current.append(s)
        count += n
    if current:
        out.append(" ".join(current))
    return out


def _article_id(obj: dict, path: str, lineno: int) -> str | int | None:
    """An article's explicit id: `"id"`, else `"_id"` (BEIR's corpus lines); None when
    it has neither (then its title, if any, names it in links)."""
    key = next((obj[k] for k in ("id", "_id") if obj.get(k) not in (None, "")), None)
    if key is not None and (not isinstance(key, (str, int)) or isinstance(key, bool)):
        raise DataError(f"{path}:{lineno}: an article's \"id\" must be a string or an integer")
    return key


def _link_targets(links: list, ids: dict, titles: dict, path: str, lineno: int) -> list[int]:
    """The article indices `links` names: by id, else by the title of exactly one article
    without an id (a title several articles share names none of them)."""
    out = []
    for x in links:
        if isinstance(x, (str, int)) and x in ids:
            out.append(ids[x])
            continue
        rows = titles.get(x, []) if isinstance(x, str) else []
        if len(rows) > 1:
            raise DataError(f"{path}:{lineno}: \"links\" names {x!r}, the title of lines "
                            f"{', '.join(str(n) for n, _ in rows)}: give those articles ids")
        if not rows:
            raise DataError(f"{path}:{lineno}: \"links\" names unknown article id {x!r}")
        out.append(rows[0][1])
    return sorted(set(out))


def _jsonl_articles(path: str, passage_words: int) -> list[_Article]:
    """Wikispeedia-layout or plain-text articles, one JSON object per line. An article
    is known in links by its id (`_article_id`), else by its title; one with neither
    (plain text) is known by its line alone, which nothing links to."""
    rows: list[tuple[int, _Article, list]]  # (line, article, its "links")
    ids: dict[str | int, int]  # article id -> row
    titles: dict[str, list[tuple[int, int]]]  # title -> (line, row) of articles without id
    rows, ids, titles = [], {}, {}
    for lineno, obj in beir.json_objects(path):
        title = obj.get("title") or ""
        if not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: \"title\" must be a string")
        if "paragraphs" in obj:
            paragraphs = obj["paragraphs"]
            if not isinstance(paragraphs, list) or not all(
                    isinstance(p, dict) and isinstance(p.get("text"), str) for p in paragraphs):
                raise DataError(f"{path}:{lineno}: \"paragraphs\" must be a list of "
                                "{\"section\", \"text\"} objects")
            kept = [(p.get("section") is None, _clean(p["text"])) for p in paragraphs]
            kept = [(lead, t) for lead, t in kept if t]
            texts = [t for _, t in kept]
            num_lead = next((i for i, (lead, _) in enumerate(kept) if not lead), len(kept))
        elif isinstance(obj.get("text"), str):
            texts = chunk_sentences(split_sentences(_clean(obj["text"])), passage_words)
            num_lead = min(1, len(texts))
        else:
            raise DataError(f"{path}:{lineno}: an article needs \"paragraphs\" (a list) or "
                            "\"text\" (a string)")
        links = obj.get("links") or []
        if not isinstance(links, list):
            raise DataError(f"{path}:{lineno}: \"links\" must be a list of article ids")
        key = _article_id(obj, path, lineno)
        if key in ids:
            raise DataError(f"{path}:{lineno}: duplicate article id {key!r} (first at line "
                            f"{rows[ids[key]][0]})")
        if key is not None:
            ids[key] = len(rows)
        elif title:
            titles.setdefault(title, []).append((lineno, len(rows)))
        rows.append((lineno, _Article(_clean(obj.get("title_in_text") or title), texts,
                                      num_lead), links))
    if not rows:
        raise DataError(f"{path}: no articles")
    for lineno, art, links in rows:
        art.links = _link_targets(links, ids, titles, path, lineno)
    return [art for _, art, _ in rows]


def kind_of(path: str) -> str:
    """"beir" (a folder), "squad" (.json) or "jsonl" (.jsonl); DataError otherwise."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "corpus.jsonl")):
            raise DataError(f"{path}: a folder must be a BEIR folder with corpus.jsonl "
                            "(data.path)")
        return "beir"
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file or folder (data.path)")
    if path.endswith(".json"):
        return "squad"
    if path.endswith(".jsonl"):
        return "jsonl"
    raise DataError(f"{path}: data.path must be a SQuAD .json file, a documents .jsonl file "
                    "or a BEIR folder")


def _digest(path: str) -> str:
    h = hashlib.sha256()
    files = ([os.path.join(path, "corpus.jsonl")] if os.path.isdir(path) else [path])
    for name in files:
        h.update(bytes.fromhex(runtime_files.sha256_of(name)))
    return h.hexdigest()


def read_collection(path: str, cache_dir: str = "", passage_words: int = 288,
                    skip_bad_lines: bool = False) -> Collection:
    """The collection at `path` (see the module docstring), cached under `cache_dir`
    ("" : no cache) as documents-<hash>.json."""
    path = os.path.abspath(os.path.expanduser(path))
    kind = kind_of(path)
    key = json.dumps({"format": FORMAT, "kind": kind, "sha256": _digest(path),
                      "passage_words": passage_words if kind == "jsonl" else 0,
                      "skip_bad_lines": skip_bad_lines}, sort_keys=True)
    cache = (os.path.join(cache_dir, f"documents-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
                          ".json") if cache_dir else "")
    if cache and os.path.exists(cache):
        with open(cache) as f:
            return Collection.from_json(json.load(f))
    if kind == "beir":
        coll = _build(_beir_articles(path, skip_bad_lines), mention_links=False)
    elif kind == "squad":
        coll = _build(_squad_articles(path), mention_links=True)
    else:
        coll = _build(_jsonl_articles(path, passage_words), mention_links=False)
    logging.info("%s: %d articles, %d passages (%d in leads), %d sentences, %d links",
                 path, coll.num_articles, len(coll.passages),
                 int((coll.lead_end - coll.article_start[:-1]).sum()), len(coll.sentences),
                 len(coll.links))
    if cache:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{cache}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(coll.to_json(), f)
        os.replace(tmp, cache)
    return coll
