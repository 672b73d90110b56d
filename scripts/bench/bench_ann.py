"""ANN speed and quality on a trained dual encoder's own corpus embeddings: ScaNN vs faiss,
each swept down to its fastest setting.

Loads a workdir's latest checkpoint (`dualjax.train.trained.load_trained`, without
building or saving an index under the workdir: this script writes nothing there),
encodes the corpus and the queries of an evaluation split, and measures, all with the
same number of threads:

- exact search: numpy (float32 matmul + argpartition) — the ground truth — and
  dualjax's own `ann.ExactIndex` (jax chunked matmul + top_k);
- ScaNN through `ann.ScannIndex`: the evaluation default (`ann.default_scann_config`,
  searched at its built setting), and trees of 1, 2 and 4 x round(sqrt(n)) leaves (more
  leaves than sqrt(n) for throughput, as ScaNN's docs advise) with SOAR, asymmetric hashing
  of 1, 2 or 4 dimensions per block, two anisotropic thresholds, float32 or int8
  reordering, each searched at leaves_to_search from 1 upward x reorder_k 20 / 50 / 100,
  and the fastest-looking tree also at several query batch sizes
  (`search_batched_parallel`); plus its brute force;
- faiss: `IndexHNSWFlat` (inner product, efConstruction 200) for M 16 and 32 at efSearch
  from k upward, and `IndexIVFPQ` (inner product, nlist = 4 sqrt(n), m = dim / 2 sub-
  quantizers of 8 bits) at nprobe from 1 upward, with and without an exact re-ranking
  step (`IndexRefineFlat`).

Every index is built first and kept; then --repeats timed passes over the whole query set
run interleaved (round 1 over every setting in order, round 2 in reverse order, ...), so
a burst of load on a shared machine hits every method alike; the fastest pass counts
(after one untimed warm-up call per setting). Per setting: build seconds, index size
(ScaNN: bytes of the saved searcher; faiss: `faiss.serialize_index` bytes; exact: the
float32 corpus), queries/second and recall@k against the numpy exact top k. Every query
excludes its own corpus row (`query_corpus_index`): the exact searches mask it, the
approximate ones ask for k + 1 neighbours and drop it (or the surplus last one), as
`ScannIndex.search` does.

Prints, per method, the Pareto frontier (settings that no other setting of the same
method beats on both queries/s and recall@k) as a markdown table, the machine, and the
verdict: the fastest setting of each method that reaches recall@k >= --target_recall, and
whether ScaNN's is at least as fast as every other method's. --json writes every setting;
--plot writes the frontiers (recall on x, queries/s on a log y) as a PNG, by default
next to --json.

    python scripts/bench/bench_ann.py --workdir=/tmp/run [--split=test] [--k=10] [--threads=2]
        [--max_queries=N] [--repeats=2] [--json=out.json] [--plot=frontier.png]
        [--methods=exact,scann,hnsw,ivfpq] [--scann_variants=default,leaves,...]

--methods and --scann_variants narrow a run to a few contenders (e.g. to time the two
fastest settings over more passes).

Run it from the directory the training ran from: a relative `data.path` (or a dataset's
default path) in the workdir's config.json resolves against the current directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any


# ----------------------------------------------------------------------------- arguments
def csv_ints(text: str) -> list[int]:
    """"32,64" -> [32, 64]."""
    return [int(v) for v in text.split(",") if v.strip()]


def csv_strs(text: str) -> list[str]:
    """"a, b" -> ["a", "b"]."""
    return [v.strip() for v in text.split(",") if v.strip()]


METHODS = ("exact", "scann", "hnsw", "ivfpq")
SCANN_VARIANTS = ("default", "leaves", "dpb", "threshold", "int8", "batch", "brute_force")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="A trained dualjax workdir (read only).")
    p.add_argument("--split", default="test", help="Evaluation split (corpus and queries).")
    p.add_argument("--k", type=int, default=10, help="Neighbours per query (recall@k).")
    p.add_argument("--threads", type=int, default=2,
                   help="Threads for every method (build and search).")
    p.add_argument("--max_queries", type=int, default=0,
                   help="Use only the first N queries of the split (0: all).")
    p.add_argument("--repeats", type=int, default=2,
                   help="Timed passes over the query set per setting, interleaved across "
                        "settings; the fastest counts.")
    p.add_argument("--target_recall", type=float, default=0.95,
                   help="The recall@k bar of the verdict line.")
    p.add_argument("--methods", type=csv_strs, default=list(METHODS),
                   help=f"Methods to time (comma separated, of: {', '.join(METHODS)}); the "
                        "numpy exact search runs anyway, as the ground truth.")
    p.add_argument("--scann_variants", type=csv_strs, default=list(SCANN_VARIANTS),
                   help=f"ScaNN indexes to build (of: {', '.join(SCANN_VARIANTS)}): the "
                        "evaluation default, the trees of --scann_leaf_factors, the variants "
                        "of AH dims per block, anisotropic threshold, int8, batch size, and "
                        "brute force.")
    p.add_argument("--scann_leaf_factors", type=csv_ints, default=[1, 2, 4],
                   help="ScaNN trees with these multiples of round(sqrt(n)) leaves (SOAR, AH "
                        "2 dims per block); the first multiple other than 1 also gets the "
                        "dims-per-block, threshold, int8 and batch-size variants.")
    p.add_argument("--scann_reorder", type=csv_ints, default=[20, 50, 100],
                   help="ScaNN: reorder_k values (candidates re-scored exactly) of the sweep.")
    p.add_argument("--scann_batch", type=csv_ints, default=[32, 128, 512, 2048],
                   help="ScaNN: search_batched_parallel batch sizes tried on one tree "
                        "(besides ScannIndex's own, min(256, queries / threads)).")
    p.add_argument("--hnsw_m", type=csv_ints, default=[16, 32], help="faiss HNSW: M values.")
    p.add_argument("--hnsw_ef_construction", type=int, default=200,
                   help="faiss HNSW: efConstruction.")
    p.add_argument("--hnsw_ef_search", type=csv_ints,
                   default=[10, 12, 16, 20, 24, 32, 48, 64, 128],
                   help="faiss HNSW: efSearch values (comma separated; faiss searches with at "
                        "least k + 1 = the neighbours asked for).")
    p.add_argument("--ivf_nlist", type=int, default=0,
                   help="faiss IVF-PQ: inverted lists (0: 4 sqrt(n), at most n / 39).")
    p.add_argument("--pq_dims", type=csv_ints, default=[2],
                   help="faiss IVF-PQ: dimensions per sub-quantizer, one index each "
                        "(m = dim / value; comma separated).")
    p.add_argument("--nprobe", type=csv_ints, default=[1, 2, 4, 8, 16, 32, 64, 128],
                   help="faiss IVF-PQ: nprobe values (comma separated).")
    p.add_argument("--refine_k_factor", type=float, default=10.0,
                   help="faiss IndexRefineFlat: candidates re-ranked exactly = k_factor * (k+1).")
    p.add_argument("--json", default="", help="Also write the results to this JSON file.")
    p.add_argument("--plot", default=None,
                   help="Write the frontier plot (PNG) here; default: next to --json "
                        "(<json stem>_frontier.png); '' with no --json: none.")
    args = p.parse_args(argv)
    if args.threads < 1 or args.k < 1 or args.repeats < 1:
        p.error("--threads, --k and --repeats must be >= 1")
    for flag, given, allowed in (("--methods", args.methods, METHODS),
                                 ("--scann_variants", args.scann_variants, SCANN_VARIANTS)):
        if set(given) - set(allowed):
            p.error(f"{flag}: {', '.join(sorted(set(given) - set(allowed)))} not one of "
                    f"{', '.join(allowed)}")
    if args.plot is None:
        args.plot = os.path.splitext(args.json)[0] + "_frontier.png" if args.json else ""
    return args


def limit_threads(threads: int) -> None:
    """Sizes the BLAS / OpenMP pools (OpenMP workers wait passively unless OMP_WAIT_POLICY
    says otherwise), and with fewer threads than usable cores pins this
    process to `threads` of them (so XLA's pool, which counts usable cores, follows).

    Must run before numpy, jax or faiss are imported: their pools size themselves then.
    """
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    # Idle OpenMP workers sleep instead of spinning: on a shared, loaded machine spinning
    # halves faiss' PQ training speed (measured); searches are one parallel region each.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])
    limit_threads(ARGS.threads)

# Imported after `limit_threads` on purpose (see there).
import faiss  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import cpu_model  # noqa: E402

from dualjax import models  # noqa: E402
from dualjax.data import builders  # noqa: E402
from dualjax.eval import scoring  # noqa: E402
from dualjax.retrieval import ann, encoding  # noqa: E402
from dualjax.runtime import sharding  # noqa: E402
from dualjax.train.trained import load_trained  # noqa: E402

# ----------------------------------------------------------------------------- embeddings
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class Embedded:
    """A split's corpus and query embeddings, and each query's own corpus row (or -1)."""

    corpus: np.ndarray   # [n, dim] float32, unit rows
    queries: np.ndarray  # [nq, dim] float32
    exclude: np.ndarray  # [nq] int64
    step: int
    query_chunk: int     # eval.query_chunk, eval.corpus_chunk of the run
    corpus_chunk: int


def embed_split(workdir: str, split: str, max_queries: int) -> Embedded:
    """Restores the latest checkpoint's params (`trained.load_trained`; no index is built
    or saved under the workdir) and encodes the split's corpus and queries."""
    run, inputs, model, params, step = load_trained(workdir)  # (config.json upgraded)
    mesh = sharding.make_mesh()
    encode_queries, encode_documents = models.make_encoders(model)
    [first] = run.tasks[:1]
    task = builders.eval_task(builders.DatasetSpec.of(first.data, run.schedule.seed),
                              first.tfds_dir, split)
    queries = task.queries[:max_queries] if max_queries > 0 else task.queries
    enc = dict(batch_size=run.eval.batch_size, mesh=mesh)
    corpus_emb = encoding.encode_texts(lambda x: encode_documents(params, x), task.corpus,
                                       inputs.document, desc="encode corpus",
                                       fields=task.corpus_fields, **enc)
    query_emb = encoding.encode_texts(lambda x: encode_queries(params, x), queries, inputs.query,
                                      desc="encode queries", fields=task.query_fields and
                                      task.query_fields[:len(queries)], **enc)
    return Embedded(corpus=np.ascontiguousarray(corpus_emb, np.float32),
                    queries=np.ascontiguousarray(query_emb, np.float32),
                    exclude=np.asarray(task.query_corpus_index[:len(queries)], np.int64),
                    step=int(step), query_chunk=run.eval.index_settings["query_chunk"],
                    corpus_chunk=run.eval.index_settings["corpus_chunk"])


