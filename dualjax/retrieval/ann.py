"""Nearest-neighbour search over corpus embeddings by inner product.

`exact`: chunked matmul + `jax.lax.top_k`. Queries are scored a chunk at a time, and
each query chunk scans the corpus a chunk at a time keeping a running top-k, so memory
holds at most [query_chunk, k + corpus_chunk] scores, never the full query x corpus
matrix.

`scann`: a ScaNN (pybind, CPU) searcher configured by corpus size after ScaNN's own rules
of thumb (see `default_scann_config`), saved to and reloaded from a directory keyed by a
fingerprint of the corpus and settings.

`hnsw`: a faiss HNSW graph (`IndexHNSWFlat`, inner product; faiss-cpu, imported only
then), saved and reloaded the same way. On the Quora benchmark (BENCHMARKS.md) it is
faster than ScaNN at recall@10 >= 0.95, but takes several times longer to build.

`make_index` gives any of them behind one `search(queries, k, exclude)` contract; each
lives in its own module (exact.py, scann_index.py, hnsw_index.py), re-exported here.
"""

from __future__ import annotations

import json
import os
import time
from typing import cast

import numpy as np

from dualjax.retrieval.exact import ExactIndex, exact_search  # noqa: F401 (the API)
from dualjax.retrieval.hnsw_index import (  # noqa: F401
    HnswIndex,
    default_hnsw_config,
    hnsw_settings,
    require_faiss,
)
from dualjax.retrieval.saved import Settings, corpus_fingerprint  # noqa: F401
from dualjax.retrieval.scann_index import (  # noqa: F401
    SCANN_MISSING,
    ScannIndex,
    default_scann_config,
    require_scann,
    scann_settings,
)

INDEXES = ("exact", "scann", "hnsw")


def make_index(kind: str, corpus: np.ndarray, eval_cfg: Settings, k: int,
               directory: str | None = None, extra: str = ""
               ) -> tuple[ExactIndex | ScannIndex | HnswIndex, dict]:
    """A searcher over corpus [n, dim] and info {built, build_seconds, bytes_on_disk, settings}.

    "scann" (eval_cfg.scann) or "hnsw" (faiss; eval_cfg.hnsw) with a directory loads the
    index saved there when its fingerprint (corpus bytes, `extra` such as the checkpoint
    step, and every build setting) matches, else builds and saves it. build_seconds is the
    time to have the index ready (building or loading).
    """
    start = time.perf_counter()
    idx: ExactIndex | ScannIndex | HnswIndex | None
    if kind == "exact":
        idx, built = ExactIndex(corpus, eval_cfg["query_chunk"], eval_cfg["corpus_chunk"]), True
    elif kind in ("scann", "hnsw"):
        cls, cfg = ((ScannIndex, eval_cfg.get("scann") or default_scann_config())
                    if kind == "scann" else (HnswIndex, eval_cfg.get("hnsw") or
                                             default_hnsw_config()))
        corpus = np.ascontiguousarray(corpus, np.float32)
        shape = cast("tuple[int, int]", corpus.shape)  # [n, dim]
        settings = (scann_settings if kind == "scann" else hnsw_settings)(*shape, k, cfg)
        # Search-time knobs stay out of the fingerprint: changing them reuses the index.
        build = {key: v for key, v in settings.items() if key not in ("num_threads", "ef_search")}
        fingerprint = corpus_fingerprint(corpus, extra + json.dumps(build, sort_keys=True))
        idx = cls.load(directory, fingerprint, *corpus.shape) if directory else None
        built = idx is None
        if idx is None:
            idx = cls.build(corpus, cfg, k)
            if directory:
                idx.save(directory, fingerprint)
        elif isinstance(idx, ScannIndex):  # kind == "scann"
            idx.set_num_threads(settings["num_threads"])
        else:
            idx.settings["ef_search"] = settings["ef_search"]
    else:
        raise ValueError(f"index {kind!r} is not one of: {', '.join(INDEXES)}")
    on_disk = kind in ("scann", "hnsw") and directory and os.path.isdir(directory)
    info = {"built": built, "build_seconds": time.perf_counter() - start,
            "bytes_on_disk": sum(e.stat().st_size for e in os.scandir(directory)
                                 if e.is_file()) if on_disk else 0,
            "settings": dict(idx.settings)}
    return idx, info
