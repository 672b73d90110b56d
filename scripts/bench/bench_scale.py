"""Step time and peak memory of the sharded in-batch softmax, plain vs blockwise.

On 8 fake CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`, set before
jax is imported), times the jitted loss + gradient w.r.t. q and d
(`losses.sharded("in_batch_softmax", mesh, column_block)`) on random unit embeddings
[B, dim] for each global batch B, with all columns at once (plain: each device holds
[B/8, B] scores) and streamed in blocks (`--block` columns: [B/8, block]). Each
configuration runs in a fresh subprocess, so its peak resident memory
(`resource.getrusage(...).ru_maxrss`) is its own; one whose estimated memory exceeds
`--max-gb` is skipped. The parent prints a markdown table.

    python scripts/bench/bench_scale.py                                  # 8k to 128k
    python scripts/bench/bench_scale.py --batches 8192,32768 --steps 2

`--towers` measures cached tower gradients instead (`config.train.encode_chunks`, GradCache):
one full train step (`step_lib.make_train_step`: the objective's loss and gradient, then
AdamW) of a transformer dual encoder (`--layers` x `--width`, texts of `--max-len`
tokens, in_batch_softmax) at global batch `--tower-batch`, for each chunk count K of
`--chunks` (1: off), each in a fresh subprocess: step time, peak RSS, and XLA's
temporary buffers per device (`memory_analysis().temp_size_in_bytes`).

    python scripts/bench/bench_scale.py --towers                         # 1,024; K = 1, 4, 8

`--bert-memory=K:column_block,...` prints XLA's memory plan per device (temporary buffers,
arguments, outputs) of one train step of a BERT-base-sized `bert` tower at global batch
`--tower-batch` of `--max-len` tokens, compiled from abstract values (nothing run):

    python scripts/bench/bench_scale.py --bert-memory=16:1024 --tower-batch=8192 --max-len=256

`--tp-memory=SHAPE:M,...` does the same for BERT-base and BERT-large shapes on a mesh of
(8 / M) data x M model devices (`mesh.model_axis`, tensor parallelism): the bytes of
parameters and Adam moments each device holds, and XLA's temporary buffers:

    python scripts/bench/bench_scale.py --tp-memory=base:1,base:2,base:4,large:1,large:2,large:4 \
        --tower-batch=512 --max-len=128 --chunks=8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

DEVICES = 8
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))  # common.py
import common  # noqa: E402

BASE_GB = 0.3     # the process with jax imported and the embeddings placed
LIVE_SCORES = 3   # [rows, columns] f32 buffers alive at once (plain at 8,192: ~2.1)


def estimate_gb(batch: int, width: int, dim: int) -> float:
    """Rough peak memory of one configuration: the score buffers of all 8 devices
    (batch rows x `width` columns each, a few alive at once) plus embeddings and base."""
    return BASE_GB + (LIVE_SCORES * batch * width + 8 * batch * dim) * 4 / 2**30


def child(batch: int, block: int, dim: int, steps: int) -> dict:
    """Runs one configuration in this process; returns its figures."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp

    sys.path.insert(0, REPO)
    from dualjax import losses
    from dualjax.runtime import sharding

    mesh = sharding.make_mesh(DEVICES)
    shard = sharding.batch_sharding(mesh)

    @jax.jit
    def embeddings(key):
        x = jax.random.normal(key, (2, batch, dim), jnp.float32)
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        return jax.lax.with_sharding_constraint(x[0], shard), jax.lax.with_sharding_constraint(
            x[1], shard)

    q, d = embeddings(jax.random.key(0))
    loss = losses.sharded("in_batch_softmax", mesh, column_block=block)
    scale, bias = jnp.float32(20.0), jnp.float32(0.0)
    step = jax.jit(jax.value_and_grad(lambda q, d: loss(q, d, scale, bias)[0], argnums=(0, 1)))
    timed = time_compiled(step, (q, d), steps, carry=False)
    return {"batch": batch, "block": block, "loss": float(timed.pop("out")[0]), **timed}