# ----------------------------------------------------------------------------- settings
SearchFn = Callable[[np.ndarray], np.ndarray]  # queries [nq, dim] -> ids [nq, k]


@dataclasses.dataclass
class Setting:
    """One method/setting to time: its index is built and kept until every pass is done."""

    family: str       # "exact" | "scann" | "faiss"
    method: str       # the frontier groups settings by this
    settings: str
    build_s: float | None
    size_bytes: int
    search: SearchFn
    details: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Row:
    """One measured method/setting."""

    family: str       # "exact" | "scann" | "faiss"
    method: str
    settings: str
    build_s: float | None
    size_bytes: int
    seconds: float    # the whole query set, fastest pass
    qps: float
    recall: float     # recall@k against the numpy exact top k
    details: dict = dataclasses.field(default_factory=dict)


def measure(settings: Sequence[Setting], queries: np.ndarray, truth: np.ndarray, k: int,
            repeats: int, warmup: int) -> list[Row]:
    """Times every setting over the whole query set `repeats` times, interleaved: pass r
    visits every setting, in order for even r and in reverse for odd r (one untimed
    warm-up call on the first `warmup` queries before a setting's first pass). The fastest
    pass counts; recall@k comes from the first pass's ids."""
    best = [math.inf] * len(settings)
    recall: list[float | None] = [None] * len(settings)
    for r in range(repeats):
        order = range(len(settings)) if r % 2 == 0 else reversed(range(len(settings)))
        start_round = time.perf_counter()
        for i in order:
            s = settings[i]
            if r == 0:
                s.search(queries[:max(1, min(warmup, len(queries)))])
            start = time.perf_counter()
            ids = s.search(queries)
            seconds = time.perf_counter() - start
            best[i] = min(best[i], seconds)
            if recall[i] is None:
                recall[i] = scoring.ann_recall(ids, truth, k)
            if r == 0:
                print(f"  {s.method}: {s.settings}: recall {recall[i]:.4f}, "
                      f"{len(queries) / seconds:,.0f} QPS", flush=True)
        print(f"timed pass {r + 1}/{repeats} over {len(settings)} settings in "
              f"{time.perf_counter() - start_round:.0f}s", flush=True)
    return [Row(s.family, s.method, s.settings, s.build_s, s.size_bytes, best[i],
                len(queries) / best[i], float(recall[i]), s.details)
            for i, s in enumerate(settings)]


