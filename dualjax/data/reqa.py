"""ReQA: sentence-level retrieval question answering on SQuAD v1.1.

ReQA (Ahmad et al., 2019; evaluated on by Chang et al., 2020) turns a reading-
comprehension set into retrieval: every sentence of every paragraph is a
candidate answer and a question must retrieve the sentence that holds its
answer. Choices made here:

* Sentences come from :func:`dualjax.text.words.sentence_spans` (sentencex).
* A question's relevant candidates are the sentences holding each of its
  distinct ``answer_start``\\ s (SQuAD dev has up to 3 answers per question); its
  training pair uses the sentence of its first answer only, so that a question
  is never twice in a batch. Questions without answers (SQuAD 2.0's impossible
  ones) are skipped and counted in the log.
* Articles, not paragraphs, are split into train/val/test, so no paragraph
  serves both training and evaluation (``split_by="article"``); or, as Ahmad et al.
  and Chang et al. run ReQA, the questions are (``split_by="question"``):
  ``train_fraction`` of them train, ``val_fraction`` validate, the rest test, and
  every split's candidates are all the sentences, so a test answer may sit in a
  paragraph that training questions also used.
* Identical candidate texts within one task's corpus are merged into one entry
  (ReQA keeps them): two copies would tie on every score, so which copy counts
  as relevant would be arbitrary. A merged entry is relevant to the questions of
  all its copies.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from absl import logging

from dualjax.data import clusters, sources
from dualjax.data.clusters import RawData, RetrievalTask
from dualjax.data.pairs_file import _read_bytes
from dualjax.errors import DataError
from dualjax.text.words import sentence_spans

SPLIT_BY = ("article", "question")
UNITS = ("sentence", "paragraph")  # what a candidate is
DEFAULTS = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1,
            "candidates": "all", "context": False, "split_by": "article",
            "train_fraction": 0.8, "unit": "sentence"}

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


def read_squad(path: str, context: bool = False, paragraphs: bool = False) -> Squad:
    """Candidates and answered questions of a SQuAD v1.1 file (see `Squad`); with
    `paragraphs`, the candidates are whole paragraphs (a question's relevant candidate
    is its paragraph) instead of sentences."""
    data = _get(_read_json(path), "data", list, "top level", path)
    candidates: list[tuple[int, str]]
    candidates, questions, unanswered = [], [], 0
    for a, article in enumerate(data):
        title = article.get("title") if isinstance(article, dict) else None
        where_a = f"data[{a}]" + (f" ({title!r})" if isinstance(title, str) else "")
        for p, paragraph in enumerate(_get(article, "paragraphs", list, where_a, path)):
            where_p = f"{where_a} paragraphs[{p}]"
            text = _get(paragraph, "context", str, where_p, path)
            spans = sentence_spans(text)
            ends = [e for _, e in spans]
            first = len(candidates)
            if paragraphs:
                candidates.append((a, text))
            else:
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
                    sentence = first + (0 if paragraphs else _sentence_of(ends, start))
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


def _split(settings: dict, path: str, num_articles: int, num_questions: int
           ) -> tuple[list[str], np.ndarray, dict[str, int], str]:
    """(split names, the split of each article or question, the count of each, "articles"
    or "questions"); DataError for fractions that leave a split empty."""
    val = float(settings["val_fraction"])
    if settings["split_by"] == "question":
        train = float(settings["train_fraction"])
        fractions = {"train": train, "val": val, "test": max(1.0 - train - val, 0.0)}
        units, unit = num_questions, "questions"
    else:
        test = float(settings["test_fraction"])
        fractions = {"train": 1.0 - val - test, "val": val, "test": test}
        units, unit = num_articles, "articles"
    try:
        split_of = clusters.split_clusters(units, fractions, int(settings["seed"]))
    except ValueError as e:
        raise DataError(f"{path}: bad train/val/test fractions: {e}") from None
    names = list(fractions)
    counts = {n: int((split_of == i).sum()) for i, n in enumerate(names)}
    for name in names:
        if (fractions[name] > 0 or name == "test") and not counts[name]:
            raise DataError(f"{path}: {units} {unit} leave split {name!r} empty "
                            f"({counts}); adjust the data fractions")
    return names, split_of, counts, unit


def load_reqa_squad(settings: dict) -> RawData:
    """ReQA training pairs and "val"/"test" tasks from a SQuAD v1.1 file.

    Args:
        settings: ``{"path": the SQuAD JSON file, "seed": int, "val_fraction":
            float, "test_fraction": float, "candidates": "split" | "all",
            "context": bool, "split_by": "article" | "question",
            "train_fraction": float, "unit": "sentence" | "paragraph"}``; all but the path
            default to `DEFAULTS`.
            Articles (or questions) are split by ``clusters.split_clusters``; a
            zero val_fraction gives no "val" task. Each split's questions are its
            queries; its corpus is the candidates of its own articles ("split")
            or of all articles ("all", ReQA's setting, and always when split by
            question), in file order.

    Returns:
        RawData: training pairs (question, sentence of its first answer) of the
        training questions; tasks whose queries are never candidates (index -1).

    Raises:
        DataError: a missing or malformed file, a bad setting, an empty split.
    """
    settings = {**DEFAULTS, **settings}
    path = os.path.expanduser(settings["path"])
    if settings["candidates"] not in sources.CANDIDATES:
        raise DataError(f"candidates={settings['candidates']!r} is not one of: "
                        f"{', '.join(sources.CANDIDATES)}")
    num_articles, candidates, questions = read_squad(
        path, context=bool(settings["context"]), paragraphs=settings["unit"] == "paragraph")
    if settings["split_by"] == "question":  # every candidate in every split
        settings = {**settings, "candidates": "all"}
    names, split_of, counts, unit = _split(settings, path, num_articles, len(questions))
    if settings["split_by"] == "question":
        split_q = [names[i] for i in split_of]
    else:
        split_q = [names[split_of[a]] for a, _, _ in questions]
    # None: split by question (then every split's candidates are all of them)
    split_a = [names[i] for i in split_of] if unit == "articles" else None

    train_pairs = [(q, candidates[rel[0]][1])
                   for (_, q, rel), sp in zip(questions, split_q, strict=True) if sp == "train"]
    tasks = {}
    for name in ("val", "test"):
        if counts[name]:
            pool = [c for c, (a, _) in enumerate(candidates)
                    if split_a is None or settings["candidates"] == "all" or split_a[a] == name]
            tasks[name] = _task(candidates, pool,
                                [x for x, sp in zip(questions, split_q, strict=True) if sp == name])
    logging.info("%s: %d articles, %d candidates, %d questions, split by %s (%s), "
                 "%d training pairs", path, num_articles, len(candidates), len(questions),
                 unit, counts, len(train_pairs))
    return RawData(train_pairs=train_pairs, tasks=tasks)


# ----------------------------------------------------------------------------- the source
SQUAD_PATH = os.path.join("..", "shared", "data", "squad", "dev-v1.1.json")  # the default


def _settings(data: Mapping[str, Any], seed: int) -> dict:
    return {**sources.clustered_settings(data, seed),
            **sources.file_settings(data["path"] or SQUAD_PATH, "a SQuAD v1.1 JSON file"),
            "val_fraction": data["val_fraction"], "test_fraction": data["test_fraction"],
            "context": data["candidate_context"],
            **({"split_by": "question", "train_fraction": data["train_fraction"]}
               if data.get("split_by", "article") == "question" else {}),
            **({"unit": "paragraph"} if data.get("candidate_unit", "sentence") == "paragraph"
               else {})}


# ReQA on SQuAD v1.1: questions against every (sentence, paragraph) candidate.
sources.register(sources.Source("reqa_squad", load_reqa_squad, _settings,
                                default_path=SQUAD_PATH))
