"""Weak supervision from the run's start (data.tasks "pseudo"): pseudo-queries that a
collection's own documents yield, each labelled with the document that the start's
hybrid with BM25 ranks first.

Each passage gives one query: one of its sentences of at least `words.min` words (chosen
by the seed), else a Contriever crop of it, cut to `words.max` words (`QueryWords`). The
query's own passage is left out of the candidates, so a pair is never the query and the
text it was cut from; among the others, the label is the first of the start's dense
ranking fused with BM25's (score interpolation at `weight`, `hybrid.fuse_scores`).
Training on these pairs carries the hybrid's ranking into the dense towers
(scripts/bench/adapt_sweep.py measured it against ICT and crops on the shared collections;
BENCHMARKS.md).

The pairs are made once, by the main process, with the start's parameters, and kept in
WORKDIR/pseudo_pairs.jsonl, so a resumed run trains on the same pairs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from absl import logging

from dualjax.data.beir import document_text
from dualjax.data.documents import Collection
from dualjax.data.pretraining import PairGenerator, QueryWords
from dualjax.retrieval import ann, baselines, hybrid
from dualjax.runtime.files import read_records, write_records

FILE = "pseudo_pairs.jsonl"
Encode = Callable[[list[str]], np.ndarray]  # texts -> unit vectors [n, dim]


def passage_documents(collection: Collection) -> list[str]:
    """Each passage as the document it is retrieved as: "title. passage"."""
    return [document_text(collection.titles[collection.passage_article[p]], text)
            for p, text in enumerate(collection.passages)]


def pseudo_queries(collection: Collection, seed: int, words: QueryWords = QueryWords(),
                   per_passage: int = 1) -> tuple[list[str], np.ndarray]:
    """(queries, the passage each was cut from, int64): `per_passage` distinct sentences
    of each passage of at least words.min words (all it has when fewer), else one crop of
    it; each cut to its first words.max words (0: whole). A passage's first query is the
    same whatever `per_passage`."""
    rng = np.random.default_rng([seed, 7])
    crops = PairGenerator(collection, ("crop",), seed)
    queries, own = [], []
    for p in range(len(collection.passages)):
        sentences = [s for s in collection.passage_sentences(p)
                     if len(s.split()) >= words.min]
        if not sentences:
            picked = [crops._crop(p, rng)]
        else:
            first = int(rng.integers(len(sentences)))
            rest = np.delete(np.arange(len(sentences)), first)
            more = np.random.default_rng([seed, 8, p]).permutation(rest)[:per_passage - 1]
            picked = [sentences[i] for i in (first, *more)]
        queries += [words.cut(s) for s in picked]
        own += [p] * len(picked)
    return queries, np.asarray(own, np.int64)


def hybrid_ranking(queries: list[str], documents: list[str], encode_queries: Encode,
                   encode_documents: Encode, weight: float, k: int, bm25: dict | None = None,
                   own: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids int [nq, k], fused scores [nq, k]): each query's top k of the documents other
    than documents[own[i]] (queries[i] was cut from it; own: by default i) by the dense
    ranking fused with BM25's (score interpolation at `weight`, `hybrid.fuse_scores`; -1
    padding). bm25: BM25's options (`baselines.rank`; None: its defaults)."""
    if own is None:
        own = np.arange(len(queries), dtype=np.int64)
    exact = ann.ExactIndex(encode_documents(documents))
    scores, ids = exact.search(encode_queries(queries), k, own)
    lex_scores, lex_ids = baselines.rank_texts("bm25", documents, queries, k, own,
                                               **(bm25 or {}))
    return hybrid.fuse_scores((np.asarray(ids), np.asarray(scores)), (lex_ids, lex_scores),
                              weight, k, with_scores=True)


def hybrid_pairs(queries: list[str], documents: list[str], encode_queries: Encode,
                 encode_documents: Encode, weight: float, k: int = 20,
                 bm25: dict | None = None) -> list[tuple[str, str]]:
    """(queries[i], the fused first of documents other than documents[i]) for each i with
    any candidate (`hybrid_ranking`)."""
    k = min(k, len(documents) - 1)
    if k < 1:
        return []
    ids, _ = hybrid_ranking(queries, documents, encode_queries, encode_documents, weight, k,
                            bm25)
    return [(q, documents[int(j)]) for q, j in zip(queries, ids[:, 0], strict=True) if j >= 0]


def pairs_path(workdir: str, name: str = "") -> str:
    """WORKDIR/pseudo_pairs.jsonl, or task `name`'s pseudo_pairs_<name>.jsonl."""
    return os.path.join(workdir, FILE if not name else FILE.replace(".jsonl", f"_{name}.jsonl"))


def load_or_make(workdir: str, collection: Collection, seed: int, words: QueryWords,
                 weight: float, encode_queries: Encode, encode_documents: Encode,
                 main: bool = True, name: str = "", bm25: dict | None = None
                 ) -> list[tuple[str, str]]:
    """WORKDIR/pseudo_pairs.jsonl (task `name`'s: pseudo_pairs_<name>.jsonl) if it is
    there whole (`files.read_records`), else the pairs made (and, by the main process,
    written there; again, said in the log, for a file cut short)."""
    path = pairs_path(workdir, name)
    if os.path.exists(path):
        pairs, why = read_records(path)
        if pairs is not None:
            return [tuple(p) for p in pairs]
        logging.warning("%s: %s: the pairs are made again", path, why)
    documents = passage_documents(collection)
    queries, _ = pseudo_queries(collection, seed, words)  # one per passage, in order
    pairs = hybrid_pairs(queries, documents, encode_queries, encode_documents, weight,
                         bm25=bm25)
    logging.info("Pseudo-labels: %d queries from %d passages, each labelled with the first "
                 "other document of the start's hybrid with BM25 (w %.2f); %s", len(pairs),
                 len(documents), weight, path)
    if main:
        write_records(path, pairs)
    return pairs
