"""Zero-shot retrieval from pretrained starts, against BM25 as the field runs it, on BEIR
folders.

    python scripts/bench/bench_zero_shot.py [--collections=../shared/data/npl,...]
        [--starts=all-MiniLM-L6-v2,wordllama:l2_supercat_256,potion-base-8M]
        [--adapt] [--adapt_flags=k=v,...] [--distill] [--distill_flags=k=v,...]
        [--out=runs/zero_shot] [--json=FILE]

For every collection (default: the four shared ones, NPL, MED, TIME, ADI), rows of
nDCG@10 (graded gains, as trec_eval) and recall@100, each also as a ratio to "BM25 at its
best" (the better of the two stemmed rows below, per collection) and averaged over the
collections:
- bm25 plain (k1 1.2, b 0.75, lowercased words: dualjax's BM25 before 2026-11), stemmed
  with k1 0.9, b 0.4 (pyserini's BEIR "flat", dualjax's `bm25` now) and stemmed with
  k1 1.2, b 0.75 (Lucene's defaults);
- sentence-transformers: all-MiniLM-L6-v2 through sentence-transformers itself (when
  it is installed: pip install sentence-transformers), on the very texts dualjax reads,
  as a reference for fidelity;
- dualjax from each start as is (`python -m dualjax.main` with model.pretrained and
  num_train_steps=0), with --adapt after `configs/adapt.py`'s adaptation, and with
  --distill the student of `configs/distill.py` (MiniLM taught all-mpnet-base-v2 + BM25);
- each dense system fused with dualjax's BM25 ("+bm25": score interpolation at
  eval.hybrid_weight's default, each list min-max scaled per query; "+rrf": reciprocal
  rank fusion).
Then each dense system's hybrid mean ratio at each weight 0, 0.1, ..., 1 (from the runs'
TREC files, WORKDIR/runs/), the figures `eval.hybrid_weight`'s default was chosen by.
Every dualjax run is one `python -m dualjax.main` call with its own workdir under --out
(a finished one is reused), with the wall time it took.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import SHARED, dualjax_run, load_task, read_rows, rows_of, slug  # noqa: E402,F401

STARTS = {  # name -> the flags that start dualjax from it
    "all-MiniLM-L6-v2": {"model.tower": "bert", "model.max_len": 256},
    "all-mpnet-base-v2": {"model.tower": "bert", "model.max_len": 384},
    "wordllama:l2_supercat_256": {"model.tower": "bow", "model.embed_dim": 256,
                                  "model.max_len": 512},
    "potion-base-8M": {"model.tower": "bow", "model.embed_dim": 256, "model.max_len": 512},
}
METRICS = ("ndcg@10", "recall@100")





LEXICAL = {  # row -> BM25 options (baselines.rank)
    "bm25 plain (1.2/0.75)": {"k1": 1.2, "b": 0.75, "stemmer": ""},
    "bm25 stemmed (0.9/0.4)": {"k1": 0.9, "b": 0.4, "stemmer": "snowball"},
    "bm25 stemmed (1.2/0.75)": {"k1": 1.2, "b": 0.75, "stemmer": "snowball"},
}
BEST = "bm25 at its best"  # per collection, the better stemmed row by nDCG@10


def lexical_rows(task) -> dict[str, dict]:
    """Each LEXICAL row's metrics on `task`, and BEST."""
    from dualjax.retrieval import baselines, metrics
    k = min(100, len(task.corpus))
    rows = {}
    for name, options in LEXICAL.items():
        _, ids = baselines.rank_texts("bm25", task.corpus, task.queries, k,
                                      task.query_corpus_index, **options)
        rows[name] = metrics.retrieval_metrics(ids, task.relevant, grades=task.grades)
    rows[BEST] = max((rows[n] for n in LEXICAL if "stemmed" in n), key=lambda r: r["ndcg@10"])
    return rows


