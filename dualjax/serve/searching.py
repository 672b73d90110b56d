"""Answering queries over a corpus: a `Searcher` (the corpus, a searcher over its
vectors and the query encoder that matches them), from an exported encoder and its
corpus index (`from_bundle`), with the optional lexical hybrid (`fused`).
`python -m dualjax.search` is its command (which also reads a training workdir).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dualjax.retrieval import baselines, hybrid
from dualjax.serve.bundle import Encoder
from dualjax.serve.corpus_index import CorpusIndex, recorded_dim
from dualjax.text import tokenizers

Results = list[list[tuple[float, str]]]


def fused(dense: tuple[np.ndarray, np.ndarray], corpus: Sequence[str], queries: Sequence[str],
          k: int, lexical: str, weight: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) [nq, k]: the dense (scores, ids) fused with `lexical`'s top k over
    `corpus`, by reciprocal rank fusion (scores: the RRF sums) or, with a `weight`, by
    score interpolation (scores: the interpolated values)."""
    (d_scores, d_ids), (l_scores, l_ids) = dense, baselines.rank_texts(lexical, corpus,
                                                                       queries, k)
    ids, scores = hybrid.fuse((d_ids, d_scores), (l_ids, l_scores), k, weight)
    return scores, ids


@dataclasses.dataclass
class Searcher:
    """A corpus, an index over its embeddings and the query encoder that matches them."""
    corpus: Sequence[str]                           # a list, or a CorpusIndex's texts (on disk)
    searcher: Any                                   # a retrieval searcher, or a CorpusIndex
    encode_queries: Callable[[Sequence[str]], np.ndarray]  # texts -> unit vectors [n, dim]
    tokenizer: tokenizers.Tokenizer                 # the query side's
    k: int = 10
    info: dict = dataclasses.field(default_factory=dict)
    ids: Sequence[str] | None = None                # the corpus' ids (None: positions)

    def ranked(self, queries: Sequence[str], hybrid: str = "",
               weight: float | None = None) -> list[list[tuple[float, int]]]:
        """Per query, the top k (score, corpus position), best first; with `hybrid` (a
        lexical system), fused with its ranking (`fused`). Typed queries carry no
        categorical fields: a query side with fields reads them as missing. A query that
        gives the model no token (`tokenizers.gives_tokens`: "?!", emoji) has no answer:
        its vector would be the towers' bias alone."""
        k = min(self.k, len(self.corpus))
        scores, ids = self.searcher.search(self.encode_queries(queries), k)
        if hybrid:
            scores, ids = fused((scores, ids), self.corpus, queries, k, hybrid, weight)
        return [[(float(s), int(i)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                if tokenizers.gives_tokens(self.tokenizer, query) else []
                for query, row_s, row_i in zip(queries, scores, ids, strict=True)]

    def search(self, queries: Sequence[str], hybrid: str = "",
               weight: float | None = None) -> Results:
        """The answers to `queries`.

        Args:
          queries: the query texts.
          hybrid: "" (dense only) or a lexical system ("bm25", "tfidf") to fuse with.
          weight: with `hybrid`, interpolate the normalised scores at this dense weight;
            None: reciprocal rank fusion.

        Returns:
          Per query, the top k (score, candidate text), best first (`ranked` gives the
          positions); none for a query that gives the model no token.
        """
        return [[(s, self.corpus[i]) for s, i in row]
                for row in self.ranked(queries, hybrid, weight)]

    def doc_id(self, position: int) -> str:
        return str(position) if self.ids is None else self.ids[position]

    def unknown(self, query: str) -> bool:
        """Whether no token of the query is in the model's vocabulary."""
        return tokenizers.known_tokens(self.tokenizer, query) == 0


def from_bundle(encoder_dir: str, index_dir: str, k: int = 10) -> Searcher:
    """A search service over a corpus index: no training state is read and the corpus is
    not encoded again.

    Args:
      encoder_dir: a bundle (`dualjax.export`).
      index_dir: a corpus index built with that bundle (`dualjax.index`; one built with
        --dim searches the queries at that width).
      k: answers per query.

    Returns:
      The `Searcher`; a ValueError names a bundle and an index that do not belong
      together.
    """
    encoder = Encoder.load(encoder_dir)
    dim = recorded_dim(index_dir)
    if dim is not None and dim < encoder.dim:  # built with --dim: queries at that width
        encoder = encoder.at_dim(dim)
    corpus_index = CorpusIndex(index_dir, encoder.id)
    return Searcher(corpus_index.texts, corpus_index, encoder.encode_queries,
                    encoder.sides["query"].tokenizer, k, {"built": False, **corpus_index.meta},
                    corpus_index.ids)
