"""ANN speed and quality on a trained dual encoder's own corpus embeddings: ScaNN vs faiss.

Loads a workdir's latest checkpoint (`dualjax.search.load_trained`, without
building or saving an index under the workdir: this script writes nothing there),
encodes the corpus and the queries of an evaluation split, and measures, all with the
same number of threads:

- exact search: numpy (float32 matmul + argpartition) — the ground truth — and
  dualjax's own `index.ExactIndex` (jax chunked matmul + top_k);
- ScaNN through `index.ScannIndex` at the auto settings (`index.default_scann_config`)
  and faster / more accurate tree + AH settings, plus its brute force;
- faiss: `IndexHNSWFlat` (inner product, M=32, efConstruction=200) over several
  efSearch, and `IndexIVFPQ` (inner product, nlist = 4 sqrt(n), m = dim/2 and dim/4
  sub-quantizers of 8 bits) over several nprobe, each with and without an exact
  re-ranking step (`IndexRefineFlat`).

Per method: build seconds, index size (ScaNN: bytes of the saved searcher; faiss:
`faiss.serialize_index` bytes; exact: the float32 corpus), queries/second over the whole
query set (after one warm-up search call, best of --repeats) and recall@k against the
numpy exact top k. Every query excludes its own corpus row (`query_corpus_index`): the
exact searches mask it, the approximate ones ask for k + 1 neighbours and drop it (or
the surplus last one), as `ScannIndex.search` does.

Prints a markdown table, the machine, and the verdict on the target "ScaNN at
recall@k >= 0.95 is faster than every faiss setting that reaches the same recall"
(computed from the rows), and writes everything as JSON with --json.

    python scripts/bench_ann.py --workdir=/tmp/run [--split=test] [--k=10] [--threads=2]
        [--max_queries=N] [--repeats=1] [--json=out.json]

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
import runpy
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Sequence


# ----------------------------------------------------------------------------- arguments
def csv_ints(text: str) -> list[int]:
    """"32,64" -> [32, 64]."""
    return [int(v) for v in text.split(",") if v.strip()]


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
    p.add_argument("--repeats", type=int, default=1,
                   help="Timed passes over the query set per method; the fastest counts.")
    p.add_argument("--target_recall", type=float, default=0.95,
                   help="The recall@k bar of the verdict line.")
    p.add_argument("--hnsw_m", type=int, default=32, help="faiss HNSW: M.")
    p.add_argument("--hnsw_ef_construction", type=int, default=200,
                   help="faiss HNSW: efConstruction.")
    p.add_argument("--hnsw_ef_search", type=csv_ints, default=[32, 64, 128, 256],
                   help="faiss HNSW: efSearch values (comma separated).")
    p.add_argument("--ivf_nlist", type=int, default=0,
                   help="faiss IVF-PQ: inverted lists (0: 4 sqrt(n), at most n / 39).")
    p.add_argument("--pq_dims", type=csv_ints, default=[2, 4],
                   help="faiss IVF-PQ: dimensions per sub-quantizer, one index each "
                        "(m = dim / value; comma separated).")
    p.add_argument("--nprobe", type=csv_ints, default=[8, 16, 32, 64],
                   help="faiss IVF-PQ: nprobe values (comma separated).")
    p.add_argument("--refine_k_factor", type=float, default=10.0,
                   help="faiss IndexRefineFlat: candidates re-ranked exactly = k_factor * (k+1).")
    p.add_argument("--json", default="", help="Also write the results to this JSON file.")
    args = p.parse_args(argv)
    if args.threads < 1 or args.k < 1 or args.repeats < 1:
        p.error("--threads, --k and --repeats must be >= 1")
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

from bench_train import cpu_model  # noqa: E402  (this folder is on sys.path when run)
from dualjax import evaluate, index, search, sharding, train  # noqa: E402
from dualjax.data import builders  # noqa: E402


# ----------------------------------------------------------------------------- embeddings
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill_missing(saved: dict, defaults: dict, path: str = "") -> list[str]:
    """Adds to `saved` (in place) the keys of `defaults` it lacks, recursively; returns
    their dotted names. A workdir written before a config key existed then still loads."""
    added = []
    for key, value in defaults.items():
        if key not in saved:
            saved[key] = value
            added.append(path + key)
        elif isinstance(value, dict) and isinstance(saved[key], dict):
            added += fill_missing(saved[key], value, f"{path}{key}.")
    return added


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The workdir's config.json, with keys added since it was written taken from
    configs/default.py (they must not change parameter shapes: the checkpoint decides)."""
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    defaults = runpy.run_path(os.path.join(REPO, "configs", "default.py"))["get_config"]()
    added = fill_missing(saved, defaults.to_dict())
    if added:
        print(f"note: {workdir}/config.json lacks {', '.join(added)}; using "
              "configs/default.py's values", flush=True)
    return ml_collections.ConfigDict(saved)