def read_run(path: str, task) -> tuple[np.ndarray, np.ndarray]:
    """A TREC run file of `task` as (ids int [nq, 100], scores [nq, 100]), -1 / -inf
    padding, in the file's rank order."""
    row = {q: i for i, q in enumerate(task.query_keys or map(str, range(len(task.queries))))}
    col = {d: j for j, d in enumerate(task.corpus_keys or map(str, range(len(task.corpus))))}
    ids = np.full((len(row), 100), -1, np.int64)
    scores = np.full((len(row), 100), -np.inf)
    with open(path) as f:
        for line in f:
            q, _, d, rank, score, _ = line.split()
            ids[row[q], int(rank) - 1], scores[row[q], int(rank) - 1] = col[d], float(score)
    return ids, scores


def weight_sweep(workdirs: dict[str, str], best: dict[str, float]
                 ) -> dict[float, tuple[float, float]]:
    """{w: (mean, lowest) over collections of nDCG@10(w * dense + (1 - w) * bm25) /
    best[c]}, from each collection's run files of one dense system."""
    from dualjax.retrieval import hybrid, metrics
    runs = {}  # collection -> (task, dense run, BM25 run), read once
    for c, workdir in workdirs.items():
        task = load_task(workdir)
        runs[c] = (task, *(read_run(os.path.join(workdir, "runs", f"test_{n}.trec"), task)
                           for n in ("dual_encoder", "bm25")))
    out = {}
    for w in hybrid.WEIGHTS:
        ratios = []
        for c, (task, dense, lexical) in runs.items():
            fused = hybrid.fuse_scores(dense, lexical, float(w), dense[0].shape[1])
            ratios.append(metrics.retrieval_metrics(fused, task.relevant,
                                                    grades=task.grades)["ndcg@10"] / best[c])
        out[float(w)] = (float(np.mean(ratios)), float(np.min(ratios)))
    return out


def collection_flags(path: str) -> dict:
    return {"data.path": os.path.abspath(path), "data.ignore_identical_ids": False,
            "eval.index": "exact", "eval.batch_size": 64, "eval.baselines": "bm25",
            "eval.hybrid": "bm25"}


