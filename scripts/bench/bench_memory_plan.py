"""The train state's memory per device (issue 45's memory plan, its parameter and
optimizer part): Qwen2-0.5B, 1.5B and 7B shapes and ModernBERT-base, all weights
trained (float32, AdamW) or, for the decoders, with LoRA (rank 16 on every projection,
the frozen weights in bfloat16), on 1, 8 and 64 devices, replicated or FSDP, and on
32 x 2 data x model.

Nothing is computed: the state is `jax.eval_shape`'s of the run's own init (the objective,
`objectives.restrict`'s optimizer), placed by `sharding.state_shardings` as the run
places it, and `train.memory_plan.shard_bytes` sums one device's shards. Prints a
markdown table; BENCHMARKS.md records it.

With --activations, the whole train step (bfloat16 activations, each layer recomputed
in the backward pass, GradCache over K chunks, AdamW) is compiled from abstract values
for a global batch of 8,192 pairs (queries 64, documents 512 tokens), as the run's
memory plan compiles it (`train.memory_plan.plan`: XLA's temporary buffers and the
step's peak per device), on fake CPU devices: these are XLA CPU's figures, and a GPU
or TPU compiles its own (fused attention, other fusions), which `mesh.memory_plan`
reads on the device before a run's first step. Nothing is run or allocated.

    python scripts/bench/bench_memory_plan.py
    python scripts/bench/bench_memory_plan.py --activations=Qwen2-0.5B:8:fsdp:lora:16,...
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=64")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from dualjax import objectives  # noqa: E402
from dualjax.models import dual_encoder  # noqa: E402
from dualjax.models.decoder import LORA_TARGETS, DecoderConfig  # noqa: E402
from dualjax.models.lora import LoraSpec  # noqa: E402
from dualjax.models.modernbert import ModernBertConfig  # noqa: E402
from dualjax.models.spec import ModelSpec  # noqa: E402
from dualjax.runtime import sharding  # noqa: E402
from dualjax.train import memory_plan  # noqa: E402
from dualjax.train import step as step_lib  # noqa: E402

# The shapes of the public config.json files (Qwen/Qwen2-0.5B, -1.5B, -7B;
# answerdotai/ModernBERT-base).
SHAPES = {
    "Qwen2-0.5B": DecoderConfig("qwen2", 151936, 896, 24, 14, 2, 64, 4864, 32768,
                                qkv_bias=True),
    "Qwen2-1.5B": DecoderConfig("qwen2", 151936, 1536, 28, 12, 2, 128, 8960, 32768,
                                qkv_bias=True),
    "Qwen2-7B": DecoderConfig("qwen2", 152064, 3584, 28, 28, 4, 128, 18944, 32768,
                              qkv_bias=True),
    "ModernBERT-base": ModernBertConfig(50368, 768, 22, 12, 1152, 8192,
                                        local=tuple(bool(i % 3) for i in range(22))),
}
DEVICE_GIB = (16, 80, 141)  # a TPU v4 core, an A100 / H100, an H200
LAYOUTS = ((1, 1, "replicated"), (8, 1, "replicated"), (8, 1, "fsdp"), (64, 1, "fsdp"),
           (64, 2, "fsdp"))


def state_bytes(arch, lora: bool, devices: int, model_axis: int, strategy: str):
    tower = "decoder" if isinstance(arch, DecoderConfig) else "modernbert"
    spec = ModelSpec(query_tower=tower, doc_tower=tower, similarity="cosine_temperature",
                     lora=LoraSpec(16, 32.0, LORA_TARGETS) if lora else LoraSpec())
    model = dual_encoder.make_model(spec, arch.vocab_size, architecture=arch)
    mesh = sharding.make_mesh(devices, model=model_axis)
    objective = objectives.make(dataclasses.replace(objectives.ObjectiveSpec(), max_len=64),
                                model, mesh)
    tx = objectives.restrict(optax.adamw(1e-4), objective)
    abstract = jax.eval_shape(step_lib.make_init_state(objective, tx), 0)
    placed = sharding.state_shardings(abstract, mesh, strategy,
                                      dual_encoder.logical_axes(model, 64))
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         abstract, placed)
    count = sum(x.size for x in jax.tree.leaves(abstract["params"]))
    return count, memory_plan.plan(state)


def step_plan(arch, lora: bool, devices: int, strategy: str, chunks: int,
              batch: int = 8192, lengths: tuple[int, int] = (64, 512), remat: bool = True):
    """(the plan of one train step compiled for `batch` pairs of `lengths` tokens with
    `chunks` GradCache chunks, seconds to compile)."""
    tower = "decoder" if isinstance(arch, DecoderConfig) else "modernbert"
    spec = ModelSpec(query_tower=tower, doc_tower=tower, similarity="cosine_temperature",
                     dtype="bfloat16", remat=remat,
                     lora=LoraSpec(16, 32.0, LORA_TARGETS) if lora else LoraSpec())
    model = dual_encoder.make_model(spec, arch.vocab_size, architecture=arch)
    mesh = sharding.make_mesh(devices)
    objective = objectives.make(dataclasses.replace(
        objectives.ObjectiveSpec(), max_len=max(lengths), encode_chunks=chunks), model, mesh)
    tx = objectives.restrict(optax.adamw(1e-4), objective)
    abstract = jax.eval_shape(step_lib.make_init_state(objective, tx), 0)
    placed = sharding.state_shardings(abstract, mesh, strategy,
                                      dual_encoder.logical_axes(model, max(lengths)))
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         abstract, placed)
    rows = sharding.batch_sharding(mesh)
    data = {"doc_ids": jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rows)}
    for side, length in zip("qd", lengths, strict=True):
        data[f"{side}_ids"] = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=rows)
        data[f"{side}_mask"] = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=rows)
    step = step_lib.make_train_step(objective, tx, lambda s: 1e-4, placed, rows,
                                    sharding.replicated(mesh))
    start = time.perf_counter()
    compiled = step.lower(state, data).compile()
    return memory_plan.plan(state, compiled), time.perf_counter() - start


def activations(rows: str) -> None:
    """--activations: one row per NAME:DEVICES:LAYOUT:TRAINING:CHUNKS."""
    gib = memory_plan.GIB
    print("| tower | training | devices, layout | encode_chunks | state GiB | XLA temporaries "
          "GiB | peak GiB per device | fits 16 / 80 / 141 GiB | compile s |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for row in rows.split(","):
        name, devices, strategy, training, chunks = row.split(":")
        p, seconds = step_plan(SHAPES[name], training == "lora", int(devices), strategy,
                               int(chunks))
        print(f"| {name} | {'LoRA r16, base bf16' if training == 'lora' else 'all weights'} "
              f"| {devices} x 1, {strategy} | {chunks} | {(p.params + p.optimizer) / gib:.2f} "
              f"| {(p.temp or 0) / gib:.2f} | {(p.peak or 0) / gib:.2f} | "
              f"{' / '.join('yes' if (p.peak or 0) <= d * gib else 'no' for d in DEVICE_GIB)} "
              f"| {seconds:.0f} |", flush=True)


def remat_probe() -> None:
    """--remat_probe: XLA's temporaries of a gradient with and without rematerialisation
    on this backend, plain jax (layers of tanh(x W) and a softmax attention over
    [32, 512, 256]) and dualjax's ModernBERT and decoder towers (256 wide, one device,
    32 pairs of 64 + 512 tokens, one chunk)."""
    from dualjax.models.modernbert import ModernBertConfig

    def layer(w, x):
        h = jnp.tanh(x @ w)
        a = jax.nn.softmax(jnp.einsum("bld,bmd->blm", h, h), axis=-1)
        return x + jnp.einsum("blm,bmd->bld", a, h)

    def net(ws, x, remat):
        f = jax.checkpoint(layer) if remat else layer
        for w in ws:
            x = f(w, x)
        return x.sum()

    mib = lambda c: c.memory_analysis().temp_size_in_bytes / 2 ** 20
    x = jax.ShapeDtypeStruct((32, 512, 256), jnp.float32)
    for n in (2, 8):
        ws = [jax.ShapeDtypeStruct((256, 256), jnp.float32)] * n
        forward = jax.jit(lambda ws, x: net(ws, x, False)).lower(ws, x).compile()
        grads = [jax.jit(jax.grad(lambda ws, x, r=r: net(ws, x, r))).lower(ws, x).compile()
                 for r in (False, True)]
        print(f"plain jax, {n} layers: forward {mib(forward):.0f} MiB, gradient "
              f"{mib(grads[0]):.0f} MiB, each layer checkpointed {mib(grads[1]):.0f} MiB")
    for layers in (2, 8):
        for arch in (ModernBertConfig(1000, 256, layers, 4, 512, 1024,
                                      local=tuple(bool(i % 3) for i in range(layers))),
                     DecoderConfig("qwen2", 1000, 256, layers, 4, 2, 64, 512, 1024,
                                   qkv_bias=True)):
            figures = [step_plan(arch, False, 1, "replicated", 1, batch=32, remat=r)[0].temp
                       for r in (False, True)]
            print(f"{type(arch).__name__}, {layers} layers: {(figures[0] or 0) / 2**20:.0f} "
                  f"MiB, model.remat {(figures[1] or 0) / 2**20:.0f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--activations", default="",
                        help="NAME:DEVICES:LAYOUT:TRAINING:CHUNKS,...: compile these steps "
                             "(TRAINING: full or lora) instead of the state table")
    parser.add_argument("--remat_probe", action="store_true",
                        help="what rematerialisation saves on this backend, instead")
    args = parser.parse_args()
    if args.remat_probe:
        return remat_probe()
    if args.activations:
        return activations(args.activations)
    gib = memory_plan.GIB
    print("| tower | training | params | devices (data x model), layout | parameters GiB "
          "| optimizer GiB | state GiB per device |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name, arch in SHAPES.items():
        for lora in (False, True):
            for devices, model_axis, strategy in LAYOUTS:
                if lora and (model_axis > 1 or not isinstance(arch, DecoderConfig)):
                    continue  # (LoRA rows for the decoders; ModernBERT trained whole)
                count, p = state_bytes(arch, lora, devices, model_axis, strategy)
                print(f"| {name} | {'LoRA r16, base bf16' if lora else 'all weights, f32'} "
                      f"| {count / 1e9:.2f} B | {devices // model_axis} x {model_axis}, "
                      f"{strategy} | {p.params / gib:.2f} | {p.optimizer / gib:.2f} | "
                      f"{(p.params + p.optimizer) / gib:.2f} |", flush=True)


if __name__ == "__main__":
    main()