@dataclasses.dataclass
class Embedded:
    """A split's corpus and query embeddings, and each query's own corpus row (or -1)."""

    corpus: np.ndarray   # [n, dim] float32, unit rows
    queries: np.ndarray  # [nq, dim] float32
    exclude: np.ndarray  # [nq] int64
    step: int
    eval_cfg: ml_collections.ConfigDict


def embed_split(workdir: str, split: str, max_queries: int) -> Embedded:
    """Restores the latest checkpoint's params (`search.load_trained`; no index is built
    or saved under the workdir) and encodes the split's corpus and queries."""
    config, inputs, model, params, step = search.load_trained(workdir, load_config(workdir))
    mesh = sharding.make_mesh()
    encode_queries, encode_documents = train.make_encoders(model)
    tfds_dir = config.data.tfds_dir or os.path.join(workdir, "tfds")
    task = builders.eval_task(config.data, config.seed, tfds_dir, split)
    queries = task.queries[:max_queries] if max_queries > 0 else task.queries
    enc = dict(batch_size=config.eval.batch_size, mesh=mesh)
    corpus_emb = evaluate.encode_texts(lambda x: encode_documents(params, x), task.corpus,
                                       inputs.document, desc="encode corpus",
                                       fields=task.corpus_fields, **enc)
    query_emb = evaluate.encode_texts(lambda x: encode_queries(params, x), queries, inputs.query,
                                      desc="encode queries", fields=task.query_fields and
                                      task.query_fields[:len(queries)], **enc)
    return Embedded(corpus=np.ascontiguousarray(corpus_emb, np.float32),
                    queries=np.ascontiguousarray(query_emb, np.float32),
                    exclude=np.asarray(task.query_corpus_index[:len(queries)], np.int64),
                    step=int(step), eval_cfg=config.eval)


# ----------------------------------------------------------------------------- search helpers
SearchFn = Callable[[np.ndarray], np.ndarray]  # queries [nq, dim] -> ids [nq, k]


@dataclasses.dataclass
class Row:
    """One measured method/setting."""

    family: str       # "exact" | "scann" | "faiss"
    method: str
    settings: str
    build_s: float | None
    size_bytes: int
    seconds: float    # the whole query set, fastest repeat
    qps: float
    recall: float     # recall@k against the numpy exact top k
    details: dict = dataclasses.field(default_factory=dict)


def time_search(search: SearchFn, queries: np.ndarray, repeats: int, warmup: int
                ) -> tuple[np.ndarray, float]:
    """(ids of the last pass, seconds of the fastest pass) over the whole query set, after
    one untimed warm-up call on its first `warmup` queries."""
    search(queries[:max(1, min(warmup, len(queries)))])
    best, ids = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        ids = search(queries)
        best = min(best, time.perf_counter() - start)
    return ids, best


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


