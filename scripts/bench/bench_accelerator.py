"""The accelerator benchmark (issue 46): dualjax's training and corpus encoding on whatever
device jax finds, beside sentence-transformers on the same device and data when torch and
sentence-transformers are installed, in one table and one JSON file.

    python scripts/bench/bench_accelerator.py --out=runs/bench_acc \
        [--squad=../shared/data/squad/dev-v1.1.json] [--tokenizer=all-MiniLM-L6-v2]
        [--shapes=minilm,bertbase] [--batch=8192] [--chunks=16] [--steps=12]
        [--docs=200000] [--parts=data,train,encode,static,peer] [--again] [--json=FILE]
        [--peer_python=PYTHON]
    python scripts/bench/bench_accelerator.py --toy --out=DIR   # minutes on a CPU (the suite's)

What it does, as a user would (`python -m dualjax.main`, `dualjax.export`,
`dualjax.index`):
- writes random-weight BERT folders of the MiniLM-L6 (384 x 6) and BERT-base (768 x 12)
  shapes with the given tokenizer's files and sentence-transformers' module files (the
  same folder loads in both), the SQuAD v1.1 dev (question, paragraph) pairs four times
  over (42,280; --toy: generated ones) and a corpus of --docs paragraphs;
- data: the data stages of a run timed alone (the pairs file read and split, the
  tables written, the pairs tokenized up front), on the SQuAD pairs or --pairs_file;
- train: each shape at a global batch of --batch pairs (queries 32, paragraphs 128
  tokens, bf16 on an accelerator, --chunks GradCache chunks): the time from the command
  to the iterator's first batch and to the first step, the steady pairs/s (median of the
  train rows after the second), the model FLOPs of a pair (6 x non-embedding parameters
  x 160 tokens, plus attention) and from them the MFU against the device's bf16 peak,
  the device's peak memory;
- encode: the MiniLM run exported and `dualjax.index` over the corpus: documents/s, and
  where its time went (host preparation, dispatch, storing, waiting for the host or
  the device: shard.json's encode_profile);
- static: a WordLlama start (when fetched) indexed the same way, against the tokenizer
  alone on the same texts and cores (the `tokenizers` library's batch encoding) and,
  where --peer_python has sentence-transformers, against its StaticEmbedding: the same
  run exported as a sentence-transformers folder (`dualjax.export
  --format=sentence-transformers`: the same table, the truncation in its tokenizer)
  encoding the same texts at the same batch size;
- peer: sentence-transformers' CachedMultipleNegativesRankingLoss (mini-batches of 512,
  bf16 autocast on a GPU) and `encode` on the same folders and data, when installed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))  # common.py
import common  # noqa: E402

SHAPES = {"minilm": dict(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
          "bertbase": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
          "toy": dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)}
QUERY_LEN, DOC_LEN = 32, 128
# bf16 dense peak FLOP/s of a device, by the start of jax's device_kind
PEAKS = {"NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12,
         "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5": 459e12, "TPU v6": 918e12}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")


# ----------------------------------------------------------------------------- the kit
def tokenizer_folder(name: str) -> str:
    """A folder holding tokenizer.json: `name` itself, or a fetched pretrained start's."""
    if os.path.isfile(os.path.join(name, "tokenizer.json")):
        return name
    from dualjax.pretrained import sources
    return sources.folder_of(name)


def write_bert(folder: str, shape: str, tokenizer: str, seed: int = 0) -> str:
    """A random-weight BERT folder of `shape`, readable by dualjax (model.pretrained) and
    by sentence-transformers (mean pooling, normalised)."""
    import jax
    from flax import linen as nn
    from safetensors.numpy import save_file

    from dualjax.models.bert import BertConfig, BertTower
    from dualjax.pretrained.bert_weights import hf_config, hf_tensors
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return folder
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    with open(os.path.join(tokenizer, "tokenizer.json")) as f:
        vocab = len(json.load(f)["model"]["vocab"])
    config = BertConfig(vocab_size=vocab, max_positions=512, **SHAPES[shape])
    ids = np.ones((1, 8), np.int32)
    params = nn.meta.unbox(BertTower(config).init(jax.random.PRNGKey(seed), ids,
                                                  ids > 0)["params"])
    save_file({k: np.ascontiguousarray(v) for k, v in hf_tensors(params, config).items()},
              os.path.join(folder, "model.safetensors"))
    files = {"config.json": hf_config(config),
             "modules.json": [
                 {"idx": 0, "name": "0", "path": "", "type":
                  "sentence_transformers.models.Transformer"},
                 {"idx": 1, "name": "1", "path": "1_Pooling", "type":
                  "sentence_transformers.models.Pooling"},
                 {"idx": 2, "name": "2", "path": "2_Normalize", "type":
                  "sentence_transformers.models.Normalize"}],
             "sentence_bert_config.json": {"max_seq_length": DOC_LEN, "do_lower_case": False},
             "1_Pooling/config.json": {"word_embedding_dimension": config.hidden_size,
                                       "pooling_mode_mean_tokens": True}}
    for name, content in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(tokenizer, name)):
            shutil.copy(os.path.join(tokenizer, name), folder)
    return folder


