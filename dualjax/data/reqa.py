"""ReQA: sentence-level retrieval question answering on SQuAD v1.1.

ReQA (Ahmad et al., 2019; evaluated on by Chang et al., 2020) turns a reading-
comprehension set into retrieval: every sentence of every paragraph is a
candidate answer and a question must retrieve the sentence that holds its
answer. Choices made here:

* Sentences come from :func:`split_sentences`, a small rule-based splitter.
* A question's relevant candidates are the sentences holding each of its
  distinct ``answer_start``\\ s (SQuAD dev has up to 3 answers per question); its
  training pair uses the sentence of its first answer only, so that a question
  is never twice in a batch. Questions without answers (SQuAD 2.0's impossible
  ones) are skipped and counted in the log.
* Articles, not paragraphs, are split into train/val/test, so no paragraph
  serves both training and evaluation.
* Identical candidate texts within one task's corpus are merged into one entry
  (ReQA keeps them): two copies would tie on every score, so which copy counts
  as relevant would be arbitrary. A merged entry is relevant to the questions of
  all its copies.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from typing import NamedTuple

import numpy as np
from absl import logging

from dualjax.data import clusters
from dualjax.data.clusters import RawData, RetrievalTask
from dualjax.data.pairs_file import DataError, _read_bytes

CANDIDATES = ("split", "all")
DEFAULTS = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1,
            "candidates": "all", "context": False}

# A sentence end: terminal punctuation, closing quotes/brackets, whitespace.
_END = re.compile(r"""([.!?]+)(["'”’)\]]*)(\s+)""")
_OPENERS = "\"'“‘(["
# Words after which a single "." does not end a sentence.
ABBREVIATIONS = frozenset(
    "Mr. Mrs. Ms. Dr. Prof. St. Mt. Ft. Jr. Sr. Gen. Col. Lt. Sgt. Capt. Gov. Sen. "
    "Rep. Rev. Hon. Pres. v. vs. etc. approx. cf. al.".split())
# ... nor before a number ("No. 5", "c. 1500", "Sept. 11").
BEFORE_NUMBER = frozenset(
    "No. Nos. Vol. c. ca. p. pp. Jan. Feb. Mar. Apr. Aug. Sep. Sept. Oct. Nov. Dec.".split())
_INITIAL_OR_ACRONYM = re.compile(r"[A-Z]\.|(?:[A-Za-z]\.){2,}")  # "J.", "U.S.", "e.g."


def _word_before(text: str, end: int) -> str:
    """The whitespace-delimited word ending at `end`, without opening quotes."""
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    return text[start:end].lstrip(_OPENERS)


def _is_boundary(paragraph: str, match: re.Match) -> bool:
    after = match.end()
    if after == len(paragraph):
        return False  # trailing whitespace
    nxt = paragraph[after]
    if not (nxt.isupper() or nxt.isdigit() or nxt in _OPENERS):
        return False
    if match.group(1) != "." or match.group(2):
        return True
    word = _word_before(paragraph, match.end(1))
    return not (word in ABBREVIATIONS or _INITIAL_OR_ACRONYM.fullmatch(word)
                or (word in BEFORE_NUMBER and nxt.isdigit()))


def split_sentences(paragraph: str) -> list[tuple[int, int]]:
    """The sentences of `paragraph` as [start, end) character spans.

    A sentence ends at ``.``, ``!`` or ``?`` (a run of them, plus closing
    quotes or brackets) followed by whitespace and an uppercase letter, a digit,
    an opening quote or bracket; a single ``.`` does not end one after a common
    abbreviation ("Mr.", "St.", "etc."), a capital initial ("J."), a dotted
    acronym ("U.S.", "e.g."), or "No."/"c."/a month before a number. Numbers
    such as "3.5" are never split (no whitespace follows the point). Spans
    exclude the surrounding whitespace; a blank paragraph has no sentences.
    """
    spans = []
    start = len(paragraph) - len(paragraph.lstrip())
    for match in _END.finditer(paragraph):
        if match.start() >= start and _is_boundary(paragraph, match):
            spans.append((start, match.start(3)))
            start = match.end()
    end = len(paragraph.rstrip())
    if end > start:
        spans.append((start, end))
    return spans


def _sentence_of(ends: list[int], position: int) -> int:
    """The sentence (given the sentences' ends) holding character `position`; in
    the whitespace between two sentences, the next one (the answer lies in it)."""
    return min(bisect.bisect_right(ends, position), len(ends) - 1)


def _get(obj, key: str, kind: type, where: str, path: str):
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{path}: {where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{path}: {where}: {key!r} must be {kind.__name__}, "
                        f"got {type(value).__name__}")
    return value


def _read_json(path: str):
    data = _read_bytes(path)
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 (byte {data[e.start:e.start + 1]!r})"
                        ) from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None


class Squad(NamedTuple):
    """The ReQA view of a SQuAD file."""

    num_articles: int
    # (article index, text) per (sentence, paragraph), in file order; the text
    # is the sentence, or with `context` the sentence, a space and its paragraph.
    candidates: list[tuple[int, str]]
    # (article index, question, candidate ids of the sentences of its distinct
    # answer starts, the first answer's first), in file order.
    questions: list[tuple[int, str, list[int]]]


