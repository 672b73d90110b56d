"""Quantized corpus indexes against float exact search (issue 32): all-MiniLM-L6-v2 as is
on the shared BEIR collections; the corpus vectors kept as float32, int8 or binary codes
(`retrieval.quantized`), each quantized search rescoring its top 4 x k (k = 100) with the
float query. Prints index size, queries/s (search alone, one run, one process) and
nDCG@10 / recall@100 as BENCHMARKS.md's "Quantized indexes" section has them.

    python scripts/bench/bench_quantized.py [--out=runs/bench_quantized]

The vectors come from a bundle of the start (an evaluation-only run, exported), so they
are what `dualjax.index` would store; they are cached under --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py

from common import MINILM_START as MINILM  # noqa: E402
from common import SHARED, dualjax_run, load_task  # noqa: E402

K = 100


def flags(path: str) -> dict:
    return {**MINILM, "data.name": "beir", "data.path": os.path.abspath(path),
            "data.ignore_identical_ids": False, "num_train_steps": 0, "model.max_len": 256,
            "model.query_max_len": 64, "eval.index": "exact", "eval.baselines": "",
            "eval.untrained": False, "eval.batch_size": 64, "mesh.num_devices": 1}


def vectors(encoder, task, cache: str) -> tuple[np.ndarray, np.ndarray]:
    if os.path.exists(cache):
        z = np.load(cache)
        return z["corpus"], z["queries"]
    corpus = encoder.encode_documents(task.corpus, batch_size=64)
    queries = encoder.encode_queries(task.queries, batch_size=64)
    np.savez(cache, corpus=corpus, queries=queries)
    return corpus, queries


def timed(search, queries) -> tuple[np.ndarray, float]:
    search(queries)  # warm-up: the exact search compiles for these shapes
    start = time.perf_counter()
    ids = search(queries)
    return ids, len(queries) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bench_quantized")
    parser.add_argument("--collections", default=",".join(SHARED))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from dualjax import export
    from dualjax.retrieval import ann, metrics, quantized
    from dualjax.serve.bundle import Encoder
    print("| collection | vectors | bytes | queries/s | nDCG@10 | recall@100 |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.collections.split(","):
        name = os.path.basename(path.rstrip("/"))
        workdir, _ = dualjax_run(args, f"MiniLM as is on {name}", "configs/default.py",
                                 flags(path))
        bundle = os.path.join(args.out, "bundle")
        if not os.path.exists(bundle):
            export.export(workdir, bundle, platforms=("cpu",))
        task = load_task(workdir)
        corpus, queries = vectors(Encoder.load(bundle), task,
                                  os.path.join(args.out, f"{name}.npz"))
        k = min(K, len(corpus))
        exclude = task.query_corpus_index
        exact = ann.ExactIndex(corpus, 256, 4096)
        systems = {"float32": (corpus.nbytes, lambda q, exact=exact, k=k, exclude=exclude:
                               exact.search(q, k, exclude)[1])}
        for kind in quantized.KINDS:
            idx = quantized.QuantizedIndex.build(corpus, kind)
            systems[kind] = (idx.nbytes, lambda q, idx=idx, k=k, exclude=exclude:
                             idx.search(q, k, exclude)[1])
        for label, (size, search) in systems.items():
            ids, qps = timed(search, queries)
            m = metrics.retrieval_metrics(ids, task.relevant, grades=task.grades)
            print(f"| {name.upper()} | {label} | {size:,} | {qps:,.0f} | {m['ndcg@10']:.3f} "
                  f"| {m['recall@100']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