def squad_rows(path: str) -> list[tuple[str, str]]:
    """(question, paragraph) of every SQuAD v1.1 question, whitespace collapsed."""
    with open(path) as f:
        data = json.load(f)["data"]
    return [(" ".join(qa["question"].split()), " ".join(p["context"].split()))
            for a in data for p in a["paragraphs"] for qa in p["qas"]]


def toy_rows(n: int = 400) -> list[tuple[str, str]]:
    rng = random.Random(0)
    words = ("bike chain brake tyre bread flour oven guitar string chord garden soil seed "
             "coffee bean river bridge boat fish").split()
    rows = []
    for i in range(n):
        topic = rng.sample(words, 4)
        paragraph = " ".join(f"the {w} of item {i} is {rng.choice(words)}." for w in topic)
        rows.append((f"what about the {topic[0]} of item {i}?", paragraph))
    return rows


def write_data(out: str, rows: list[tuple[str, str]], repeat: int, docs: int) -> tuple[str, str]:
    """pairs.tsv (the rows `repeat` times, shuffled each time) and corpus.jsonl (`docs`
    paragraphs, each numbered: no id and no text repeats)."""
    pairs, corpus = os.path.join(out, "pairs.tsv"), os.path.join(out, "corpus.jsonl")
    rng = random.Random(0)
    with open(pairs, "w") as f:
        for _ in range(repeat):
            rows = rows[:]
            rng.shuffle(rows)
            f.writelines(f"{q}\t{c}\n" for q, c in rows)
    paragraphs = sorted({c for _, c in rows})
    with open(corpus, "w") as f:  # each text distinct (its number in front): no encoder
        # may tokenize a repeated one once for all (dualjax's batches would)
        f.writelines(json.dumps({"_id": f"d{i}", "text": f"{i}. {paragraphs[i % len(paragraphs)]}"})
                     + "\n" for i in range(docs))
    return pairs, corpus


# ----------------------------------------------------------------------------- dualjax
def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def flops_per_pair(shape: str) -> float:
    """Training FLOPs of one (query, paragraph) pair at 32 + 128 tokens: 6 x the
    non-embedding parameters x the tokens, plus the attention's 12 x layers x width x
    length^2 (forward and backward), per text."""
    s = SHAPES[shape]
    h, layers, mlp = s["hidden_size"], s["num_layers"], s["intermediate_size"]
    params = layers * (4 * h * h + 2 * h * mlp)
    return sum(6 * params * n + 12 * layers * h * n * n for n in (QUERY_LEN, DOC_LEN))


def device_info() -> dict:
    import jax
    d = jax.devices()[0]
    peak = next((v for k, v in PEAKS.items() if d.device_kind.startswith(k)), None)
    return {"platform": d.platform, "kind": d.device_kind, "devices": jax.device_count(),
            "peak_flops": peak, "jax": jax.__version__}


