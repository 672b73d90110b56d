"""A decoder-LLM tower (`model.tower="decoder"`): the Llama family as Hugging Face's
LlamaModel, MistralModel, Qwen2Model and Qwen3Model compute it, shaped to take their
pretrained weights (e5-mistral, gte-Qwen2, Qwen3-Embedding are these models fine-tuned
as embedders).

Each layer is pre-norm: x = x + attention(rms(x)); x = x + down(silu(gate(rms(x))) *
up(rms(x))), and a final RMSNorm. RMSNorm as theirs: x * rsqrt(mean(x^2) + eps) in
float32, cast back, times the weight. Attention is causal, with grouped-query heads
(`num_kv_heads` keys and values shared by groups of query heads) and rotary positions
(the halves rotated, `rope_theta`; Llama 3's and linear frequency scaling). The
families differ in small ways the config holds:
- Qwen2: biases on the query, key and value projections;
- Qwen3: an RMSNorm over each query and key head before the rotation (`qk_norm`), and a
  head width of its own (`head_dim`);
- Mistral: a sliding window (each token sees the `window` latest, itself included);
- Llama: `attention_bias` and `mlp_bias` when its config sets them.

Padding: a token's position counts the real tokens before it, so a text's states are the
same whatever pads precede or follow it (rotary attention depends on distances only, so
transformers' own numbering of left-padded texts gives the same states). Pooling is the
last real token's state (`last_token`, the end-of-text token the tokenizer appends, see
`pretrained`) or the mean of the real tokens' states (`mean`).

Its sizes come from the pretrained folder's config.json (`DecoderConfig.from_hf`), never
from the run's config, and are saved with the run (WORKDIR/pretrained.json). Weights
carry logical axis names as every tower's ("heads", "mlp" for the model axis; the key
and value heads "kv_heads", kept whole on it); compute dtype as every tower's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models import lora as lora_lib
from dualjax.models import towers
from dualjax.models.layers import _axes, _ones, _zeros
from dualjax.models.lora import LoraSpec
from dualjax.models.spec import Architecture
from dualjax.models.towers import masked_mean, own_or_shared

POOLINGS = ("last_token", "mean")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # Hugging Face model_type values
# The projections LoRA may adapt (model.lora_targets; Hugging Face's q_proj ... down_proj)
LORA_TARGETS = ("query", "key", "value", "out", "mlp_gate", "mlp_up", "mlp_down")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class DecoderConfig(Architecture):
    """A decoder's sizes, its family's details and its pooling (hashable: a Flax module
    field). `windows`: each layer's sliding window (0: the whole causal past)."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    windows: tuple[int, ...] = ()
    pooling: str = "last_token"
    init_std: float = 0.02
    eos_token_id: int = -1  # appended to every text by the tokenizer (-1: none)

    @classmethod
    def from_hf(cls, hf: dict, pooling: str, eos_token_id: int = -1) -> DecoderConfig:
        """From a Hugging Face Llama, Mistral, Qwen2 or Qwen3 config.json's fields;
        ValueError naming the field of one this tower does not compute."""
        family = hf.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"model_type {family!r} is not one of {', '.join(FAMILIES)}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r}: only SwiGLU's 'silu' is implemented")
        heads = int(hf["num_attention_heads"])
        kv = int(hf.get("num_key_value_heads") or heads)
        if heads % kv:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv}")
        hidden = int(hf["hidden_size"])
        layers = int(hf["num_hidden_layers"])
        rope = _rope(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(family=family, vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
                   num_layers=layers, num_heads=heads, num_kv_heads=kv,
                   head_dim=int(hf.get("head_dim") or hidden // heads),
                   intermediate_size=int(hf["intermediate_size"]),
                   max_positions=int(hf.get("max_position_embeddings", 2048)),
                   rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), **rope,
                   qkv_bias=family == "qwen2" or attention_bias,
                   out_bias=family != "qwen2" and attention_bias,
                   mlp_bias=bool(hf.get("mlp_bias", False)), qk_norm=family == "qwen3",
                   windows=_windows(hf, family, layers), pooling=pooling,
                   init_std=float(hf.get("initializer_range", 0.02)),
                   eos_token_id=int(eos_token_id))

    @property
    def max_length(self) -> int:
        """The longest text (special tokens included) it was trained to read."""
        return self.max_positions

    def inverse_frequencies(self) -> np.ndarray:
        """float32 [head_dim / 2]: each rotated pair's angle per position, as
        transformers' rope initialisers compute them for rope_type."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
        inv = inv.astype(np.float32)
        if self.rope_type == "linear":
            return inv / np.float32(self.rope_factor)
        if self.rope_type == "llama3":
            factor, low = self.rope_factor, self.rope_low_freq_factor
            high = self.rope_high_freq_factor
            old = self.rope_original_max_positions
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > old / low, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        return inv


def _rope(hf: dict) -> dict[str, Any]:
    """The rotary settings of a config.json: transformers 5's `rope_parameters`, or the
    older `rope_theta` and `rope_scaling`."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # per layer type: these families use one
        params = params["full_attention"]
    scaling = hf.get("rope_scaling") or {}
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r}: only {', '.join(ROPE_TYPES)} rotary positions "
                         "are implemented")
    out: dict[str, Any] = {"rope_theta": float(merged.get("rope_theta",
                                                          hf.get("rope_theta", 10000.0))),
                           "rope_type": kind}
    if kind != "default":
        out["rope_factor"] = float(merged["factor"])
    if kind == "llama3":
        out.update(rope_low_freq_factor=float(merged["low_freq_factor"]),
                   rope_high_freq_factor=float(merged["high_freq_factor"]),
                   rope_original_max_positions=int(merged["original_max_position_embeddings"]))
    if float(merged.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor: only rotations of the whole head are "
                         "implemented")
    return out


