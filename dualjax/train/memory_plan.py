"""The memory a run's train step needs on each device, known before its first step
(`mesh.memory_plan`), and a run refused in one line when it does not fit.

Per device: the parameters and the optimizer state (their shards under the mesh's
layout: the model axis, FSDP; LoRA's frozen weights in their own dtype), read from the
train state's shardings without computing anything; and, from the step compiled for
the run's first (full-length) batch (`compiled.memory_analysis()`), the step's
temporary buffers (activations, gradients, the loss's blocks: what GradCache chunks,
remat and the blockwise loss shrink; XLA CPU's scheduler undoes remat's saving, GPUs'
and TPUs' keep it: BENCHMARKS.md) and its peak, argument + temporaries + outputs
less what the donated state shares with them. The peak is checked against the device's
own limit (`memory_stats()["bytes_limit"]`, on GPUs and TPUs; the host's memory is
not checked). The compiled step is the one the run then takes (`TrainStep.compile`), so
the plan costs no second compilation.

"auto" compiles the plan on accelerators and, on CPU (where the run's batches are
trimmed to their longest text, so the full-length step may never run), gives the
parameter and optimizer figures alone; "compile" always compiles it; "off" skips it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from dualjax.errors import ConfigError
from dualjax.runtime import sharding
from dualjax.runtime.sharding import MEMORY_PLANS as MODES  # noqa: F401 (mesh.memory_plan)

GIB = 2.0 ** 30


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device. temp and peak: the compiled step's (None: not compiled);
    limit: the device's (None: not known, or the host's)."""
    params: int
    optimizer: int
    temp: int | None = None
    peak: int | None = None
    limit: int | None = None
    device: str = ""
    layout: str = ""  # the mesh, FSDP, GradCache chunks, LoRA

    @property
    def fits(self) -> bool:
        return self.peak is None or self.limit is None or self.peak <= self.limit

    def describe(self) -> str:
        """One line: each part, the peak and the limit, in GiB."""
        parts = [f"parameters {self.params / GIB:.2f}", f"optimizer {self.optimizer / GIB:.2f}"]
        if self.temp is not None:
            parts.append(f"activations and temporaries {self.temp / GIB:.2f}")
        peak = (f"; peak {self.peak / GIB:.2f} GiB of the compiled step" if self.peak is not None
                else "; activations not compiled on cpu (mesh.memory_plan=compile)")
        limit = f" of {self.limit / GIB:.2f} GiB on {self.device}" if self.limit else ""
        return (f"memory per device ({self.layout}): {', '.join(parts)} GiB{peak}{limit}")


def shard_bytes(tree: Any) -> int:
    """Bytes of one device's shard of every array of `tree` (arrays or abstract ones
    with shardings; the largest shard, where they differ)."""
    total = 0
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "sharding") or not hasattr(x, "shape"):
            continue
        shape = x.sharding.shard_shape(x.shape)
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    return total


def device_limit(device: jax.Device) -> int | None:
    """The device's memory limit in bytes (None on CPU or where it is not reported)."""
    if device.platform == "cpu":
        return None
    try:
        stats = device.memory_stats() or {}
    except Exception:  # (a backend without memory statistics)
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def plan(state: Any, compiled: Any = None, layout: str = "",
         device: jax.Device | None = None) -> MemoryPlan:
    """The plan of `state` (the train state, placed) and, when given, of the compiled
    step (`jax.stages.Compiled`)."""
    device = device or jax.devices()[0]
    temp = peak = None
    if compiled is not None:
        m = compiled.memory_analysis()
        if m is not None:
            temp = int(m.temp_size_in_bytes)
            peak = int(m.argument_size_in_bytes + m.temp_size_in_bytes
                       + m.output_size_in_bytes - m.alias_size_in_bytes)
    return MemoryPlan(params=shard_bytes(state["params"]),
                      optimizer=shard_bytes(state["opt_state"]), temp=temp, peak=peak,
                      limit=device_limit(device), device=device.device_kind, layout=layout)


def compiles(mode: str, device: jax.Device | None = None) -> bool:
    """Whether `mode` compiles the step for its plan on this device's platform."""
    platform = (device or jax.devices()[0]).platform
    return mode == "compile" or (mode == "auto" and platform != "cpu")


AUTO = -1  # train.encode_chunks: the fewest chunks whose compiled step fits
# The most chunks -1 tries: 8 texts a side a chunk at a global batch of 8,192 on one
# device, where a decoder's 512-token documents need more than 64 chunks on a 16 GiB
# core (BENCHMARKS.md, "The train state per device"); the search compiles about
# log2 of the choices, so the cap costs a few compilations, not one per choice.
MAX_AUTO_CHUNKS = 1024


