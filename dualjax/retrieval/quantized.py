"""Quantized corpus vectors: int8 (one byte a dimension) and binary (one bit a dimension),
searched over the codes and rescored (sentence-transformers' `quantize_embeddings` and
`semantic_search_*(rescore=True)`).

- int8: each dimension's range over the corpus, [lo, hi], cut into 256 steps
  (`Int8Codes`); the corpus is kept as those codes alone. A query is coded the same way
  for the first pass (codes against codes), then the top `rescore` candidates are scored
  with the float query against the decoded corpus vectors.
- binary: the sign of each coordinate, packed eight to a byte. The first pass ranks by
  Hamming distance between the query's signs and the corpus', then the top `rescore`
  are scored with the float query against the corpus' +-1 vectors over sqrt(dim): the
  unit vectors along the signs, so that scores are cosines as the float and int8
  indexes' are (lower: a sign vector is not quite its document's direction).

`QuantizedIndex.search` keeps `ExactIndex.search`'s contract (scores, ids [nq, k], a
query's own document excluded, -1 padding); the float corpus vectors are not kept. Both
passes are one jitted XLA program per chunk of queries (`_search_chunk`), over codes put
on the device once: the int8 first pass an integer matrix product, the binary one XOR
and a population count; then the gather, decoding and float rescoring of the top
`rescore` (BENCHMARKS.md, "Quantized indexes").
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("int8", "binary")
FILE = "quantized.npz"


@dataclasses.dataclass(frozen=True)
class QuantizedIndex:
    """kind "int8": codes int8 [n, dim], lo and step float32 [dim] (x ~ lo + (code + 128)
    * step); kind "binary": codes uint8 [n, ceil(dim / 8)] (np.packbits of x > 0; x ~
    sign(x) / sqrt(dim))."""
    kind: str
    codes: np.ndarray
    dim: int
    lo: np.ndarray | None = None
    step: np.ndarray | None = None
    rescore: int = 0  # candidates rescored with the float query (0: 4 x k)
    # (codes, lo, step) on the device, placed by the first search
    _device: tuple | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, corpus: np.ndarray, kind: str, rescore: int = 0) -> QuantizedIndex:
        """The codes of float corpus vectors [n, dim]."""
        if kind not in KINDS:
            raise ValueError(f"quantize={kind!r} is not one of: {', '.join(KINDS)}")
        corpus = np.asarray(corpus, np.float32)
        if kind == "binary":
            return cls(kind, np.packbits(corpus > 0, axis=1), corpus.shape[1], rescore=rescore)
        lo, hi = corpus.min(0), corpus.max(0)
        step = np.maximum(hi - lo, 1e-12) / 255.0
        return cls(kind, _int8(corpus, lo, step), corpus.shape[1], lo, step, rescore)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + sum(a.nbytes for a in (self.lo, self.step) if a is not None)

    def decoded(self, rows: np.ndarray) -> np.ndarray:
        """The corpus vectors the codes of `rows` stand for, float32 [..., dim]."""
        codes = self.codes[rows]
        if self.kind == "binary":
            bits = np.unpackbits(codes, axis=-1, count=self.dim)
            return (bits.astype(np.float32) * 2.0 - 1.0) / np.float32(np.sqrt(self.dim))
        return self.lo + (codes.astype(np.float32) + 128.0) * self.step

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               query_chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) [nq, k] best first: the top max(rescore, k) of the first pass,
        rescored as float query . decoded corpus vector; `exclude[i]` (-1: none) is never
        query i's answer."""
        queries = np.asarray(queries, np.float32)
        n, nq = len(self.codes), len(queries)
        k = min(k, n)
        depth = min(n, max(self.rescore or 4 * k, k))
        if self._device is None:
            lo, step = (np.zeros(1, np.float32),) * 2 if self.lo is None else (self.lo, self.step)
            object.__setattr__(self, "_device", tuple(map(jax.device_put, (self.codes, lo, step))))
        assert self._device is not None  # (placed above)
        if self.kind == "binary":  # its first pass holds [chunk, n, bytes]: at most ~128 MB
            query_chunk = max(1, min(query_chunk, 2 ** 27 // max(self.codes.size, 1)))
        own = np.full(nq, -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
        scores = np.full((nq, k), -np.inf, np.float32)
        ids = np.full((nq, k), -1, np.int64)
        for at in range(0, nq, query_chunk):
            q, o = queries[at:at + query_chunk], own[at:at + query_chunk]
            rows = len(q)
            if rows < query_chunk and nq > query_chunk:  # the last chunk padded: one program
                q = np.pad(q, ((0, query_chunk - rows), (0, 0)))
                o = np.pad(o, (0, query_chunk - rows), constant_values=-1)
            s, i = _search_chunk(q, o, *self._device, kind=self.kind, dim=self.dim, k=k,
                                 depth=depth)
            scores[at:at + rows], ids[at:at + rows] = np.asarray(s)[:rows], np.asarray(i)[:rows]
        ids[~np.isfinite(scores)] = -1
        return scores, ids

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        # (Any: mypy would match np.ndarray values against savez's `allow_pickle: bool`)
        arrays: dict[str, Any] = {"codes": self.codes, "dim": np.int64(self.dim),
                                  "rescore": np.int64(self.rescore)}
        if self.kind == "int8":
            arrays.update(lo=self.lo, step=self.step)
        with open(os.path.join(directory, FILE), "wb") as f:
            np.savez(f, kind=np.str_(self.kind), **arrays)

    @classmethod
    def load(cls, directory: str) -> QuantizedIndex:
        with np.load(os.path.join(directory, FILE)) as z:
            kind = str(z["kind"])
            return cls(kind, z["codes"], int(z["dim"]), z["lo"] if kind == "int8" else None,
                       z["step"] if kind == "int8" else None, int(z["rescore"]))


def _int8(x: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    return (np.clip(np.rint((x - lo) / step), 0, 255) - 128).astype(np.int8)


@functools.partial(jax.jit, static_argnames=("kind", "dim", "k", "depth"))
def _search_chunk(q: jax.Array, own: jax.Array, codes: jax.Array, lo: jax.Array,
                  step: jax.Array, *, kind: str, dim: int, k: int, depth: int
                  ) -> tuple[jax.Array, jax.Array]:
    """One chunk of queries q [c, dim] (own [c]: the document each must not get, -1:
    none): the codes' first pass, its top `depth`, and their float rescoring's top k."""
    n = codes.shape[0]
    if kind == "binary":  # minus the Hamming distance of the signs
        bits = jnp.packbits(q > 0, axis=1)
        differ = jax.lax.population_count(jnp.bitwise_xor(bits[:, None, :], codes[None]))
        first = -differ.sum(-1, dtype=jnp.int32).astype(jnp.float32)
    else:  # the int8 codes' dot product, exact in int32
        coded = (jnp.clip(jnp.rint((q - lo) / step), 0, 255) - 128).astype(jnp.int8)
        first = jnp.dot(coded, codes.T, preferred_element_type=jnp.int32).astype(jnp.float32)
    first = jnp.where(jnp.arange(n)[None, :] == own[:, None], -jnp.inf, first)
    top, cand = jax.lax.top_k(first, depth)  # [c, depth]
    picked = codes[cand]  # [c, depth, dim or bytes]
    if kind == "binary":
        signs = jnp.unpackbits(picked, axis=-1, count=dim).astype(jnp.float32) * 2.0 - 1.0
        vectors = signs / jnp.sqrt(jnp.float32(dim))  # unit vectors: the scores are cosines
    else:
        vectors = lo + (picked.astype(jnp.float32) + 128.0) * step
    exact = jnp.einsum("qd,qcd->qc", q, vectors)
    exact = jnp.where(jnp.isfinite(top), exact, -jnp.inf)
    best, at = jax.lax.top_k(exact, k)
    return best, jnp.take_along_axis(cand, at, 1)
