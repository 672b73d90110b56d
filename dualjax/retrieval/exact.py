"""Exact maximum-inner-product search: chunked matmul + `jax.lax.top_k`.

Queries are scored a chunk at a time, and each query chunk scans the corpus a chunk at a
time keeping a running top-k, so memory holds at most [query_chunk, k + corpus_chunk]
scores, never the full query x corpus matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dualjax.retrieval import searchers


@functools.partial(jax.jit, static_argnames=("k",))
def _search_chunk(queries, corpus, valid, exclude, k):
    """Top-k of queries [qc, dim] over corpus [n_chunks * cc, dim], scanned a chunk of cc
    rows at a time (the reshape is free inside the program: the rows lie in order).

    valid [n_chunks, cc] marks real (not padding) corpus rows; exclude [qc] is a corpus
    index each query must never retrieve (its own), or -1.
    """
    corpus_chunks = corpus.reshape(valid.shape + corpus.shape[1:])
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


@functools.partial(jax.jit, donate_argnums=0)
def _put_rows(buffer, rows, start):
    """buffer [N, dim] with rows [b, dim] written at `start`, in place (donated)."""
    return jax.lax.dynamic_update_slice(buffer, rows, (start, jnp.int32(0)))


Rows = Callable[[int, int], np.ndarray]  # (start, stop) -> float32 rows [stop - start, dim]
_BLOCK_BYTES = 1 << 24  # host rows copied to the device at a time


def _device_corpus(corpus: np.ndarray | tuple[Rows, int, int], corpus_chunk: int
                   ) -> tuple[jax.Array, jax.Array]:
    """The corpus on the device, [n_chunks * cc, dim] (zero rows after the last), and the
    validity of its rows [n_chunks, cc]. `corpus` is an array (a memmap too) or (rows,
    n, dim) reading it from disk. It goes over a block of ~16 MB at a time into one
    device buffer updated in place, so the host never holds a second, padded copy of a
    corpus of millions of rows."""
    rows, n, dim = ((lambda a, b: corpus[a:b], *corpus.shape)
                    if isinstance(corpus, np.ndarray) else corpus)
    cc = max(1, min(corpus_chunk, n))
    n_chunks = -(-n // cc)
    total = n_chunks * cc
    block = max(1, min(_BLOCK_BYTES // (4 * dim), total))  # one shape: one program
    buffer = jnp.zeros((total, dim), jnp.float32)
    for start in range(0, n, block):
        at = min(start, total - block)  # (a later start would be clamped: XLA's rule)
        part = np.zeros((block, dim), np.float32)
        got = rows(at, min(at + block, n))
        part[:len(got)] = got
        buffer = _put_rows(buffer, jnp.asarray(part), jnp.int32(at))
    valid = (np.arange(n_chunks * cc) < n).reshape(n_chunks, cc)
    return buffer, jnp.asarray(valid)


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

    def __init__(self, corpus: np.ndarray | tuple[Rows, int, int], query_chunk: int = 256,
                 corpus_chunk: int = 4096):
        """corpus: [n, dim] (an array or a memmap), or (rows, n, dim): rows(start, stop)
        reads them (`from_npy`: from a .npy file, never mapped whole into memory)."""
        self.corpus = corpus if isinstance(corpus, tuple) else np.asarray(corpus, np.float32)
        self.settings = {"query_chunk": int(query_chunk), "corpus_chunk": int(corpus_chunk)}
        self._device: tuple[jax.Array, jax.Array] | None = None

    @classmethod
    def from_npy(cls, path: str, query_chunk: int = 256, corpus_chunk: int = 4096
                 ) -> ExactIndex:
        """An index over the float32 [n, dim] array saved at `path`, read a block at a
        time when placed on the device (a memmap would leave every page it read in the
        process' resident memory beside the device's copy)."""
        with open(path, "rb") as f:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(
                np.lib.format.read_magic(f))
            if read_header is None:
                raise ValueError(f"{path}: a .npy version this dualjax does not read")
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
        if len(shape) != 2 or fortran or dtype != np.dtype("<f4"):
            raise ValueError(f"{path}: not a float32 [n, dim] array")
        n, dim = shape

        def rows(start: int, stop: int) -> np.ndarray:
            out = np.empty((stop - start, dim), np.float32)
            with open(path, "rb") as f:
                f.seek(offset + start * dim * 4)
                f.readinto(out.data.cast("B"))
            return out
        return cls((rows, n, dim), query_chunk, corpus_chunk)

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k] float32, ids [nq, k] int32), best first; see `exact_search`."""
        if self._device is None:
            self._device = _device_corpus(self.corpus, self.settings["corpus_chunk"])
        return _search(queries, self._device, k, exclude, self.settings["query_chunk"])


searchers.register(searchers.Kind(
    "exact", lambda corpus, cfg, k: ExactIndex(corpus, cfg["query_chunk"], cfg["corpus_chunk"])))