# ----------------------------------------------------------------------------- ScaNN
def scann_variants(n: int, dim: int, k: int, threads: int
                   ) -> list[tuple[str, ml_collections.ConfigDict, list[tuple[int, int]]]]:
    """(name, eval.scann config, [(leaves_to_search, reorder_k), ...]): each index is built
    once and searched at every (leaves, reorder) setting (0: the built one).

    - "auto": `index.default_scann_config()` as evaluation uses it (tree + SOAR + AH +
      reorder, 10% of the leaves, reorder max(1000, 10k));
    - "SOAR": the same tree searched at 1%, 2.5%, 5% and 10% of its round(sqrt(n)) leaves,
      re-scoring 10k candidates exactly;
    - "no SOAR": the same without spilling, at 2.5%, 5%, 10% and 20% of the leaves;
    - brute force.
    Settings that coincide are kept once.
    """
    leaves = max(1, round(math.sqrt(n)))

    def cfg(**overrides: Any) -> ml_collections.ConfigDict:
        c = index.default_scann_config()
        c.num_threads = threads
        c.update(overrides)
        return c

    def at(*fractions: float) -> list[tuple[int, int]]:
        return sorted({(max(1, round(leaves * f)), 10 * k) for f in fractions})

    candidates = [
        ("auto", cfg(), [(0, 0)]),
        ("SOAR", cfg(mode="tree_ah"), at(0.01, 0.025, 0.05, 0.1)),
        ("no SOAR", cfg(mode="tree_ah", soar_lambda=0.0), at(0.025, 0.05, 0.1, 0.2)),
        ("brute_force", cfg(mode="brute_force"), [(0, 0)]),
    ]
    out = []
    for name, c, searches in candidates:
        if index.scann_settings(n, dim, k, c)["mode"] != "tree_ah":
            searches = [(0, 0)]
        out.append((name, c, searches))
    return out


