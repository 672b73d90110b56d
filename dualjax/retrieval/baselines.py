"""Lexical retrieval baselines on a `RetrievalTask` (Gillick et al., 2018, compare to these).

Every system maps texts to sparse vectors over the corpus vocabulary (the normalised words
of `dualjax.text.words.words`; query words absent from the corpus are ignored), scores a query
against every document with one sparse product, and ranks by score:

* ``identity``: cosine of raw term-count vectors, cos(q, d) = <c_q, c_d> / (|c_q| |c_d|),
  with c_x[t] = number of occurrences of word t in x (no weighting: the "identity"
  transform of the bag of words).
* ``tfidf``: cosine of TF-IDF vectors, w_x[t] = tf_x(t) * idf(t), with tf = raw count (or
  1 + ln(count) if ``sublinear=True``) and the smooth idf of scikit-learn,
  idf(t) = ln((1 + N) / (1 + df(t))) + 1, N documents, df(t) documents containing t.
* ``bm25``: Okapi BM25 as pyserini runs it on BEIR ("flat": title and text one field),
  over the terms of `analyze` (Lucene's English analyzer: lowercased words, English
  stopwords out, each word stemmed; ``stemmer=""`` keeps the plain normalised words of
  the other systems), k1 0.9 and b 0.4 by default, indexed by the `bm25s` library
  (method "lucene"):
  score(q, d) = sum over query tokens t (repeats counted) of
  idf(t) * tf_d(t) / (tf_d(t) + k1 * (1 - b + b * |d| / avgdl)),
  idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)). bm25s leaves out the usual
  (k1 + 1) numerator factor, a constant that does not change the order. The per-document
  term weights come from `bm25s.BM25.index`; scoring and top-k use the shared code below
  (not `bm25s.BM25.retrieve`) so that ties, self-exclusion and padding are handled alike.

Ranking rules, common to all systems: a query never retrieves its own corpus entry
(`task.query_corpus_index`); only documents with a positive score (at least one shared
word) are returned, so a query with no corpus word gets an all ``-1`` row; ties are broken
by the lower corpus id; rows shorter than ``k`` are padded with ``-1``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from dualjax.retrieval.task import RetrievalTask
from dualjax.text import words as text_lib

BASELINES = ("identity", "tfidf", "bm25")
PAD_ID = -1
# Dense score blocks (queries x documents) of at most 2**23 float64 = 64 MiB each, scored by
# up to _MAX_THREADS threads (scipy and numpy release the GIL): peak memory about 1 GiB.
_BLOCK_ELEMENTS = 2**23
_MAX_THREADS = 4
# `_top_k_block` thresholds on at least this many columns (fewer only if n is smaller).
_SUBSAMPLE_MIN = 8192
# pyserini's BEIR "flat" BM25: k1 0.9, b 0.4, Lucene's English analyzer (`analyze`).
_OPTIONS: dict[str, dict] = {"identity": {}, "tfidf": {"sublinear": False},
                             "bm25": {"k1": 0.9, "b": 0.4, "stemmer": "snowball"}}
STEMMERS = ("snowball", "porter", "")  # `analyze`; "": no stopwords, no stemming
# Lucene's English stopwords (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, as pyserini and
# bm25s's "en" list use them).
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split())


# A word as Lucene's StandardTokenizer cuts it: Unicode letters, digits and the marks that
# go with them, joined by an inner apostrophe or dot ("don't", "u.s", "3.5"); a CJK
# ideograph or kana is a word alone. On ASCII text, the faster `_ASCII_TERM`.
_JOINERS = "'\u2019."
_TERM = re.compile(f"[^\\s{_JOINERS}]+(?:[{_JOINERS}][^\\s{_JOINERS}]+)*")
_ASCII_TERM = re.compile("[a-z0-9]+(?:['.][a-z0-9]+)*")
_CJK_CHAR = re.compile(f"[{text_lib.CJK}]")


def _terms(text: str) -> list[str]:
    """`text`'s words, lowercased (before stopwords and stems)."""
    text = text.lower()
    if text.isascii():
        return _ASCII_TERM.findall(text)
    spaced = _CJK_CHAR.sub(r" \g<0> ", text.translate(text_lib.separators(_JOINERS)))
    return _TERM.findall(spaced)


_POSSESSIVE = re.compile("['\u2019]s$")


def bm25_defaults() -> dict:
    """{"k1", "b", "stemmer"}: the `bm25` system's default options."""
    return dict(_OPTIONS["bm25"])


def options_for(system: str, bm25: dict | None) -> dict:
    """`bm25` (a run's BM25 options) for the "bm25" system, no options for the others."""
    return dict(bm25 or {}) if system == "bm25" else {}


