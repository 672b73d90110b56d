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

`make_index` gives any of them behind one `search(queries, k, exclude)` contract.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import time
import types
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

_META = "meta.json"


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


INDEXES = ("exact", "scann", "hnsw")
_MODES = ("auto", "brute_force", "ah", "tree_ah")


Settings = Mapping[str, Any]  # a plain dict, or the config's eval.scann / eval.hnsw


def default_scann_config() -> dict[str, Any]:
    """ScaNN knobs (mounted as `config.eval.scann`); 0 / "auto" pick by corpus size n.

    The defaults follow ScaNN's docs/algorithms.md rules of thumb.
    """
    c = types.SimpleNamespace()  # (c.KEY = ... # comment: what `--keys` prints for eval.scann)
    c.mode = "auto"               # "brute_force" | "ah" | "tree_ah"; auto: n < 20k brute force,
                                  # n < 100k AH + reorder, else tree + AH + reorder
    c.num_leaves = 0              # tree_ah: k-means partitions (0: round(sqrt(n)))
    c.spherical = True            # tree_ah: spherical k-means (centroids on the unit sphere;
                                  # on Quora bow embeddings recall@10 0.929 -> 0.950)
    c.num_leaves_to_search = 0    # tree_ah: partitions scored per query (0: ceil(num_leaves / 10),
                                  # ~10% of the corpus, ~20% of the points with SOAR's spilling:
                                  # recall-leaning, this is for evaluation)
    c.soar_lambda = 1.5           # tree_ah: SOAR spilling (Sun et al. 2023): each point is also
                                  # stored in a second leaf chosen to be orthogonal to its residual
                                  # (0: off). On Quora embeddings it raised recall@10 at 5% of the
                                  # leaves from 0.87 to 0.96 (BENCHMARKS.md)
    c.overretrieve_factor = 2.0   # tree_ah with SOAR: extra candidates to make up for duplicates
    c.training_sample_size = 0    # rows sampled to train the tree and AH codes (0: min(n, 250k))
    c.dims_per_block = 2          # AH: dimensions per 16-centre codebook block (a remainder
                                  # becomes one smaller block, so odd dims work)
    c.anisotropic_threshold = 0.2  # AH: anisotropic quantization threshold (unit-norm data)
    c.reorder_k = 0               # AH: candidates rescored exactly (0: max(1000, 10 * k); 2 * k
                                  # loses ~15% of recall@100 at k = 100)
    c.num_threads = 0             # build and search threads (0: all cores this process may use)
    return vars(c)


