"""PSES (Li & Jia 2018) against the single-space dual encoder and BM25: Table 2's shape.

    python scripts/bench/bench_pses.py --out=runs/bench_pses [--seeds=0,1,2]
        [--weak_steps=500] [--tune_steps=200] [--systems=one_space,pses,...]
        [--nn_s_alone] [--shared_score] [--json=out.json]

SQuAD v1.1 dev questions against its 2,067 paragraphs (configs/pses.py: a random 70% of
the questions train, 10% validate, 20% test; every paragraph a candidate). Each model is trained
in two steps, each one `python -m dualjax.main` call with its own workdir under --out (a
finished workdir is reused, so an interrupted benchmark resumes where it stopped):

1. weak supervision: BM25's top 5 paragraphs of each training question are its
   positives (data.pseudo_labels=5; the questions' labels are not read), --weak_steps;
2. fine-tuning on the labelled training pairs from step 1's model, --tune_steps.

Rows (--systems picks some, by the names in brackets): BM25; the single-space bow dual
encoder (model.name=dual_encoder) [one_space]; PSES [pses]; M_Pa (no orthogonality)
[m_pa], M_Pb (no adversary) [m_pb], M_Pc (neither) [m_pc]; and, for reference, the dual
encoder trained on the labels alone for weak_steps + tune_steps [labels_only]. Every
model uses the in-batch softmax over the global batch (configs/pses.py), so the models
differ only in their spaces and PSES's terms. Columns: MAP (map@100), P@20 and nDCG@20 on
the test questions, mean and standard deviation over the seeds (BM25's too: each seed
draws its own question split).

--nn_s_alone adds the paper's way of fine-tuning: step 2 from PSES's step 1 with
loss.pses.trainable=shared (NN_s and the similarity train, every other param is kept).
--shared_score evaluates every fine-tuned PSES-family workdir once more with
model.pses.score=shared (queries and paragraphs searched by z_s alone instead of
[z_s; z_specific]): an evaluation-only run of the same params (init_from=that workdir,
num_train_steps=0, as scripts/bench/bench_hybrid.py does), so both scorings are reported side
by side.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import read_rows, run_main, slug  # noqa: E402

SQUAD = "../shared/data/squad/dev-v1.1.json"
METRICS = ("map@100", "p@20", "ndcg@20")
SYSTEMS = {  # label -> config overrides
    "dual encoder (one space)": {"model.name": "dual_encoder"},
    "PSES": {},
    "M_Pa (no orthogonality)": {"loss.pses.orthogonality_weight": 0.0},
    "M_Pb (no adversary)": {"loss.pses.adversarial_weight": 0.0},
    "M_Pc (neither)": {"loss.pses.orthogonality_weight": 0.0,
                       "loss.pses.adversarial_weight": 0.0},
}
LABELS_ONLY = "dual encoder, labels only"
NN_S_ALONE = "PSES, fine-tuning NN_s alone (trainable=shared)"
CHOICES = {"one_space": "dual encoder (one space)", "pses": "PSES",
           "m_pa": "M_Pa (no orthogonality)", "m_pb": "M_Pb (no adversary)",
           "m_pc": "M_Pc (neither)", "labels_only": LABELS_ONLY}


def run(args, name: str, flags: dict, steps: int) -> str:
    """Runs (or reuses) one workdir of configs/pses.py; returns it."""
    workdir = os.path.abspath(os.path.join(args.out, slug(name)))
    if any(r["split"] == "test" and r["step"] == steps for r in read_rows(workdir)):
        return workdir
    wall = run_main("configs/pses.py", workdir, {
        "num_train_steps": steps, "data.tfds_dir": args.tfds_dir,
        "data.path": os.path.abspath(args.squad), "checkpoint_every_steps": steps, **flags})
    print(f"  {wall:.0f} s", flush=True)
    return workdir


def test_row(workdir: str, steps: int, system: str) -> dict:
    return next(r for r in read_rows(workdir) if r["split"] == "test" and r["step"] == steps
                and r.get("system") == system and r.get("index") == "exact")


def last_train_row(workdir: str) -> dict:
    return [r for r in read_rows(workdir) if r["split"] == "train"][-1]


def cell(values: list[float]) -> str:
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_pses")
    parser.add_argument("--tfds_dir", default="", help="default: OUT/tfds (shared by the runs)")
    parser.add_argument("--squad", default=SQUAD)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--weak_steps", type=int, default=500)
    parser.add_argument("--tune_steps", type=int, default=200)
    parser.add_argument("--systems", default=",".join(CHOICES),
                        help=f"comma-separated, of: {', '.join(CHOICES)}")
    parser.add_argument("--nn_s_alone", action="store_true",
                        help="also fine-tune PSES with loss.pses.trainable=shared")
    parser.add_argument("--shared_score", action="store_true",
                        help="also evaluate each fine-tuned PSES model by z_s alone")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    unknown = [k for k in args.systems.split(",") if k not in CHOICES]
    if unknown:
        parser.error(f"--systems: unknown {unknown}; known: {', '.join(CHOICES)}")
    chosen = [CHOICES[k] for k in args.systems.split(",")]
    if args.nn_s_alone and "PSES" not in chosen:
        parser.error("--nn_s_alone fine-tunes PSES's weak model: --systems must include pses")
    args.tfds_dir = os.path.abspath(args.tfds_dir or os.path.join(args.out, "tfds"))
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.time()

    results: dict = {"weak": {}, "tuned": {}, "train": {}, "shared_score": {}}
    bm25: dict[int, dict] = {}  # seed -> BM25's test row (each seed has its own split)
    tuned_pses = []  # (label, fine-tuned workdir, its flags): for --shared_score
    for label, overrides in SYSTEMS.items():
        if label not in chosen:
            continue
        system = overrides.get("model.name", "pses")
        for seed in seeds:
            weak = run(args, f"weak {label} {seed}", {**overrides, "seed": seed},
                       args.weak_steps)
            flags = {**overrides, "seed": seed, "data.pseudo_labels": 0, "init_from": weak}
            tuned = run(args, f"tuned {label} {seed}", flags, args.tune_steps)
            results["weak"].setdefault(label, []).append(test_row(weak, args.weak_steps, system))
            results["tuned"].setdefault(label, []).append(
                test_row(tuned, args.tune_steps, system))
            results["train"].setdefault(label, []).append(last_train_row(weak))
            bm25.setdefault(seed, test_row(weak, args.weak_steps, "bm25"))
            if system == "pses":
                tuned_pses.append((label, tuned, flags))
            if label == "PSES" and args.nn_s_alone:
                flags = {**flags, "loss.pses.trainable": "shared"}
                w = run(args, f"tuned NN_s alone {seed}", flags, args.tune_steps)
                results["tuned"].setdefault(NN_S_ALONE, []).append(
                    test_row(w, args.tune_steps, "pses"))
                tuned_pses.append((NN_S_ALONE, w, flags))
    if LABELS_ONLY in chosen:
        for seed in seeds:
            steps = args.weak_steps + args.tune_steps
            w = run(args, f"labels only {seed}", {"model.name": "dual_encoder", "seed": seed,
                                                  "data.pseudo_labels": 0}, steps)
            results["tuned"].setdefault(LABELS_ONLY, []).append(
                test_row(w, steps, "dual_encoder"))
            bm25.setdefault(seed, test_row(w, steps, "bm25"))
    if args.shared_score:  # the same params, searched by z_s alone: evaluation only
        for label, tuned, flags in tuned_pses:
            w = run(args, f"shared score {os.path.basename(tuned)}",
                    {**flags, "init_from": tuned, "model.pses.score": "shared",
                     "eval.baselines": ""}, 0)
            results["shared_score"].setdefault(label, []).append(test_row(w, 0, "pses"))

    head = ("| system | weak: MAP | P@20 | nDCG@20 | fine-tuned: MAP | P@20 | nDCG@20 |\n"
            "|---|---:|---:|---:|---:|---:|---:|")
    bm25_cells = " | ".join(cell([bm25[s][k] for s in seeds]) for k in METRICS)
    lines = [head, f"| BM25 | {bm25_cells} | {bm25_cells} |"]
    for label in [*SYSTEMS, LABELS_ONLY, NN_S_ALONE]:
        if label not in results["tuned"]:
            continue
        weak = results["weak"].get(label)
        tuned = results["tuned"][label]
        lines.append(f"| {label} | "
                     + " | ".join(cell([r[k] for r in weak]) if weak else "" for k in METRICS)
                     + " | " + " | ".join(cell([r[k] for r in tuned]) for k in METRICS) + " |")
    critic = ["", "| system (weak step, last logged) | critic accuracy | Wasserstein | "
                  "orthogonality | reconstruction |", "|---|---:|---:|---:|---:|"]
    for label, rows in results["train"].items():
        if "critic_accuracy" in rows[0]:
            critic.append(f"| {label} | " + " | ".join(
                cell([r[k] for r in rows]) for k in ("critic_accuracy", "wasserstein",
                                                     "orthogonality", "reconstruction")) + " |")
    shared = []
    if results["shared_score"]:
        shared = ["", "| fine-tuned system, same params | [z_s; z_spec]: MAP | P@20 | nDCG@20 "
                      "| z_s alone: MAP | P@20 | nDCG@20 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for label, rows in results["shared_score"].items():
            shared.append(f"| {label} | " + " | ".join(
                cell([r[k] for r in results["tuned"][label]]) for k in METRICS) + " | "
                + " | ".join(cell([r[k] for r in rows]) for k in METRICS) + " |")
    per_seed = ["", "Per seed (fine-tuned MAP): " + "; ".join(
        f"{label}: " + ", ".join(f"{r['map@100']:.3f}" for r in rows)
        for label, rows in [("BM25", [bm25[s] for s in seeds]), *results["tuned"].items(),
                            *((f"{label}, z_s alone", rows)
                              for label, rows in results["shared_score"].items())])]
    text = "\n".join(lines + critic + shared + per_seed)
    print(text)
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, {time.time() - start:.0f} s, "
          f"seeds {seeds}, "
          f"{args.weak_steps} weak + {args.tune_steps} fine-tuning steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bm25": {str(s): r for s, r in bm25.items()}, **results, "table": text},
                      f, indent=1)


if __name__ == "__main__":
    main()
