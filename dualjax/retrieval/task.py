"""What a retrieval evaluation searches and scores: queries, a corpus of candidates, and
which candidates each query should find (built by data/, searched by retrieval/ and
eval/)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RetrievalTask:
    """A retrieval evaluation task: queries against a corpus of candidates."""

    corpus: list[str]  # Candidate texts.
    queries: list[str]
    relevant: list[frozenset[int]]  # Per query, the relevant corpus indices.
    # int [num_queries]: the query's own index in the corpus, or -1, so that
    # search can exclude it (a query never retrieves itself).
    query_corpus_index: np.ndarray
    # Categorical fields per candidate / per query ({name: value}, None: a record without
    # any), when the data has any.
    corpus_fields: list[dict | None] | None = None
    query_fields: list[dict | None] | None = None
    # Per query, {relevant corpus index: its judgement's grade} where the data grades
    # them (BEIR qrels): nDCG's gains. None: every relevant item has grade 1.
    grades: list[dict[int, int]] | None = None
    # The data's own ids of the candidates and queries (BEIR's "_id"), where it has any:
    # TREC run files and search results name them. None: the row numbers.
    corpus_keys: list[str] | None = None
    query_keys: list[str] | None = None

    def __post_init__(self):
        n = len(self.queries)
        if len(self.relevant) != n or len(self.query_corpus_index) != n:
            raise ValueError(
                    f"{n} queries but {len(self.relevant)} relevant sets and "
                    f"{len(self.query_corpus_index)} query corpus indices")
