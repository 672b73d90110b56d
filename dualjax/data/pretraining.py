"""Pre-training pairs from an unlabelled collection (Chang et al. 2020, §3).

Three paragraph-level tasks, each making (query, document) pairs from a `Collection`:
- ICT, Inverse Cloze Task (Lee et al. 2019): the query is a random sentence of a passage;
  the document is the article's title and the passage, with the query sentence removed
  with probability `mask_rate` (ORQA's `ict_dataset.py`: 0.9, so it stays in 10% of the
  time), and with it every other occurrence of its text (`remove_text`). A passage needs
  two sentences (one to ask, one left to answer).
- BFS, Body First Selection: the query is a random sentence of the article's lead; the
  document is a random passage of the same article outside its lead.
- WLP, Wiki Link Prediction: the query is a random sentence of article A's lead; the
  document is a passage of another article B that links to A (`Collection.links`).
- CROP, independent cropping (Contriever, Izacard et al. 2022): the query and the
  document are two spans of one passage ("title. passage" as words), each of a length
  drawn uniformly from CROP_RATIO of its words and placed uniformly, independently (they
  may overlap). No sentence structure is needed, so it applies to any collection.
- PSEUDO, weak supervision from a model (`dualjax.train.weak_labels`): (query, document)
  pairs made before training, e.g. a sentence of each passage labelled with the
  document the start's hybrid with BM25 ranks first among the others; given to the
  generator as `pseudo_pairs`.
- DISTILL, a teacher's scores (`dualjax.train.teacher`): pseudo-queries each with a
  positive and k negatives (passage indices) and the teacher's scores of them, given to
  the generator as `distill`; `candidates(position)` gives a pair's negatives and scores.
  Alone in data.tasks: every pair of a batch then has its candidates.
And for MLM (`objectives.mlm.objective`, alone): the document is a passage, the query
empty.

Every document is "title. passage" (`beir.document_text`). A query's length is bounded by
`QueryWords` (data.min_query_words, data.max_query_words): sentences of fewer than `min`
words (split on whitespace: captions, infobox fragments) are never queries, and with `max`
a query is cut to its first that many words (a "sentence" that the splitter could not
break, a list of references, say, is no query; left whole, one such text in a batch pads
every query of it to the documents' length).

Pair number `position` of the stream is a function of (seed, position) alone:
position % T picks the task (T tasks, interleaved: a uniform mixture, as the paper
samples each pair from the tasks uniformly), position // T the task's item through a
seeded shuffle per epoch of its items, and `np.random.default_rng([seed, position])`
the sentence and the masking. So a passage drawn again in a later epoch gets a new
sentence, and a resumed run (grain stores the position) sees the pairs an uninterrupted
one would.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dualjax.data.beir import document_text
from dualjax.data.documents import Collection
from dualjax.errors import DataError

PRETRAIN = "pretrain"  # data.name of an unlabelled collection (pre-training pairs)
TASKS = ("ict", "bfs", "wlp", "crop", "pseudo", "distill", "mlm")
ALONE = ("mlm", "distill")  # tasks that do not mix with others
CROP_RATIO = (0.1, 0.5)  # Contriever's span lengths, as fractions of the passage's words
CROP_MIN_WORDS = 4  # passages shorter than this are not cropped (nothing to split)


@dataclasses.dataclass(frozen=True)
class QueryWords:
    """How long a pre-training query is, in words split on whitespace: a sentence of fewer
    than `min` is never one; a query is cut to its first `max` (0: left whole)."""
    min: int = 5
    max: int = 0

    @classmethod
    def of(cls, data) -> QueryWords:
        """A data group's data.min_query_words and data.max_query_words."""
        return cls(data["min_query_words"], data.get("max_query_words", 0))

    def cut(self, text: str) -> str:
        """`text`'s first `max` words, or `text` itself when it has no more or max is 0."""
        if not self.max:
            return text
        words = text.split()
        return text if len(words) <= self.max else " ".join(words[:self.max])