def train(args, name: str, folder: str, pairs: str, accelerator: bool,
          again: bool = False) -> dict:
    """`dualjax.main` on the pairs from `folder`; the times and rates it shows. The
    bench's own compilation cache (OUT/xla, emptied when the bench starts); `again`:
    the same run once more, its tables and compiled programs kept from the first."""
    work = os.path.join(args.out, f"run_{name}")
    shutil.rmtree(work, ignore_errors=True)
    cmd = _python("-m", "dualjax.main", "--config=configs/default.py", f"--workdir={work}",
                  "--config.data.name=pairs", f"--config.data.path={pairs}",
                  f"--config.data.tfds_dir={os.path.join(args.out, 'tfds')}",
                  "--config.data.val_fraction=0.01", "--config.data.test_fraction=0.02",
                  "--config.model.tower=bert", "--config.model.tokenizer=hf",
                  f"--config.model.pretrained={folder}", f"--config.model.max_len={DOC_LEN}",
                  f"--config.model.query_max_len={QUERY_LEN}",
                  f"--config.model.doc_max_len={DOC_LEN}",
                  "--config.model.similarity=cosine_temperature",
                  "--config.model.temperature=0.05",
                  f"--config.model.dtype={'bfloat16' if accelerator else 'float32'}",
                  f"--config.global_batch_size={args.batch}",
                  f"--config.train.encode_chunks={args.chunks}",
                  f"--config.num_train_steps={args.steps}", "--config.log_every_steps=1",
                  "--config.checkpoint_every_steps=100000", "--config.eval_every_steps=0",
                  "--config.optimizer.learning_rate=1e-5", "--config.eval.baselines=",
                  "--config.eval.untrained=False", "--config.eval.index=exact")
    start = time.perf_counter()
    marks, lines = {}, []
    env = {**os.environ, "DUALJAX_COMPILATION_CACHE": os.path.join(args.out, "xla")}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    for line in proc.stdout:
        lines.append(line)
        now = time.perf_counter() - start
        # the pairs tokenized (beside the model's build), or a generated collection read
        if "training pairs" in line or "generated from" in line:
            marks.setdefault("data_ready_s", now)
        if re.search(r"step 1/\d+:", line):
            marks.setdefault("first_step_s", now)
    code = proc.wait()
    result = {"name": name + (" again" if again else ""), "exit": code,
              "wall_s": round(time.perf_counter() - start, 1),
              **{k: round(v, 1) for k, v in marks.items()}}
    if code:
        result["error"] = "".join(lines[-5:])[-600:]
        return result
    rows = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    train_rows = [r for r in rows if r["split"] == "train" and "pairs_per_second" in r]
    steady = [r["pairs_per_second"] for r in train_rows if r["step"] > 2] or \
        [train_rows[-1]["pairs_per_second"]]
    rate = statistics.median(steady)
    info = device_info()
    flops = flops_per_pair(args.shape_of[name])
    result.update(pairs_per_s=round(rate, 1), gflop_per_pair=round(flops / 1e9, 2),
                  tflops=round(rate * flops / 1e12, 2), workdir=work,
                  mfu=round(rate * flops / (info["peak_flops"] * info["devices"]), 3)
                  if info["peak_flops"] else None,
                  device_peak_gib=round(max((r.get("device_peak_gib", 0) for r in train_rows),
                                            default=0), 2) or None)
    return result


def data_stages(args, pairs: str, tokenizer: str) -> dict:
    """The data stages of a run, timed here (in this process, a fresh table folder): the
    pairs file read and split with the evaluation tables written, the pairs table
    written, and the pairs tokenized up front as the run does (`pipeline.ReadPairs`,
    queries at 32 and documents at 128 tokens)."""
    from dualjax.data import builders, pipeline
    from dualjax.text.hf import HFTokenizer
    from dualjax.text.sides import Inputs, Side
    folder = os.path.join(args.out, "tfds_data")
    shutil.rmtree(folder, ignore_errors=True)
    spec = builders.DatasetSpec.of({
        "name": "pairs", "path": pairs, "val_fraction": 0.01, "test_fraction": 0.02,
        "skip_bad_lines": False, "candidates": "split", "min_cluster_coherence": 0.0}, 0)
    tok = HFTokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
    times, start = {}, time.perf_counter()
    builders.prepare(spec, folder, "queries")
    builders.prepare(spec, folder, "corpus")
    times["read_and_eval_tables_s"] = time.perf_counter() - start
    mark = time.perf_counter()
    source = builders.train_source(spec, folder)
    times["pairs_table_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    pipeline.ReadPairs(source, Inputs(Side(tok, QUERY_LEN), Side(tok, DOC_LEN)))
    times["tokenized_s"] = time.perf_counter() - mark
    total = time.perf_counter() - start
    with open(pairs) as f:
        n = sum(1 for _ in f)
    return {"pairs": n, **{k: round(v, 2) for k, v in times.items()},
            "total_s": round(total, 2), "pairs_per_s": round(n / total, 1)}


def index(args, name: str, bundle: str, corpus: str) -> dict:
    """`dualjax.index` over the corpus: documents/s and where the time went."""
    out = os.path.join(args.out, f"index_{name}")
    start = time.perf_counter()
    done = subprocess.run(_python("-m", "dualjax.index", f"--encoder={bundle}",
                                  f"--corpus={corpus}", f"--out={out}", "--kind=exact",
                                  f"--batch_size={args.encode_batch}", "--overwrite"),
                          cwd=REPO, capture_output=True, text=True)
    result = {"name": name, "exit": done.returncode,
              "wall_s": round(time.perf_counter() - start, 1)}
    if done.returncode:
        result["error"] = done.stderr[-600:]
        return result
    with open(os.path.join(out, "shard-00000-of-00001", "shard.json")) as f:
        shard = json.load(f)
    result.update(docs=shard["n"], encode_s=shard["encode_seconds"],
                  docs_per_s=round(shard["n"] / shard["encode_seconds"], 1),
                  profile=shard.get("encode_profile", {}))
    return result


def export(workdir: str, out: str, *flags: str) -> str:
    done = subprocess.run(_python("-m", "dualjax.export", f"--workdir={workdir}", f"--out={out}",
                                  "--overwrite", *flags), cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-600:])
    return out


