"""Hybrid search (eval.hybrid=bm25: reciprocal rank fusion, and score interpolation with
its weight chosen on val) against the dual encoder and BM25 alone, on trained workdirs.

    python scripts/bench/bench_hybrid.py --out=runs/bench_hybrid NAME=WORKDIR [NAME=WORKDIR ...]

Each WORKDIR is a finished run; its towers are evaluated again, on its own dataset and
split, with no training (init_from, num_train_steps=0) in OUT/NAME, with eval.hybrid=bm25
and exact search. A run trained with num_train_steps=0 itself (a zero-shot evaluation)
is evaluated from the workdir it started from. Prints the test split's MAP@100,
nDCG@10, recall@10 and recall@100 of the four systems, and the interpolation's weight.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy

import ml_collections

from dualjax.config.keys import flatten
from dualjax.eval.metrics_log import setup_logging
from dualjax.train import checkpoints
from dualjax.train import loop as train

KEYS = ("map@100", "ndcg@10", "recall@10", "recall@100")
DEFAULT = pathlib.Path(__file__).resolve().parents[2] / "configs" / "default.py"


def hybrid_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's config (today's defaults for keys it predates), evaluating its towers."""
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    config = runpy.run_path(str(DEFAULT))["get_config"]()
    for key, value in flatten(saved).items():
        try:
            config.update_from_flattened_dict({key: value})
        except (KeyError, AttributeError):  # a key since renamed or removed
            pass
    try:
        checkpoints.latest_params(workdir)
        config.init_from = os.path.abspath(workdir)
    except FileNotFoundError:  # a zero-shot run: the towers it evaluated
        config.init_from = saved["init_from"]
    config.num_train_steps = 0
    config.eval.update(hybrid="bm25", baselines="bm25", index="exact", untrained=False,
                       typo_probs="", select_by="")
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_hybrid")
    parser.add_argument("runs", nargs="+", help="NAME=WORKDIR")
    args = parser.parse_args()
    setup_logging()
    lines = ["| run | system | " + " | ".join(KEYS) + " | weight |",
             "|---|---|" + "---:|" * (len(KEYS) + 1)]
    for item in args.runs:
        name, workdir = item.split("=", 1)
        config = hybrid_config(workdir)
        model = config.model.name
        results = train.train_and_evaluate(config, os.path.join(args.out, name))
        for system in (model, "bm25", f"{model}+bm25", f"{model}+bm25_interp"):
            row = results[f"{system} [exact]"]
            weight = f"{row['hybrid_weight']:.1f}" if "hybrid_weight" in row else ""
            lines.append(f"| {name} | {system} | " + " | ".join(f"{row[k]:.4f}" for k in KEYS)
                         + f" | {weight} |")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
