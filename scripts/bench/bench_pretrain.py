"""Pre-training for retrieval (Chang et al. 2020) on our data: Table 3 and Table 5 shapes.

    python scripts/bench/bench_pretrain.py --out=runs/bench_pretrain [--suite=table3]
        [--pretrain_steps=1000] [--finetune_steps=500] [--towers=bow_mlp,transformer]
        [--fractions=0.01,0.05,0.8] [--transformer_tasks="mlm;ict;ict,bfs,wlp"]
        [--json=out.json]

Every run is one `python -m dualjax.main` call with its own workdir under --out (a
finished workdir is reused, so an interrupted benchmark resumes where it stopped; only
when its config.json holds the very settings the run would have: a workdir of the same
name run with other settings, e.g. another --pretrain_steps, stops the benchmark with a
one-line message naming the keys that differ):

- pre-training (configs/pretrain.py) on the Wikispeedia articles
  (../shared/data/wikispeedia/articles.jsonl) with the tasks of the row;
- fine-tuning (configs/reqa_finetune.py) on ReQA SQuAD at each train fraction (a random
  split of the 10,570 questions; every (sentence, paragraph) of SQuAD dev a candidate),
  from the pre-trained towers (config.init_from) or from scratch ("none");
- zero-shot: the pre-trained towers evaluated with no fine-tuning at all
  (num_train_steps=0) on every ReQA question (train_fraction=0) and on NPL
  (../shared/data/npl, BEIR layout, query and document ids unrelated), against BM25.

Suites: table3 (rows: BM25; each tower without pre-training and with ICT+BFS+WLP, the
transformer also with MLM and with ICT alone; columns recall@1/5/10/50/100 at each train fraction;
plus the zero-shot table), ablation (bow_mlp pre-trained on ICT, BFS, WLP alone and
together: zero-shot, and fine-tuned at 5%), similarity (ICT+BFS+WLP with
cosine_affine, a fixed temperature and the learned temperature: zero-shot and 5%), and
corpora (for NPL and ReQA zero-shot: pre-training on Wikispeedia, on the target's own
documents, and on both in sequence).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import read_rows, run_main, slug  # noqa: E402

from dualjax.config.keys import flatten

RECALL = ("recall@1", "recall@5", "recall@10", "recall@50", "recall@100")
FRACTIONS = (0.01, 0.05, 0.8)
WIKISPEEDIA = "../shared/data/wikispeedia/articles.jsonl"
SQUAD = "../shared/data/squad/dev-v1.1.json"
NPL = "../shared/data/npl"
TOWERS = {
    "bow_mlp": {},
    # 4 x 256 as configs/pretrain.py sets it; documents cut to 128 tokens for CPU time.
    "transformer": {"model.tower": "transformer", "model.doc_max_len": 128,
                    "model.transformer.max_positions": 128},
    # What 2 CPU cores pre-train in minutes (~245 pairs/s against 6-7 for 4 x 256):
    # 2 layers x 128, queries cut to 32 tokens, documents to 128.
    "transformer_2x128": {"model.tower": "transformer", "model.transformer.num_layers": 2,
                          "model.transformer.width": 128, "model.transformer.num_heads": 2,
                          "model.transformer.mlp_dim": 512, "model.query_max_len": 32,
                          "model.doc_max_len": 128, "model.transformer.max_positions": 128},
}
SIMILARITIES = {
    "learned temperature": {},  # configs/pretrain.py's default (log tau learned, from 0.05)
    "fixed temperature 0.05": {"model.similarity": "cosine_temperature"},
    "cosine_affine": {"model.similarity": "cosine_affine", "model.init_scale": 20.0},
}


def finished(workdir: str, steps: int, evaluates: bool) -> bool:
    rows = read_rows(workdir)
    if evaluates:
        return any(r["split"] == "test" and r["step"] == steps for r in rows)
    return any(r["split"] == "train" and r["step"] == steps for r in rows)


# Keys whose value does not change what a run computes: where the data cache lives.
NOT_SETTINGS = ("data.tfds_dir",)


def settings(config: str, flags: dict) -> dict:
    """{dotted key: value} of the config `python -m dualjax.main --config=CONFIG
    --config.KEY=VALUE ...` runs with, as its workdir's config.json records it."""
    cfg = runpy.run_path(config)["get_config"]()
    cfg.update_from_flattened_dict(flags)
    return {k: v for k, v in flatten(json.loads(json.dumps(cfg.to_dict()))).items()
            if k not in NOT_SETTINGS}