def tokenizer_alone(texts: list[str], bundle: str, repeats: int = 3) -> float:
    """Documents/s of the `tokenizers` library alone batch-encoding the texts (truncated
    at the bundle's document length, in its own threads; its fastest form, without
    character offsets), median of `repeats`."""
    import tokenizers

    import dualjax
    side = dualjax.Encoder.load(bundle).sides["document"]
    tok = tokenizers.Tokenizer.from_str(side.tokenizer._tok.to_str())
    tok.enable_truncation(side.max_len)
    lower = side.tokenizer.lowercase
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for at in range(0, len(texts), 256):
            batch = texts[at:at + 256]
            tok.encode_batch_fast([t.lower() for t in batch] if lower else batch)
        rates.append(len(texts) / (time.perf_counter() - start))
    return statistics.median(rates)


def static_bundle(args, corpus: str) -> str | None:
    """An exported WordLlama start as it is (an evaluation-only run, OUT/run_static), or
    None unfetched."""
    from dualjax import pretrained
    try:
        pretrained.resolve("wordllama")
    except Exception:
        return None
    beir = os.path.join(args.out, "slice")
    os.makedirs(os.path.join(beir, "qrels"), exist_ok=True)
    with open(corpus) as f:
        docs = [json.loads(next(f)) for _ in range(3)]
    with open(os.path.join(beir, "corpus.jsonl"), "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    with open(os.path.join(beir, "queries.jsonl"), "w") as f:
        f.write(json.dumps({"_id": "q0", "text": docs[0]["text"][:40]}) + "\n")
    with open(os.path.join(beir, "qrels", "test.tsv"), "w") as f:
        f.write(f"query-id\tcorpus-id\tscore\nq0\t{docs[0]['_id']}\t1\n")
    run = os.path.join(args.out, "run_static")
    shutil.rmtree(run, ignore_errors=True)
    done = subprocess.run(_python(
        "-m", "dualjax.main", "--config=configs/default.py", f"--workdir={run}",
        "--config.data.name=beir", f"--config.data.path={beir}", "--config.num_train_steps=0",
        "--config.model.pretrained=wordllama", "--config.model.tower=bow",
        "--config.model.tokenizer=hf", "--config.model.embed_dim=256",
        "--config.model.output_dim=256", f"--config.model.max_len={DOC_LEN}",
        "--config.eval.baselines=", "--config.eval.index=exact"), cwd=REPO,
        capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-600:])
    return export(run, os.path.join(args.out, "bundle_static"))


# sentence-transformers' StaticEmbedding encoding a corpus (run by --peer_python, which
# need not have dualjax): argv folder, corpus.jsonl, batch size, rounds; prints its
# figures as JSON, {} where sentence-transformers is not installed.
STATIC_PEER = """
import json, statistics, sys, time
try:
    import torch
    import sentence_transformers
    from sentence_transformers import SentenceTransformer
except ImportError:
    print("{}")
    sys.exit(0)
folder, corpus, batch, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
texts = [json.loads(line)["text"] for line in open(corpus)]
device = "cuda" if torch.cuda.is_available() else "cpu"
model = SentenceTransformer(folder, device=device)
model.encode(texts[:batch], batch_size=batch)  # warm
rates = []
for _ in range(rounds):
    start = time.perf_counter()
    model.encode(texts, batch_size=batch, convert_to_numpy=True)
    rates.append(len(texts) / (time.perf_counter() - start))
print(json.dumps({"docs_per_s": round(statistics.median(rates), 1),
                  "rates": [round(r, 1) for r in rates],
                  "sentence_transformers": sentence_transformers.__version__,
                  "torch": torch.__version__, "device": device}))
"""


