"""Step time and peak memory of the sharded in-batch softmax, plain vs blockwise.

On 8 fake CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`, set before
jax is imported), times the jitted loss + gradient w.r.t. q and d
(`losses.sharded("in_batch_softmax", mesh, column_block)`) on random unit embeddings
[B, dim] for each global batch B, with all columns at once (plain: each device holds
[B/8, B] scores) and streamed in blocks (`--block` columns: [B/8, block]). Each
configuration runs in a fresh subprocess, so its peak resident memory
(`resource.getrusage(...).ru_maxrss`) is its own; one whose estimated memory exceeds
`--max-gb` is skipped. The parent prints a markdown table.

    python scripts/bench_scale.py                                  # 8k to 128k
    python scripts/bench_scale.py --batches 8192,32768 --steps 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEVICES = 8
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    import resource

    import jax
    import jax.numpy as jnp

    sys.path.insert(0, REPO)
    from dualjax import losses, sharding

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
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    compiled = step.lower(q, d).compile()
    compile_s = time.perf_counter() - start
    times, value = [], None
    for _ in range(steps + 1):  # the first run warms up
        start = time.perf_counter()
        value, grads = compiled(q, d)
        jax.block_until_ready((value, grads))
        times.append(time.perf_counter() - start)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"batch": batch, "block": block, "loss": float(value), "compile_s": compile_s,
            "step_s": statistics.median(times[1:]), "base_gb": base_kb / 2**20,
            "peak_gb": peak_kb / 2**20}


def run_one(batch: int, block: int, dim: int, steps: int) -> dict:
    """One configuration in a fresh subprocess."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{batch},{block}",
           "--dim", str(dim), "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"batch": batch, "block": block, "error": (out.stderr.strip().splitlines()
                                                          or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], dim: int) -> str:
    """The results as a markdown table."""
    lines = [f"| global batch | rows/device | columns at once | step (s) | compile (s) | "
             f"peak RSS (GB) | loss |", "|---:|---:|---:|---:|---:|---:|---:|"]
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
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