def drop_self(ids: np.ndarray, exclude: np.ndarray, k: int) -> np.ndarray:
    """ids [nq, w] (best first, -1: none) of a search for k + 1 -> [nq, k]: each row
    without its query's own corpus index (first occurrence) or else without its last
    (surplus) entry, padded with -1 to k; `ScannIndex.search`'s rule."""
    ids = np.asarray(ids, np.int64)
    if ids.shape[1] == 0:
        return np.full((len(ids), k), -1, np.int64)
    hit = (ids == exclude[:, None]) & (exclude[:, None] >= 0)
    drop = hit & (np.cumsum(hit, axis=1) == 1)
    drop[~drop.any(axis=1), -1] = True
    kept = ids[~drop].reshape(len(ids), ids.shape[1] - 1)
    out = np.full((len(ids), k), -1, np.int64)
    width = min(k, kept.shape[1])
    out[:, :width] = kept[:, :width]
    return out


def numpy_exact(queries: np.ndarray, corpus: np.ndarray, k: int, exclude: np.ndarray,
                chunk: int = 1024) -> np.ndarray:
    """Exact top-k ids [nq, k] by float32 matmul + argpartition, each query's own corpus
    row masked; -1 past the corpus."""
    n = len(corpus)
    kk = min(k, n)
    out = np.full((len(queries), k), -1, np.int64)
    corpus_t = np.ascontiguousarray(corpus.T)
    for start in range(0, len(queries), chunk):
        scores = queries[start:start + chunk] @ corpus_t
        rows = np.arange(len(scores))
        ex = exclude[start:start + chunk]
        own = ex >= 0
        scores[rows[own], ex[own]] = -np.inf
        part = np.argpartition(scores, n - kk, axis=1)[:, n - kk:]
        part_scores = np.take_along_axis(scores, part, axis=1)
        order = np.argsort(-part_scores, axis=1, kind="stable")
        top = np.take_along_axis(part, order, axis=1)
        top[~np.isfinite(np.take_along_axis(part_scores, order, axis=1))] = -1
        out[start:start + len(scores), :kk] = top
    return out