def static_peer(args, folder: str, corpus: str, rounds: int = 3) -> dict:
    """sentence-transformers' StaticEmbedding (the folder `dualjax.export
    --format=sentence-transformers` wrote) encoding the corpus: documents/s, median of
    `rounds`; {} where --peer_python has no sentence-transformers."""
    return common.run_worker([args.peer_python, "-c", STATIC_PEER, folder, corpus,
                              str(args.encode_batch), str(rounds)])


# ----------------------------------------------------------------------------- the peer
def peer(args, folders: dict[str, str], pairs: str, corpus_texts: list[str],
         accelerator: bool) -> dict:
    """sentence-transformers on the same folders and data: CachedMNRL training pairs/s
    and `encode` documents/s; {} when it is not installed."""
    try:
        import torch
        from sentence_transformers import SentenceTransformer, losses
    except ImportError:
        return {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with open(pairs) as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    out = {"torch": torch.__version__}
    for name, folder in folders.items():
        model = SentenceTransformer(folder, device=device)
        model.max_seq_length = DOC_LEN
        loss = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=min(
            512, args.batch))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5,
                                      fused=device == "cuda")
        times = []
        for step in range(min(args.steps, 6)):
            batch = rows[step * args.batch:(step + 1) * args.batch]
            start = time.perf_counter()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=accelerator):
                features = [model.tokenize([b[i] for b in batch]) for i in (0, 1)]
                features = [{k: v.to(device) for k, v in f.items()} for f in features]
                value = loss(features, None)
                value.backward()
            optimizer.step()
            optimizer.zero_grad()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[f"train_{name}_pairs_per_s"] = round(args.batch / statistics.median(
            times[1:] or times), 1)
        if name == "minilm" or name == "toy":
            encoder = model.half() if accelerator else model
            start = time.perf_counter()
            encoder.encode(corpus_texts, batch_size=256, convert_to_numpy=True)
            out["encode_docs_per_s"] = round(len(corpus_texts) / (time.perf_counter() - start), 1)
    return out


