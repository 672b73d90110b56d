"""Same task, same budget, one thing changed: the loss, the batch size or the tower.

    python scripts/bench/bench_variants.py --suite=losses --out=runs/bench_losses [--steps=400]
    python scripts/bench/bench_variants.py --suite=batch --out=runs/bench_batch [--steps=150]
    python scripts/bench/bench_variants.py --suite=towers --out=runs/bench_towers [--steps=600]
    python scripts/bench/bench_variants.py --suite=hits --out=runs/bench_hits [--steps=400]
        [--only="LABEL;LABEL"] [--tfds_dir=DIR] [--json=out.json]

Each variant is one `python -m dualjax.main` run (own workdir under --out, a shared
--tfds_dir so the data is prepared once) on the Quora cluster split, searched exactly,
with every question as a candidate (the towers suite: the split's questions). A finished
workdir is not trained again, so an interrupted suite resumes where it stopped. The table
gives the dual encoder's test-split metrics, the training throughput (median pairs/second
of the train rows of metrics.jsonl after the first, which includes compilation) and the
wall time.

Suites:
- losses: configs/quora_gillick.py (bow 300-d, SGD momentum lr 0.01, batch 1000) with each
  `loss.name` and its main options, plus in-batch softmax with one BM25-mined hard
  negative per pair and with 1,000 mixed (uniformly drawn) negatives. `pointwise_logistic`
  needs labelled negative pairs, which our Quora data (positives only) does not have, so
  it is not in the suite.
- batch: the same with in-batch softmax at global batch 16, 128, 1024 and 8192 on 8 fake
  CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), same number of steps.
- hits: in_batch_softmax on configs/quora_gillick.py without accidental-hit removal, with
  a column removed when it holds the row's own document (loss.remove_accidental_hits),
  also when it holds the row's own query text (loss.remove_query_hits), and also when it
  is of the row's cluster of paraphrases (loss.remove_cluster_hits).
- towers: bow, bow_mlp, cnn and a small transformer on words, and bow and cnn on words +
  character trigrams, all with AdamW (lr 1e-3, warmup 100, linear decay; the
  transformer would not train with the Gillick SGD setting), batch 256, each with the
  typo sweep (queries at typo p = 0, 0.25, 0.5, 0.75); candidates are the split's own
  questions (data.candidates=split), to keep the five evaluations per run cheap.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import read_rows, run_main, slug  # noqa: E402

KEYS = ("map@100", "success@1", "success@10", "mrr@10", "recall@10", "recall@100")
GILLICK = "configs/quora_gillick.py"
COMMON = {"eval_every_steps": 0, "eval.untrained": False, "eval.baselines": "",
          "eval.index": "exact", "keep_checkpoints": 1}
ADAMW = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3,
         "optimizer.warmup_steps": 100, "optimizer.decay": "linear",
         "model.embed_init_std": 0.1}
TRIGRAMS = {"model.tokenizer": "word+char_trigram", "model.trigram_vocab_size": 40000,
            "model.num_oov_buckets": 20000, "model.max_len": 96}
SMALL_TRANSFORMER = {"model.tower": "transformer", "model.transformer.num_layers": 2,
                     "model.transformer.width": 128, "model.transformer.num_heads": 4,
                     "model.transformer.mlp_dim": 512, "model.output_dim": 300}


def losses_suite() -> list[tuple[str, dict]]:
    return [
        ("in_batch_softmax", {"loss.name": "in_batch_softmax"}),
        ("in_batch_softmax, symmetric", {"loss.name": "in_batch_softmax", "loss.symmetric": True}),
        ("in_batch_sigmoid", {"loss.name": "in_batch_sigmoid"}),
        ("in_batch_triplet_hardest (margin 0.5)", {"loss.name": "in_batch_triplet_hardest"}),
        ("triplet_margin, cosine (TL(Rand), margin 0.3)", {"loss.name": "triplet_margin"}),
        ("triplet_margin, cosine, hard (TL(Hard))", {"loss.name": "triplet_margin",
                                                     "loss.hard": True}),
        ("triplet_margin, euclidean (EUC, margin 0.5)", {"loss.name": "triplet_margin",
                                                         "loss.distance": "euclidean"}),
        ("triplet_margin, squared euclidean (SSD, margin 0.5)",
         {"loss.name": "triplet_margin", "loss.distance": "squared_euclidean"}),
        ("sdml (label smoothing 0.3)", {"loss.name": "sdml"}),
        ("in_batch_softmax + 1 BM25-mined hard negative per pair",
         {"loss.name": "in_batch_softmax", "data.hard_negatives": 1}),
        ("in_batch_softmax + 1,000 mixed negatives", {"loss.name": "in_batch_softmax",
                                                      "loss.num_mixed_negatives": 1000}),
    ]


def batch_suite() -> list[tuple[str, dict]]:
    return [(f"batch {b}", {"global_batch_size": b}) for b in (16, 128, 1024, 8192)]


def towers_suite() -> list[tuple[str, dict]]:
    # The split's own questions as candidates: five evaluations per run (val, test and the
    # test queries at four typo rates) would otherwise encode all 137k questions each time.
    typo = {"eval.typo_probs": "0,0.25,0.5,0.75", "global_batch_size": 256,
            "data.candidates": "split", **ADAMW}
    return [
        ("bow, word", {"model.tower": "bow", **typo}),
        ("bow_mlp, word", {"model.tower": "bow_mlp", "model.hidden_dim": 512,
                           "model.output_dim": 300, **typo}),
        ("cnn, word", {"model.tower": "cnn", "model.cnn_windows": "5",
                       "model.cnn_filters": 300, "model.output_dim": 300, **typo}),
        ("transformer (2 layers, 128 wide), word", {**SMALL_TRANSFORMER, **typo}),
        ("bow, word+char_trigram", {"model.tower": "bow", **TRIGRAMS, **typo}),
        ("cnn, word+char_trigram", {"model.tower": "cnn", "model.cnn_windows": "5",
                                    "model.cnn_filters": 300, "model.output_dim": 300,
                                    **TRIGRAMS, **typo}),
    ]


def hits_suite() -> list[tuple[str, dict]]:
    return [
        ("no accidental-hit removal", {"loss.remove_accidental_hits": False}),
        ("a column with the row's document removed", {"loss.remove_query_hits": False,
                                                      "loss.remove_cluster_hits": False}),
        ("... and a column holding the row's own query", {"loss.remove_cluster_hits": False}),
        ("... and every document of the row's cluster", {}),
    ]


SUITES = {"losses": (losses_suite, 400, 1), "batch": (batch_suite, 150, 8),
          "towers": (towers_suite, 600, 1), "hits": (hits_suite, 400, 1)}
# name -> (variants, default steps, devices)


def summarize(rows: list[dict], steps: int) -> dict | None:
    """The final test rows of a finished run (None if it did not finish)."""
    final = [r for r in rows if r["split"] == "test" and r["step"] == steps]
    exact = [r for r in final if r.get("system") == "dual_encoder" and r.get("index") == "exact"
             and "typo_p" not in r]
    if not exact:
        return None
    train = [r["pairs_per_second"] for r in rows
             if r["split"] == "train" and "pairs_per_second" in r][1:]
    typo = {r["typo_p"]: r for r in final if r.get("system") == "dual_encoder" and "typo_p" in r}
    return {"metrics": {k: exact[0][k] for k in KEYS},
            "pairs_per_second": statistics.median(train) if train else None,
            "num_queries": exact[0].get("num_queries"),
            "typo": {str(p): {"recall@10": r["recall@10"], "recall@100": r["recall@100"]}
                     for p, r in sorted(typo.items())}}


def run_variant(label: str, overrides: dict, args, devices: int) -> dict:
    workdir = os.path.join(args.out, slug(label))
    flags = {**COMMON, "num_train_steps": args.steps, "checkpoint_every_steps": args.steps,
             "log_every_steps": max(1, args.steps // 10), "data.tfds_dir": args.tfds_dir,
             **overrides}
    wall = None
    summary = summarize(read_rows(workdir), args.steps)
    if summary is None:
        shutil.rmtree(workdir, ignore_errors=True)
        wall = run_main(args.config, workdir, flags, devices)
        summary = summarize(read_rows(workdir), args.steps)
    return {"label": label, "overrides": overrides, "wall_seconds": wall, **summary}


def table(results: list[dict]) -> str:
    lines = ["| variant | " + " | ".join(KEYS) + " | pairs/s | wall (min) |",
             "|---|" + "---:|" * (len(KEYS) + 2)]
    for r in results:
        m = r["metrics"]
        pps = f"{r['pairs_per_second']:,.0f}" if r["pairs_per_second"] else "-"
        wall = f"{r['wall_seconds'] / 60:.1f}" if r["wall_seconds"] else "-"
        lines.append(f"| {r['label']} | " + " | ".join(f"{100 * m[k]:.1f}" for k in KEYS)
                     + f" | {pps} | {wall} |")
    if any(r["typo"] for r in results):
        ps = sorted({p for r in results for p in r["typo"]}, key=float)
        lines += ["", "Typo sweep (test queries with typos at p), recall@10 / recall@100 (%):", "",
                  "| variant | " + " | ".join(f"p={p}" for p in ps) + " |",
                  "|---|" + "---:|" * len(ps)]
        for r in results:
            cells = [f"{100 * r['typo'][p]['recall@10']:.1f} / "
                     f"{100 * r['typo'][p]['recall@100']:.1f}"
                     if p in r["typo"] else "-" for p in ps]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--out", required=True, help="Parent folder of the variants' workdirs.")
    p.add_argument("--config", default=GILLICK, help="The base config of every variant.")
    p.add_argument("--steps", type=int, default=0, help="Training steps (0: the suite's).")
    p.add_argument("--tfds_dir", default="", help="Shared TFDS folder (default OUT/tfds).")
    p.add_argument("--only", default="",
                   help="Labels to run, separated by ';' (labels contain commas; default all).")
    p.add_argument("--json", default="", help="Also write the results here.")
    args = p.parse_args()
    variants, default_steps, devices = SUITES[args.suite]
    args.steps = args.steps or default_steps
    args.tfds_dir = os.path.abspath(args.tfds_dir or os.path.join(args.out, "tfds"))
    os.makedirs(args.out, exist_ok=True)
    wanted = {s.strip() for s in args.only.split(";") if s.strip()}
    unknown = wanted - {label for label, _ in variants()}
    if unknown:
        p.error(f"--only: no variant labelled {', '.join(map(repr, sorted(unknown)))}")
    results = []
    for label, overrides in variants():
        if wanted and label not in wanted:
            continue
        results.append(run_variant(label, overrides, args, devices))
        print(table(results[-1:]), flush=True)
    print(f"\nSuite {args.suite}: {args.steps} steps per variant, base {args.config}, "
          f"{devices} device(s); test split, {results[0]['num_queries']} queries; machine: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": args.suite, "steps": args.steps, "config": args.config,
                       "devices": devices, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
