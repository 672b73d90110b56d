"""A faiss HNSW graph (`IndexHNSWFlat`, inner product; faiss-cpu, imported only then),
saved and reloaded as ScaNN's is (`saved.py`)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, cast

import numpy as np
from absl import logging

from dualjax.retrieval import searchers
from dualjax.retrieval.exact import exact_search
from dualjax.retrieval.saved import (
    Settings,
    drop_excluded,
    loaded,
    pad,
    save_index,
    saved_meta,
)


def default_hnsw_config() -> dict[str, Any]:
    """faiss HNSW knobs, for callers whose eval config has no `hnsw` (configs/default.py's
    `eval.hnsw` holds the same values, commented)."""
    return {"M": 32, "ef_construction": 200, "ef_search": 0}


def hnsw_settings(n: int, dim: int, k: int, cfg: Settings) -> dict:
    """The knobs actually used (ef_search 0: max(128, 2 * (k + 1))). Raises ValueError
    naming the knob when a value cannot work."""
    if n < 1 or dim < 1:
        raise ValueError(f"cannot build an HNSW index over a corpus of shape ({n}, {dim})")
    if cfg["M"] < 2:
        raise ValueError(f"hnsw.M={cfg['M']} must be >= 2")
    if cfg["ef_construction"] < 1 or cfg["ef_search"] < 0:
        raise ValueError(f"hnsw.ef_construction={cfg['ef_construction']} must be >= 1 and "
                         f"hnsw.ef_search={cfg['ef_search']} >= 0 (0: auto)")
    return {"M": int(cfg["M"]), "ef_construction": int(cfg["ef_construction"]),
            "ef_search": int(cfg["ef_search"]) or max(128, 2 * (k + 1))}


def require_faiss():
    """faiss, imported on first use: only HNSW indexes need it."""
    try:
        import faiss
    except ImportError:
        raise ImportError("an HNSW index needs faiss: pip install faiss-cpu (or "
                          "'dualjax[bench]')") from None
    return faiss


class HnswIndex:
    """faiss HNSW (`IndexHNSWFlat`, inner product) with `ExactIndex.search`'s contract.

    settings: the knobs used (`hnsw_settings`); n, dim: the corpus shape it was built over.
    Searches use faiss' OpenMP threads (all cores unless OMP_NUM_THREADS says otherwise).
    """

    FILE = "hnsw.faiss"

    def __init__(self, faiss_index, settings: dict, n: int, dim: int):
        self.index, self.settings, self.n, self.dim = faiss_index, settings, n, dim

    @classmethod
    def build(cls, corpus: np.ndarray, hnsw_cfg: Settings, k: int
              ) -> HnswIndex:
        """Builds the graph over corpus [n, dim] (unit vectors: inner product = cosine)."""
        faiss = require_faiss()
        corpus = np.ascontiguousarray(corpus, np.float32)
        s = hnsw_settings(*cast("tuple[int, int]", corpus.shape), k, hnsw_cfg)
        idx = faiss.IndexHNSWFlat(corpus.shape[1], s["M"], faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = s["ef_construction"]
        idx.add(corpus)
        return cls(idx, s, *corpus.shape)

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k] float32, ids [nq, k] int32), best first, -inf / -1 padded.

        Asks for k + 1 neighbours, drops exclude[i] from row i (or the surplus last one).
        ef_search overrides the setting for this call (faiss searches at least k + 1 wide).
        """
        queries = np.ascontiguousarray(queries, np.float32)
        nq, want = len(queries), min(self.n, k + (exclude is not None))
        if nq == 0 or want == 0:
            return pad(np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int32), k)
        self.index.hnsw.efSearch = int(ef_search or self.settings["ef_search"])
        scores, ids = self.index.search(queries, want)
        ids, scores = ids.astype(np.int64), scores.astype(np.float32)
        short = (ids < 0).any(axis=1)
        if short.any():  # the graph walk found fewer than `want` (k near n): scan them all
            scores[short], ids[short] = self._scan(queries[short], want)
        if exclude is not None:
            ids, scores = drop_excluded(ids, scores, exclude)
        return pad(scores, ids.astype(np.int32), k)

    def _scan(self, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact (scores, ids) [nq, want] over the vectors the graph stores (chunked, as
        `exact_search` goes: never the whole queries x corpus matrix)."""
        return exact_search(queries, self.index.reconstruct_n(0, self.n), want)

    def tune(self, settings: dict) -> None:
        """The search-time settings of `settings` (ef_search) on this index."""
        self.settings["ef_search"] = settings["ef_search"]

    def save(self, directory: str, fingerprint: str) -> None:
        """Writes the index (faiss.write_index) and meta.json (last, so a partial save never
        loads). Replaces only an empty directory or a saved dualjax index."""
        faiss = require_faiss()
        meta = {"kind": "hnsw", "fingerprint": fingerprint, "n": self.n, "dim": self.dim,
                "settings": self.settings, "faiss": faiss.__version__}
        save_index(directory, "HNSW", lambda tmp: faiss.write_index(
            self.index, os.path.join(tmp, self.FILE)), meta)

    @classmethod
    def load(cls, directory: str, fingerprint: str, n: int | None = None,
             dim: int | None = None) -> HnswIndex | None:
        """The index saved in `directory`, or None, logging why, when there is none or it was
        saved under another fingerprint, n or dim (None: unchecked)."""
        meta = saved_meta(directory, "HNSW", {"kind": "hnsw", "n": n, "dim": dim,
                                               "fingerprint": fingerprint})
        if meta is None:
            return None
        try:
            idx = require_faiss().read_index(os.path.join(directory, cls.FILE))
        except (RuntimeError, OSError) as e:
            logging.warning("HNSW index at %s could not be loaded (%s); rebuilding", directory, e)
            return None
        return loaded(directory, "HNSW", cls(idx, meta["settings"], meta["n"], meta["dim"]),
                       idx.ntotal, meta)


FAISS_MISSING = "HNSW needs faiss: pip install 'dualjax[hnsw]' (or pip install faiss-cpu)"


def _hnsw_config(cfg: Settings) -> Settings:
    return cfg.get("hnsw") or default_hnsw_config()


searchers.register(searchers.Kind(
    "hnsw", lambda corpus, cfg, k: HnswIndex.build(corpus, _hnsw_config(cfg), k),
    load=HnswIndex.load, search_time=("ef_search",),
    settings=lambda n, dim, k, cfg: hnsw_settings(n, dim, k, _hnsw_config(cfg)),
    missing=lambda: None if importlib.util.find_spec("faiss") else FAISS_MISSING,
    require=require_faiss,
    check=lambda cfg: cfg.get("hnsw") is not None and hnsw_settings(1, 1, 1, cfg["hnsw"])))