def time_compiled(fn, args: tuple, steps: int, carry: bool) -> dict:
    """Compiles jitted `fn` for `args`, runs it once to warm up and `steps` more times
    (with `carry`, each run's first output replaces the first argument, as a train state),
    and returns {"compile_s", "step_s" (median), "temp_mb" (XLA's temp buffers per
    device), "base_gb", "peak_gb" (this process's resident memory before compiling and
    at the end), "out" (the last outputs)}."""
    import resource

    import jax

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    times, out = [], None
    for _ in range(steps + 1):  # the first run warms up
        start = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        if carry:
            args = (out[0], *args[1:])
    return {"compile_s": compile_s, "step_s": statistics.median(times[1:]),
            "temp_mb": analysis.temp_size_in_bytes / 2**20 if analysis else float("nan"),
            "base_gb": base_kb / 2**20,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "out": out}


def towers_child(batch: int, chunks: int, layers: int, width: int, max_len: int,
                 steps: int, block: int = 0) -> dict:
    """One train step of a transformer dual encoder with encode_chunks=`chunks` and the
    loss's column_block=`block`, in this process; returns its figures."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import runpy

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    sys.path.insert(0, REPO)
    from dualjax import losses
    from dualjax.config import specs
    from dualjax.models import dual_encoder
    from dualjax.objectives import in_batch as objective_lib
    from dualjax.runtime import sharding
    from dualjax.train import step as step_lib

    cfg = runpy.run_path(os.path.join(REPO, "configs", "default.py"))["get_config"]().model
    cfg.tower, cfg.max_len = "transformer", max_len
    t = cfg.transformer
    t.num_layers, t.width, t.num_heads, t.mlp_dim = layers, width, max(1, width // 32), 4 * width
    vocab = 8000
    mesh = sharding.make_mesh(DEVICES)
    model = dual_encoder.make_model(specs.model_spec(cfg), vocab)
    objective = objective_lib.objective(
        model, losses.sharded("in_batch_softmax", mesh, column_block=block), max_len,
        encode_chunks=chunks)
    tx = optax.adamw(1e-3)
    replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    params = objective.init(jax.random.key(0))
    state = jax.device_put({"params": params, "opt_state": tx.init(params),
                            "step": jnp.int32(0), "rng": jax.random.key(1)}, replicated)
    rng = np.random.default_rng(0)
    data = {"doc_ids": np.arange(batch, dtype=np.int32)}
    for side in ("q", "d"):
        data[f"{side}_ids"] = rng.integers(1, vocab, (batch, max_len)).astype(np.int32)
        data[f"{side}_mask"] = np.arange(max_len) < rng.integers(max_len // 2, max_len + 1,
                                                                  (batch, 1))
    data = sharding.put_global_batch(data, mesh)
    step = step_lib.make_train_step(objective, tx, lambda s: 1e-3, replicated, batch_sharding,
                                    replicated)
    timed = time_compiled(step.jitted, (state, data, np.bool_(False)), steps, carry=True)
    return {"batch": batch, "chunks": chunks, "block": block,
            "loss": float(timed.pop("out")[1]["loss"]), **timed}


def towers_table(rows: list[dict], layers: int, width: int, max_len: int) -> str:
    """The --towers results as a markdown table."""
    lines = ["| global batch | encode_chunks K | column_block | rows/device/chunk | step (s) | "
             "compile (s) | peak RSS (GB) | XLA temp/device (MB) | loss (last step) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = (f"| {r['batch']:,} | {r['chunks']} | {r.get('block', 0) or 'all'} | "
                f"{r['batch'] // DEVICES // max(r['chunks'], 1)}")
        if "error" in r:
            lines.append(f"{head} | failed: {r['error'][:60]} | | | | |")
        else:
            lines.append(f"{head} | {r['step_s']:.2f} | {r['compile_s']:.1f} | "
                         f"{r['peak_gb']:.2f} | {r['temp_mb']:.0f} | {r['loss']:.4f} |")
    return "\n".join(lines) + (f"\n\n(one train step: loss + gradient + AdamW; transformer "
                                f"{layers} x {width}, {max_len} tokens, in_batch_softmax; "
                                f"{DEVICES} fake CPU devices)")


def run_child(args: list[str], head: dict) -> dict:
    """This script with `args` in a fresh subprocess; its last stdout line as JSON."""
    try:
        return common.run_worker([sys.executable, os.path.abspath(__file__), *args])
    except common.WorkerFailed as e:
        return {**head, "error": str(e).strip().splitlines()[-1]}


def run_one(batch: int, block: int, dim: int, steps: int) -> dict:
    """One configuration in a fresh subprocess."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{batch},{block}",
           "--dim", str(dim), "--steps", str(steps)]
    return run_child(cmd[2:], {"batch": batch, "block": block})