def dir_bytes(path: str) -> int:
    """Total size of the files under `path`."""
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def leaf_sweep(leaves: int, low: float = 0.0, high: float = 0.1) -> list[int]:
    """leaves_to_search from 1 upward, about x1.5 apart, up to `high` of the leaves (and
    that), keeping those at or above `low` of the leaves."""
    top = max(1, round(leaves * high))
    out, v = {top}, 1.0
    while round(v) <= top:
        out.add(int(round(v)))
        v *= 1.5
    return sorted(ls for ls in out if ls >= low * leaves)


# ----------------------------------------------------------------------------- ScaNN
@dataclasses.dataclass
class ScannVariant:
    name: str
    cfg: ml_collections.ConfigDict
    searches: list[tuple[int, int, int]]  # (leaves_to_search, reorder_k, batch); 0: default
    group: str = ""                        # its --scann_variants name


def scann_variants(n: int, dim: int, k: int, args: argparse.Namespace
                   ) -> list[ScannVariant]:
    """Each built once and searched at every (leaves, reorder, batch) setting.

    - "eval default": `ann.default_scann_config()` as evaluation uses it (tree of
      round(sqrt(n)) leaves + SOAR + AH + reorder, 10% of the leaves, reorder
      max(1000, 10k)), at its built setting, and swept like the others;
    - "Lx": trees of L x round(sqrt(n)) leaves (SOAR, AH 2 dims per block, threshold 0.2,
      float32 reordering) at leaves_to_search 1 ... 10% of the leaves (x reorder_k);
    - on the tree of the first multiple other than 1, from 0.5% to 6% of its leaves: AH 1
      and 4 dims per block, anisotropic threshold 0.4 (the default 0.2 is ScaNN's advice for
      unit-norm data), int8 reordering with int8 centroids, and query batch sizes;
    - brute force.
    """
    sqrt_n = max(1, round(math.sqrt(n)))
    reorders = sorted({max(r, k + 1) for r in args.scann_reorder})

    def cfg(**overrides: Any) -> ml_collections.ConfigDict:
        c = ann.default_scann_config()
        c["num_threads"] = args.threads
        c.update(overrides)
        return c

    def sweep(leaves: int, low: float = 0.0, high: float = 0.1, batches: Sequence[int] = (0,)
              ) -> list[tuple[int, int, int]]:
        return [(ls, r, b) for ls in leaf_sweep(leaves, low, high) for r in reorders
                for b in batches]

    out = []
    base = cfg()
    base_leaves = ann.scann_settings(n, dim, k, base).get("num_leaves", sqrt_n)
    out.append(ScannVariant("eval default", base, [(0, 0, 0)] + sweep(base_leaves), "default"))
    factors = [f for f in args.scann_leaf_factors if f != 1]
    for f in factors:
        out.append(ScannVariant(f"{f}x sqrt(n) leaves", cfg(mode="tree_ah",
                                                             num_leaves=f * sqrt_n),
                                sweep(f * sqrt_n), "leaves"))
    if factors:
        leaves = factors[0] * sqrt_n
        tuned = dict(mode="tree_ah", num_leaves=leaves)
        for group, name, extra in (
                ("dpb", "AH 1 dim/block", dict(dims_per_block=1)),
                ("dpb", "AH 4 dims/block", dict(dims_per_block=4)),
                ("threshold", "AH threshold 0.4", dict(anisotropic_threshold=0.4)),
                ("int8", "int8 reorder + centroids",
                 dict(reorder_int8=True, quantize_centroids=True))):
            out.append(ScannVariant(f"{factors[0]}x, {name}", cfg(**extra, **tuned),
                                    sweep(leaves, 0.005, 0.06), group))
        # Query batch size: on the plain tree of this size, near the bar.
        out.append(ScannVariant(f"{factors[0]}x, batch sizes", cfg(**tuned),
                                sweep(leaves, 0.012, 0.04, args.scann_batch), "batch"))
    out.append(ScannVariant("brute force", cfg(mode="brute_force"), [(0, 0, 0)], "brute_force"))
    out = [v for v in out if v.group in args.scann_variants]
    for v in out:
        if ann.scann_settings(n, dim, k, v.cfg)["mode"] != "tree_ah":
            v.searches = [(0, 0, 0)]
    return out


