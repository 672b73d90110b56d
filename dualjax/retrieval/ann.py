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

`make_index` gives any of them behind one contract (`searchers.Searcher`); each lives in
its own module (exact.py, scann_index.py, hnsw_index.py), registered in
`searchers.SEARCHERS` as it is imported here, and re-exported.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, cast

import numpy as np

from dualjax.retrieval import searchers
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

# dualjax's own searchers (the imports above registered them), in the order the commands
# list them; a searcher of your own registers itself the same way (searchers.py).
INDEXES = ("exact", "scann", "hnsw")
searchers.SEARCHERS.put_first(INDEXES)


def make_index(kind: str, corpus: np.ndarray, eval_cfg: Settings, k: int,
               directory: str | None = None, extra: str = ""
               ) -> tuple[searchers.Searcher, dict]:
    """A searcher of `kind` (`searchers.SEARCHERS`) over corpus [n, dim] and info {built,
    build_seconds, bytes_on_disk, settings}.

    A kind that saves itself ("scann": eval_cfg["scann"], "hnsw": eval_cfg["hnsw"]) with
    a directory loads the searcher saved there when its fingerprint (corpus bytes,
    `extra` such as the checkpoint step, and every build setting) matches, else builds and
    saves it. build_seconds is the time to have the searcher ready (building or loading).
    """
    start = time.perf_counter()
    spec = searchers.SEARCHERS.named(kind)
    idx: Any = None
    if spec.load is None:
        idx = spec.build(corpus, eval_cfg, k)
    else:
        corpus = np.ascontiguousarray(corpus, np.float32)
        n, dim = cast("tuple[int, int]", corpus.shape)
        settings = spec.settings(n, dim, k, eval_cfg)
        # Search-time knobs stay out of the fingerprint: changing them reuses the index.
        build = {key: v for key, v in settings.items() if key not in spec.search_time}
        fingerprint = corpus_fingerprint(corpus, extra + json.dumps(build, sort_keys=True))
        idx = spec.load(directory, fingerprint, n, dim) if directory else None
        if idx is not None:
            idx.tune(settings)
    built = idx is None or spec.load is None
    if idx is None:
        idx = spec.build(corpus, eval_cfg, k)
        if directory:
            idx.save(directory, fingerprint)
    on_disk = spec.saves and directory and os.path.isdir(directory)
    info = {"built": built, "build_seconds": time.perf_counter() - start,
            "bytes_on_disk": sum(e.stat().st_size for e in os.scandir(directory)
                                 if e.is_file()) if on_disk else 0,
            "settings": dict(idx.settings)}
    return idx, info