def read_squad(path: str, context: bool = False) -> Squad:
    """Candidates and answered questions of a SQuAD v1.1 file (see `Squad`)."""
    data = _get(_read_json(path), "data", list, "top level", path)
    candidates, questions, unanswered = [], [], 0
    for a, article in enumerate(data):
        title = article.get("title") if isinstance(article, dict) else None
        where_a = f"data[{a}]" + (f" ({title!r})" if isinstance(title, str) else "")
        for p, paragraph in enumerate(_get(article, "paragraphs", list, where_a, path)):
            where_p = f"{where_a} paragraphs[{p}]"
            text = _get(paragraph, "context", str, where_p, path)
            spans = split_sentences(text)
            ends = [e for _, e in spans]
            first = len(candidates)
            for s, e in spans:
                candidates.append((a, f"{text[s:e]} {text}" if context else text[s:e]))
            for q, qa in enumerate(_get(paragraph, "qas", list, where_p, path)):
                where_q = f"{where_p} qas[{q}]"
                question = _get(qa, "question", str, where_q, path)
                sentences = []
                for k, answer in enumerate(_get(qa, "answers", list, where_q, path)):
                    where = f"{where_q} answers[{k}]"
                    start = _get(answer, "answer_start", int, where, path)
                    if not 0 <= start < len(text) or not spans:
                        raise DataError(f"{path}: {where}: answer_start {start} is outside "
                                        f"its context ({len(text.strip())} non-blank "
                                        f"of {len(text)} characters)")
                    sentence = first + _sentence_of(ends, start)
                    if sentence not in sentences:
                        sentences.append(sentence)
                if sentences:
                    questions.append((a, question, sentences))
                else:
                    unanswered += 1
    if unanswered:
        logging.info("%s: skipped %d question(s) without answers", path, unanswered)
    if not questions:
        raise DataError(f"{path}: no answered questions")
    return Squad(len(data), candidates, questions)


def _task(candidates, pool: list[int], queries) -> RetrievalTask:
    """A task over candidate ids `pool`; identical texts are merged."""
    index: dict[str, int] = {}
    corpus_of = {}
    for c in pool:
        corpus_of[c] = index.setdefault(candidates[c][1], len(index))
    return RetrievalTask(
        corpus=list(index),
        queries=[q for _, q, _ in queries],
        relevant=[frozenset(corpus_of[c] for c in rel) for _, _, rel in queries],
        query_corpus_index=np.full(len(queries), -1, dtype=np.int64))


def load_reqa_squad(settings: dict) -> RawData:
    """ReQA training pairs and "val"/"test" tasks from a SQuAD v1.1 file.

    Args:
        settings: ``{"path": the SQuAD JSON file, "seed": int, "val_fraction":
            float, "test_fraction": float, "candidates": "split" | "all",
            "context": bool}``; all but the path default to `DEFAULTS`.
            Articles are split by ``clusters.split_clusters``; a zero
            val_fraction gives no "val" task. Each split's questions are its
            queries; its corpus is the candidates of its own articles ("split")
            or of all articles ("all", ReQA's setting), in file order.

    Returns:
        RawData: training pairs (question, sentence of its first answer) of the
        train articles; tasks whose queries are never candidates (index -1).

    Raises:
        DataError: a missing or malformed file, a bad setting, an empty split.
    """
    settings = {**DEFAULTS, **settings}
    path = os.path.expanduser(settings["path"])
    if settings["candidates"] not in CANDIDATES:
        raise DataError(f"candidates={settings['candidates']!r} is not one of: "
                        f"{', '.join(CANDIDATES)}")
    num_articles, candidates, questions = read_squad(path, context=bool(settings["context"]))
    val, test = float(settings["val_fraction"]), float(settings["test_fraction"])
    fractions = {"train": 1.0 - val - test, "val": val, "test": test}
    try:
        split_of = clusters.split_clusters(num_articles, fractions, int(settings["seed"]))
    except ValueError as e:
        raise DataError(f"{path}: bad val_fraction/test_fraction: {e}") from None
    names = list(fractions)
    counts = {n: int((split_of == i).sum()) for i, n in enumerate(names)}
    for name in names:
        if (fractions[name] > 0 or name == "test") and not counts[name]:
            raise DataError(f"{path}: {num_articles} articles leave split {name!r} empty "
                            f"({counts}); adjust val_fraction / test_fraction")
    split = [names[i] for i in split_of]

    train_pairs = [(q, candidates[rel[0]][1]) for a, q, rel in questions if split[a] == "train"]
    tasks = {}
    for name in ("val", "test"):
        if counts[name]:
            pool = [c for c, (a, _) in enumerate(candidates)
                    if settings["candidates"] == "all" or split[a] == name]
            tasks[name] = _task(candidates, pool, [x for x in questions if split[x[0]] == name])
    logging.info("%s: %d articles (%s), %d candidates, %d questions, %d training pairs",
                 path, num_articles, counts, len(candidates), len(questions), len(train_pairs))
    return RawData(train_pairs=train_pairs, tasks=tasks)
