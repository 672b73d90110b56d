"""Training-step and input-pipeline throughput on this machine's CPU.

Measures pairs/second of the real jitted update (`dualjax.train.step.make_train_step`, with
`optimizer.make_optimizer`, `losses.sharded` and the `bow_mlp` dual encoder of
configs/default.py, resized) on random token ids, once per device count. Each device
count runs in its own subprocess, because the number of fake CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`) must be set before jax is
imported; the parent prints a combined table and the N-device / 1-device ratios.

Input cost is excluded from the step timing: the random batches are placed on the mesh
with `sharding.put_global_batch` before the clock starts. `--input` measures the input
pipeline (grain over the synthetic TFDS dataset, word tokenizer) separately, so the
two can be compared.

    python scripts/bench/bench_train.py                 # 1 and 8 devices, batch 1024 x 32
    python scripts/bench/bench_train.py --input --json bench.json
    python scripts/bench/bench_train.py --devices=8 --param-sharding=replicated,fsdp
    python scripts/bench/bench_train.py --vs-torch      # dualjax vs PyTorch, alternating

`--vs-torch` (needs `pip install -e .[bench]`, which pins torch) times, instead of the
device-count table, dualjax's step and PyTorch steps of the same work on one CPU device
(torch with `--torch-threads` threads), every side a subprocess in turn, `--rounds` times
per workload, and prints the medians and the ratios. The workloads (`--workloads`, see
COMPARE_WORKLOADS): "A" two separate bow_mlp towers (each its own vocab x dim table) at
`--batch` x `--seq-len`, run by dualjax with dense Adam and with table_updates=lazy, and
by PyTorch three ways (TORCH_FORMS: nn.Embedding + Adam as a user first writes it,
EmbeddingBag + fused Adam, EmbeddingBag(sparse) + SparseAdam: its fast paths); "B-2x128"
and "B-4x256" two separate Transformer towers (pre-LN, GELU MLP of 4x width, 4 heads,
[CLS] pooling) at `--transformer-batch` x `--seq-len`; "MiniLM" one BERT tower at
all-MiniLM-L6-v2's sizes for queries and documents (dualjax's `bert` tower against
`transformers`' BertModel, mean pooling, no dropout, random weights) at batch 64 x
`--seq-len`. PyTorch's Transformer sides use Adam(fused=True). Every side: in-batch
softmax over alpha * cos + beta (alpha, beta learned, 10 and 0 at init), Adam at a
constant learning rate of 3e-3. Ratios compare like with like: dense Adam with the faster
dense PyTorch form, the lazy update with SparseAdam. Both sides' workers run with the
malloc setting dualjax makes on import (docs/training.md); `--malloc-ablation` adds
dualjax's dense side without it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common.py
from common import MINILM_SIZES as MINILM  # noqa: E402
from common import REPO, cpu_model, default_config  # noqa: E402,F401


# ----------------------------------------------------------------------------- helpers
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0 <= q <= 100) of `values`."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def minor_faults() -> int:
    """This process's minor page faults so far (a step's, as a difference)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def summarize(times_s: list[float], items_per_step: int) -> dict[str, float]:
    """Median and p10/p90 step time in ms, and items/s at the median step time."""
    median = statistics.median(times_s)
    return {"median_ms": 1e3 * median, "p10_ms": 1e3 * percentile(times_s, 10),
            "p90_ms": 1e3 * percentile(times_s, 90), "per_s": items_per_step / median}