def _windows(hf: dict, family: str, layers: int) -> tuple[int, ...]:
    """Each layer's sliding window, as transformers reads the config: Mistral's
    `sliding_window` on every layer; Qwen's `layer_types` (else `use_sliding_window` from
    layer `max_window_layers` on)."""
    window = hf.get("sliding_window")
    if family == "mistral":
        return (int(window or 0),) * layers
    if family == "llama" or not window:
        return (0,) * layers
    types = hf.get("layer_types")
    if types is None:
        start = int(hf.get("max_window_layers", layers))
        use = bool(hf.get("use_sliding_window", False))
        types = ["sliding_attention" if use and i >= start else "full_attention"
                 for i in range(layers)]
    return tuple(int(window) if t == "sliding_attention" else 0 for t in types)


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * scale, the statistics in float32, as Llama's."""
    eps: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        scale = self.param("scale", _axes(_ones, "embed"), (x.shape[-1],))
        y = x.astype(jnp.float32)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + np.float32(self.eps))
        return scale.astype(self.dtype) * y.astype(self.dtype)


def rotate(x: jnp.ndarray, positions: jnp.ndarray, inverse_frequencies: np.ndarray
           ) -> jnp.ndarray:
    """x [b, n, heads, d] rotated by each position's angles (positions [b, n]): the two
    halves of each head as the (real, imaginary) parts, as transformers' rotate_half."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inverse_frequencies)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [b, n, 1, d]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class DecoderAttention(nn.Module):
    """Causal grouped-query attention with rotary positions over x [b, n, hidden]."""
    config: DecoderConfig
    window: int = 0
    dtype: Any = jnp.float32
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray, positions: jnp.ndarray
                 ) -> jnp.ndarray:
        c = self.config
        init = nn.initializers.normal(stddev=c.init_std)

        def project(name: str, heads: int, axis: str) -> jnp.ndarray:  # [b, n, heads, d]
            w = self.param(f"{name}_kernel", _axes(init, "embed", axis, "kv"),
                           (c.hidden_size, heads, c.head_dim))
            y = jnp.einsum("bne,ehd->bnhd", x, w.astype(self.dtype))
            adapted = lora_lib.delta(self, self.lora, name, x, heads * c.head_dim, self.dtype)
            if adapted is not None:
                y = y + adapted.reshape(y.shape)
            if c.qkv_bias:
                y = y + self.param(f"{name}_bias", _axes(_zeros, axis, "kv"),
                                   (heads, c.head_dim)).astype(self.dtype)
            return y

        q = project("query", c.num_heads, "heads")
        k = project("key", c.num_kv_heads, "kv_heads")
        v = project("value", c.num_kv_heads, "kv_heads")
        if c.qk_norm:
            q = RMSNorm(c.rms_norm_eps, self.dtype, name="query_norm")(q)
            k = RMSNorm(c.rms_norm_eps, self.dtype, name="key_norm")(k)
        inv = c.inverse_frequencies()
        q, k = rotate(q, positions, inv), rotate(k, positions, inv)
        keys = mask[:, None, None, :]  # [b, 1, 1, keys]
        if self.window:  # each query sees the `window` latest keys, itself included
            # (not local_window_size=: its mask needs a concrete length, and an exported
            # bundle's is symbolic)
            n = jnp.arange(x.shape[1])
            keys = keys & (n[:, None] - n[None, :] < self.window)[None, None]
        y = jax.nn.dot_product_attention(q, k, v, mask=keys, is_causal=True)
        w = self.param("out_kernel", _axes(init, "heads", "kv", "embed"),
                       (c.num_heads, c.head_dim, c.hidden_size))
        out = jnp.einsum("bqhd,hde->bqe", y, w.astype(self.dtype))
        adapted = lora_lib.delta(self, self.lora, "out", y.reshape(*y.shape[:2], -1),
                                 c.hidden_size, self.dtype)
        if adapted is not None:
            out = out + adapted
        if c.out_bias:
            out = out + self.param("out_bias", _axes(_zeros, "embed"),
                                   (c.hidden_size,)).astype(self.dtype)
        return out


class DecoderLayer(nn.Module):
    """x = x + attention(rms(x)); x = x + down(silu(gate(rms(x))) * up(rms(x)))."""
    config: DecoderConfig
    window: int = 0
    dtype: Any = jnp.float32
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray, positions: jnp.ndarray
                 ) -> jnp.ndarray:
        c = self.config
        h = RMSNorm(c.rms_norm_eps, self.dtype, name="ln_attn")(x)
        x = x + DecoderAttention(c, self.window, self.dtype, self.lora, name="attn")(
            h, mask, positions)
        h = RMSNorm(c.rms_norm_eps, self.dtype, name="ln_mlp")(x)
        init = nn.initializers.normal(stddev=c.init_std)

        def dense(name: str, size: int, axes: tuple[str, str], y: jnp.ndarray) -> jnp.ndarray:
            out = nn.Dense(size, use_bias=c.mlp_bias, dtype=self.dtype, name=name,
                           kernel_init=_axes(init, *axes), bias_init=_axes(_zeros, axes[1]))(y)
            adapted = lora_lib.delta(self, self.lora, name, y, size, self.dtype)
            return out if adapted is None else out + adapted

        gate = dense("mlp_gate", c.intermediate_size, ("embed", "mlp"), h)
        up = dense("mlp_up", c.intermediate_size, ("embed", "mlp"), h)
        return x + dense("mlp_down", c.hidden_size, ("mlp", "embed"), nn.silu(gate) * up)


def last_token(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """x [b, n, d] at each row's last real position (mask [b, n]), as float32 [b, d]; a
    row with no real token gives the zero vector."""
    n = mask.shape[1]
    last = n - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    picked = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    return jnp.where(mask.any(axis=1, keepdims=True), picked, 0.0)


class DecoderTower(nn.Module):
    """ids [b, len] (with the tokenizer's special tokens and end-of-text token), mask
    [b, len] -> float32 [b, hidden_size]: the final states pooled. `extra` (categorical
    feature vectors) has no layer to go to and is refused."""
    config: DecoderConfig
    dtype: Any = jnp.float32
    embed: nn.Module | None = None
    lora: LoraSpec = LoraSpec()
    remat: bool = False  # each layer's activations recomputed in the backward pass

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        c = self.config
        if extra is not None:  # the config checks reject this earlier, naming the key
            raise ValueError("the decoder tower has no layer above its states to feed "
                             "categorical features to")
        table = own_or_shared(self.embed, c.vocab_size, c.hidden_size, c.init_std)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)
        x = table(ids).astype(self.dtype)
        layer = nn.remat(DecoderLayer) if self.remat else DecoderLayer
        for i in range(c.num_layers):
            window = c.windows[i] if c.windows else 0
            x = layer(c, window, self.dtype, self.lora, name=f"layer_{i}")(x, mask, positions)
        x = RMSNorm(c.rms_norm_eps, self.dtype, name="ln_final")(x)
        # every position's final state, for apply(..., mutable="intermediates")
        self.sow("intermediates", "hidden_states", x)
        return masked_mean(x, mask) if c.pooling == "mean" else last_token(x, mask)


def make_decoder(vocab_size: int, name: str, embed: nn.Module | None = None, *,
                 architecture: DecoderConfig, dtype: Any, lora: LoraSpec, remat: bool
                 ) -> nn.Module:
    """model.tower="decoder": a decoder LLM of the pretrained start's sizes
    (`architecture`; its weights replace the initialisation, `train.warm_start`)."""
    del vocab_size  # the start's own (architecture.vocab_size)
    return DecoderTower(architecture, dtype, embed, lora, remat, name=name)


towers.register("decoder", make_decoder, from_pretrained=True, lora_targets=LORA_TARGETS,
                remat=True, features=False, width=lambda s: s["architecture"].hidden_size)