def settings_differ(workdir: str, config: str, flags: dict) -> list[str] | None:
    """"key: saved -> wanted" for each setting the workdir's config.json holds otherwise;
    None when it has no config.json (no run started there)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        saved = {k: v for k, v in flatten(json.load(f)).items() if k not in NOT_SETTINGS}
    wanted = settings(config, flags)
    return [f"{k}: {saved.get(k, '(absent)')!r} -> {wanted.get(k, '(absent)')!r}"
            for k in sorted(set(saved) | set(wanted))
            if saved.get(k, "(absent)") != wanted.get(k, "(absent)")]


def run(args, name: str, config: str, flags: dict, steps: int, evaluates: bool = True
        ) -> tuple[str, float | None]:
    """Runs (or reuses) one workdir; returns (workdir, wall seconds or None if reused).
    Refuses (exits with one line) a workdir that was run with other settings."""
    workdir = os.path.abspath(os.path.join(args.out, slug(name)))
    flags = {"num_train_steps": steps, "data.tfds_dir": args.tfds_dir, **flags}
    differ = settings_differ(workdir, config, flags)
    if differ:
        sys.exit(f"bench_pretrain: {workdir} was run with other settings "
                 f"({'; '.join(differ[:4])}{'; ...' if len(differ) > 4 else ''}): remove it "
                 "or give another --out")
    if differ is None and read_rows(workdir):
        sys.exit(f"bench_pretrain: {workdir} has results but no config.json to compare the "
                 "settings with: remove it or give another --out")
    if finished(workdir, steps, evaluates):
        return workdir, None
    return workdir, run_main(config, workdir, flags)


def pretrain(args, tower: str, tasks: str, path: str = WIKISPEEDIA, extra: dict | None = None,
             label: str = "", init_from: str = "") -> dict:
    name = f"pretrain {tower} {tasks} {label or os.path.basename(path)}"
    flags = {"data.path": os.path.abspath(path), "data.tasks": tasks,
             "checkpoint_every_steps": args.pretrain_steps,
             "log_every_steps": max(1, args.pretrain_steps // 20), **TOWERS[tower],
             # configs/pretrain.py warms up for 200 steps; a shorter run, for half of it
             "optimizer.warmup_steps": min(200, args.pretrain_steps // 2),
             **(extra or {}), **({"init_from": init_from} if init_from else {})}
    workdir, wall = run(args, name, "configs/pretrain.py", flags, args.pretrain_steps, False)
    rows = [r for r in read_rows(workdir) if r["split"] == "train"]
    # The last train row's own figure: in-batch p@1 of the pairs, or MLM's masked-token
    # accuracy (a token-level objective has no in-batch retrieval).
    metric = "mlm_accuracy" if "mlm_accuracy" in rows[-1] else "in_batch_p@1"
    return {"workdir": workdir, "wall_seconds": wall, "steps": args.pretrain_steps,
            "final_loss": rows[-1]["loss"], f"final_{metric}": rows[-1].get(metric),
            "pairs_per_second": sorted(r["pairs_per_second"] for r in rows[1:])[len(rows[1:]) // 2]
            if len(rows) > 1 else None}


def test_rows(workdir: str, steps: int) -> dict[str, dict]:
    """system -> its exact test row at `steps`."""
    return {r["system"]: r for r in read_rows(workdir)
            if r["split"] == "test" and r["step"] == steps and r.get("index") == "exact"}


def finetune(args, tower: str, init_from: str, fraction: float, label: str,
             extra: dict | None = None) -> dict[str, dict]:
    name = f"finetune {tower} {label} {fraction}"
    flags = {"data.train_fraction": fraction, "eval.index": "exact", "eval.untrained": False,
             "checkpoint_every_steps": args.finetune_steps, **TOWERS[tower], **(extra or {}),
             **({"init_from": init_from} if init_from else {})}
    if fraction < 0.05:  # ~105 training questions: a batch of 256 would repeat each
        flags["global_batch_size"] = 64
    workdir, _ = run(args, name, "configs/reqa_finetune.py", flags, args.finetune_steps)
    return test_rows(workdir, args.finetune_steps)


def zero_shot(args, tower: str, init_from: str, target: str, label: str,
              extra: dict | None = None) -> dict[str, dict]:
    """The pre-trained towers on every ReQA question, or on NPL; with BM25 beside them."""
    flags = {"init_from": init_from, "eval.index": "exact", "eval.untrained": False,
             **TOWERS[tower], **(extra or {})}
    if target == "reqa":
        flags["data.train_fraction"] = 0.0
    else:
        flags.update({"data.name": "beir", "data.path": os.path.abspath(NPL),
                      "data.ignore_identical_ids": False})
    workdir, _ = run(args, f"zeroshot {target} {tower} {label}", "configs/reqa_finetune.py",
                     flags, 0)
    return test_rows(workdir, 0)


def recall_cells(row: dict) -> str:
    return " / ".join(f"{100 * row[k]:.1f}" for k in RECALL)


def table3(args) -> dict:
    towers = [t.strip() for t in args.towers.split(",") if t.strip()]
    models = []  # (label, tower, init_from workdir or "")
    pretrained = {}
    for tower in towers:
        models.append((f"{tower}, no pre-training", tower, ""))
        for tasks in (args.transformer_tasks.split(";") if tower.startswith("transformer")
                      else ("ict,bfs,wlp",)):
            p = pretrained[(tower, tasks)] = pretrain(args, tower, tasks)
            models.append((f"{tower}, {tasks.upper().replace(',', '+')}", tower, p["workdir"]))
    results = {"models": {}, "bm25": {}, "pretraining": {
        f"{t} {k}": v for (t, k), v in pretrained.items()}, "zero_shot": {}}
    for fraction in args.fractions:
        for label, tower, init in models:
            rows = finetune(args, tower, init, fraction, slug(label))
            results["models"].setdefault(label, {})[fraction] = rows["dual_encoder"]
            results["bm25"][fraction] = rows["bm25"]
    for (tower, tasks), p in pretrained.items():
        for target in ("reqa", "npl") if tasks != "mlm" else ():  # MLM has no retrieval head
            rows = zero_shot(args, tower, p["workdir"], target, tasks)
            results["zero_shot"][f"{tower}, {tasks} -> {target}"] = {
                "dual_encoder": rows["dual_encoder"], "bm25": rows["bm25"]}
    lines = ["| model | " + " | ".join(f"{f:g}: R@1 / 5 / 10 / 50 / 100" for f in args.fractions)
             + " |", "|---|" + "---|" * len(args.fractions),
             "| BM25 | " + " | ".join(recall_cells(results["bm25"][f]) for f in args.fractions)
             + " |"]
    for label, per in results["models"].items():
        lines.append(f"| {label} | " + " | ".join(recall_cells(per[f]) for f in args.fractions)
                     + " |")
    results["table"] = "\n".join(lines)
    results["zero_shot_table"] = zero_shot_table(results["zero_shot"])
    return results


def zero_shot_table(rows: dict) -> str:
    lines = ["| pre-training -> target | R@1 / 5 / 10 / 50 / 100 | nDCG@10 | MAP@100 | "
             "BM25 R@100 | BM25 nDCG@10 | ratio nDCG@10 |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, r in rows.items():
        de, bm = r["dual_encoder"], r["bm25"]
        lines.append(f"| {label} | {recall_cells(de)} | "
                     f"{de['ndcg@10']:.3f} | {de['map@100']:.3f} | {100 * bm['recall@100']:.1f} | "
                     f"{bm['ndcg@10']:.3f} | {de['ndcg@10'] / bm['ndcg@10']:.2f}x |")
    return "\n".join(lines)


def variants_suite(args, variants: dict[str, tuple[str, dict]]) -> dict:
    """label -> (tasks, pre-training flags): zero-shot on ReQA and NPL, and fine-tuned at
    5% (fine-tuning keeps the pre-training run's similarity)."""
    out = {"pretraining": {}, "zero_shot": {}, "finetuned_0.05": {}}
    for label, (tasks, extra) in variants.items():
        p = out["pretraining"][label] = pretrain(args, "bow_mlp", tasks, extra=extra,
                                                 label=slug(label))
        for target in ("reqa", "npl"):
            rows = zero_shot(args, "bow_mlp", p["workdir"], target, slug(label), extra)
            out["zero_shot"][f"{label} -> {target}"] = {"dual_encoder": rows["dual_encoder"],
                                                         "bm25": rows["bm25"]}
        rows = finetune(args, "bow_mlp", p["workdir"], 0.05, slug(label), extra)
        out["finetuned_0.05"][label] = rows
    lines = ["| pre-training | fine-tuned at 5%: R@1 / 5 / 10 / 50 / 100 | BM25 |", "|---|---|---|"]
    for label, rows in out["finetuned_0.05"].items():
        lines.append(f"| {label} | {recall_cells(rows['dual_encoder'])} | "
                     f"{recall_cells(rows['bm25'])} |")
    out["table"] = "\n".join(lines)
    out["zero_shot_table"] = zero_shot_table(out["zero_shot"])
    return out


def ablation(args) -> dict:
    return variants_suite(args, {t.upper().replace(",", "+"): (t, {})
                                 for t in ("ict", "bfs", "wlp", "ict,bfs,wlp")})


def similarity(args) -> dict:
    return variants_suite(args, {name: ("ict,bfs,wlp", flags)
                                 for name, flags in SIMILARITIES.items()})


def corpora(args) -> dict:
    """Which pre-training corpus helps which zero-shot target."""
    wiki = pretrain(args, "bow_mlp", "ict,bfs,wlp")
    runs = {"Wikispeedia (ICT+BFS+WLP)": wiki,
            "NPL documents (ICT)": pretrain(args, "bow_mlp", "ict", NPL, label="npl"),
            "SQuAD paragraphs (ICT+BFS+WLP)": pretrain(args, "bow_mlp", "ict,bfs,wlp", SQUAD,
                                                       label="squad"),
            "Wikispeedia, then NPL (ICT)": pretrain(args, "bow_mlp", "ict", NPL,
                                                    label="wiki_then_npl",
                                                    init_from=wiki["workdir"]),
            "Wikispeedia, then SQuAD paragraphs": pretrain(args, "bow_mlp", "ict,bfs,wlp", SQUAD,
                                                           label="wiki_then_squad",
                                                           init_from=wiki["workdir"])}
    out = {"pretraining": runs, "zero_shot": {}}
    for label, p in runs.items():
        for target in ("reqa", "npl"):
            rows = zero_shot(args, "bow_mlp", p["workdir"], target, slug(label))
            out["zero_shot"][f"{label} -> {target}"] = {"dual_encoder": rows["dual_encoder"],
                                                         "bm25": rows["bm25"]}
    out["zero_shot_table"] = zero_shot_table(out["zero_shot"])
    return out


SUITES = {"table3": table3, "ablation": ablation, "similarity": similarity, "corpora": corpora}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="Parent folder of the runs' workdirs.")
    p.add_argument("--suite", choices=sorted(SUITES), default="table3")
    p.add_argument("--pretrain_steps", type=int, default=1000)
    p.add_argument("--finetune_steps", type=int, default=500)
    p.add_argument("--towers", default="bow_mlp,transformer",
                   help=f"table3: towers to run, of {', '.join(TOWERS)}.")
    p.add_argument("--transformer_tasks", default="mlm;ict;ict,bfs,wlp",
                   help="table3: a Transformer's pre-training rows, separated by ';'.")
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)),
                   help="table3: the train fractions to fine-tune at.")
    p.add_argument("--tfds_dir", default="", help="Shared data cache (default OUT/tfds).")
    p.add_argument("--json", default="", help="Also write the results here.")
    args = p.parse_args()
    args.fractions = [float(f) for f in args.fractions.split(",")]
    unknown = set(args.towers.split(",")) - set(TOWERS)
    if unknown:
        p.error(f"--towers: unknown {', '.join(sorted(unknown))}; known: {', '.join(TOWERS)}")
    args.out = os.path.abspath(args.out)
    args.tfds_dir = os.path.abspath(args.tfds_dir or os.path.join(args.out, "tfds"))
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    results = SUITES[args.suite](args)
    print(f"\nSuite {args.suite}: pre-training {args.pretrain_steps} steps, fine-tuning "
          f"{args.finetune_steps} steps; machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; {(time.time() - start) / 60:.1f} min\n")
    for key in ("table", "zero_shot_table"):
        if key in results:
            print(results[key] + "\n")
    for label, p in results.get("pretraining", {}).items():
        wall = f"{p['wall_seconds'] / 60:.1f} min" if p["wall_seconds"] else "reused"
        name, value = (("masked-token accuracy", p["final_mlm_accuracy"])
                       if "final_mlm_accuracy" in p else ("in-batch p@1", p["final_in_batch_p@1"]))
        print(f"pre-training {label}: {p['steps']} steps, {wall}, final loss "
              f"{p['final_loss']:.3f}, {name} {value:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": args.suite, "args": vars(args), **results}, f, indent=1,
                      default=str)


if __name__ == "__main__":
    main()
