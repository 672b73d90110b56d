"""nDCG@10 by embedding dimension (issue 32): all-MiniLM-L6-v2 fine-tuned on Quora
duplicate questions with and without `loss.matryoshka_dims`, each then evaluated
zero-shot on the shared BEIR collections with its vectors cut to 256, 128 and 64
dimensions (`eval.dims`: the first m coordinates, renormalised, searched exactly), and
the start as it is for reference.

    python scripts/bench/bench_matryoshka.py [--steps=300] [--out=runs/bench_matryoshka]

Every run is a `python -m dualjax.main` workdir under --out (reused when finished); the
table is printed as BENCHMARKS.md's "Matryoshka embeddings" section has it.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py

from common import MINILM_START as MINILM  # noqa: E402
from common import SHARED, dualjax_run, rows_of  # noqa: E402

DIMS = (256, 128, 64)



def train_flags(args, matryoshka: bool) -> dict:
    return {**MINILM, "data.name": "quora", "data.val_fraction": 0.01,
            "data.test_fraction": 0.01, "model.max_len": 64,
            "num_train_steps": args.steps, "checkpoint_every_steps": args.steps,
            "eval_every_steps": 0, "global_batch_size": 32, "optimizer.learning_rate": 2e-5,
            "optimizer.warmup_steps": args.steps // 10, "eval.index": "exact",
            "eval.baselines": "", "eval.untrained": False, "eval.batch_size": 64,
            "loss.matryoshka_dims": ",".join(map(str, sorted(DIMS))) if matryoshka else "",
            "mesh.num_devices": 1}


def eval_flags(path: str, start: dict) -> dict:
    return {**start, "data.name": "beir", "data.path": os.path.abspath(path),
            "data.ignore_identical_ids": False, "num_train_steps": 0,
            "model.max_len": 256, "model.query_max_len": 64, "eval.index": "exact",
            "eval.baselines": "", "eval.untrained": False, "eval.batch_size": 64,
            "eval.dims": ",".join(map(str, sorted(DIMS))), "mesh.num_devices": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="runs/bench_matryoshka")
    parser.add_argument("--collections", default=",".join(SHARED))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    starts = {"MiniLM as is": MINILM}
    for name, on in (("fine-tuned on Quora", False), ("fine-tuned on Quora, Matryoshka", True)):
        workdir, took = dualjax_run(args, name, "configs/default.py", train_flags(args, on))
        print(f"{name}: {workdir}" + (f" ({took:.0f} s)" if took else " (reused)"), flush=True)
        starts[name] = {"init_from": workdir, "model.tower": "bert", "model.tokenizer": "hf"}
    table = {}
    for model, start in starts.items():
        for path in args.collections.split(","):
            name = os.path.basename(path.rstrip("/"))
            workdir, took = dualjax_run(args, f"{model} on {name}", "configs/default.py",
                                        eval_flags(path, start))
            rows = rows_of(workdir)
            table[(model, name)] = {"384 (full)": rows["dual_encoder"]["ndcg@10"],
                                    **{str(m): rows[f"dual_encoder@{m}"]["ndcg@10"]
                                       for m in DIMS}}
    names = [os.path.basename(p.rstrip("/")) for p in args.collections.split(",")]
    columns = ["384 (full)", *map(str, DIMS)]
    print("\n| model | collection | " + " | ".join(columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    for model in starts:
        for name in names:
            row = table[(model, name)]
            print(f"| {model} | {name.upper()} | "
                  + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
        means = [sum(table[(model, n)][c] for n in names) / len(names) for c in columns]
        print(f"| {model} | mean | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")


if __name__ == "__main__":
    main()