def child_env(devices: int) -> dict[str, str]:
    """This process's environment with exactly `devices` host CPU devices forced."""
    env = dict(os.environ)
    flags = re.sub(rf"{DEVICE_COUNT_FLAG}=\S+", "", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(flags + [f"{DEVICE_COUNT_FLAG}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    return env


# --vs-torch: name -> the tower both sides build (two separate towers per side, each with
# its own vocab x width token table). "A" is issue 13's workload (at --batch); the
# Transformers run at --transformer-batch.
COMPARE_WORKLOADS: dict[str, dict[str, Any]] = {
        "A": {"tower": "bow_mlp"},
        "B-2x128": {"tower": "transformer", "num_layers": 2, "width": 128},
        "B-4x256": {"tower": "transformer", "num_layers": 4, "width": 256},
        "MiniLM": {"tower": "bert", "batch": 64},
}
COMPARE_HEADS = 4  # attention heads of the Transformer workloads (dualjax's default)
COMPARE_LR = 3e-3  # constant Adam learning rate on both sides (configs/default.py's peak)


def comparison_config(config, args: argparse.Namespace) -> None:
    """Sets `config` (configs/default.py's) to `--vs-torch` workload `args.workload`: two
    separate towers, in-batch softmax over alpha * cos + beta, plain Adam at a constant rate."""
    w = COMPARE_WORKLOADS[args.workload]
    m = config.model
    m.tower = w["tower"]
    m.shared_towers = False
    m.shared_embedding = False
    m.max_len = args.seq_len
    m.similarity = "cosine_affine"
    if w["tower"] == "bow_mlp":
        m.embed_dim = m.hidden_dim = m.output_dim = args.dim
    elif w["tower"] == "bert":
        m.shared_towers = True
    else:
        t = m.transformer
        t.preset, t.num_layers, t.width = "", w["num_layers"], w["width"]
        t.num_heads, t.mlp_dim, t.pooling = COMPARE_HEADS, 4 * w["width"], "cls"
        m.output_dim = w["width"]
    config.loss.name = "in_batch_softmax"
    config.loss.symmetric = False
    o = config.optimizer
    o.name, o.learning_rate, o.warmup_steps, o.decay = "adam", COMPARE_LR, 0, "constant"
    o.grad_clip_norm = 0.0


# ----------------------------------------------------------------------------- workers
def random_batch(rng, batch: int, seq_len: int, vocab: int) -> dict[str, Any]:
    """Uniform token ids in [1, vocab) with random lengths 1..seq_len, right-padded with 0."""
    import numpy as np

    out = {}
    for side in ("q", "d"):
        lengths = rng.integers(1, seq_len + 1, size=(batch, 1))
        mask = np.arange(seq_len)[None, :] < lengths
        ids = rng.integers(1, vocab, size=(batch, seq_len), dtype=np.int32)
        out[f"{side}_ids"] = np.where(mask, ids, 0).astype(np.int32)
        out[f"{side}_mask"] = mask
    return out


def bench_train_step(args: argparse.Namespace) -> dict[str, Any]:
    """Times the real train step on `args.devices` CPU devices (run in a subprocess), with
    malloc set as training sets it for the tower (dualjax/runtime/malloc.py)."""
    from dualjax.runtime import malloc
    malloc.for_tower(COMPARE_WORKLOADS[args.workload]["tower"] if args.workload else "bow_mlp")
    import jax
    import numpy as np

    from dualjax import losses, objectives
    from dualjax.config import specs
    from dualjax.models import dual_encoder
    from dualjax.objectives.optimizer import make_optimizer
    from dualjax.runtime import sharding
    from dualjax.train import lazy_rows
    from dualjax.train import step as step_lib

    (devices,) = args.devices
    config = default_config()
    config.model.tower = "bow_mlp"
    config.model.max_len = args.seq_len
    config.model.embed_dim = config.model.hidden_dim = config.model.output_dim = args.dim
    config.loss.name = "in_batch_softmax"
    if args.workload:  # --vs-torch
        comparison_config(config, args)
    config.global_batch_size = args.batch
    if args.batch % devices:
        raise SystemExit(f"--batch {args.batch} is not divisible by {devices} devices")

    if jax.device_count() != devices:
        raise SystemExit(f"expected {devices} CPU devices, jax sees {jax.device_count()} "
                         f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
    mesh = sharding.make_mesh(devices)
    bert = None
    if args.workload and COMPARE_WORKLOADS[args.workload]["tower"] == "bert":
        from dualjax.models.bert import BertConfig
        bert = BertConfig(**MINILM)
    model = dual_encoder.make_model(specs.model_spec(config.model), args.vocab, architecture=bert)
    # Schedule long enough that warmup/decay never reach zero during the benchmark.
    tx, schedule = make_optimizer(specs.optimizer_spec(config.optimizer),
                                  100 * (args.steps + args.warmup))

    objective = objectives.in_batch.objective(
        model, losses.sharded(config.loss.name, mesh), args.seq_len)
    init_state = step_lib.make_init_state(objective, tx)
    replicated = sharding.replicated(mesh)
    state_sharding = sharding.state_shardings(
        jax.eval_shape(init_state, 0), mesh, args.param_sharding[0],
        dual_encoder.logical_axes(model, args.seq_len))
    state = jax.jit(init_state, static_argnums=0, out_shardings=state_sharding)(0)
    step_fn = step_lib.make_train_step(objective, tx, schedule, state_sharding,
                                       sharding.batch_sharding(mesh), replicated,
                                       table_updates=args.table_updates)
    num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    device_bytes = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state))

    # A few distinct batches, placed on the mesh before any timing. With lazy updates the
    # host lists each table's rows as the training loop does (lazy_rows.BatchRows), and that
    # listing (with placing the batch) is inside each timed step; the lists' lengths are
    # set on every batch first, so no timed step compiles.
    rng = np.random.default_rng(0)
    batches = [random_batch(rng, args.batch, args.seq_len, args.vocab) for _ in range(4)]
    if args.table_updates == "lazy":
        host_rows = lazy_rows.BatchRows(objective.tables(state["params"]), state["params"])
        for b in batches:
            host_rows(b)
        place = lambda b: sharding.put_global_batch(host_rows(b), mesh)  # noqa: E731
    else:
        batches = [sharding.put_global_batch(b, mesh) for b in batches]
        jax.block_until_ready(batches)
        place = lambda b: b  # noqa: E731 (already placed)

    t0 = time.perf_counter()
    state, metrics = step_fn(state, place(batches[0]), norms=False)
    jax.block_until_ready((state, metrics))
    first_step_s = time.perf_counter() - t0  # compile + one step
    for i in range(1, args.warmup):
        state, metrics = step_fn(state, place(batches[i % len(batches)]), norms=False)
        jax.block_until_ready((state, metrics))

    times, faults = [], minor_faults()
    for i in range(args.steps):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        state, metrics = step_fn(state, place(batch), norms=False)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    faults = (minor_faults() - faults) / args.steps
    loss = float(metrics["loss"])
    if not np.isfinite(loss):
        raise SystemExit(f"non-finite loss {loss} on {devices} devices")

    return {"kind": "train", "framework": "dualjax", "workload": args.workload,
            "devices": devices, "param_sharding": args.param_sharding[0],
            "table_updates": args.table_updates,
            "state_mb_per_device": device_bytes / 2**20, "jax_devices": jax.device_count(),
            "jax_version": jax.__version__, "backend": jax.default_backend(),
            "num_params": int(num_params), "state_mb": state_bytes / 2**20,
            "first_step_s": first_step_s, "last_loss": loss, "step_times_s": times,
            "page_faults_per_step": faults,
            **summarize(times, args.batch)}


# --vs-torch, workload A: PyTorch written three ways (the last two are its fast paths).
TORCH_FORMS = {
    "embedding": "nn.Embedding + masked mean, torch.optim.Adam (defaults)",
    "bag": "nn.EmbeddingBag(mode='mean'), Adam(fused=True): dense Adam at its fastest",
    "bag_sparse": "nn.EmbeddingBag(mode='mean', sparse=True), SparseAdam for the tables, "
                  "Adam(fused=True) for the rest: lazy Adam, as table_updates=lazy",
}


def torch_dual_encoder(workload: str, vocab: int, dim: int, form: str = "embedding"):
    """The PyTorch model of `--vs-torch` workload `workload`, written as a user would: two
    towers (each its own nn.Embedding), F.normalize, and a learned alpha, beta; calling it
    on a batch gives the in-batch softmax loss (F.cross_entropy over alpha * q @ d.T + beta).

    "A": nn.Embedding -> masked mean -> Linear -> tanh -> Linear -> tanh, as dualjax's
    BowMlpTower; with form "bag" / "bag_sparse" the table and the mean are one
    nn.EmbeddingBag(mode="mean") over the real tokens (flat ids and offsets; sparse
    gradients for "bag_sparse"). "B-*": token + learned position (512 rows) embeddings, a
    learned [CLS] vector prepended, nn.TransformerEncoder (pre-LN, GELU MLP of 4x width, no
    dropout, padding keys masked) with a final LayerNorm, Linear on the [CLS] state, as
    dualjax's TransformerTower.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class BowMlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = (nn.Embedding(vocab, dim) if form == "embedding" else
                          nn.EmbeddingBag(vocab, dim, mode="mean",
                                          sparse=form == "bag_sparse"))
            self.hidden = nn.Linear(dim, dim)
            self.output = nn.Linear(dim, dim)

        def forward(self, ids, mask):  # bag forms: (flat ids of real tokens, offsets)
            if form == "embedding":
                m = mask.unsqueeze(-1).to(torch.float32)
                x = (self.embed(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
            else:
                x = self.embed(ids, mask)
            return torch.tanh(self.output(torch.tanh(self.hidden(x))))

    class Transformer(nn.Module):
        def __init__(self, num_layers: int, width: int, max_positions: int = 512):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(0.02 * torch.randn(max_positions, width))
            self.cls = nn.Parameter(0.02 * torch.randn(width))
            layer = nn.TransformerEncoderLayer(
                width, COMPARE_HEADS, 4 * width, dropout=0.0,
                activation=nn.GELU(approximate="tanh"),  # flax's nn.gelu default
                layer_norm_eps=1e-6, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers,
                                                 norm=nn.LayerNorm(width, eps=1e-6),
                                                 enable_nested_tensor=False)
            self.output = nn.Linear(width, width)

        def forward(self, ids, mask):
            b, n = ids.shape
            x = self.embed(ids) + self.pos[:n]
            x = torch.cat([self.cls.expand(b, 1, -1), x], dim=1)
            keys = torch.cat([mask.new_ones(b, 1), mask], dim=1)
            x = self.encoder(x, src_key_padding_mask=~keys)
            return self.output(x[:, 0])

    w = COMPARE_WORKLOADS[workload]

    class MiniLM(nn.Module):  # transformers' BertModel at MINILM's sizes, mean-pooled
        def __init__(self):
            super().__init__()
            from transformers import BertConfig, BertModel
            c = MINILM
            self.bert = BertModel(BertConfig(
                vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                num_hidden_layers=c["num_layers"], num_attention_heads=c["num_heads"],
                intermediate_size=c["intermediate_size"],
                max_position_embeddings=c["max_positions"], hidden_act="gelu",
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                add_pooling_layer=False)

        def forward(self, ids, mask):
            x = self.bert(input_ids=ids, attention_mask=mask.long()).last_hidden_state
            m = mask.unsqueeze(-1).to(x.dtype)
            return (x * m).sum(1) / m.sum(1).clamp(min=1.0)

    def tower():
        if w["tower"] == "bert":
            return MiniLM()
        return BowMlp() if w["tower"] == "bow_mlp" else Transformer(w["num_layers"], w["width"])

    class DualEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.query_tower = tower()
            self.doc_tower = self.query_tower if w["tower"] == "bert" else tower()
            self.alpha = nn.Parameter(torch.tensor(10.0))
            self.beta = nn.Parameter(torch.tensor(0.0))

        def forward(self, q_ids, q_mask, d_ids, d_mask):
            q = F.normalize(self.query_tower(q_ids, q_mask), dim=-1)
            d = F.normalize(self.doc_tower(d_ids, d_mask), dim=-1)
            logits = self.alpha * (q @ d.T) + self.beta
            return F.cross_entropy(logits, torch.arange(q.shape[0]))

    return DualEncoder()


def bench_torch_step(args: argparse.Namespace) -> dict[str, Any]:
    """Times the PyTorch step of `--vs-torch` workload `args.workload` (run in a
    subprocess): zero_grad, forward, backward, Adam step, on `--torch-threads` threads.
    PyTorch's CPU tensors come from the same malloc, set as dualjax's training sets it for
    the workload's tower (docs/training.md, "Memory on Linux"): where dualjax's steps are
    spared the page faults, so are PyTorch's."""
    from dualjax.runtime import malloc
    malloc.for_tower(COMPARE_WORKLOADS[args.workload]["tower"])  # before torch allocates
    import numpy as np
    import torch

    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(0)
    form = args.torch_form
    model = torch_dual_encoder(args.workload, args.vocab, args.dim, form)
    model.train()
    if COMPARE_WORKLOADS[args.workload]["tower"] != "bow_mlp":  # its fastest Adam
        opts = [torch.optim.Adam(model.parameters(), lr=COMPARE_LR, fused=True)]
    elif form == "embedding":
        opts = [torch.optim.Adam(model.parameters(), lr=COMPARE_LR)]
    elif form == "bag":
        opts = [torch.optim.Adam(model.parameters(), lr=COMPARE_LR, fused=True)]
    else:
        tables = [p for n, p in model.named_parameters() if n.endswith("embed.weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("embed.weight")]
        opts = [torch.optim.SparseAdam(tables, lr=COMPARE_LR),
                torch.optim.Adam(rest, lr=COMPARE_LR, fused=True)]
    num_params = sum(p.numel() for p in model.parameters())

    def side(ids, mask):  # the bag forms read the real tokens, flat, and their offsets
        if form == "embedding":
            return torch.from_numpy(ids).long(), torch.from_numpy(mask)
        lengths = mask.sum(1)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return torch.from_numpy(ids[mask]).long(), torch.from_numpy(offsets).long()

    rng = np.random.default_rng(0)  # the same batches as the dualjax worker
    batches = []
    for _ in range(4):
        b = random_batch(rng, args.batch, args.seq_len, args.vocab)
        batches.append((*side(b["q_ids"], b["q_mask"]), *side(b["d_ids"], b["d_mask"])))

    def step(batch):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss = model(*batch)
        loss.backward()
        for opt in opts:
            opt.step()
        return loss

    t0 = time.perf_counter()
    loss = step(batches[0])
    first_step_s = time.perf_counter() - t0
    for i in range(1, args.warmup):
        loss = step(batches[i % len(batches)])
    times, faults = [], minor_faults()
    for i in range(args.steps):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = step(batch)
        times.append(time.perf_counter() - t0)
    faults = (minor_faults() - faults) / args.steps
    loss = float(loss.detach())
    if not np.isfinite(loss):
        raise SystemExit(f"non-finite torch loss {loss}")
    return {"kind": "train", "framework": "pytorch", "torch_form": form,
            "workload": args.workload, "devices": 1,
            "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "num_params": int(num_params), "first_step_s": first_step_s, "last_loss": loss,
            "step_times_s": times, "page_faults_per_step": faults,
            **summarize(times, args.batch)}


def bench_input(args: argparse.Namespace) -> dict[str, Any]:
    """Times `pipeline.train_iterator` over the synthetic dataset (run in a subprocess)."""
    from dualjax.config import specs
    from dualjax.data import builders, pipeline
    from dualjax.text import sides
    from dualjax.text import words as text

    config = default_config()
    with tempfile.TemporaryDirectory(prefix="bench_tfds_") as tfds_dir:
        t0 = time.perf_counter()
        source = builders.train_source(specs.dataset_spec(config.data, config.seed), tfds_dir)
        prepare_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        records = (source[i] for i in range(len(source)))
        tok = text.build_word_tokenizer(
            (r[k].decode("utf-8") for r in records for k in ("query", "document")),
            config.model.vocab_size, config.model.num_oov_buckets)
        tokenizer_s = time.perf_counter() - t0
        side = sides.Side(tok, args.seq_len)
        modes = {}
        for pretokenize in (False, True):  # each record encoded per batch / once up front
            t0 = time.perf_counter()
            it = pipeline.train_iterator(source, sides.Inputs(side, side), args.batch,
                                         config.seed, config.data.worker_count,
                                         prefetch_batches=args.prefetch_batches,
                                         pretokenize=pretokenize)
            setup_s = time.perf_counter() - t0
            for _ in range(args.warmup):
                next(it)
            # `prefetch_batches` threads build batches ahead, so single next() calls come
            # in bursts; the sustained rate is batches / total time.
            t0 = time.perf_counter()
            for _ in range(args.input_batches):
                batch = next(it)
            modes[pretokenize] = (setup_s, time.perf_counter() - t0)
        pretokenize_s, total_s = modes[True]
        per_batch_total_s = modes[False][1]
        shape = list(batch["q_ids"].shape)
        mean_tokens = float(batch["q_mask"].sum(1).mean() + batch["d_mask"].sum(1).mean()) / 2
        num_pairs = len(source)
    import jax

    return {"kind": "input", "jax_version": jax.__version__, "num_pairs": num_pairs,
            "vocab_size": tok.vocab_size, "worker_count": config.data.worker_count,
            "prefetch_batches": args.prefetch_batches,
            "batch_shape": shape, "mean_tokens_per_text": mean_tokens, "prepare_s": prepare_s,
            "tokenizer_s": tokenizer_s, "num_batches": args.input_batches, "total_s": total_s,
            "pretokenize_s": pretokenize_s,
            "per_batch_encoding_per_s": args.input_batches * args.batch / per_batch_total_s,
            "ms_per_batch": 1e3 * total_s / args.input_batches,
            "batches_per_s": args.input_batches / total_s,
            "per_s": args.input_batches * args.batch / total_s}


# ----------------------------------------------------------------------------- parent
def run_worker(args: argparse.Namespace, worker: str, devices: int,
               param_sharding: str = "replicated", workload: str = "",
               batch: int | None = None, steps: int | None = None,
               table_updates: str | None = None, torch_form: str = "embedding",
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Re-invokes this script as `--worker WORKER --devices N` and returns its result
    (`workload`, `batch`, `steps`: a `--vs-torch` measurement)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    batch = args.batch if batch is None else batch
    steps = args.steps if steps is None else steps
    vocab = (MINILM["vocab_size"] if workload and COMPARE_WORKLOADS[workload]["tower"] == "bert"
             else args.vocab)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker,
           "--devices", str(devices), "--batch", str(batch), "--seq-len", str(args.seq_len),
           "--vocab", str(vocab), "--dim", str(args.dim), "--steps", str(steps),
           "--warmup", str(args.warmup), "--input-batches", str(args.input_batches),
           "--prefetch-batches", str(args.prefetch_batches), "--param-sharding",
           param_sharding, "--workload", workload, "--torch-threads", str(args.torch_threads),
           "--table-updates", table_updates or args.table_updates,
           "--torch-form", torch_form, "--out", out]
    what = f"workload {workload}, batch {batch}" if workload else f"{param_sharding} state"
    print(f"# running {worker} on {devices} device(s), {what} ...", file=sys.stderr, flush=True)
    try:
        subprocess.run(cmd, env={**child_env(devices), **(env or {})}, check=True)
        with open(out, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(out)


def print_report(args: argparse.Namespace, train_results: list[dict], input_result: dict | None
                 ) -> None:
    """The machine, the per-device-count table, the ratios and the input figure."""
    jax_version = next((r["jax_version"] for r in train_results + [input_result or {}]
                        if "jax_version" in r), "?")
    print(f"\nMachine: {cpu_model()}; os.cpu_count()={os.cpu_count()}; "
          f"python {platform.python_version()}; jax {jax_version} (CPU backend)")
    print(f"Workload: bow_mlp shared tower, in-batch softmax, adamw; global batch {args.batch} "
          f"pairs, {args.seq_len} tokens per text, vocab {args.vocab} rows, "
          f"embed=hidden=output dim {args.dim}; {args.warmup} warm-up + {args.steps} timed "
          "steps; input pre-placed on the mesh (excluded).")
    if train_results:
        r0 = train_results[0]
        print(f"Params: {r0['num_params']:,}; train state {r0['state_mb']:.0f} MiB\n")
        header = (f"{'devices':>7} | {'state':>10} | {'MiB/device':>10} | {'median ms':>9} | "
                  f"{'p10 ms':>8} | {'p90 ms':>8} | {'pairs/s':>8} | {'compile+1st s':>13} | "
                  f"{'loss':>6}")
        print(header)
        print("-" * len(header))
        for r in train_results:
            print(f"{r['devices']:>7} | {r['param_sharding']:>10} | "
                  f"{r['state_mb_per_device']:>10.0f} | {r['median_ms']:>9.1f} | "
                  f"{r['p10_ms']:>8.1f} | {r['p90_ms']:>8.1f} | {r['per_s']:>8.0f} | "
                  f"{r['first_step_s']:>13.2f} | {r['last_loss']:>6.3f}")
        base = train_results[0]
        for r in train_results[1:]:
            print(f"\nRatio {r['devices']}-device {r['param_sharding']} / {base['devices']}-device "
                  f"{base['param_sharding']} (same run): "
                  f"pairs/s x{r['per_s'] / base['per_s']:.2f}, "
                  f"median step time x{r['median_ms'] / base['median_ms']:.2f}")
    if input_result:
        r = input_result
        print(f"\nInput pipeline (grain, worker_count={r['worker_count']}, "
              f"{r['prefetch_batches']} batches built ahead by as many threads, "
              f"{r['num_pairs']:,} synthetic pairs, word tokenizer of {r['vocab_size']:,} ids, "
              f"batches {r['batch_shape'][0]} x {r['batch_shape'][1]}, "
              f"{r['mean_tokens_per_text']:.1f} real tokens per text):")
        print(f"  {r['num_batches']} batches in {r['total_s']:.2f} s = {r['ms_per_batch']:.1f} "
              f"ms/batch: {r['batches_per_s']:.2f} batches/s, "
              f"{r['per_s']:.0f} pairs/s, pairs encoded once up front "
              f"({r['pretokenize_s']:.1f} s for {r['num_pairs']:,} pairs; TFDS prepare "
              f"{r['prepare_s']:.1f} s, tokenizer build {r['tokenizer_s']:.1f} s, not included)")
        print(f"  each batch's records read and encoded per batch instead (as before): "
              f"{r['per_batch_encoding_per_s']:.0f} pairs/s")
        for t in train_results:
            side = "input" if r["per_s"] < t["per_s"] else "compute"
            print(f"  vs train step on {t['devices']} device(s): {t['per_s']:.0f} pairs/s -> "
                  f"{side} is the bottleneck (input/compute = {r['per_s'] / t['per_s']:.2f})")


# --vs-torch sides: (name, worker, run_worker options). The bag-of-words workload also
# runs dualjax's lazy update and PyTorch's two fast paths; the Transformers one each.
BOW_SIDES = (("dualjax", "train", {"table_updates": "dense"}),
             ("dualjax_lazy", "train", {"table_updates": "lazy"}),
             ("pytorch", "torch", {"torch_form": "embedding"}),
             ("pytorch_bag", "torch", {"torch_form": "bag"}),
             ("pytorch_sparse", "torch", {"torch_form": "bag_sparse"}))
TRANSFORMER_SIDES = (("dualjax", "train", {}), ("pytorch", "torch", {}))
# --malloc-ablation: dualjax's dense side again with glibc's malloc left as it is.
MALLOC_SIDE = ("dualjax_malloc_default", "train", {"env": {"DUALJAX_MALLOC": "default"}})


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """`--vs-torch`: per workload, `--rounds` rounds of every side's subprocess in turn;
    each side's step times pooled over its rounds. Ratios (pairs/s) against PyTorch at its
    best with the same semantics: dense Adam against the faster of nn.Embedding + Adam and
    EmbeddingBag + fused Adam; dualjax's lazy update against EmbeddingBag + SparseAdam."""
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    workloads, versions = {}, {}
    for name in args.workloads:
        transformer = COMPARE_WORKLOADS[name]["tower"] != "bow_mlp"
        batch = COMPARE_WORKLOADS[name].get(
            "batch", args.transformer_batch if transformer else args.batch)
        steps = args.transformer_steps if transformer else args.steps
        sides_spec = (TRANSFORMER_SIDES if transformer else BOW_SIDES) + (
            (MALLOC_SIDE,) if args.malloc_ablation else ())
        runs: dict[str, list[dict]] = {side: [] for side, _, _ in sides_spec}
        for _ in range(args.rounds):
            for side, worker, options in sides_spec:
                runs[side].append(run_worker(args, worker, 1, workload=name, batch=batch,
                                             steps=steps, **options))
        sides = {}
        for side, rs in runs.items():
            times = [t for r in rs for t in r["step_times_s"]]
            sides[side] = {**summarize(times, batch),
                           "round_median_ms": [r["median_ms"] for r in rs],
                           "num_params": rs[0]["num_params"],
                           "first_step_s": [r["first_step_s"] for r in rs],
                           "last_loss": [r["last_loss"] for r in rs],
                           "page_faults_per_step": [r.get("page_faults_per_step")
                                                    for r in rs]}
            versions.update({k: rs[0][k] for k in ("jax_version", "torch_version",
                                                   "torch_threads") if k in rs[0]})
        rate = lambda side, sides=sides: sides[side]["per_s"]
        ratios = {"dense": rate("dualjax") / max(rate(s) for s in sides if s in
                                                  ("pytorch", "pytorch_bag"))}
        if not transformer:
            ratios["lazy"] = rate("dualjax_lazy") / rate("pytorch_sparse")
            ratios["lazy_vs_dense"] = rate("dualjax_lazy") / rate("dualjax")
        if args.malloc_ablation:
            ratios["malloc"] = rate("dualjax") / rate(MALLOC_SIDE[0])
        workloads[name] = {"batch": batch, "steps": steps, "runs": runs, **sides,
                           "sides": list(runs), "ratios": ratios}
    return {"load_before": load_before, "load_after": os.getloadavg(),
            "wall_s": time.perf_counter() - t_start, "workloads": workloads,
            "versions": {"jax": versions.get("jax_version"),
                         "torch": versions.get("torch_version"),
                         "torch_threads": versions.get("torch_threads")}}


def print_comparison(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The machine, the load, and one table row per workload and side, with the ratios."""
    v = result["versions"]
    print(f"\nMachine: {cpu_model()}; os.cpu_count()={os.cpu_count()}; "
          f"python {platform.python_version()}; jax {v['jax']} (CPU backend, 1 device); "
          f"torch {v['torch']} ({v['torch_threads']} threads)")
    fmt = lambda la: ", ".join(f"{x:.2f}" for x in la)
    print(f"Load average (1, 5, 15 min): before {fmt(result['load_before'])}; after "
          f"{fmt(result['load_after'])}; comparison took {result['wall_s'] / 60:.1f} min")
    print(f"Every side: two separate towers, in-batch softmax over alpha*cos+beta (learned), "
          f"Adam lr {COMPARE_LR} (constant); {args.seq_len} tokens per text, random lengths; "
          f"vocab {args.vocab} rows per tower; {args.rounds} rounds, the sides in turn; each "
          f"run {args.warmup} warm-up + the timed steps; medians over every timed step.")
    print("dualjax_lazy: optimizer.table_updates=lazy. PyTorch forms: "
          + "; ".join(f"{k}: {v}" for k, v in TORCH_FORMS.items()) + "\n")
    header = (f"{'workload':>8} | {'side':>22} | {'batch':>5} | {'params':>10} | "
              f"{'median ms':>9} | {'p10 ms':>8} | {'p90 ms':>8} | {'pairs/s':>8} | "
              f"{'round medians ms':>22} | {'faults/step':>11}")
    print(header)
    print("-" * len(header))
    for name, w in result["workloads"].items():
        for side in w["sides"]:
            r = w[side]
            rounds = ", ".join(f"{x:.0f}" for x in r["round_median_ms"])
            faults = [x for x in r.get("page_faults_per_step", []) if x is not None]
            faults = f"{statistics.median(faults):,.0f}" if faults else "-"
            print(f"{name:>8} | {side:>22} | {w['batch']:>5} | {r['num_params']:>10,} | "
                  f"{r['median_ms']:>9.1f} | {r['p10_ms']:>8.1f} | {r['p90_ms']:>8.1f} | "
                  f"{r['per_s']:>8.0f} | {rounds:>22} | {faults:>11}")
    for name, w in result["workloads"].items():
        ratios = ", ".join(f"{k} x{x:.2f}" for k, x in w["ratios"].items())
        losses = "; ".join(f"{side} " + ", ".join(f"{x:.3f}" for x in w[side]["last_loss"])
                           for side in w["sides"])
        print(f"{name}: {ratios}. {w['steps']} timed steps per run; last loss per round: "
              f"{losses}")
    print("dense: dualjax / the faster PyTorch dense-Adam form; lazy: dualjax_lazy / "
          "pytorch_sparse; lazy_vs_dense: dualjax_lazy / dualjax; malloc: dualjax / "
          "dualjax_malloc_default (pairs/s at the median). faults/step: minor page faults "
          "per timed step, median over the rounds.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=1024, help="global batch (pairs per step)")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per text (max_len)")
    p.add_argument("--vocab", type=int, default=50_000, help="embedding rows (token id range)")
    p.add_argument("--dim", type=int, default=256, help="embed_dim = hidden_dim = output_dim")
    p.add_argument("--steps", type=int, default=20, help="timed steps (and timed input batches)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed blocking steps first (the first one compiles)")
    p.add_argument("--input-batches", type=int, default=60,
                   help="--input: consecutive batches timed as a whole (after --warmup)")
    p.add_argument("--devices", default="1,8",
                   help="comma-separated fake CPU device counts, one subprocess each "
                        "('' with --input: input pipeline only)")
    p.add_argument("--input", action="store_true",
                   help="also measure the input pipeline (grain + tokenizer) throughput")
    p.add_argument("--prefetch-batches", type=int, default=4,
                   help="--input: batches built ahead, by as many threads "
                        "(config.data.prefetch_batches)")
    p.add_argument("--param-sharding", default="replicated",
                   help="comma-separated train-state shardings (mesh.param_sharding), each "
                        "measured on every device count")
    p.add_argument("--table-updates", default="dense", choices=("dense", "lazy"),
                   help="dualjax's optimizer.table_updates (lazy: only the rows a batch reads)")
    p.add_argument("--json", help="write all results to this path")
    p.add_argument("--vs-torch", action="store_true",
                   help="instead of the device-count table: dualjax vs a PyTorch step of the "
                        "same work, alternating (needs torch: pip install -e .[bench])")
    p.add_argument("--workloads", default=",".join(COMPARE_WORKLOADS),
                   help="--vs-torch: comma-separated workloads, of: "
                        + ", ".join(COMPARE_WORKLOADS))
    p.add_argument("--rounds", type=int, default=3,
                   help="--vs-torch: rounds of (dualjax, pytorch) per workload")
    p.add_argument("--torch-threads", type=int, default=2,
                   help="--vs-torch: torch.set_num_threads")
    p.add_argument("--transformer-batch", type=int, default=256,
                   help="--vs-torch: global batch of the Transformer workloads")
    p.add_argument("--transformer-steps", type=int, default=6,
                   help="--vs-torch: timed steps per run of the Transformer workloads")
    p.add_argument("--malloc-ablation", action="store_true",
                   help="--vs-torch: also run dualjax's dense side with DUALJAX_MALLOC=default "
                        "(glibc's malloc as it is; docs/training.md)")
    p.add_argument("--worker", choices=("train", "input", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--workload", default="", help=argparse.SUPPRESS)
    p.add_argument("--torch-form", default="embedding", choices=tuple(TORCH_FORMS),
                   help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.devices = [int(d) for d in args.devices.split(",") if d.strip()]
    args.param_sharding = [s.strip() for s in args.param_sharding.split(",") if s.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if min(args.steps, args.warmup, args.input_batches) < 1:
        p.error("--steps, --warmup and --input-batches must be >= 1")
    if not args.devices and not args.input and not args.vs_torch:
        p.error("nothing to do: give --devices and/or --input")
    if args.vs_torch:
        unknown = sorted(set(args.workloads) - set(COMPARE_WORKLOADS))
        if unknown or not args.workloads:
            p.error(f"--workloads: unknown {unknown}; choose from {', '.join(COMPARE_WORKLOADS)}")
        if min(args.rounds, args.torch_threads, args.transformer_batch,
               args.transformer_steps) < 1:
            p.error("--rounds, --torch-threads, --transformer-batch and --transformer-steps "
                    "must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:  # a subprocess: one measurement, written to --out
        workers = {"train": bench_train_step, "input": bench_input, "torch": bench_torch_step}
        result = workers[args.worker](args)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return

    if args.vs_torch:
        train_results, input_result = [], None
        comparison = run_comparison(args)
        print_comparison(args, comparison)
    else:
        comparison = None
        train_results = [run_worker(args, "train", n, strategy)
                         for strategy in args.param_sharding for n in args.devices]
        input_result = run_worker(args, "input", 1) if args.input else None
        print_report(args, train_results, input_result)
    if args.json:
        payload = {"args": {k: v for k, v in vars(args).items()
                            if k not in ("worker", "workload", "out")},
                   "machine": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                               "python": platform.python_version()},
                   "train": train_results, "input": input_result, "vs_torch": comparison}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        print(f"\nWrote {args.json}")


if __name__ == "__main__":
    main()