def analyzer(stemmer: str = "snowball") -> Callable[[str], list[str]]:
    """text -> the terms BM25 indexes for it, as Lucene's English analyzer makes them
    (pyserini's default for BEIR): words lowercased, a trailing possessive "'s" cut,
    `STOPWORDS` dropped, each word stemmed by `stemmer`: "snowball" (Snowball English) or
    "porter" (Porter's algorithm, Lucene's PorterStemFilter), both PyStemmer's C code.
    stemmer="": the plain normalised words (`dualjax.text.words.words`), no stopword list."""
    if stemmer not in STEMMERS:
        raise ValueError(f"unknown stemmer {stemmer!r}; choose from {STEMMERS}")
    if not stemmer:
        return text_lib.words
    import Stemmer  # PyStemmer
    stem = Stemmer.Stemmer("english" if stemmer == "snowball" else "porter").stemWords

    def terms(text: str) -> list[str]:
        words = (_POSSESSIVE.sub("", t) for t in _terms(text))
        return stem([w for w in words if w not in STOPWORDS])
    return terms


def analyze(text: str, stemmer: str = "snowball") -> list[str]:
    """`analyzer(stemmer)(text)`, e.g. "The runner's shoes were running" -> ["runner",
    "shoe", "were", "run"]."""
    return analyzer(stemmer)(text)


def _count_matrix(tokens: Sequence[Sequence[str]], vocab: dict[str, int]) -> sp.csr_matrix:
    """Raw term counts, float64 CSR [len(tokens), len(vocab)]; words not in `vocab` dropped."""
    rows: list[int] = []
    cols: list[int] = []
    for i, toks in enumerate(tokens):
        for w in toks:
            j = vocab.get(w)
            if j is not None:
                rows.append(i)
                cols.append(j)
    counts = sp.coo_matrix(
            (np.ones(len(rows)),
             (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64))),
            shape=(len(tokens), len(vocab))).tocsr()
    counts.sum_duplicates()  # Repeated (row, col) entries add up to the count.
    return counts


def _l2_normalize(m: sp.csr_matrix) -> sp.csr_matrix:
    """Rows of `m` scaled to unit L2 norm; all-zero rows stay zero."""
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return sp.csr_matrix(sp.diags(inv) @ m)


def _bm25_weights(doc_tokens: Sequence[Sequence[str]], vocab: dict[str, int],
                  k1: float, b: float) -> sp.csr_matrix:
    """bm25s per-(document, term) BM25 weights, float64 CSR [num_docs, len(vocab)]."""
    if not vocab:  # No words at all (bm25s would divide by a zero mean length).
        return sp.csr_matrix((len(doc_tokens), 0))
    import bm25s  # Imported lazily: it imports jax at import time.

    model = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float64")
    ids = [[vocab[w] for w in toks] for toks in doc_tokens]
    # The (ids, vocab) tuple form keeps our term ids (bm25s infers "list of str tokens" from
    # the first document only, which misfires when it is empty).
    model.index((ids, dict(vocab)), create_empty_token=False, show_progress=False)
    s = model.scores
    csc = sp.csc_matrix((s["data"], s["indices"], s["indptr"]), shape=(s["num_docs"], len(vocab)))
    return csc.tocsr()


