"""ScaNN (pybind, CPU): a searcher configured by corpus size after ScaNN's own rules of
thumb (`default_scann_config`), saved to and reloaded from a directory keyed by a
fingerprint of the corpus and settings (`saved.py`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import types
from typing import Any, cast

import numpy as np
from absl import logging

from dualjax.retrieval import searchers
from dualjax.retrieval.saved import (
    Settings,
    drop_excluded,
    loaded,
    pad,
    save_index,
    saved_meta,
)

_MODES = ("auto", "brute_force", "ah", "tree_ah")



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
    s: dict[str, Any] = {"mode": mode,
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
              ) -> ScannIndex:
        """Trains a searcher over corpus [n, dim] (unit vectors: dot product = cosine)."""
        scann_ops_pybind = require_scann().scann_ops_pybind
        corpus = np.ascontiguousarray(corpus, np.float32)
        s = scann_settings(*cast("tuple[int, int]", corpus.shape), k, scann_cfg)
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
            return pad(np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int32), k)
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
            ids, scores = drop_excluded(ids, scores, exclude)
        return pad(scores, ids.astype(np.int32), k)

    def tune(self, settings: dict) -> None:
        """The search-time settings of `settings` (num_threads) on this searcher."""
        self.set_num_threads(settings["num_threads"])

    def set_num_threads(self, num_threads: int) -> None:
        """Threads for search (0: all cores this process may use)."""
        self.settings["num_threads"] = int(num_threads) or len(os.sched_getaffinity(0))
        self.searcher.set_num_threads(self.settings["num_threads"])

    def save(self, directory: str, fingerprint: str) -> None:
        """Writes the searcher and meta.json (last, so a partial save never loads)."""
        meta = {"fingerprint": fingerprint, "n": self.n, "dim": self.dim,
                "settings": self.settings, "scann": importlib.metadata.version("scann")}
        # movable: asset paths relative
        save_index(directory, "ScaNN", lambda tmp: self.searcher.serialize(
            tmp, relative_path=True), meta)

    @classmethod
    def load(cls, directory: str, fingerprint: str, n: int | None = None,
             dim: int | None = None) -> ScannIndex | None:
        """The searcher saved in `directory`, or None, logging why, when there is none or it
        was saved under another fingerprint, n or dim (None: unchecked) or scann version."""
        meta = saved_meta(directory, "ScaNN", {
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
        return loaded(directory, "ScaNN", cls(searcher, meta["settings"], meta["n"], meta["dim"]),
                       searcher.size(), meta)


def _scann_config(cfg: Settings) -> Settings:
    return cfg.get("scann") or default_scann_config()


searchers.register(searchers.Kind(
    "scann", lambda corpus, cfg, k: ScannIndex.build(corpus, _scann_config(cfg), k),
    load=ScannIndex.load, search_time=("num_threads",),
    settings=lambda n, dim, k, cfg: scann_settings(n, dim, k, _scann_config(cfg)),
    missing=lambda: None if importlib.util.find_spec("scann") else SCANN_MISSING,
    require=require_scann))
