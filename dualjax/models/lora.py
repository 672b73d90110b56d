"""LoRA (Hu et al. 2021): low-rank adapters on a tower's projections, the tower's own
weights frozen (`model.lora_rank`, `model.lora_alpha`, `model.lora_targets`,
`model.lora_base_dtype`).

A targeted projection y = x W gains y += (x A) B * alpha / rank, A [in, rank] drawn
from a normal of std 1/sqrt(in) and B [rank, out] zero, so a run starts from the
tower as it was. The adapters are params beside the weight they adapt ("query_lora_a"
and "query_lora_b" next to "query_kernel"), so checkpoints, resuming, sharding and
evaluation carry them as any param; `trainable` marks them (and every param outside the
towers: the similarity's scale and bias) as the only ones the optimizer moves, and the
step differentiates those alone. The frozen tower weights are kept in
`model.lora_base_dtype` (bfloat16 halves them). `merge` folds the adapters into the
weights for export, so a bundle or a sentence-transformers folder holds plain weights.

A tower takes adapters when it registers the names of its projections
(`towers.register(..., lora_targets=...)`) and calls `delta` where it projects.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

SUFFIXES = ("_lora_a", "_lora_b")
TOWER_KEYS = ("tower", "query_tower", "doc_tower", "embed")  # a dual encoder's tower params
BASE_DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Hugging Face's names of the projections, as PEFT's target_modules name them (ModernBERT's
# "Wo" is both its attention's and its MLP's output, as PEFT matches it)
ALIASES = {"q_proj": ("query",), "k_proj": ("key",), "v_proj": ("value",), "o_proj": ("out",),
           "gate_proj": ("mlp_gate",), "up_proj": ("mlp_up",), "down_proj": ("mlp_down",),
           "Wqkv": ("qkv",), "Wi": ("mlp_in",), "Wo": ("out", "mlp_out")}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """rank: the adapters' rank (0: no LoRA, every weight trains); alpha: their scale
    numerator (the update is A B alpha / rank); targets: the projections adapted (the
    tower's names, `towers.Tower.lora_targets`); base_dtype: the frozen weights' dtype."""
    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = ()
    base_dtype: str = "bfloat16"

    def adapts(self, name: str) -> bool:
        return self.rank > 0 and name in self.targets


NO_LORA = LoraSpec()


def parse_targets(value: str, available: tuple[str, ...]) -> tuple[str, ...]:
    """model.lora_targets ("query,value" or Hugging Face's "q_proj,v_proj"; "": all of
    `available`) as the tower's names; ValueError naming one that is not there."""
    names = [name for t in value.split(",") if t.strip()
             for name in ALIASES.get(t.strip(), (t.strip(),))]
    for name in names:
        if name not in available:
            raise ValueError(f"model.lora_targets: {name!r} names no weight of the tower; it "
                             f"has {', '.join(available)}")
    return tuple(dict.fromkeys(names)) if names else available


def delta(module: nn.Module, spec: LoraSpec, name: str, x: jnp.ndarray, out: int,
          dtype: Any) -> jnp.ndarray | None:
    """(x A) B * alpha / rank [..., out] for projection `name` of x [..., in] (call inside
    the module's nn.compact: A and B are its params "{name}_lora_a" / "_lora_b"); None
    when `name` is not adapted."""
    if not spec.adapts(name):
        return None
    fan_in = x.shape[-1]
    unnamed: Any = lambda init: nn.with_logical_partitioning(init, (None, None))
    a = module.param(f"{name}_lora_a",
                     unnamed(nn.initializers.normal(stddev=1 / math.sqrt(fan_in))),
                     (fan_in, spec.rank))
    b = module.param(f"{name}_lora_b", unnamed(nn.initializers.zeros_init()),
                     (spec.rank, out))
    y = jnp.einsum("...i,ir->...r", x, a.astype(dtype))
    return jnp.einsum("...r,ro->...o", y, b.astype(dtype)) * np.float32(spec.alpha / spec.rank
                                                                          ).astype(dtype)


def _is_adapter(key: str) -> bool:
    return key.endswith(SUFFIXES)


def _keys(path) -> list[str]:
    return [str(getattr(k, "key", k)) for k in path]


def trainable(params: Any) -> Any:
    """A bool tree over `params`: True on the adapters and on every param outside the
    towers; False on the towers' own weights."""
    def one(path, _):
        keys = _keys(path)
        return _is_adapter(keys[-1]) or keys[0] not in TOWER_KEYS
    return jax.tree_util.tree_map_with_path(one, params)


def frozen_to(params: Any, dtype: Any) -> Any:
    """`params` with the towers' frozen weights cast to `dtype` (the adapters and the
    rest as they are)."""
    mask = trainable(params)
    return jax.tree.map(lambda t, p: p if t else p.astype(dtype), mask, params)


def merge(params: Any, spec: LoraSpec) -> Any:
    """The params with every adapter folded into the weight it adapts (float32) and the
    adapters gone: the params of the same tower without LoRA. A weight "{name}_kernel"
    or "{name}/kernel" takes "{name}_lora_a" @ "{name}_lora_b" * alpha / rank,
    reshaped to it (its input dimensions first, as the tower projects)."""
    scale = spec.alpha / spec.rank if spec.rank else 0.0

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return np.asarray(node, np.float32) if hasattr(node, "dtype") else node
        out = {k: walk(v) for k, v in node.items() if not _is_adapter(k)}
        for key in node:
            if not key.endswith("_lora_a"):
                continue
            name = key.removesuffix("_lora_a")
            update = (np.asarray(node[key], np.float32)
                      @ np.asarray(node[f"{name}_lora_b"], np.float32)) * np.float32(scale)
            if f"{name}_kernel" in out:
                out[f"{name}_kernel"] = out[f"{name}_kernel"] + update.reshape(
                    out[f"{name}_kernel"].shape)
            else:
                dense = out[name]
                out[name] = {**dense, "kernel": dense["kernel"] + update.reshape(
                    dense["kernel"].shape)}
        return out

    return walk(jax.device_get(params))