def before_first_step(spec: Any, mesh: jax.sharding.Mesh, train_step: Any, state: Any,
                      first_batch: Callable[[], dict],
                      step_with: Callable[[int], Any] | None = None) -> Any:
    """The run's plan (`spec`: its RunSpec), logged; ConfigError in one line when it
    does not fit. With a compiled plan the step is compiled for `first_batch()` (the
    global batch, placed) and keeps that executable for the run. With
    train.encode_chunks=-1 the chunks are chosen first (`choose_chunks`, `step_with(K)`
    making the step of K chunks). Returns the step the run takes."""
    mode = spec.mesh.memory_plan
    chunks = spec.objective.encode_chunks
    compiled = None
    if chunks == AUTO:
        assert step_with is not None, "train.encode_chunks=-1 needs the steps to choose from"
        chunks, train_step, compiled = choose_chunks(spec, mesh, state, first_batch, step_with)
    if mode == "off":
        return train_step
    if compiled is None and compiles(mode):
        compiled = train_step.compile(state, first_batch())
    p = plan(state, compiled, _layout(spec, mesh, chunks))
    logging.info("Memory plan: %s", p.describe())
    check(p)
    return train_step


def _layout(spec: Any, mesh: jax.sharding.Mesh, chunks: int) -> str:
    lora = spec.model.lora
    return (f"{sharding.data_size(mesh)} x {mesh.shape[sharding.MODEL_AXIS]} data x model "
            f"mesh, {spec.mesh.param_sharding} params, encode_chunks {chunks or 1}, "
            f"{spec.model.dtype} activations" + (", each layer recomputed (remat)"
                                                 if spec.model.remat else "")
            + (f", LoRA rank {lora.rank}" if lora.rank else ""))


def chunk_choices(global_batch: int, mixed: int, devices: int) -> list[int]:
    """The encode_chunks K a batch can take: 1 and the powers of two that split the
    global batch (and the mixed negatives) into chunks of a multiple of the devices, up
    to MAX_AUTO_CHUNKS."""
    out, k = [1], 2
    while k <= MAX_AUTO_CHUNKS and not any(n % (k * devices) for n in (global_batch, mixed)):
        out.append(k)
        k *= 2
    return out


def choose_chunks(spec: Any, mesh: jax.sharding.Mesh, state: Any,
                  first_batch: Callable[[], dict], step_with: Callable[[int], Any]
                  ) -> tuple[int, Any, Any]:
    """train.encode_chunks=-1: the fewest GradCache chunks whose step, compiled for the
    first batch, fits the device's memory (a binary search over `chunk_choices`: the
    peak falls as the chunks grow), each compiled step's peak logged with the choice.
    Where nothing is compiled (mesh.memory_plan off, or auto on a CPU, whose host memory
    is not planned) or the device's limit is not known: one chunk. ConfigError, with the
    figures, when even the most chunks do not fit. Returns (K, its step, its compiled
    step or None)."""
    device = jax.devices()[0]
    limit = device_limit(device)
    choices = chunk_choices(spec.schedule.global_batch_size, spec.num_mixed_negatives,
                            sharding.data_size(mesh))
    chunkable = spec.objective.kind == "in_batch"
    if (spec.mesh.memory_plan == "off" or not compiles(spec.mesh.memory_plan, device)
            or limit is None or not chunkable):
        why = ("only the dual encoder's in-batch objective chunks" if not chunkable
               else "no device memory limit to fit" if limit is None or device.platform == "cpu"
               else "mesh.memory_plan=off")
        logging.info("train.encode_chunks=-1: 1 chunk (%s)", why)
        return 1, step_with(1), None
    batch = first_batch()
    tried: dict[int, tuple[Any, Any, MemoryPlan]] = {}

    def attempt(k: int) -> MemoryPlan:
        step = step_with(k)
        compiled = step.compile(state, batch)
        tried[k] = (step, compiled, plan(state, compiled, _layout(spec, mesh, k), device))
        return tried[k][2]

    low, high = 1, len(choices) - 1  # one chunk first (a step that fits as it is, once)
    if attempt(1).fits:
        high = 0
    elif high == 0 or not attempt(choices[high]).fits:
        raise ConfigError(
            f"config.train.encode_chunks=-1: even {choices[high]} chunks do not fit: "
            f"{tried[choices[high]][2].describe()}. Split the step otherwise: "
            "mesh.param_sharding=fsdp, a larger mesh.model_axis, model.lora_rank, "
            "model.dtype=bfloat16 or a smaller global_batch_size")
    while low < high:  # choices[high] fits; find the first that does
        mid = (low + high) // 2
        if attempt(choices[mid]).fits:
            high = mid
        else:
            low = mid + 1
    k = choices[high]
    logging.info("train.encode_chunks=-1: %d chunks, the fewest that fit %.2f GiB on %s "
                 "(compiled peaks: %s)", k, limit / GIB, device.device_kind,
                 ", ".join(f"{c}: {(tried[c][2].peak or 0) / GIB:.2f} GiB"
                           for c in sorted(tried)))
    return k, tried[k][0], tried[k][1]


def check(p: MemoryPlan) -> None:
    """ConfigError, in one line with the figures, for a plan that does not fit."""
    if not p.fits:
        raise ConfigError(
            f"config: the train step does not fit: {p.describe()}. Split it further: "
            "mesh.param_sharding=fsdp, a larger mesh.model_axis, train.encode_chunks "
            "(GradCache), model.lora_rank, model.dtype=bfloat16 or a smaller "
            "global_batch_size")