def _vectors(system: str, corpus: Sequence[str], queries: Sequence[str],
             options: dict) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(query vectors [nq, V], document vectors [n, V]); score = queries @ documents.T."""
    if system not in BASELINES:
        raise ValueError(f"unknown baseline {system!r}; choose from {BASELINES}")
    unknown = set(options) - set(_OPTIONS[system])
    if unknown:
        raise ValueError(f"unknown options for {system!r}: {sorted(unknown)}; "
                         f"accepted: {sorted(_OPTIONS[system])}")
    opts = {**_OPTIONS[system], **options}
    terms = analyzer(opts.pop("stemmer", ""))

    doc_tokens = [terms(d) for d in corpus]
    vocab: dict[str, int] = {}
    for toks in doc_tokens:
        for w in toks:
            vocab.setdefault(w, len(vocab))
    query_counts = _count_matrix([terms(q) for q in queries], vocab)
    if system == "bm25":
        return query_counts, _bm25_weights(doc_tokens, vocab, float(opts["k1"]), float(opts["b"]))
    doc_counts = _count_matrix(doc_tokens, vocab)
    if system == "identity":
        return _l2_normalize(query_counts), _l2_normalize(doc_counts)
    if opts["sublinear"]:
        for m in (query_counts, doc_counts):
            m.data = 1.0 + np.log(m.data)
    df = np.bincount(doc_counts.indices, minlength=len(vocab))
    n = len(corpus)
    idf = sp.diags(np.log((1.0 + n) / (1.0 + df)) + 1.0)
    return _l2_normalize(query_counts @ idf), _l2_normalize(doc_counts @ idf)


def scores(system: str, corpus: Sequence[str], queries: Sequence[str], **options) -> np.ndarray:
    """Dense scores float64 [len(queries), len(corpus)] of `system` (small inputs only).

    Same definitions and options as `rank`, without self-exclusion.
    """
    q, d = _vectors(system, corpus, queries, options)
    return (q @ d.T).toarray()


def _top_k_block(block: np.ndarray, k: int) -> np.ndarray:
    """Top-k column ids [c, k] of each row of `block` [c, n] among positive scores.

    Best first, ties by lower column id, -1 padding where fewer than k scores are > 0.
    Exact: the kk-th largest value of a strided subset of a row's columns is a lower bound
    of the row's kk-th largest value, so every top-kk entry (ties included) passes the
    threshold; only those few candidates are then sorted. This is ~4x cheaper than an
    argpartition of full rows.
    """
    c, n = block.shape
    out = np.full((c, k), PAD_ID, dtype=np.int64)
    kk = min(k, n)
    stride = max(1, n // max(_SUBSAMPLE_MIN, 4 * kk))
    sample = block[:, ::stride]
    if sample.shape[1] >= kk:
        m = sample.shape[1]
        bound = np.partition(sample, m - kk, axis=1)[:, m - kk]
        mask = (block > 0) & (block >= bound[:, None])
    else:
        mask = block > 0
    rows, cols = np.nonzero(mask)  # Row-major; columns ascending within a row.
    order = np.lexsort((cols, -block[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    counts = np.bincount(rows, minlength=c)
    position = np.arange(len(rows)) - (np.cumsum(counts) - counts)[rows]
    keep = position < kk
    out[rows[keep], position[keep]] = cols[keep]
    return out


def rank(system: str, task: RetrievalTask, k: int, **options) -> np.ndarray:
    """Ranks the corpus of `task` for each of its queries with a lexical baseline.

    Args:
        system: one of `BASELINES` (definitions in the module docstring).
        task: queries, corpus and each query's own corpus index (never retrieved).
        k: results per query, >= 1; may exceed the corpus size (rows are padded).
        **options: ``tfidf``: ``sublinear`` (bool, default False); ``bm25``: ``k1``
            (default 0.9), ``b`` (default 0.4), ``stemmer`` (one of `STEMMERS`, default
            "snowball"); ``identity``: none.

    Returns:
        int64 [num_queries, k]: corpus ids, best first, ties by lower id; only documents
        sharing a word with the query (positive score), never the query itself; -1 padding.

    Raises:
        ValueError: unknown system or option, or k < 1.
    """
    return rank_texts(system, task.corpus, task.queries, k, task.query_corpus_index,
                      **options)[1]


def rank_texts(system: str, corpus: Sequence[str], queries: Sequence[str], k: int,
               exclude: np.ndarray | None = None, **options) -> tuple[np.ndarray, np.ndarray]:
    """`rank` on plain texts, with the scores: (scores float64 [nq, k], -inf padding;
    ids int64 [nq, k], -1 padding). exclude [nq]: a corpus index row i never retrieves
    (-1: none)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    q, d = _vectors(system, corpus, queries, options)
    d_t = sp.csr_matrix(d.T)  # [V, n]; CSR, else scipy converts it for every block.
    nq, n = q.shape[0], d.shape[0]
    self_index = (np.full(nq, -1, np.int64) if exclude is None
                  else np.asarray(exclude, dtype=np.int64))
    ranked = np.full((nq, k), PAD_ID, dtype=np.int64)
    scored = np.full((nq, k), -np.inf)
    if n == 0:
        return scored, ranked
    chunk = max(1, _BLOCK_ELEMENTS // n)

    def score_block(start: int) -> None:
        stop = min(start + chunk, nq)
        block = (q[start:stop] @ d_t).toarray()  # [stop - start, n]
        own = self_index[start:stop]
        has_own = np.flatnonzero(own >= 0)
        block[has_own, own[has_own]] = -np.inf
        ids = _top_k_block(block, k)
        ranked[start:stop] = ids
        scored[start:stop] = np.where(ids >= 0, np.take_along_axis(block, np.maximum(ids, 0), 1),
                                      -np.inf)

    starts = range(0, nq, chunk)
    threads = min(_MAX_THREADS, os.cpu_count() or 1, len(starts))
    if threads <= 1:
        for start in starts:
            score_block(start)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(score_block, starts))  # list() re-raises worker errors.
    return scored, ranked
