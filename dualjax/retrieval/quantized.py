"""Quantized corpus vectors: int8 (one byte a dimension) and binary (one bit a dimension),
searched over the codes and rescored (sentence-transformers' `quantize_embeddings` and
`semantic_search_*(rescore=True)`).

- int8: each dimension's range over the corpus, [lo, hi], cut into 256 steps
  (`Int8Codes`); the corpus is kept as those codes alone. A query is coded the same way
  for the first pass (codes against codes), then the top `rescore` candidates are scored
  with the float query against the decoded corpus vectors.
- binary: the sign of each coordinate, packed eight to a byte. The first pass ranks by
  Hamming distance between the query's signs and the corpus', then the top `rescore`
  are scored with the float query against the corpus' +-1 vectors.

`QuantizedIndex.search` keeps `ExactIndex.search`'s contract (scores, ids [nq, k], a
query's own document excluded, -1 padding); the float corpus vectors are not kept.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

KINDS = ("int8", "binary")
FILE = "quantized.npz"
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


@dataclasses.dataclass(frozen=True)
class QuantizedIndex:
    """kind "int8": codes int8 [n, dim], lo and step float32 [dim] (x ~ lo + (code + 128)
    * step); kind "binary": codes uint8 [n, ceil(dim / 8)] (np.packbits of x > 0)."""
    kind: str
    codes: np.ndarray
    dim: int
    lo: np.ndarray | None = None
    step: np.ndarray | None = None
    rescore: int = 0  # candidates rescored with the float query (0: 4 x k)

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
            return bits.astype(np.float32) * 2.0 - 1.0
        return self.lo + (codes.astype(np.float32) + 128.0) * self.step

    def _first_pass(self, queries: np.ndarray) -> np.ndarray:
        """float32 [nq, n]: higher is better (codes against codes)."""
        if self.kind == "binary":
            q = np.packbits(queries > 0, axis=1)
            return -np.stack([_POPCOUNT[np.bitwise_xor(self.codes, row)].sum(1, dtype=np.int32)
                              for row in q]).astype(np.float32)
        q = _int8(queries, self.lo, self.step).astype(np.float32)
        return q @ self.codes.T.astype(np.float32)

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               query_chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) [nq, k] best first: the top max(rescore, k) of the first pass,
        rescored as float query . decoded corpus vector; `exclude[i]` (-1: none) is never
        query i's answer."""
        queries = np.asarray(queries, np.float32)
        n, nq = len(self.codes), len(queries)
        k = min(k, n)
        depth = min(n, max(self.rescore or 4 * k, k))
        scores = np.full((nq, k), -np.inf, np.float32)
        ids = np.full((nq, k), -1, np.int64)
        for at in range(0, nq, query_chunk):
            q = queries[at:at + query_chunk]
            first = self._first_pass(q)
            if exclude is not None:
                own = np.asarray(exclude[at:at + len(q)])
                rows = np.nonzero(own >= 0)[0]
                first[rows, own[rows]] = -np.inf
            cand = np.argpartition(-first, depth - 1, axis=1)[:, :depth]
            exact = np.einsum("qd,qcd->qc", q, self.decoded(cand))
            exact[np.take_along_axis(first, cand, 1) == -np.inf] = -np.inf
            best = np.argsort(-exact, axis=1, kind="stable")[:, :k]
            scores[at:at + len(q)] = np.take_along_axis(exact, best, 1)
            ids[at:at + len(q)] = np.take_along_axis(cand, best, 1)
        ids[~np.isfinite(scores)] = -1
        return scores, ids

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        arrays = {"codes": self.codes, "dim": np.int64(self.dim),
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