# ----------------------------------------------------------------------------- the table
def table(results: dict) -> str:
    d = results["device"]
    lines = [f"device: {d['kind']} x {d['devices']} ({d['platform']}), jax {d['jax']}; "
             f"{results['machine']}", "",
             "| what | dualjax | sentence-transformers | ratio |", "|---|---:|---:|---:|"]
    peer_ = results.get("peer", {})

    def row(what, ours, theirs=None, unit=""):
        ratio = f"{ours / theirs:.2f}x" if ours and theirs else ""
        lines.append(f"| {what} | {ours if ours is not None else '-'}{unit} | "
                     f"{theirs if theirs else '-'}{unit if theirs else ''} | {ratio} |")

    for t in results.get("train", []):
        if t.get("exit"):
            lines.append(f"| train {t['name']} | failed: {t.get('error', '')[:80]!r} | | |")
            continue
        row(f"train {t['name']}, batch {results['batch']} (pairs/s)", t["pairs_per_s"],
            peer_.get(f"train_{t['name']}_pairs_per_s"))
        lines.append(f"| train {t['name']}: MFU, TFLOP/s, peak memory | "
                     f"{t['mfu'] if t['mfu'] is not None else '-'}, {t['tflops']}, "
                     f"{t['device_peak_gib'] or '-'} GiB | | |")
        lines.append(f"| train {t['name']}: data ready, first step (s from the command) | "
                     f"{t.get('data_ready_s', '-')}, {t.get('first_step_s', '-')} | | |")
    d = results.get("data")
    if d:
        lines.append(f"| data, {d['pairs']} pairs: read + eval tables, pairs table, tokenized "
                     f"(s); pairs/s | {d['read_and_eval_tables_s']}, {d['pairs_table_s']}, "
                     f"{d['tokenized_s']}; {d['pairs_per_s']} | | |")
    e = results.get("encode")
    if e and not e.get("exit"):
        row(f"encode {e['docs']} documents (docs/s)", e["docs_per_s"],
            peer_.get("encode_docs_per_s"))
        p = e["profile"]
        lines.append(f"| encode: host preparing (its threads summed), dispatch, storing, "
                     f"waiting for host / device (s) | {p.get('prepare')}, "
                     f"{p.get('dispatch')}, {p.get('store')}, "
                     f"{p.get('wait_host')} / {p.get('wait_device')} | | |")
    s = results.get("static")
    if s and not s.get("exit"):
        lines.append(f"| static tower (WordLlama) docs/s; the tokenizer alone | "
                     f"{s['docs_per_s']}; {s['tokenizer_alone_docs_per_s']} "
                     f"({s['docs_per_s'] / s['tokenizer_alone_docs_per_s']:.2f}x) | | |")
        theirs = s.get("peer", {}).get("docs_per_s")
        if theirs:
            row("static tower (WordLlama) docs/s: dualjax.index; StaticEmbedding.encode",
                s["docs_per_s"], theirs)
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--squad", default=os.path.join(REPO, "..", "shared", "data", "squad",
                                                   "dev-v1.1.json"))
    p.add_argument("--tokenizer", default="all-MiniLM-L6-v2",
                   help="a folder with tokenizer.json, or a fetched pretrained name")
    p.add_argument("--shapes", default="minilm,bertbase")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--chunks", type=int, default=16, help="train.encode_chunks")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--encode_batch", type=int, default=1024)
    p.add_argument("--parts", default="data,train,encode,static,peer")
    p.add_argument("--again", action="store_true",
                   help="train each shape a second time, with the tables and the "
                        "compilation cache of the first")
    p.add_argument("--pairs_file", default="",
                   help="the data part's pairs (TSV) instead of the SQuAD pairs")
    p.add_argument("--toy", action="store_true", help="tiny shapes and data (a CPU, tests)")
    p.add_argument("--peer_python", default=sys.executable,
                   help="the Python that runs sentence-transformers' StaticEmbedding (static "
                        "part; skipped where it has no sentence-transformers)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.toy:
        args.shapes, args.batch, args.chunks, args.steps, args.docs = "toy", 32, 2, 4, 400
        args.encode_batch = 64
        args.tokenizer = os.path.join(REPO, "tests", "fixtures", "pretrained", "tiny_bert")
    parts = set(args.parts.split(","))
    os.makedirs(args.out, exist_ok=True)
    info = device_info()
    accelerator = info["platform"] != "cpu"
    tok = tokenizer_folder(args.tokenizer)
    shapes = args.shapes.split(",")
    args.shape_of = {s: s for s in shapes}
    folders = {s: write_bert(os.path.join(args.out, s), s, tok) for s in shapes}
    rows = toy_rows() if args.toy or not os.path.isfile(args.squad) else squad_rows(args.squad)
    pairs, corpus = write_data(args.out, rows, 4, args.docs)
    results = {"device": info, "machine": f"{platform.node()}, {os.cpu_count()} cores",
               "batch": args.batch, "pairs": 4 * len(rows), "toy": args.toy}
    for fresh in ("tfds", "xla"):  # a first run writes its tables and compiles
        shutil.rmtree(os.path.join(args.out, fresh), ignore_errors=True)
    if "data" in parts:
        results["data"] = data_stages(args, args.pairs_file or pairs, tok)
    if "train" in parts or "encode" in parts:
        results["train"] = [r for s in shapes for r in (
            [train(args, s, folders[s], pairs, accelerator)]
            + ([train(args, s, folders[s], pairs, accelerator, again=True)]
               if args.again else []))]
        print(json.dumps(results["train"]), flush=True)
    first = results.get("train", [{}])[0]
    if "encode" in parts and first.get("workdir"):
        bundle = export(first["workdir"], os.path.join(args.out, f"bundle_{shapes[0]}"))
        results["encode"] = index(args, shapes[0], bundle, corpus)
    if "static" in parts:
        bundle = static_bundle(args, corpus)
        if bundle:
            results["static"] = index(args, "static", bundle, corpus)
            with open(corpus) as f:
                texts = [json.loads(line)["text"] for line in f]
            results["static"]["tokenizer_alone_docs_per_s"] = round(
                tokenizer_alone(texts, bundle), 1)
            folder = export(os.path.join(args.out, "run_static"),
                            os.path.join(args.out, "st_static"),
                            "--format=sentence-transformers")
            results["static"]["peer"] = static_peer(args, folder, corpus)
    if "peer" in parts:
        with open(corpus) as f:
            texts = [json.loads(line)["text"] for line in f]
        results["peer"] = peer(args, {s: folders[s] for s in shapes}, pairs, texts,
                               accelerator)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