def table(rows: list[dict], dim: int) -> str:
    """The results as a markdown table."""
    lines = ["| global batch | rows/device | columns at once | step (s) | compile (s) | "
             "peak RSS (GB) | loss |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        width = r["block"] or r["batch"]
        head = f"| {r['batch']:,} | {r['batch'] // DEVICES:,} | {width:,}"
        head += " (plain)" if not r["block"] else " (blockwise)"
        if "skipped" in r:
            lines.append(f"{head} | skipped: est. {r['skipped']:.1f} GB | | | |")
        elif "error" in r:
            lines.append(f"{head} | failed: {r['error'][:60]} | | | |")
        else:
            lines.append(f"{head} | {r['step_s']:.2f} | {r['compile_s']:.1f} | "
                         f"{r['peak_gb']:.2f} | {r['loss']:.4f} |")
    return "\n".join(lines) + (f"\n\n(in_batch_softmax + d/dq, d/dd; dim {dim}; "
                                f"{DEVICES} fake CPU devices)")


def bert_memory_child(batch: int, chunks: int, block: int, max_len: int) -> dict:
    """XLA's memory plan, per device, of one train step of a BERT-base-sized `bert`
    tower (12 x 768, 12 heads, MLP 3,072, 30,522 ids; shared by both sides, AdamW) at
    global batch `batch` of `max_len`-token texts with encode_chunks=`chunks` and
    column_block=`block`: compiled from abstract values, nothing allocated or run."""
    return tp_memory_child("base", 1, batch, chunks, max_len, block)


SHAPES = {"base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}  # layers, width,
                                                                    # heads, MLP


def tp_memory_child(shape: str, model: int, batch: int, chunks: int, max_len: int,
                    block: int = 0) -> dict:
    """Per device, one train step of a BERT-`shape` `bert` tower (30,522 ids, shared by
    both sides, AdamW) on 8 devices as (8 / model) x model (`mesh.model_axis`): the
    params' and Adam moments' bytes each device holds (from their shardings), and XLA's
    memory plan (temporary buffers: the activations; arguments), compiled from abstract
    values at global batch `batch` of `max_len`-token texts, encode_chunks=`chunks`,
    column_block=`block`."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import runpy

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    sys.path.insert(0, REPO)
    from dualjax import losses
    from dualjax.config import specs
    from dualjax.models import dual_encoder
    from dualjax.models.bert import BertConfig
    from dualjax.objectives import in_batch as objective_lib
    from dualjax.runtime import sharding
    from dualjax.train import step as step_lib

    cfg = runpy.run_path(os.path.join(REPO, "configs", "default.py"))["get_config"]().model
    cfg.tower, cfg.max_len, cfg.tokenizer = "bert", max_len, "hf"
    layers, width, heads, mlp = SHAPES[shape]
    bert = BertConfig(30522, width, layers, heads, mlp, 512)
    mesh = sharding.make_mesh(DEVICES, model=model)
    net = dual_encoder.make_model(specs.model_spec(cfg), bert.vocab_size, architecture=bert)
    objective = objective_lib.objective(
        net, losses.sharded("in_batch_softmax", mesh, column_block=block), max_len,
        encode_chunks=chunks)
    tx = optax.adamw(1e-5)
    init = lambda: {"params": (p := objective.init(jax.random.key(0))), "opt_state": tx.init(p),
                    "step": jnp.int32(0), "rng": jax.random.key(1)}
    shapes = jax.eval_shape(init)
    shardings = sharding.state_shardings(shapes, mesh, "replicated",
                                         dual_encoder.logical_axes(net, max_len))
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         shapes, shardings)
    batch_sharding = sharding.batch_sharding(mesh)
    data = {"doc_ids": jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=batch_sharding)}
    for side in ("q", "d"):
        data[f"{side}_ids"] = jax.ShapeDtypeStruct((batch, max_len), jnp.int32,
                                                   sharding=batch_sharding)
        data[f"{side}_mask"] = jax.ShapeDtypeStruct((batch, max_len), jnp.bool_,
                                                    sharding=batch_sharding)
    step = step_lib.make_train_step(objective, tx, lambda s: 1e-5, shardings, batch_sharding,
                                    sharding.replicated(mesh))
    per_device = lambda tree: sum(  # bytes of one device's shard of every leaf
        int(np.prod(s.sharding.shard_shape(s.shape))) * s.dtype.itemsize
        for s in jax.tree.leaves(tree) if hasattr(s, "sharding") and s.shape != ())
    start = time.perf_counter()
    m = step.lower(state, data).compile().memory_analysis()
    gib = lambda n: round(n / 2**30, 3)
    return {"shape": shape, "model_axis": model, "data_axis": DEVICES // model,
            "batch": batch, "chunks": chunks, "block": block, "max_len": max_len,
            "params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["params"])),
            "param_gib": gib(per_device(state["params"])),
            "adam_gib": gib(per_device(state["opt_state"])),
            "compile_seconds": round(time.perf_counter() - start, 1),
            "temp_gib": gib(m.temp_size_in_bytes), "argument_gib": gib(m.argument_size_in_bytes),
            "output_gib": gib(m.output_size_in_bytes), "alias_gib": gib(m.alias_size_in_bytes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="8192,32768,65536,131072",
                        help="global batch sizes, comma-separated")
    parser.add_argument("--block", type=int, default=1024, help="blockwise column_block")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="timed steps after a warm-up")
    parser.add_argument("--max-gb", type=float, default=16.0,
                        help="skip a configuration estimated to need more memory")
    parser.add_argument("--modes", default="plain,blockwise")
    parser.add_argument("--towers", action="store_true",
                        help="measure a transformer train step with encode_chunks = --chunks")
    parser.add_argument("--chunks", default="1,4,8",
                        help="--towers: encode_chunks values, each optionally K:column_block")
    parser.add_argument("--tower-batch", type=int, default=1024, help="--towers: global batch")
    parser.add_argument("--layers", type=int, default=2, help="--towers: transformer layers")
    parser.add_argument("--width", type=int, default=128, help="--towers: transformer width")
    parser.add_argument("--max-len", type=int, default=32, help="--towers: tokens per text")
    parser.add_argument("--bert-memory", default="",
                        help="K:column_block,...: XLA's per-device memory plan of a BERT-base "
                             "train step at --tower-batch x --max-len (compiled, not run)")
    parser.add_argument("--tp-memory", default="",
                        help="SHAPE:M,...: per-device parameter, Adam and activation bytes of a "
                             "BERT-SHAPE (base, large) train step on 8 devices as (8 / M) x M "
                             "(mesh.model_axis=M), at --tower-batch x --max-len, "
                             "--chunks=K (compiled, not run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--towers-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tp_memory:
        for combo in args.tp_memory.split(","):
            shape, _, model = combo.partition(":")
            print(json.dumps(tp_memory_child(shape, int(model or 1), args.tower_batch,
                                             int(args.chunks.split(",")[0]), args.max_len)),
                  flush=True)
        return
    if args.bert_memory:
        for combo in args.bert_memory.split(","):
            chunks, _, block = combo.partition(":")
            print(json.dumps(bert_memory_child(args.tower_batch, int(chunks), int(block or 0),
                                               args.max_len)), flush=True)
        return
    if args.towers_child:
        batch, chunks, block = map(int, args.towers_child.split(","))
        print(json.dumps(towers_child(batch, chunks, args.layers, args.width, args.max_len,
                                      args.steps, block)))
        return
    if args.towers:
        rows = []
        for combo in args.chunks.split(","):  # K, or K:column_block
            chunks, _, block = combo.partition(":")
            chunks, block = int(chunks), int(block or 0)
            row = run_child(["--towers-child", f"{args.tower_batch},{chunks},{block}", "--layers",
                             str(args.layers), "--width", str(args.width), "--max-len",
                             str(args.max_len), "--steps", str(args.steps)],
                            {"batch": args.tower_batch, "chunks": chunks, "block": block})
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        print(towers_table(rows, args.layers, args.width, args.max_len))
        return
    if args.child:
        batch, block = map(int, args.child.split(","))
        print(json.dumps(child(batch, block, args.dim, args.steps)))
        return
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mode in args.modes.split(","):
            block = args.block if mode == "blockwise" else 0
            need = estimate_gb(batch, block or batch, args.dim)
            row = ({"batch": batch, "block": block, "skipped": need} if need > args.max_gb
                   else run_one(batch, block, args.dim, args.steps))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(table(rows, args.dim))


if __name__ == "__main__":
    main()
