"""BM25 hard-negative mining (`dualjax.data.mining.mine_hard_negatives`) on the Quora
training pairs: this tree's implementation against the one of a git revision.

    python scripts/bench/bench_mining.py [--k=1] [--seed=0] [--limit=N] [--rounds=1]
        [--selection_rounds=3] [--old_rev=HEAD]

The training pairs are those the `quora` dataset trains on (configs/quora_gillick.py:
the cluster split of ../shared/data/quora/pairs.tsv, read by the Quora builder's own
loader); --limit keeps the first N of them. The old implementation is
`git show OLD_REV:dualjax/data/mining.py`, imported from a temporary file; both use this
tree's BM25 (`dualjax.retrieval.baselines`). Runs alternate (old, new, old, new, ...) on the same
pairs, k and seed, and must return the same negatives.

Two timings:
- end to end: one call each, BM25 ranking included (`baselines.rank`, the same code in
  both: it scores every document for every query, in dense blocks);
- selection: the same calls with BM25's ranks computed once beforehand (`baselines.rank`
  replaced by the stored result), so only what the change touches is timed: dropping
  the own cluster's candidates and drawing the random fallback.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import os
import pathlib
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np
from absl import logging as absl_logging

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dualjax.config import specs  # noqa: E402
from dualjax.data import builders, mining, sources  # noqa: E402, F401 (builders: the sources)
from dualjax.data.clusters import RetrievalTask  # noqa: E402
from dualjax.retrieval import baselines  # noqa: E402
from dualjax.text.words import normalize  # noqa: E402


def quora_train_pairs(config: str, seed: int) -> list[tuple[str, str]]:
    """The training pairs of the `quora` dataset of `config`, as its builder loads them."""
    cfg = runpy.run_path(str(ROOT / config))["get_config"]()
    spec = specs.dataset_spec(cfg.data, seed)
    # nothing is written: the source's load alone (builders.py imported registers it)
    return sources.SOURCES.named(spec.name).load(spec.loaded_settings()).train_pairs


def old_module(rev: str) -> ModuleType:
    """dualjax/data/mining.py at git revision `rev`, imported from a temporary file."""
    source = subprocess.run(["git", "show", f"{rev}:dualjax/data/mining.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "old_mining.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_mining", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bm25_ranks(pairs: Sequence[tuple[str, str]], k: int, depth: int) -> tuple[int, int, np.ndarray]:
    """(documents, queries, BM25 ranks) exactly as `mine_hard_negatives` asks for them."""
    first: dict[str, str] = {}  # a document's first spelling represents it
    for _, d in pairs:
        first.setdefault(normalize(d), d)
    docs = list(first.values())
    queries = list(dict.fromkeys(q for q, _ in pairs))
    task = RetrievalTask(corpus=docs, queries=queries, relevant=[frozenset()] * len(queries),
                         query_corpus_index=np.full(len(queries), -1, np.int64))
    return len(docs), len(queries), baselines.rank("bm25", task,
                                                   min(len(docs), depth or 4 * k + 10))


class _Count(logging.Handler):
    """Keeps the mining log lines (the number of random fallback draws)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Hard negatives"):
            self.lines.append(record.getMessage())


def alternate(calls: dict[str, Callable[[], list]], rounds: int
              ) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Seconds of each call per round, run in turn; and each call's last result."""
    seconds = {name: [] for name in calls}
    results = {}
    for _ in range(rounds):
        for name, call in calls.items():
            gc.collect()
            start = time.perf_counter()
            results[name] = call()
            seconds[name].append(time.perf_counter() - start)
    return seconds, results


def report(title: str, seconds: dict[str, list[float]]) -> None:
    old, new = statistics.median(seconds["old"]), statistics.median(seconds["new"])
    runs = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    print(f"{title}: before {old:.3f} s [{runs(seconds['old'])}], "
          f"after {new:.3f} s [{runs(seconds['new'])}], ratio before/after {old / new:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quora_gillick.py")
    parser.add_argument("--k", type=int, default=1, help="negatives per pair (BENCHMARKS: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--depth", type=int, default=0, help="BM25 results per query (0: 4k+10)")
    parser.add_argument("--limit", type=int, default=0, help="first N training pairs (0: all)")
    parser.add_argument("--rounds", type=int, default=1, help="end-to-end runs of each")
    parser.add_argument("--selection_rounds", type=int, default=3,
                        help="runs of each with BM25's ranks computed beforehand")
    parser.add_argument("--old_rev", default="HEAD")
    args = parser.parse_args()
    os.chdir(ROOT)  # the config's data path is relative to the project root

    pairs = quora_train_pairs(args.config, args.seed)
    total = len(pairs)
    if args.limit:
        pairs = pairs[:args.limit]
    old = old_module(args.old_rev)
    absl_logging.set_verbosity(absl_logging.INFO)
    counter = _Count()
    logging.getLogger("absl").addHandler(counter)
    logging.getLogger("absl").propagate = False  # counted, not printed once per call
    import bm25s  # noqa: F401  (imported here, it sets its logger to DEBUG: quiet it after)
    logging.getLogger("bm25s").setLevel(logging.WARNING)

    n_docs, n_queries, ranked = bm25_ranks(pairs, args.k, args.depth)
    depth = ranked.shape[1]
    print(f"Quora training pairs: {len(pairs):,} of {total:,}"
          + (f" (--limit={args.limit})" if args.limit else "")
          + f"; k={args.k}, seed={args.seed}, old = {args.old_rev}:dualjax/data/mining.py")
    print(f"queries {n_queries:,}, documents {n_docs:,}, BM25 depth {depth}: "
          f"candidates examined {n_queries * depth:,} (queries x depth); "
          f"{int((ranked >= 0).sum()):,} of them non-empty")

    calls = {name: (lambda m=module: m.mine_hard_negatives(pairs, args.k, args.seed, args.depth))
             for name, module in (("old", old), ("new", mining))}
    if args.selection_rounds:
        rank = baselines.rank
        baselines.rank = lambda *a, **kw: ranked  # both modules call baselines.rank
        try:
            seconds, results = alternate(calls, args.selection_rounds)
        finally:
            baselines.rank = rank
        assert results["old"] == results["new"], "old and new negatives differ"
        selected = results["new"]
        report("selection (BM25 ranks precomputed)", seconds)
    if args.rounds:
        seconds, results = alternate(calls, args.rounds)
        assert results["old"] == results["new"], "old and new negatives differ"
        assert not args.selection_rounds or selected == results["new"], "stored ranks differ"
        report("end to end (BM25 ranking included)", seconds)
    print("negatives identical before and after"
          + (f"; {counter.lines[-1]}" if counter.lines else "; no random fallback draw"))


if __name__ == "__main__":
    main()