def scann_settings(n: int, dim: int, k: int, cfg: Settings) -> dict:
    """The knobs actually used for a corpus of n x dim searched for k results.

    Raises ValueError naming the knob when a value cannot work.
    """
    if cfg["mode"] not in _MODES:
        raise ValueError(f"scann mode {cfg['mode']!r} is not one of: {', '.join(_MODES)}")
    if n < 1 or dim < 1:
        raise ValueError(f"cannot build a ScaNN index over a corpus of shape ({n}, {dim})")
    mode = cfg["mode"] if cfg["mode"] != "auto" else (
        "brute_force" if n < 20_000 else "ah" if n < 100_000 else "tree_ah")
    s = {"mode": mode,
         "num_threads": int(cfg["num_threads"]) or len(os.sched_getaffinity(0))}
    if mode == "brute_force":
        return s
    if cfg["dims_per_block"] < 1:
        raise ValueError(f"scann dims_per_block={cfg['dims_per_block']} must be >= 1")
    s.update(dims_per_block=int(cfg["dims_per_block"]),
             anisotropic_threshold=float(cfg["anisotropic_threshold"]),
             reorder_k=min(n, int(cfg["reorder_k"]) or max(1000, 10 * k)),
             training_sample_size=min(n, int(cfg["training_sample_size"]) or 250_000))
    if mode == "tree_ah":
        leaves = int(cfg["num_leaves"]) or max(1, round(math.sqrt(n)))
        search = int(cfg["num_leaves_to_search"]) or -(-leaves // 10)
        if not 1 <= leaves <= s["training_sample_size"]:
            raise ValueError(f"scann num_leaves={leaves} must be in [1, training sample size "
                             f"{s['training_sample_size']}]")
        if not 1 <= search <= leaves:
            raise ValueError(f"scann num_leaves_to_search={search} must be in [1, {leaves}]")
        soar = float(cfg.get("soar_lambda", 0.0))
        if soar < 0 or (soar and cfg["overretrieve_factor"] < 1):
            raise ValueError(f"scann soar_lambda={soar} must be >= 0 (0: off) and "
                             f"overretrieve_factor={cfg['overretrieve_factor']} >= 1")
        s.update(num_leaves=leaves, num_leaves_to_search=search, spherical=bool(cfg["spherical"]),
                 soar_lambda=soar)
        if soar:
            s["overretrieve_factor"] = float(cfg["overretrieve_factor"])
        if cfg.get("quantize_centroids", False):  # int8 query-centroid scoring
            s["quantize_centroids"] = True
    if cfg.get("reorder_int8", False):  # reordering on int8 copies, not float32
        s["reorder_int8"] = True
    return s


def corpus_fingerprint(corpus: np.ndarray, extra: str = "") -> str:
    """sha256 hex digest of the corpus' shape, dtype and bytes, then `extra`."""
    corpus = np.ascontiguousarray(corpus)
    h = hashlib.sha256(f"{corpus.shape}|{corpus.dtype.str}|".encode())
    h.update(memoryview(corpus).cast("B"))
    h.update(extra.encode())
    return h.hexdigest()


def _pad(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[nq, <=k] -> [nq, k] with -inf / -1 on the right."""
    out_s = np.full((len(scores), k), -np.inf, np.float32)
    out_i = np.full((len(ids), k), -1, np.int32)
    width = min(k, scores.shape[1])
    out_s[:, :width], out_i[:, :width] = scores[:, :width], ids[:, :width]
    return out_s, out_i


def _drop_excluded(ids: np.ndarray, scores: np.ndarray, exclude: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """ids / scores [nq, w] (best first) of a search for one more than wanted: row i's first
    exclude[i] (if any) moves last as -1 / -inf, so the first w - 1 are the results."""
    exclude = np.asarray(exclude, np.int64)[:, None]
    hit = (ids == exclude) & (exclude >= 0)
    drop = hit & (np.cumsum(hit, axis=1) == 1)  # the first match only
    order = np.argsort(drop, axis=1, kind="stable")  # the dropped one goes last
    ids, scores = np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
    drop = np.take_along_axis(drop, order, 1)
    ids[drop], scores[drop] = -1, -np.inf
    return ids, scores


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


def _save_index(directory: str, label: str, write: Callable[[str], None], meta: dict) -> None:
    """`write(folder)` then meta.json (last, so a partial save never loads) into a fresh
    folder that replaces `directory`; refuses to replace a folder that is not a saved index."""
    occupied = os.path.isfile(directory) or os.path.isdir(directory) and os.listdir(directory)
    if occupied and not (os.path.isfile(os.path.join(directory, "scann_assets.pbtxt"))
                         or os.path.isfile(os.path.join(directory, _META))):
        raise ValueError(f"{directory} exists and is not a {label} index: not replacing it")
    tmp = f"{directory.rstrip('/')}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write(tmp)
    with open(os.path.join(tmp, _META), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


_WORDS = {"n": "corpus size", "scann": "scann version"}  # meta.json keys, as the log says them


def _saved_meta(directory: str, label: str, expected: dict) -> dict | None:
    """meta.json of the index saved in `directory` if each of its `expected` values (None:
    unchecked) matches; else None, logging why."""
    path = os.path.join(directory, _META)
    if not os.path.isfile(path):
        logging.warning("%s index: nothing saved at %s; building", label, directory)
        return None
    with open(path) as f:
        meta = json.load(f)
    for what, now in expected.items():
        if now is not None and meta.get(what) != now:  # fingerprint: another model/corpus/settings
            logging.warning("%s index at %s was saved for %s %.16s, not %.16s; rebuilding",
                            label, directory, _WORDS.get(what, what), meta.get(what), now)
            return None
    return meta


def _loaded(directory: str, label: str, searcher, size: int, meta: dict):
    """`searcher` if it holds meta.json's n rows; else None, logging why."""
    if size != meta["n"]:
        logging.warning("%s index at %s holds %d rows, meta.json says %d; rebuilding",
                        label, directory, size, meta["n"])
        return None
    return searcher


class ScannIndex:
    """ScaNN (pybind, dot product) searcher with `ExactIndex.search`'s contract.

    settings: the knobs used (`scann_settings`); n, dim: the corpus shape it was built over.
    """

    def __init__(self, searcher: Any, settings: dict, n: int,  # a ScannSearcher
                 dim: int):
        self.searcher, self.settings, self.n, self.dim = searcher, settings, n, dim
        searcher.set_num_threads(settings["num_threads"])

    @classmethod
    def build(cls, corpus: np.ndarray, scann_cfg: Settings, k: int
              ) -> "ScannIndex":
        """Trains a searcher over corpus [n, dim] (unit vectors: dot product = cosine)."""
        scann_ops_pybind = require_scann().scann_ops_pybind
        corpus = np.ascontiguousarray(corpus, np.float32)
        s = scann_settings(*corpus.shape, k, scann_cfg)
        b = scann_ops_pybind.builder(corpus, k, "dot_product").set_n_training_threads(
            s["num_threads"])
        if s["mode"] == "tree_ah":
            soar = ({"soar_lambda": s["soar_lambda"],
                     "overretrieve_factor": s["overretrieve_factor"]}
                    if s.get("soar_lambda") else {})
            b = b.tree(s["num_leaves"], s["num_leaves_to_search"],
                       training_sample_size=s["training_sample_size"], spherical=s["spherical"],
                       quantize_centroids=s.get("quantize_centroids", False), **soar)
        if s["mode"] == "brute_force":
            b = b.score_brute_force()
        else:
            from scann.scann_ops.py.scann_builder import ReorderType
            b = b.score_ah(s["dims_per_block"], s["anisotropic_threshold"],
                           training_sample_size=s["training_sample_size"]).reorder(
                s["reorder_k"], quantize=ReorderType.INT8 if s.get("reorder_int8")
                else ReorderType.FLOAT32)
        return cls(b.build(), s, *corpus.shape)

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               leaves_to_search: int | None = None, reorder_k: int | None = None,
               batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k] float32, ids [nq, k] int32), best first, -inf / -1 padded.

        Asks ScaNN for k + 1 neighbours, drops exclude[i] from row i (or the surplus last one).
        leaves_to_search / reorder_k override the built settings for this call (tree_ah / AH);
        batch_size the queries per `search_batched_parallel` batch (None: one batch per thread,
        at most 256).
        """
        queries = np.ascontiguousarray(queries, np.float32)
        nq, want = len(queries), min(self.n, k + (exclude is not None))
        if nq == 0 or want == 0:
            return _pad(np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int32), k)
        # final_num_neighbors above the reorder count silently comes back as NaN rows.
        pre = max(want, reorder_k or self.settings.get("reorder_k", want))
        batch = batch_size or min(256, -(-nq // self.settings["num_threads"]))  # 1 per thread
        kwargs = {"leaves_to_search": int(leaves_to_search)} if leaves_to_search else {}
        ids, scores = self.searcher.search_batched_parallel(
            queries, final_num_neighbors=want, pre_reorder_num_neighbors=pre, batch_size=batch,
            **kwargs)
        ids, scores = ids.astype(np.int64), scores.astype(np.float32)
        missing = ~np.isfinite(scores)  # fewer than `want` found: NaN score, id 0
        ids[missing], scores[missing] = -1, -np.inf
        if exclude is not None:
            ids, scores = _drop_excluded(ids, scores, exclude)
        return _pad(scores, ids.astype(np.int32), k)

    def set_num_threads(self, num_threads: int) -> None:
        """Threads for search (0: all cores this process may use)."""
        self.settings["num_threads"] = int(num_threads) or len(os.sched_getaffinity(0))
        self.searcher.set_num_threads(self.settings["num_threads"])

    def save(self, directory: str, fingerprint: str) -> None:
        """Writes the searcher and meta.json (last, so a partial save never loads)."""
        meta = {"fingerprint": fingerprint, "n": self.n, "dim": self.dim,
                "settings": self.settings, "scann": importlib.metadata.version("scann")}
        # movable: asset paths relative
        _save_index(directory, "ScaNN", lambda tmp: self.searcher.serialize(
            tmp, relative_path=True), meta)

    @classmethod
    def load(cls, directory: str, fingerprint: str, n: int | None = None,
             dim: int | None = None) -> "ScannIndex | None":
        """The searcher saved in `directory`, or None, logging why, when there is none or it
        was saved under another fingerprint, n or dim (None: unchecked) or scann version."""
        meta = _saved_meta(directory, "ScaNN", {
            "n": n, "dim": dim, "fingerprint": fingerprint,
            "scann": importlib.metadata.version("scann")})
        if meta is None:
            return None
        scann_ops_pybind = require_scann().scann_ops_pybind
        try:
            searcher = scann_ops_pybind.load_searcher(directory)
        except (RuntimeError, ValueError, OSError) as e:
            logging.warning("ScaNN index at %s could not be loaded (%s); rebuilding", directory, e)
            return None
        return _loaded(directory, "ScaNN", cls(searcher, meta["settings"], meta["n"], meta["dim"]),
                       searcher.size(), meta)


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


SCANN_MISSING = ("ScaNN is not installed (its wheels are for Linux only): pip install "
                 "'dualjax[scann]' on Linux, or search exactly or with HNSW")


def require_scann():
    """scann, imported on first use; ImportError saying what to install or use instead."""
    try:
        import scann
        from scann import scann_ops_pybind  # noqa: F401 (the module the searcher uses)
    except ImportError:
        raise ImportError(SCANN_MISSING) from None
    return scann


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
              ) -> "HnswIndex":
        """Builds the graph over corpus [n, dim] (unit vectors: inner product = cosine)."""
        faiss = require_faiss()
        corpus = np.ascontiguousarray(corpus, np.float32)
        s = hnsw_settings(*corpus.shape, k, hnsw_cfg)
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
            return _pad(np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int32), k)
        self.index.hnsw.efSearch = int(ef_search or self.settings["ef_search"])
        scores, ids = self.index.search(queries, want)
        ids, scores = ids.astype(np.int64), scores.astype(np.float32)
        short = (ids < 0).any(axis=1)
        if short.any():  # the graph walk found fewer than `want` (k near n): scan them all
            scores[short], ids[short] = self._scan(queries[short], want)
        if exclude is not None:
            ids, scores = _drop_excluded(ids, scores, exclude)
        return _pad(scores, ids.astype(np.int32), k)

    def _scan(self, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact (scores, ids) [nq, want] over the vectors the graph stores (chunked, as
        `exact_search` goes: never the whole queries x corpus matrix)."""
        return exact_search(queries, self.index.reconstruct_n(0, self.n), want)

    def save(self, directory: str, fingerprint: str) -> None:
        """Writes the index (faiss.write_index) and meta.json (last, so a partial save never
        loads). Replaces only an empty directory or a saved dualjax index."""
        faiss = require_faiss()
        meta = {"kind": "hnsw", "fingerprint": fingerprint, "n": self.n, "dim": self.dim,
                "settings": self.settings, "faiss": faiss.__version__}
        _save_index(directory, "HNSW", lambda tmp: faiss.write_index(
            self.index, os.path.join(tmp, self.FILE)), meta)

    @classmethod
    def load(cls, directory: str, fingerprint: str, n: int | None = None,
             dim: int | None = None) -> "HnswIndex | None":
        """The index saved in `directory`, or None, logging why, when there is none or it was
        saved under another fingerprint, n or dim (None: unchecked)."""
        meta = _saved_meta(directory, "HNSW", {"kind": "hnsw", "n": n, "dim": dim,
                                               "fingerprint": fingerprint})
        if meta is None:
            return None
        try:
            idx = require_faiss().read_index(os.path.join(directory, cls.FILE))
        except (RuntimeError, OSError) as e:
            logging.warning("HNSW index at %s could not be loaded (%s); rebuilding", directory, e)
            return None
        return _loaded(directory, "HNSW", cls(idx, meta["settings"], meta["n"], meta["dim"]),
                       idx.ntotal, meta)


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
    if kind == "exact":
        idx, built = ExactIndex(corpus, eval_cfg["query_chunk"], eval_cfg["corpus_chunk"]), True
    elif kind in ("scann", "hnsw"):
        cls, cfg = ((ScannIndex, eval_cfg.get("scann") or default_scann_config())
                    if kind == "scann" else (HnswIndex, eval_cfg.get("hnsw") or
                                             default_hnsw_config()))
        corpus = np.ascontiguousarray(corpus, np.float32)
        settings = (scann_settings if kind == "scann" else hnsw_settings)(*corpus.shape, k, cfg)
        # Search-time knobs stay out of the fingerprint: changing them reuses the index.
        build = {key: v for key, v in settings.items() if key not in ("num_threads", "ef_search")}
        fingerprint = corpus_fingerprint(corpus, extra + json.dumps(build, sort_keys=True))
        idx = cls.load(directory, fingerprint, *corpus.shape) if directory else None
        built = idx is None
        if built:
            idx = cls.build(corpus, cfg, k)
            if directory:
                idx.save(directory, fingerprint)
        elif kind == "scann":
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