def bench_scann(emb: Embedded, k: int, threads: int, repeats: int, warmup: int,
                truth: np.ndarray) -> list[Row]:
    rows = []
    n, dim = emb.corpus.shape
    for name, cfg, searches in scann_variants(n, dim, k, threads):
        start = time.perf_counter()
        idx = index.ScannIndex.build(emb.corpus, cfg, k)
        build_s = time.perf_counter() - start
        tmp = tempfile.mkdtemp(prefix="bench_ann_scann_")
        try:
            idx.save(os.path.join(tmp, "index"), fingerprint="bench_ann")
            size = dir_bytes(os.path.join(tmp, "index"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        s = dict(idx.settings)
        for leaves, reorder in searches:
            ids, seconds = time_search(
                lambda q: idx.search(q, k, emb.exclude[:len(q)], leaves_to_search=leaves or None,
                                     reorder_k=reorder or None)[1],
                emb.queries, repeats, warmup)
            used = {**s, **({"num_leaves_to_search": leaves} if leaves else {}),
                    **({"reorder_k": reorder} if reorder else {})}
            shown = {key: used[key] for key in ("mode", "num_leaves", "num_leaves_to_search",
                                                "soar_lambda", "reorder_k") if key in used}
            rows.append(Row("scann", f"ScaNN {name}",
                            ", ".join(f"{a}={b}" for a, b in shown.items()), build_s, size,
                            seconds, len(emb.queries) / seconds,
                            evaluate.ann_recall(ids, truth, k), {"settings": used}))
            print(f"  {rows[-1].method}: {rows[-1].settings}: recall {rows[-1].recall:.4f}, "
                  f"{rows[-1].qps:.0f} QPS, built in {build_s:.1f}s", flush=True)
        idx = None  # free the index before building the next
    return rows


# ----------------------------------------------------------------------------- faiss
def faiss_search_fn(idx: "faiss.Index", k: int, n: int, exclude: np.ndarray) -> SearchFn:
    """queries -> ids [nq, k]: a search for k + 1 with each query's own row dropped."""

    def search(q: np.ndarray) -> np.ndarray:
        _, ids = idx.search(q, min(k + 1, n))
        return drop_self(ids, exclude[:len(q)], k)

    return search


def bench_hnsw(emb: Embedded, k: int, args: argparse.Namespace, warmup: int,
               truth: np.ndarray) -> list[Row]:
    n, dim = emb.corpus.shape
    start = time.perf_counter()
    idx = faiss.IndexHNSWFlat(dim, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    idx.hnsw.efConstruction = args.hnsw_ef_construction
    idx.add(emb.corpus)
    build_s = time.perf_counter() - start
    size = len(faiss.serialize_index(idx))
    rows = []
    for ef in args.hnsw_ef_search:
        idx.hnsw.efSearch = ef
        ids, seconds = time_search(faiss_search_fn(idx, k, n, emb.exclude), emb.queries,
                                   args.repeats, warmup)
        rows.append(Row("faiss", "faiss HNSWFlat",
                        f"M={args.hnsw_m}, efC={args.hnsw_ef_construction}, efSearch={ef}",
                        build_s, size, seconds, len(emb.queries) / seconds,
                        evaluate.ann_recall(ids, truth, k)))
        print(f"  {rows[-1].method}: {rows[-1].settings}: recall {rows[-1].recall:.4f}, "
              f"{rows[-1].qps:.0f} QPS", flush=True)
    return rows


def pq_m(dim: int, dims_per_subquantizer: int) -> int:
    """The largest divisor of dim that is at most dim / dims_per_subquantizer (>= 1)."""
    m = max(1, dim // max(1, dims_per_subquantizer))
    while dim % m:
        m -= 1
    return m


def bench_ivfpq(emb: Embedded, k: int, args: argparse.Namespace, warmup: int,
                truth: np.ndarray) -> list[Row]:
    n, dim = emb.corpus.shape
    nlist = args.ivf_nlist or max(1, min(round(4 * math.sqrt(n)), n // 39))
    nbits = max(1, min(8, int(math.log2(n))))  # PQ trains 2^nbits centres per sub-space
    nprobes = sorted({min(p, nlist) for p in args.nprobe})
    rows = []
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
        for refined in (False, True):
            for nprobe in nprobes:
                base.nprobe = nprobe
                idx = refine if refined else base
                ids, seconds = time_search(faiss_search_fn(idx, k, n, emb.exclude), emb.queries,
                                           args.repeats, warmup)
                settings = f"nlist={nlist}, m={m}x{nbits}b, nprobe={nprobe}"
                if refined:
                    settings += f", refine k_factor={args.refine_k_factor:g}"
                rows.append(Row("faiss", "faiss IVFPQ+RefineFlat" if refined else "faiss IVFPQ",
                                settings, refine_build_s if refined else build_s,
                                refine_size if refined else size, seconds,
                                len(emb.queries) / seconds, evaluate.ann_recall(ids, truth, k)))
                print(f"  {rows[-1].method}: {rows[-1].settings}: recall "
                      f"{rows[-1].recall:.4f}, {rows[-1].qps:.0f} QPS", flush=True)
        del refine, base
    return rows


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


def markdown_table(rows: Sequence[Row], k: int) -> str:
    lines = [f"| method | settings | build s | size MB | QPS | recall@{k} |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        build = "-" if r.build_s is None else f"{r.build_s:.2f}"
        lines.append(f"| {r.method} | {r.settings} | {build} | {r.size_bytes / 2**20:.2f} | "
                     f"{r.qps:,.0f} | {r.recall:.4f} |")
    return "\n".join(lines)


def verdict(rows: Sequence[Row], k: int, target: float, max_listed: int = 3) -> dict:
    """The target "ScaNN at recall@k >= target is faster than every faiss setting that
    reaches the same recall", from the rows: the fastest ScaNN row with recall >= target
    against every faiss row whose recall is at least that ScaNN row's recall. Also the
    fastest faiss row with recall >= target, for a comparison at the bar itself. The line
    lists the `max_listed` fastest of those faiss rows; the dict holds them all."""
    claim = (f"ScaNN at recall@{k} >= {target:g} is faster than every faiss setting that "
             f"reaches the same recall")
    scann_ok = [r for r in rows if r.family == "scann" and r.recall >= target]
    faiss_rows = [r for r in rows if r.family == "faiss"]
    at_bar = [r for r in faiss_rows if r.recall >= target]
    fastest_faiss = max(at_bar, key=lambda r: r.qps) if at_bar else None
    out: dict[str, Any] = {"claim": claim, "target_recall": target,
                           "fastest_faiss_at_target": dataclasses.asdict(fastest_faiss)
                           if fastest_faiss else None}
    if not scann_ok:
        out.update(holds=False, scann=None, faiss_peers=[],
                   line=f"{claim}: FAILS (no ScaNN setting reaches recall@{k} >= {target:g})")
        return out
    best = max(scann_ok, key=lambda r: r.qps)
    peers = sorted((r for r in faiss_rows if r.recall >= best.recall), key=lambda r: -r.qps)
    holds = all(best.qps > r.qps for r in peers)
    head = (f"{claim}: {'HOLDS' if holds else 'FAILS'} — fastest ScaNN with recall >= "
            f"{target:g}: {best.method} ({best.settings}), recall {best.recall:.4f}, "
            f"{best.qps:,.0f} QPS")
    if peers:
        shown = peers[:max_listed]
        body = (f"; {len(peers)} faiss setting(s) reach recall >= {best.recall:.4f}, fastest "
                "first: " + "; ".join(f"{r.method} ({r.settings}) recall {r.recall:.4f}, "
                                     f"{r.qps:,.0f} QPS (ScaNN x{best.qps / r.qps:.2f})"
                                     for r in shown))
        if len(peers) > len(shown):
            body += f"; +{len(peers) - len(shown)} slower (all in the JSON)"
    else:
        body = f"; no faiss setting reaches recall {best.recall:.4f} (holds vacuously)"
    line = head + body
    if fastest_faiss is not None:
        line += (f"\nAt the bar itself (recall >= {target:g}): fastest faiss is "
                 f"{fastest_faiss.method} ({fastest_faiss.settings}), recall "
                 f"{fastest_faiss.recall:.4f}, {fastest_faiss.qps:,.0f} QPS; ScaNN "
                 f"x{best.qps / fastest_faiss.qps:.2f}")
    out.update(holds=holds, scann=dataclasses.asdict(best),
               faiss_peers=[dataclasses.asdict(r) for r in peers], line=line)
    return out


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
    warmup = max(512, int(emb.eval_cfg.query_chunk))  # same compiled shapes for ExactIndex
    print(f"{args.workdir} step {emb.step}, split {args.split}: {n} x {dim} corpus, {nq} "
          f"queries, k={k}, {args.threads} threads", flush=True)

    rows: list[Row] = []
    exact_bytes = emb.corpus.nbytes
    truth, seconds = time_search(lambda q: numpy_exact(q, emb.corpus, k, emb.exclude[:len(q)]),
                                 emb.queries, args.repeats, warmup)
    rows.append(Row("exact", "numpy exact", "float32 matmul + argpartition", None, exact_bytes,
                    seconds, nq / seconds, evaluate.ann_recall(truth, truth, k)))
    exact_idx = index.ExactIndex(emb.corpus, emb.eval_cfg.query_chunk, emb.eval_cfg.corpus_chunk)
    ids, seconds = time_search(lambda q: exact_idx.search(q, k, emb.exclude[:len(q)])[1],
                               emb.queries, args.repeats, warmup)
    rows.append(Row("exact", "dualjax ExactIndex",
                    "jax matmul + top_k, query_chunk={query_chunk}, corpus_chunk={corpus_chunk}"
                    .format(**exact_idx.settings), None, exact_bytes, seconds, nq / seconds,
                    evaluate.ann_recall(ids, truth, k)))
    for r in rows:
        print(f"  {r.method}: recall {r.recall:.4f}, {r.qps:.0f} QPS", flush=True)

    rows += bench_scann(emb, k, args.threads, args.repeats, warmup, truth)
    rows += bench_hnsw(emb, k, args, warmup, truth)
    rows += bench_ivfpq(emb, k, args, warmup, truth)

    machine = machine_info(args.threads)
    load_after = os.getloadavg()
    result = {
        "workdir": os.path.abspath(args.workdir), "split": args.split, "step": emb.step,
        "corpus_size": n, "dim": dim, "num_queries": nq, "k": k, "threads": args.threads,
        "repeats": args.repeats, "warmup_queries": min(warmup, nq), "machine": machine,
        "load_average": {"before": load_before, "after": load_after},
        "rows": [dataclasses.asdict(r) for r in rows],
        "verdict": verdict(rows, k, args.target_recall),
        "total_seconds": time.perf_counter() - start_all,
    }
    print()
    print(f"## ANN benchmark: {n:,} x {dim} corpus, {nq:,} queries, recall@{k} vs numpy "
          f"exact, {args.threads} threads\n")
    print(markdown_table(rows, k))
    print(f"\nMachine: {machine['cpu_model']}, {machine['usable_cores']} usable cores "
          f"({machine['cpu_count']} online), {args.threads} threads; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          + ", ".join(f"{p} {v}" for p, v in machine["versions"].items()))
    print(f"\n{result['verdict']['line']}")
    print(f"\n(total {result['total_seconds']:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(ARGS)
