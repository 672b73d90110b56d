"""Exact maximum-inner-product search: chunked matmul + `jax.lax.top_k`.

Queries are scored a chunk at a time, and each query chunk scans the corpus a chunk at a
time keeping a running top-k, so memory holds at most [query_chunk, k + corpus_chunk]
scores, never the full query x corpus matrix.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.jit, static_argnames=("k",))
def _search_chunk(queries, corpus_chunks, valid, exclude, k):
    """Top-k of queries [qc, dim] over corpus_chunks [n_chunks, cc, dim].

    valid [n_chunks, cc] marks real (not padding) corpus rows; exclude [qc] is a corpus
    index each query must never retrieve (its own), or -1.
    """
    cc = corpus_chunks.shape[1]
    init = (jnp.full((queries.shape[0], k), -jnp.inf, queries.dtype),
            jnp.full((queries.shape[0], k), -1, jnp.int32))

    def scan_chunk(best, chunk):
        index, docs, ok = chunk
        ids = index * cc + jnp.arange(cc, dtype=jnp.int32)
        scores = queries @ docs.T
        keep = ok[None, :] & (ids[None, :] != exclude[:, None])
        scores = jnp.where(keep, scores, -jnp.inf)
        all_scores = jnp.concatenate([best[0], scores], axis=1)
        all_ids = jnp.concatenate([best[1], jnp.broadcast_to(ids, scores.shape)], axis=1)
        top, pos = jax.lax.top_k(all_scores, k)
        return (top, jnp.take_along_axis(all_ids, pos, axis=1)), None

    steps = (jnp.arange(corpus_chunks.shape[0], dtype=jnp.int32), corpus_chunks, valid)
    (scores, ids), _ = jax.lax.scan(scan_chunk, init, steps)
    return scores, jnp.where(jnp.isfinite(scores), ids, -1)


def exact_search(queries: np.ndarray, corpus: np.ndarray, k: int,
                 exclude: np.ndarray | None = None, query_chunk: int = 256,
                 corpus_chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Exact maximum-inner-product search.

    Args:
      queries: [num_queries, dim]; corpus: [num_docs, dim].
      k: results per query; rows hold -1 ids (and -inf scores) past the corpus size.
      exclude: [num_queries] corpus index that query must not retrieve, or -1.
    Returns:
      (scores [num_queries, k] float32, ids [num_queries, k] int32), best first.
    """
    return _search(queries, _device_corpus(corpus, corpus_chunk), k, exclude, query_chunk)


def _device_corpus(corpus: np.ndarray, corpus_chunk: int) -> tuple[jax.Array, jax.Array]:
    """The corpus on the device as chunks [n_chunks, cc, dim] (zero-padded) and their
    validity [n_chunks, cc]."""
    n, dim = corpus.shape
    cc = max(1, min(corpus_chunk, n))
    n_chunks = -(-n // cc)
    padded = np.zeros((n_chunks * cc, dim), np.float32)
    padded[:n] = corpus
    valid = (np.arange(n_chunks * cc) < n).reshape(n_chunks, cc)
    return jnp.asarray(padded.reshape(n_chunks, cc, dim)), jnp.asarray(valid)


def _search(queries: np.ndarray, corpus: tuple[jax.Array, jax.Array], k: int,
            exclude: np.ndarray | None, query_chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """`exact_search` over a `_device_corpus`: every query chunk is dispatched before any
    result is read back, so the device works while the host prepares the next chunk."""
    nq, dim = queries.shape
    exclude = np.full(nq, -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
    qc = max(1, min(query_chunk, nq))
    pending = []
    for start in range(0, nq, qc):
        q = np.zeros((qc, dim), np.float32)
        ex = np.full(qc, -1, np.int32)
        n = min(qc, nq - start)
        q[:n], ex[:n] = queries[start:start + n], exclude[start:start + n]
        pending.append((start, n, _search_chunk(jnp.asarray(q), *corpus, jnp.asarray(ex), k)))
    scores, ids = np.empty((nq, k), np.float32), np.empty((nq, k), np.int32)
    for start, n, (s, i) in pending:
        scores[start:start + n], ids[start:start + n] = np.asarray(s)[:n], np.asarray(i)[:n]
    return scores, ids


class ExactIndex:
    """Exact search (`exact_search`) over a fixed corpus [n, dim], kept on the device
    (placed once, on the first search) for every search after."""

    def __init__(self, corpus: np.ndarray, query_chunk: int = 256, corpus_chunk: int = 4096):
        self.corpus = np.asarray(corpus, np.float32)
        self.settings = {"query_chunk": int(query_chunk), "corpus_chunk": int(corpus_chunk)}
        self._device = None

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k] float32, ids [nq, k] int32), best first; see `exact_search`."""
        if self._device is None:
            self._device = _device_corpus(self.corpus, self.settings["corpus_chunk"])
        return _search(queries, self._device, k, exclude, self.settings["query_chunk"])
