"""Adapting MiniLM: peak memory and pairs/s of `configs/adapt.py`'s training step, beside
sentence-transformers' own training step on the same kind of batch.

    python scripts/bench/bench_adapt.py --collection=DOCS.jsonl [--steps=12] [--vs-st | --st-only]
        [--st_bf16]
        [--st_python=PYTHON] [--flags=train.encode_chunks=0,...] [--json=FILE]
    python scripts/bench/bench_adapt.py --steps-only [--chunks=0,4,8,16] [--q_len=64 --d_len=256]
    python scripts/bench/bench_adapt.py --write-wiki5k=wiki5k.jsonl

--write-wiki5k: the issue's collection, written from ../shared/data/wikispeedia: every
paragraph of 150-300 words, shuffled with seed 0, the first 5,000, as {"_id", "title",
"text"} lines (almost every one is cut at 256 tokens).

DOCS.jsonl: a documents file ({"title", "text"} a line, as `configs/adapt.py` takes it)
or a BEIR folder. Each side runs in its own process, so each peak resident memory
(ru_maxrss of the child) is its own:
- dualjax: `python -m dualjax.main --config=configs/adapt.py` on the collection, with
  data.tasks=ict (a sentence of a passage against the passage: the pseudo-labels' shapes,
  with no labelling pass before the steps), --steps steps, a train row every step; pairs/s
  is the median over the steps after the first few, whose programs compile; peak RSS and
  the wall time cover the whole run (data, compilation, steps).
- --vs-st: sentence-transformers (all-MiniLM-L6-v2 from the same pretrained folder,
  max_seq_length 256) with MultipleNegativesRankingLoss and AdamW, the step as its
  trainer runs it (tokenize, forward, backward, step), batch 64 of (a sentence of a
  document, the document) from the same collection, torch on the same 2 threads: the
  peer at its best on CPU; --st_bf16 adds a row with bfloat16 autocast (what its
  trainer's bf16=True does), faster where the CPU has bfloat16 dot products (AVX512-BF16,
  AMX). Needs torch and sentence-transformers (not dualjax's install).
--steps-only: the jitted training step alone at MiniLM's sizes (random weights, random
tokens of --q_len / --d_len), for each of --chunks (train.encode_chunks): XLA's temporary
buffer size (`compiled.memory_analysis()`), the step time and the process's peak RSS,
each in a process of its own.
Figures: BENCHMARKS.md, "Adapting MiniLM".
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))  # common.py
import common  # noqa: E402

SKIP = 4  # first steps left out of pairs/s: each new (query, document) length compiles


def child_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run_dualjax(args) -> dict:
    workdir = tempfile.mkdtemp(prefix="bench_adapt_")
    flags = {"data.path": os.path.abspath(args.collection), "data.tasks": "ict",
             "num_train_steps": args.steps, "max_epochs": 0.0, "log_every_steps": 1,
             "checkpoint_every_steps": 10**6, "eval.untrained": False,
             **dict(kv.split("=", 1) for kv in args.flags.split(",") if kv)}
    cmd = [sys.executable, "-m", "dualjax.main", "--config=configs/adapt.py",
           f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in flags.items())]
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - start
    if out.returncode:
        raise SystemExit(f"dualjax run failed:\n{out.stderr[-3000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rates = [r["pairs_per_second"] for r in rows if r["split"] == "train" and r["step"] > SKIP]
    return {"side": "dualjax", "flags": flags, "pairs_per_second": median(rates),
            "peak_rss_mb": child_peak_mb(), "wall_s": wall, "workdir": workdir}


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


ST_WORKER = r'''
import json, random, sys, time, resource
import torch
from sentence_transformers import SentenceTransformer, losses
torch.set_num_threads(int(sys.argv[3]))
pairs = json.load(open(sys.argv[1]))
steps, batch, bf16 = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "bf16"
model = SentenceTransformer(sys.argv[2], device="cpu")
model.max_seq_length = 256
loss = losses.MultipleNegativesRankingLoss(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
model.train()
times = []
for i in range(steps):
    chunk = pairs[i * batch:(i + 1) * batch]
    t = time.perf_counter()
    features = [model.tokenize([q for q, _ in chunk]), model.tokenize([d for _, d in chunk])]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # its trainer's bf16=True
        value = loss(features, None)
    value.backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def st_pairs(collection: str, count: int, seed: int = 0,
             max_query_words: int = 48) -> list[tuple[str, str]]:
    """(a sentence of a document, cut as configs/adapt.py cuts its queries, the document)
    for `count` documents of the collection."""
    sys.path.insert(0, REPO)
    from dualjax.data.beir import document_text
    from dualjax.data.pretraining import QueryWords
    from dualjax.text.words import sentence_spans
    path = os.path.join(collection, "corpus.jsonl") if os.path.isdir(collection) else collection
    rng, out = __import__("random").Random(seed), []
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            text = document_text(d.get("title", ""), d["text"])
            sentences = [text[a:b] for a, b in sentence_spans(d["text"])
                         if len(text[a:b].split()) >= 5] or [d["text"][:200]]
            out.append((QueryWords(max=max_query_words).cut(rng.choice(sentences)), text))
            if len(out) == count:
                break
    return out


def write_wiki5k(out: str, count: int = 5000, seed: int = 0) -> None:
    src = os.path.join(REPO, "..", "shared", "data", "wikispeedia", "articles.jsonl")
    rows = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            article = json.loads(line)
            for i, p in enumerate(article["paragraphs"]):
                if 150 <= len(p["text"].split()) <= 300:
                    rows.append({"_id": f"{article['id']}#{i}", "title": article["title"],
                                 "text": p["text"]})
    __import__("random").Random(seed).shuffle(rows)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows[:count]:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{out}: {min(count, len(rows))} of {len(rows)} paragraphs of 150-300 words")


def run_st(args, precision: str = "fp32") -> dict:
    sys.path.insert(0, REPO)
    from dualjax.pretrained import sources
    pairs = st_pairs(args.collection, args.steps * 64)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(pairs, f)
    cmd = [args.st_python, "-c", ST_WORKER, f.name, sources.folder_of("all-MiniLM-L6-v2"),
           str(args.threads), str(args.steps), "64", precision]
    got = common.run_worker(cmd)  # (the sentence-transformers side)
    return {"side": f"sentence-transformers {precision}", "pairs_per_second":
            64 / median(got["times"][SKIP // 2:]), "step_s": got["times"],
            "peak_rss_mb": got["peak_rss_mb"]}


STEP_WORKER = r'''
import json, resource, sys, time
sys.path.insert(0, sys.argv[1] + "/scripts"); sys.path.insert(0, sys.argv[1])
import jax, numpy as np
from common import MINILM_SIZES as MINILM, default_config
from dualjax import losses, objectives
from dualjax.runtime import sharding
from dualjax.config import specs
from dualjax.train import step as step_lib
from dualjax.objectives.optimizer import make_optimizer
from dualjax.models import dual_encoder
from dualjax.models.bert import BertConfig
q_len, d_len, chunks, steps, rank = map(int, sys.argv[2:7])
c = default_config()
m = c.model
m.tower, m.max_len, m.similarity, m.temperature = "bert", 256, "cosine_temperature", 0.05
m.lora_rank, m.lora_alpha = rank, 2.0 * rank  # 0: every weight trains
c.loss.name = "in_batch_softmax"
mesh = sharding.make_mesh(1)
model = dual_encoder.make_model(specs.model_spec(m), MINILM["vocab_size"],
                                architecture=BertConfig(**MINILM))
tx, schedule = make_optimizer(specs.optimizer_spec(c.optimizer), 1000)
objective = objectives.make(objectives.ObjectiveSpec(loss=c.loss.name, max_len=256,
                                                    encode_chunks=chunks), model, mesh)
tx = objectives.restrict(tx, objective)  # (LoRA: the adapters alone)
init = step_lib.make_init_state(objective, tx)
shardings = sharding.state_shardings(jax.eval_shape(init, 0), mesh, "replicated",
                                     dual_encoder.logical_axes(model, 256))
state = jax.jit(init, static_argnums=0, out_shardings=shardings)(0)
step = step_lib.make_train_step(objective, tx, schedule, shardings,
                                sharding.batch_sharding(mesh), sharding.replicated(mesh))
rng, batch = np.random.default_rng(0), {}
for side, length in (("q", q_len), ("d", d_len)):
    mask = np.arange(length)[None] < rng.integers(length // 2, length + 1, size=(64, 1))
    batch[f"{side}_ids"] = np.where(mask, rng.integers(1, 30522, (64, length)), 0).astype(np.int32)
    batch[f"{side}_mask"] = mask
batch = sharding.put_global_batch(batch, mesh)
temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
times = []
for _ in range(steps):
    t = time.perf_counter()
    state, _ = step(state, batch, norms=False)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
print(json.dumps({"chunks": chunks, "lora_rank": rank, "temp_gib": temp / 2**30,
                  "state_gib": sum(x.nbytes for x in jax.tree.leaves(state)) / 2**30,
                  "step_s": times,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def run_steps(args) -> list[dict]:
    """--steps-only: the step alone for each of --chunks, a process each."""
    out = []
    for chunks, rank in ((c, r) for c in map(int, args.chunks.split(","))
                         for r in map(int, args.lora.split(","))):
        r = common.run_worker([sys.executable, "-c", STEP_WORKER, REPO, str(args.q_len),
                               str(args.d_len), str(chunks), str(args.steps), str(rank)])
        r["pairs_per_second"] = 64 / median(r["step_s"][1:])
        out.append(r)
        print(f"encode_chunks {chunks:2d}, LoRA rank {rank:2d}: train state "
              f"{r['state_gib']:.3f} GiB, XLA temp {r['temp_gib']:.2f} GiB, peak RSS "
              f"{r['peak_rss_mb']:.0f} MB, {r['pairs_per_second']:.2f} pairs/s", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collection", default="")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--flags", default="", help="extra k=v,k=v for configs/adapt.py")
    p.add_argument("--vs-st", action="store_true", help="also sentence-transformers' step")
    p.add_argument("--st-only", action="store_true", help="sentence-transformers' rows alone")
    p.add_argument("--st_bf16", action="store_true",
                   help="--vs-st: also with bfloat16 autocast (its trainer's bf16=True)")
    p.add_argument("--st_python", default=sys.executable,
                   help="a Python with torch and sentence-transformers")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="")
    p.add_argument("--steps-only", action="store_true", help="the jitted step alone")
    p.add_argument("--chunks", default="0,4,8,16", help="--steps-only: encode_chunks values")
    p.add_argument("--lora", default="0",
                   help="--steps-only: model.lora_rank values (0: every weight trains)")
    p.add_argument("--q_len", type=int, default=64)
    p.add_argument("--d_len", type=int, default=256)
    p.add_argument("--write-wiki5k", default="", help="write the issue's 5,000 paragraphs here")
    args = p.parse_args()
    if args.write_wiki5k:
        return write_wiki5k(args.write_wiki5k)
    if args.steps_only:
        results = run_steps(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    results = [] if args.st_only else [run_dualjax(args)]
    if args.vs_st or args.st_only:
        results += [run_st(args, p) for p in ("fp32", "bf16")[:1 + args.st_bf16]]
    print(f"\n{'side':24s} {'pairs/s':>8s} {'peak RSS MB':>12s}")
    for r in results:
        print(f"{r['side']:24s} {r['pairs_per_second']:8.2f} {r['peak_rss_mb']:12.0f}")
    for r in results[1:] if not args.st_only else []:
        print(f"dualjax / {r['side']}: "
              f"x{results[0]['pairs_per_second'] / r['pairs_per_second']:.2f} pairs/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
