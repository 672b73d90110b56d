"""The memory a run's train step needs on each device, known before its first step
(`mesh.memory_plan`), and a run refused in one line when it does not fit.

Per device: the parameters and the optimizer state (their shards under the mesh's
layout: the model axis, FSDP; LoRA's frozen weights in their own dtype), read from the
train state's shardings without computing anything; and, from the step compiled for
the run's first (full-length) batch (`compiled.memory_analysis()`), the step's
temporary buffers (activations, gradients, the loss's blocks: what GradCache chunks,
remat and the blockwise loss shrink) and its peak, argument + temporaries + outputs
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


def before_first_step(spec: Any, mesh: jax.sharding.Mesh, train_step: Any, state: Any,
                      first_batch: Callable[[], dict]) -> MemoryPlan | None:
    """The run's plan (`spec`: its RunSpec), logged; ConfigError in one line when it
    does not fit. With a compiled plan the step is compiled for `first_batch()` (the
    global batch, placed) and `train_step` keeps that executable for the run."""
    mode = spec.mesh.memory_plan
    if mode == "off":
        return None
    compiled = train_step.compile(state, first_batch()) if compiles(mode) else None
    lora = spec.model.lora
    layout = (f"{sharding.data_size(mesh)} x {mesh.shape[sharding.MODEL_AXIS]} data x model "
              f"mesh, {spec.mesh.param_sharding} params, encode_chunks "
              f"{spec.objective.encode_chunks or 1}"
              + (f", LoRA rank {lora.rank}" if lora.rank else ""))
    p = plan(state, compiled, layout)
    logging.info("Memory plan: %s", p.describe())
    check(p)
    return p


def check(p: MemoryPlan) -> None:
    """ConfigError, in one line with the figures, for a plan that does not fit."""
    if not p.fits:
        raise ConfigError(
            f"config: the train step does not fit: {p.describe()}. Split it further: "
            "mesh.param_sharding=fsdp, a larger mesh.model_axis, train.encode_chunks "
            "(GradCache), model.lora_rank, model.dtype=bfloat16 or a smaller "
            "global_batch_size")