def parse_tasks(spec: str) -> tuple[str, ...]:
    """"ict,bfs,wlp" -> ("ict", "bfs", "wlp"); ValueError for an unknown or repeated name,
    or "mlm" (a token-level objective, not pairs) or "distill" (pairs with scored
    candidates) with another task."""
    names = tuple(t.strip() for t in spec.split(",") if t.strip())
    bad = [t for t in names if t not in TASKS]
    alone = any(t in ALONE for t in names) and len(names) > 1
    if not names or bad or len(set(names)) != len(names) or alone:
        mixed = [t for t in TASKS if t not in ALONE]
        raise ValueError(f"data.tasks={spec!r} must name distinct tasks among "
                         f"{', '.join(mixed)}, separated by commas, or "
                         + " or ".join(f"{t} alone" for t in ALONE))
    return names


def remove_text(text: str, query: str) -> str:
    """`text` without any occurrence of `query`, whitespace runs then made one space.
    Dropping the query's sentence is not enough: Wikipedia repeats captions ("X Enlarge
    X") and sentences, and the splitter may cut a repeat differently, so the query's text
    can be another sentence, inside one, or across two joined ones (3% of Wikispeedia's
    ICT passages), and ICT would keep it far more often than 1 - mask_rate. Unchanged
    when `query` is not in `text`; repeated since a removal can join a new occurrence."""
    while query and query in text:
        text = " ".join(text.replace(query, " ").split())
    return text