def bench_scann(emb: Embedded, k: int, args: argparse.Namespace) -> list[Setting]:
    out = []
    n, dim = emb.corpus.shape
    built: dict[str, tuple[ann.ScannIndex, float, int]] = {}
    for v in scann_variants(n, dim, k, args):
        key = json.dumps(ann.scann_settings(n, dim, k, v.cfg), sort_keys=True)
        if key in built:  # the "batch sizes" tree is the "2x" tree: build once
            idx, build_s, size = built[key]
        else:
            start = time.perf_counter()
            idx = ann.ScannIndex.build(emb.corpus, v.cfg, k)
            build_s = time.perf_counter() - start
            tmp = tempfile.mkdtemp(prefix="bench_ann_scann_")
            try:
                idx.save(os.path.join(tmp, "index"), fingerprint="bench_ann")
                size = dir_bytes(os.path.join(tmp, "index"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            built[key] = (idx, build_s, size)
            print(f"  built ScaNN {v.name} in {build_s:.1f}s ({size / 2**20:.0f} MB)", flush=True)
        s = dict(idx.settings)
        brute = s["mode"] == "brute_force"
        for leaves, reorder, batch in v.searches:
            used = {**s, **({"num_leaves_to_search": leaves} if leaves else {}),
                    **({"reorder_k": reorder} if reorder else {}),
                    **({"batch_size": batch} if batch else {})}
            shown = {key: used[key] for key in (
                "num_leaves", "num_leaves_to_search", "dims_per_block", "anisotropic_threshold",
                "reorder_int8", "reorder_k", "batch_size") if key in used}
            names = {"num_leaves": "leaves", "num_leaves_to_search": "search",
                     "dims_per_block": "dpb", "anisotropic_threshold": "AT",
                     "reorder_int8": "int8", "reorder_k": "reorder", "batch_size": "batch"}
            text = f"{v.name}: " + ", ".join(f"{names[a]}={b}" for a, b in shown.items())
            if (leaves, reorder, batch) == (0, 0, 0) and not brute:
                text = f"{v.name} (built setting): " + text.split(": ", 1)[1]

            def search_fn(q, idx=idx, leaves=leaves, reorder=reorder, batch=batch):
                return idx.search(q, k, emb.exclude[:len(q)], leaves_to_search=leaves or None,
                                  reorder_k=reorder or None, batch_size=batch or None)[1]

            method = "ScaNN brute force" if brute else "ScaNN"
            out.append(Setting("scann", method, "float32 dot products" if brute else text,
                               build_s, size,
                               search_fn, {"variant": v.name, "settings": used}))
    return out


# ----------------------------------------------------------------------------- faiss
def faiss_search_fn(idx: faiss.Index, k: int, n: int, exclude: np.ndarray,
                    **params: int) -> SearchFn:
    """queries -> ids [nq, k]: a search for k + 1 with each query's own row dropped, after
    setting `params` (efSearch of idx.hnsw, nprobe of an IVF index) on the index."""

    def search(q: np.ndarray) -> np.ndarray:
        if "efSearch" in params:
            idx.hnsw.efSearch = params["efSearch"]
        if "nprobe" in params:
            faiss.extract_index_ivf(idx).nprobe = params["nprobe"]
        _, ids = idx.search(q, min(k + 1, n))
        return drop_self(ids, exclude[:len(q)], k)

    return search


def bench_hnsw(emb: Embedded, k: int, args: argparse.Namespace) -> list[Setting]:
    n, dim = emb.corpus.shape
    out = []
    for m in args.hnsw_m:
        start = time.perf_counter()
        idx = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = args.hnsw_ef_construction
        idx.add(emb.corpus)
        build_s = time.perf_counter() - start
        size = len(faiss.serialize_index(idx))
        print(f"  built faiss HNSW M={m} in {build_s:.1f}s ({size / 2**20:.0f} MB)", flush=True)
        for ef in sorted(set(args.hnsw_ef_search)):
            out.append(Setting("faiss", "faiss HNSW",
                               f"M={m}, efC={args.hnsw_ef_construction}, efSearch={ef}",
                               build_s, size, faiss_search_fn(idx, k, n, emb.exclude, efSearch=ef),
                               {"M": m, "efConstruction": args.hnsw_ef_construction,
                                "efSearch": ef}))
    return out


def pq_m(dim: int, dims_per_subquantizer: int) -> int:
    """The largest divisor of dim that is at most dim / dims_per_subquantizer (>= 1)."""
    m = max(1, dim // max(1, dims_per_subquantizer))
    while dim % m:
        m -= 1
    return m


def bench_ivfpq(emb: Embedded, k: int, args: argparse.Namespace) -> list[Setting]:
    n, dim = emb.corpus.shape
    nlist = args.ivf_nlist or max(1, min(round(4 * math.sqrt(n)), n // 39))
    nbits = max(1, min(8, int(math.log2(n))))  # PQ trains 2^nbits centres per sub-space
    nprobes = sorted({min(p, nlist) for p in args.nprobe})
    out = []
    for m in sorted({pq_m(dim, d) for d in args.pq_dims}, reverse=True):
        start = time.perf_counter()
        base = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, m, nbits,
                                faiss.METRIC_INNER_PRODUCT)
        base.train(emb.corpus)
        base.add(emb.corpus)
        build_s = time.perf_counter() - start
        size = len(faiss.serialize_index(base))
        start = time.perf_counter()
        refine = faiss.IndexRefineFlat(base, faiss.swig_ptr(emb.corpus))
        refine.k_factor = args.refine_k_factor
        refine_build_s = build_s + time.perf_counter() - start
        refine_size = len(faiss.serialize_index(refine))
        print(f"  built faiss IVF-PQ m={m} in {build_s:.1f}s ({size / 2**20:.0f} MB)", flush=True)
        for refined in (False, True):
            idx = refine if refined else base
            for nprobe in nprobes:
                settings = f"nlist={nlist}, m={m}x{nbits}b, nprobe={nprobe}"
                if refined:
                    settings += f", refine k_factor={args.refine_k_factor:g}"
                out.append(Setting("faiss", "faiss IVF-PQ + refine" if refined else "faiss IVF-PQ",
                                   settings, refine_build_s if refined else build_s,
                                   refine_size if refined else size,
                                   faiss_search_fn(idx, k, n, emb.exclude, nprobe=nprobe),
                                   {"nlist": nlist, "m": m, "nbits": nbits, "nprobe": nprobe,
                                    "refine_k_factor": args.refine_k_factor if refined else 0}))
    return out


# ----------------------------------------------------------------------------- report
def machine_info(threads: int) -> dict:
    versions = {}
    for pkg in ("scann", "faiss-cpu", "numpy", "jax"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "?"
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "threads": threads,
            "python": platform.python_version(), "versions": versions}


def frontiers(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """method -> its Pareto frontier: the rows that no other row of the same method beats
    on both QPS and recall (ties: the first kept), by rising recall."""
    out: dict[str, list[Row]] = {}
    for method in dict.fromkeys(r.method for r in rows):
        mine = sorted((r for r in rows if r.method == method), key=lambda r: (-r.recall, -r.qps))
        keep, fastest = [], -math.inf
        for r in mine:  # by falling recall: kept when faster than everything more accurate
            if r.qps > fastest:
                keep.append(r)
                fastest = r.qps
        out[method] = keep[::-1]
    return out


def markdown_table(rows: Sequence[Row], k: int) -> str:
    lines = [f"| method | settings | build s | size MB | QPS | recall@{k} |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        build = "-" if r.build_s is None else f"{r.build_s:.1f}"
        lines.append(f"| {r.method} | {r.settings} | {build} | {r.size_bytes / 2**20:.0f} | "
                     f"{r.qps:,.0f} | {r.recall:.4f} |")
    return "\n".join(lines)


def verdict(rows: Sequence[Row], k: int, target: float) -> dict:
    """The fastest setting of each method with recall@k >= target, fastest first, and
    whether ScaNN's is at least as fast as every other approximate method's."""
    best: dict[str, Row] = {}
    for r in rows:
        if r.recall >= target and (r.method not in best or r.qps > best[r.method].qps):
            best[r.method] = r
    ranked = sorted(best.values(), key=lambda r: -r.qps)
    scann = best.get("ScaNN")
    others = [r for r in ranked if r.family == "faiss"]
    claim = (f"ScaNN at recall@{k} >= {target:g} is at least as fast as every faiss method "
             "at its fastest setting reaching the same bar")
    holds = scann is not None and all(scann.qps >= r.qps for r in others)
    parts = [f"{r.method} ({r.settings}) recall {r.recall:.4f}, {r.qps:,.0f} QPS"
             + (f" (ScaNN x{scann.qps / r.qps:.2f})" if scann is not None and r is not scann
                else "") for r in ranked]
    line = (f"{claim}: {'HOLDS' if holds else 'FAILS'}. Fastest setting per method with "
            f"recall@{k} >= {target:g}, fastest first: " + "; ".join(parts)
            + ("" if scann is not None else f"; no ScaNN setting reaches {target:g}")
            + ("" if others else f"; no faiss setting reaches {target:g}"))
    return {"claim": claim, "target_recall": target, "holds": holds,
            "fastest_per_method": [dataclasses.asdict(r) for r in ranked],
            "scann": dataclasses.asdict(scann) if scann is not None else None, "line": line}


def plot_frontiers(front: dict[str, list[Row]], k: int, target: float, title: str,
                   path: str) -> None:
    """Recall@k on x, QPS on a log y, one line per method (its frontier)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5.5))
    low = min(0.8, target - 0.05)
    for method, rows in front.items():
        shown = [r for r in rows if r.recall >= low]
        if shown:
            ax.plot([r.recall for r in shown], [r.qps for r in shown], marker="o",
                    markersize=4, label=method)
    ax.axvline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlim(low, 1.002)
    ax.set_xlabel(f"recall@{k} (vs exact)")
    ax.set_ylabel("queries / second (log)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def main(args: argparse.Namespace) -> dict:
    start_all = time.perf_counter()
    load_before = os.getloadavg()
    faiss.omp_set_num_threads(args.threads)
    emb = embed_split(args.workdir, args.split, args.max_queries)
    n, dim = emb.corpus.shape
    nq = len(emb.queries)
    if n == 0 or nq == 0:
        raise SystemExit(f"bench_ann: {args.split} has {n} candidates and {nq} queries")
    k = args.k
    warmup = max(512, int(emb.query_chunk))  # same compiled shapes for ExactIndex
    print(f"{args.workdir} step {emb.step}, split {args.split}: {n} x {dim} corpus, {nq} "
          f"queries, k={k}, {args.threads} threads", flush=True)

    truth = numpy_exact(emb.queries, emb.corpus, k, emb.exclude)
    exact_idx = ann.ExactIndex(emb.corpus, emb.query_chunk, emb.corpus_chunk)
    settings = [
        Setting("exact", "numpy exact", "float32 matmul + argpartition", None,
                emb.corpus.nbytes, lambda q: numpy_exact(q, emb.corpus, k, emb.exclude[:len(q)])),
        Setting("exact", "dualjax ExactIndex",
                "jax matmul + top_k, query_chunk={query_chunk}, corpus_chunk={corpus_chunk}"
                .format(**exact_idx.settings), None, emb.corpus.nbytes,
                lambda q: exact_idx.search(q, k, emb.exclude[:len(q)])[1]),
    ] if "exact" in args.methods else []
    start = time.perf_counter()
    for name, bench in (("scann", bench_scann), ("hnsw", bench_hnsw), ("ivfpq", bench_ivfpq)):
        if name in args.methods:
            settings += bench(emb, k, args)
    build_seconds = time.perf_counter() - start
    print(f"built every index in {build_seconds:.0f}s; timing {len(settings)} settings x "
          f"{args.repeats} passes", flush=True)
    rows = measure(settings, emb.queries, truth, k, args.repeats, warmup)

    machine = machine_info(args.threads)
    load_after = os.getloadavg()
    front = frontiers(rows)
    result = {
        "workdir": os.path.abspath(args.workdir), "split": args.split, "step": emb.step,
        "corpus_size": n, "dim": dim, "num_queries": nq, "k": k, "threads": args.threads,
        "repeats": args.repeats, "warmup_queries": min(warmup, nq), "machine": machine,
        "load_average": {"before": load_before, "after": load_after},
        "rows": [dataclasses.asdict(r) for r in rows],
        "frontier": {m: [dataclasses.asdict(r) for r in f] for m, f in front.items()},
        "verdict": verdict(rows, k, args.target_recall),
        "build_seconds": build_seconds, "total_seconds": time.perf_counter() - start_all,
    }
    title = (f"{n:,} x {dim} corpus, {nq:,} queries, recall@{k} vs numpy exact, "
             f"{args.threads} threads")
    print(f"\n## ANN frontier: {title}\n")
    print(markdown_table([r for f in front.values() for r in f], k))
    print(f"\nMachine: {machine['cpu_model']}, {machine['usable_cores']} usable cores "
          f"({machine['cpu_count']} online), {args.threads} threads; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          + ", ".join(f"{p} {v}" for p, v in machine["versions"].items()))
    print(f"\n{result['verdict']['line']}")
    print(f"\n({len(rows)} settings; total {result['total_seconds']:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot_frontiers(front, k, args.target_recall, f"Pareto frontiers: {title}", args.plot)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main(ARGS)