def sentence_transformers_rows(workdir: str, folder: str, weight: float) -> dict[str, dict]:
    """all-MiniLM-L6-v2 through sentence-transformers on the texts of `workdir`'s test
    split (as dualjax read them), searched exactly; alone and fused with BM25."""
    from sentence_transformers import SentenceTransformer

    from dualjax.retrieval import baselines, hybrid, metrics
    task = load_task(workdir)
    model = SentenceTransformer(folder, device="cpu")
    start = time.time()
    d = model.encode(task.corpus, batch_size=64, normalize_embeddings=True)
    q = model.encode(task.queries, batch_size=64, normalize_embeddings=True)
    seconds = time.time() - start
    k = min(100, len(task.corpus))
    scores = q @ d.T
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    dense = (ids, np.take_along_axis(scores, ids, 1))
    lex_scores, lex_ids = baselines.rank_texts("bm25", task.corpus, task.queries, k,
                                               task.query_corpus_index)
    m = lambda ranked: metrics.retrieval_metrics(ranked, task.relevant, grades=task.grades)
    return {"sentence-transformers": {**m(ids), "seconds": seconds},
            "sentence-transformers+bm25": m(hybrid.fuse_scores(dense, (lex_ids, lex_scores),
                                                               weight, k))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collections", default=",".join(SHARED))
    p.add_argument("--starts", default=",".join(STARTS))
    p.add_argument("--adapt", action="store_true", help="also adapt (configs/adapt.py)")
    p.add_argument("--adapt_flags", default="", help="extra k=v,k=v for configs/adapt.py")
    p.add_argument("--distill", action="store_true", help="also distill (configs/distill.py)")
    p.add_argument("--distill_flags", default="", help="extra k=v,k=v for configs/distill.py")
    p.add_argument("--out", default="runs/zero_shot")
    p.add_argument("--json", default="")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from dualjax.pretrained import sources
    weight = runpy_default("eval.hybrid_weight")
    table: dict[str, dict[str, dict]] = {}  # collection -> system -> row
    sweeps: dict[str, dict[str, str]] = {}  # dense system -> collection -> its workdir
    for path in args.collections.split(","):
        c, rows = os.path.basename(path.rstrip("/")), {}
        common = collection_flags(path)
        for start in args.starts.split(","):
            flags = {"data.name": "beir", "model.pretrained": start, "model.tokenizer": "hf",
                     "num_train_steps": 0, "eval.untrained": False, **STARTS[start], **common}
            workdir, wall = dualjax_run(args, f"{c} {start} as is", "configs/default.py", flags)
            got = rows_of(workdir)
            if not rows:
                rows.update(lexical_rows(load_task(workdir)))
                rows["bm25"] = got["bm25"]  # dualjax's own (= the stemmed 0.9/0.4 row)
            rows[start] = {**got["dual_encoder"], "seconds": wall}
            rows[f"{start}+bm25"] = got["dual_encoder+bm25_interp"]
            rows[f"{start}+rrf"] = got["dual_encoder+bm25"]
            sweeps.setdefault(start, {})[c] = workdir
            if start == "all-MiniLM-L6-v2":
                try:
                    rows.update(sentence_transformers_rows(
                        workdir, sources.folder_of(start), weight))
                except ImportError:
                    print("sentence-transformers is not installed: no reference row")
        with open(os.path.join(path, "corpus.jsonl"), "rb") as f:
            documents = sum(1 for line in f if line.strip())
        for name, on, config, flags, batch in (
                ("adapted", args.adapt, "configs/adapt.py", args.adapt_flags, 64),
                ("distilled", args.distill, "configs/distill.py", args.distill_flags, 32)):
            if not on:
                continue
            # The configs' rule: about 2 passes over the documents, at most 300 steps.
            steps = max(1, min(300, -(-2 * documents // batch)))
            extra = {"num_train_steps": steps, "checkpoint_every_steps": steps,
                     **dict(kv.split("=", 1) for kv in flags.split(",") if kv)}
            workdir, wall = dualjax_run(args, f"{c} {name} {flags}", config,
                                        {**common, **extra})
            got = rows_of(workdir)
            rows[name] = {**got["dual_encoder"], "seconds": wall, "steps": steps}
            rows[f"{name}+bm25"] = got["dual_encoder+bm25_interp"]
            rows[f"{name}+rrf"] = got["dual_encoder+bm25"]
            sweeps.setdefault(name, {})[c] = workdir
        table[c] = rows
    print_tables(table)
    sweep = {name: weight_sweep(dirs, {c: table[c][BEST]["ndcg@10"] for c in dirs})
             for name, dirs in sweeps.items() if len(dirs) == len(table)}
    if sweep:
        print(f"\nEach dense system + bm25 by the interpolation's dense weight w: mean "
              f"(lowest) nDCG@10 ratio to {BEST}")
        weights = list(next(iter(sweep.values())))
        print("| system | " + " | ".join(f"{w:g}" for w in weights) + " |")
        print("|---|" + "---:|" * len(weights))
        for name, by_w in sweep.items():
            print(f"| {name} | " + " | ".join(f"{m:.3f} ({low:.2f})"
                                             for m, low in by_w.values()) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
                       "hybrid_weight": weight, "table": table, "weight_sweep": sweep},
                      f, indent=1)


def runpy_default(key: str):
    import runpy
    config = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                         "default.py"))["get_config"]()
    for part in key.split("."):
        config = config[part]
    return config


def print_tables(table: dict[str, dict[str, dict]]) -> None:
    collections = list(table)
    systems = list(dict.fromkeys(s for rows in table.values() for s in rows))
    for metric in METRICS:
        print(f"\n{metric} (ratio to {BEST}); mean ratio over {', '.join(collections)}")
        print("| system | " + " | ".join(collections) + " | mean ratio | seconds |")
        print("|---|" + "---:|" * (len(collections) + 2))
        for s in systems:
            cells, ratios, seconds = [], [], []
            for c in collections:
                row, bm25 = table[c].get(s), table[c][BEST][metric]
                if row is None:
                    cells.append("")
                    continue
                ratios.append(row[metric] / bm25)
                cells.append(f"{row[metric]:.3f} ({ratios[-1]:.2f}x)")
                if row.get("seconds"):
                    seconds.append(row["seconds"])
            mean = f"{np.mean(ratios):.3f}x" if len(ratios) == len(collections) else ""
            wall = f"{sum(seconds):.0f}" if seconds else ""
            print(f"| {s} | " + " | ".join(cells) + f" | {mean} | {wall} |")


if __name__ == "__main__":
    main()