class PairGenerator:
    """(seed, position) -> one pre-training pair; see the module docstring."""

    def __init__(self, collection: Collection, tasks: tuple[str, ...], seed: int,
                 mask_rate: float = 0.9, query_words: QueryWords = QueryWords(),
                 pseudo_pairs: list[tuple[str, str]] | None = None,
                 distill: list[dict] | None = None):
        c = self.collection = collection
        self.query_words = query_words
        self.pseudo_pairs = pseudo_pairs or []
        self.distill = distill or []  # {"query", "documents": [passage], "scores": [float]}
        self.tasks, self.seed, self.mask_rate = tasks, seed, mask_rate
        # Query sentences (long enough), in order; those of sentences [s0, s1) are
        # self._query_sents[searchsorted(s0) : searchsorted(s1)].
        counts = np.fromiter((len(x.split()) for x in c.sentences), np.int64, len(c.sentences))
        self._query_sents = np.flatnonzero(counts >= query_words.min)
        where = lambda sents: np.searchsorted(self._query_sents, sents)
        starts = c.passage_sent_start
        self._passage_q = np.stack([where(starts[:-1]), where(starts[1:])], 1)  # [P, 2]
        first = c.article_start[:-1]
        self._lead_q = np.stack([where(starts[first]), where(starts[c.lead_end])], 1)  # [A, 2]
        self._items = {t: self._task_items(t) for t in tasks}
        for t in tasks:
            if not len(self._items[t]):
                raise DataError(self._nothing_for(t))
        self._perm: dict[tuple[int, int], np.ndarray] = {}  # (task, epoch) -> item order

    def _task_items(self, task: str) -> np.ndarray:
        """The items task `task` draws from: passages, links or pseudo pairs."""
        c, starts = self.collection, self.collection.passage_sent_start
        has_query = self._passage_q[:, 1] > self._passage_q[:, 0]
        lead_has_query = self._lead_q[:, 1] > self._lead_q[:, 0]
        passages = np.arange(len(c.passages))
        if task == "ict":  # passages with a query sentence and another sentence
            return passages[has_query & (starts[1:] - starts[:-1] >= 2)]
        if task == "bfs":  # passages outside a lead whose article's lead has a query
            article = c.passage_article
            return passages[(passages >= c.lead_end[article]) & lead_has_query[article]]
        if task == "mlm":  # every passage (its text is the input; no query)
            return passages
        if task == "pseudo":  # the pairs made for it
            return np.arange(len(self.pseudo_pairs))
        if task == "distill":  # the teacher's scored queries
            return np.arange(len(self.distill))
        if task == "crop":  # passages with enough words to crop twice
            n_words = np.fromiter((len(p.split()) for p in c.passages), np.int64, len(passages))
            return passages[n_words >= CROP_MIN_WORDS]
        # wlp: links (passage of B, A) whose target A has a lead query
        return np.flatnonzero(lead_has_query[c.links[:, 1]] if len(c.links) else [])

    def _nothing_for(self, task: str) -> str:
        """The error for a task without items, naming the tasks that have some, so that
        e.g. plain-text documents (no links: no WLP) say what to run instead."""
        has = [t for t in ("ict", "bfs", "wlp", "crop") if len(self._task_items(t))]
        fix = [t for t in self.tasks if t in has] or has
        return (f"data.tasks: the collection has nothing to make {task.upper()} pairs from "
                f"({_NEEDS[task]}); " + (f"it has pairs for {', '.join(has)}: use e.g. "
                                         f"--config.data.tasks={','.join(fix)}"
                                         if has else "nor for any other pre-training task"))

    def num_items(self, task: str) -> int:
        return len(self._items[task])

    def _item(self, t: int, k: int) -> int:
        """The k-th item of task t's stream: epochs of seeded shuffles of its items."""
        items = self._items[self.tasks[t]]
        epoch, i = divmod(k, len(items))
        if (t, epoch) not in self._perm:
            if len(self._perm) > 2 * len(self.tasks):
                self._perm.clear()  # only the current (and next) epoch are in use
            self._perm[(t, epoch)] = np.random.default_rng(
                [self.seed, t, epoch]).permutation(len(items))
        return int(items[self._perm[(t, epoch)][i]])

    def _document(self, p: int, drop: int | None = None) -> str:
        """Passage p as a document; with `drop`, without sentence `drop` and without any
        other occurrence of its text (`remove_text`)."""
        c = self.collection
        start, end = c.passage_sent_start[p], c.passage_sent_start[p + 1]
        if drop is None:
            text = c.passages[p]
        else:
            text = " ".join(c.sentences[s] for s in range(start, end) if s != drop)
            text = remove_text(text, c.sentences[drop])
        return document_text(c.titles[c.passage_article[p]], text)

    def _crop(self, p: int, rng: np.random.Generator) -> str:
        """A random span of passage p's words (title included), CROP_RATIO long."""
        words = self._document(p).split()
        low, high = (max(1, round(r * len(words))) for r in CROP_RATIO)
        length = int(rng.integers(low, high + 1))
        start = int(rng.integers(0, len(words) - length + 1))
        return " ".join(words[start:start + length])

    def pair(self, position: int) -> tuple[str, str, str]:
        """(query, document, task name) of pair number `position` of the stream."""
        t, k = position % len(self.tasks), position // len(self.tasks)
        task, item = self.tasks[t], self._item(t, k)
        rng = np.random.default_rng([self.seed, position])
        c = self.collection
        if task == "mlm":
            return "", self._document(item), task
        if task == "crop":
            return self._crop(item, rng), self._crop(item, rng), task
        if task == "pseudo":
            return (*self.pseudo_pairs[item], task)
        if task == "distill":
            record = self.distill[item]
            return record["query"], self._document(record["documents"][0]), task
        pick = lambda lo_hi: int(self._query_sents[rng.integers(*lo_hi)])  # a query sentence
        query = lambda s: self.query_words.cut(c.sentences[s])
        if task == "ict":
            s = pick(self._passage_q[item])
            drop = s if rng.random() < self.mask_rate else None
            return query(s), self._document(item, drop), task
        if task == "bfs":
            s = pick(self._lead_q[c.passage_article[item]])
            return query(s), self._document(item), task
        p, a = c.links[item]
        return query(pick(self._lead_q[a])), self._document(int(p)), task

    def candidates(self, position: int) -> tuple[list[str], np.ndarray]:
        """(the k negatives' texts, float32 [1 + k] the teacher's scores of the positive
        and them) of "distill" pair number `position`."""
        t, k = position % len(self.tasks), position // len(self.tasks)
        if self.tasks[t] != "distill":
            raise ValueError(f"pair {position} is a {self.tasks[t]} pair: no candidates")
        record = self.distill[self._item(t, k)]
        return ([self._document(p) for p in record["documents"][1:]],
                np.asarray(record["scores"], np.float32))

    def texts(self):
        """Every title and passage (for building a vocabulary)."""
        yield from self.collection.titles
        yield from self.collection.passages


_NEEDS = {"ict": "passages of two or more sentences",
          "bfs": "articles with a lead and passages after it",
          "wlp": "links between articles, or titles mentioned in other articles",
          "crop": f"passages of {CROP_MIN_WORDS} or more words",
          "pseudo": "pseudo-labelled pairs (dualjax.train.weak_labels)",
          "distill": "queries with a teacher's scored candidates (dualjax.train.teacher)",
          "mlm": "passages"}
