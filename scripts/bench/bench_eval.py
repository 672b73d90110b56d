"""Evaluation speed on a trained workdir: encoding (texts/s) and exact search (queries/s).

    python scripts/bench/bench_eval.py --workdir=runs/quora_trigram [--split=test] [--repeats=3]

Encodes the split's corpus and queries with the training-time encoders
(`encoding.encode_texts`, tokenization included, the mesh of all local devices), then
times exact top-100 search of every query over the whole corpus, alternating:
`ann.exact_search` (the corpus padded and placed on the device at every call, each
query chunk read back before the next is sent: the path before this script) and
`ann.ExactIndex` (the corpus placed once and kept on the device, every query chunk
dispatched before any result is read back). Both must return the same ids. Prints a
table; writes nothing into the workdir.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    from dualjax import models
    from dualjax.retrieval import ann, encoding
    from dualjax.runtime import sharding
    from dualjax.train import tasks
    from dualjax.train.trained import load_trained

    trained = load_trained(args.workdir)
    spec, inputs = trained.spec, trained.inputs
    task = tasks.make_tasks(spec.tasks, spec.schedule.seed)[0].eval_task(args.split)
    mesh = sharding.make_mesh()
    encode_q, encode_d = models.make_encoders(trained.model)
    times = {}

    def encode(name, fn, texts, side, fields):
        start = time.perf_counter()
        out = encoding.encode_texts(lambda x: fn(trained.params, x), texts, side,
                                    spec.eval.batch_size, mesh, fields=fields)
        times[name] = (len(texts), time.perf_counter() - start)
        return out

    encode("warm-up", encode_d, task.corpus[:4 * spec.eval.batch_size], inputs.document, None)
    corpus = encode("corpus", encode_d, task.corpus, inputs.document, task.corpus_fields)
    queries = encode("queries", encode_q, task.queries, inputs.query, task.query_fields)
    exclude = task.query_corpus_index
    chunks = {k: spec.eval.index_settings[k] for k in ("query_chunk", "corpus_chunk")}
    kept = ann.ExactIndex(corpus, **chunks)
    runs = {"exact_search (corpus placed per call)": [], "ExactIndex (kept on device)": []}
    answers = {}
    for _ in range(args.repeats + 1):  # the first round compiles and is not counted
        for name in runs:
            start = time.perf_counter()
            if name.startswith("exact_search"):
                answers[name] = ann.exact_search(queries, corpus, args.k, exclude, **chunks)
            else:
                answers[name] = kept.search(queries, args.k, exclude)
            runs[name].append(time.perf_counter() - start)
    a, b = answers.values()
    assert np.array_equal(a[1], b[1]), "the two exact searches disagree"

    print(f"\n{os.path.abspath(args.workdir)}: {len(task.corpus):,} candidates x "
          f"{corpus.shape[1]}, {len(task.queries):,} queries, {len(mesh.devices.flat)} device(s)")
    print("| what | items | seconds | per second |\n|---|---:|---:|---:|")
    for name in ("corpus", "queries"):
        n, s = times[name]
        print(f"| encode {name} (tokenize + towers) | {n:,} | {s:.2f} | {n / s:,.0f} texts |")
    for name, ts in runs.items():
        med = statistics.median(ts[1:])
        print(f"| exact top-{args.k}: {name} | {len(queries):,} | {med:.2f} | "
              f"{len(queries) / med:,.0f} queries |")


if __name__ == "__main__":
    main()
