"""The train state's memory per device (issue 45's memory plan, its parameter and
optimizer part): Qwen2-0.5B, 1.5B and 7B shapes and ModernBERT-base, all weights
trained (float32, AdamW) or, for the decoders, with LoRA (rank 16 on every projection,
the frozen weights in bfloat16), on 1, 8 and 64 devices, replicated or FSDP, and on
32 x 2 data x model.

Nothing is computed: the state is `jax.eval_shape`'s of the run's own init (the objective,
`objectives.restrict`'s optimizer), placed by `sharding.state_shardings` as the run
places it, and `train.memory_plan.shard_bytes` sums one device's shards. The
activations need the step compiled for the device (`mesh.memory_plan`, on the GPU or
TPU itself); they are not here. Prints a markdown table; BENCHMARKS.md records it.

    python scripts/bench/bench_memory_plan.py
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=64")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

import dataclasses  # noqa: E402

import jax  # noqa: E402
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


def main() -> None:
    gib = memory_plan.GIB
    print("| tower | training | params | devices (data x model), layout | parameters GiB "
          "| optimizer GiB | state GiB per device |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name, arch in SHAPES.items():
        for lora in (False, True):
            for devices, model_axis, strategy in LAYOUTS:
                if lora and (model_axis > 1 or not isinstance(arch, DecoderConfig)):
                    continue  # (the modernbert tower takes no adapters yet)
                count, p = state_bytes(arch, lora, devices, model_axis, strategy)
                print(f"| {name} | {'LoRA r16, base bf16' if lora else 'all weights, f32'} "
                      f"| {count / 1e9:.2f} B | {devices // model_axis} x {model_axis}, "
                      f"{strategy} | {p.params / gib:.2f} | {p.optimizer / gib:.2f} | "
                      f"{(p.params + p.optimizer) / gib:.2f} |", flush=True)


if __name__ == "__main__":
    main()
