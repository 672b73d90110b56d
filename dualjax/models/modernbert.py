"""A ModernBERT tower (`model.tower="modernbert"`; Warner et al. 2024, gte-modernbert,
nomic-embed-text-v2's base), as Hugging Face's ModernBertModel computes it, shaped to take
its pretrained weights.

Token embeddings, then a LayerNorm; pre-norm layers (the first without the norm before
its attention): x = x + Wo(attention(LN(x))); x = x + Wo(gelu(a) * g) with (a, g) the
halves of Wi(LN(x)) (GeGLU); a final LayerNorm. No biases (unless the config sets them),
LayerNorms without a bias. Attention is bidirectional with rotary positions, alternating
global layers (every `global_every`-th, rope_theta 160,000) and local ones (each token sees
the tokens within `local_attention / 2` positions, rope_theta 10,000). Texts are padded on
the right (the tokenizer's [CLS] ... [SEP]); pooling is [CLS]'s state or the mean of the
real tokens' (as the folder's sentence-transformers Pooling module says).

Its sizes come from the folder's config.json (`ModernBertConfig.from_hf`) and are saved
with the run; weights carry the logical axis names every tower's do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models import lora as lora_lib
from dualjax.models import towers
from dualjax.models.decoder import rotate
from dualjax.models.layers import _axes, _ones, _zeros, gelu
from dualjax.models.lora import LoraSpec
from dualjax.models.spec import Architecture
from dualjax.models.towers import masked_mean, own_or_shared

POOLINGS = ("cls", "mean")
FAMILIES = ("modernbert",)
# The projections LoRA may adapt (model.lora_targets; Hugging Face's Wqkv, Wo, Wi)
LORA_TARGETS = ("qkv", "out", "mlp_in", "mlp_out")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(Architecture):
    """A ModernBERT's sizes, its layers' kinds (`local`: True for a sliding-window
    layer) and its pooling (hashable: a Flax module field)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    local: tuple[bool, ...] = ()
    local_attention: int = 128  # the whole window: a token sees half of it on each side
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    pooling: str = "cls"
    init_std: float = 0.02
    family: str = "modernbert"
    pad_token_id: int = 50283  # the embedding row transformers keeps for padding

    @classmethod
    def from_hf(cls, hf: dict, pooling: str) -> ModernBertConfig:
        """From a Hugging Face ModernBERT config.json's fields (ValueError naming one
        this tower does not compute)."""
        if hf.get("model_type") != "modernbert":
            raise ValueError(f"model_type {hf.get('model_type')!r} is not modernbert")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        act = hf.get("hidden_activation", "gelu")
        if act != "gelu":
            raise ValueError(f"hidden_activation={act!r}: only the exact 'gelu' is implemented")
        layers = int(hf["num_hidden_layers"])
        types = hf.get("layer_types")
        if types is None:
            every = int(hf.get("global_attn_every_n_layers", 3))
            local = tuple(bool(i % every) for i in range(layers))
        else:
            local = tuple(t == "sliding_attention" for t in types)
        rope = hf.get("rope_parameters") or {}
        theta = {kind: float((rope.get(key) or {}).get("rope_theta", hf.get(key2, default)))
                 for kind, key, key2, default in (
                     ("global", "full_attention", "global_rope_theta", 160000.0),
                     ("local", "sliding_attention", "local_rope_theta", 10000.0))}
        return cls(vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
                   num_layers=layers, num_heads=int(hf["num_attention_heads"]),
                   intermediate_size=int(hf["intermediate_size"]),
                   max_positions=int(hf.get("max_position_embeddings", 8192)), local=local,
                   local_attention=int(hf.get("local_attention", 128)),
                   global_rope_theta=theta["global"], local_rope_theta=theta["local"],
                   norm_eps=float(hf.get("norm_eps", 1e-5)),
                   norm_bias=bool(hf.get("norm_bias", False)),
                   attention_bias=bool(hf.get("attention_bias", False)),
                   mlp_bias=bool(hf.get("mlp_bias", False)), pooling=pooling,
                   init_std=float(hf.get("initializer_range", 0.02)),
                   pad_token_id=int(hf.get("pad_token_id", 50283)))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_length(self) -> int:
        return self.max_positions



def _norm(c: ModernBertConfig, dtype: Any, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=c.norm_eps, use_bias=c.norm_bias, dtype=dtype, name=name,
                        scale_init=_axes(_ones, "embed"), bias_init=_axes(_zeros, "embed"))


def _inverse_frequencies(d: int, theta: float) -> np.ndarray:
    return (1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)


class ModernBertLayer(nn.Module):
    """x = x + Wo(attention(LN(x))) (no LN on layer 0); x = x + Wo(GeGLU(LN(x))).
    `lora`: adapters on the projections it names (LORA_TARGETS)."""
    config: ModernBertConfig
    index: int
    dtype: Any = jnp.float32
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        c = self.config
        h, d, n = c.num_heads, c.head_dim, x.shape[1]
        init = nn.initializers.normal(stddev=c.init_std)
        y = x if self.index == 0 else _norm(c, self.dtype, "ln_attn")(x)
        w = self.param("qkv_kernel", _axes(init, "embed", None, "heads", "kv"),
                       (c.hidden_size, 3, h, d))
        qkv = jnp.einsum("bne,ethd->tbnhd", y, w.astype(self.dtype))
        adapted = lora_lib.delta(self, self.lora, "qkv", y, 3 * h * d, self.dtype)
        if adapted is not None:  # [b, n, 3 h d] in the kernel's (3, h, d) order
            qkv = qkv + jnp.moveaxis(adapted.reshape(*y.shape[:2], 3, h, d), 2, 0)
        if c.attention_bias:
            qkv = qkv + self.param("qkv_bias", _axes(_zeros, None, "heads", "kv"),
                                   (3, h, d)).astype(self.dtype)[:, None, None]
        local = c.local[self.index] if c.local else False
        positions = jnp.broadcast_to(jnp.arange(n), mask.shape)
        inv = _inverse_frequencies(d, c.local_rope_theta if local else c.global_rope_theta)
        q, k = rotate(qkv[0], positions, inv), rotate(qkv[1], positions, inv)
        keys = mask[:, None, None, :]
        if local:  # each token sees those within half the window, on both sides
            p = jnp.arange(n)
            keys = keys & (jnp.abs(p[:, None] - p[None, :]) <= c.local_attention // 2)[None, None]
        att = jax.nn.dot_product_attention(q, k, qkv[2], mask=keys)
        w_out = self.param("out_kernel", _axes(init, "heads", "kv", "embed"), (h, d, c.hidden_size))
        out = jnp.einsum("bnhd,hde->bne", att, w_out.astype(self.dtype))
        adapted = lora_lib.delta(self, self.lora, "out", att.reshape(*att.shape[:2], h * d),
                                 c.hidden_size, self.dtype)
        out = out if adapted is None else out + adapted
        if c.attention_bias:
            out = out + self.param("out_bias", _axes(_zeros, "embed"),
                                   (c.hidden_size,)).astype(self.dtype)
        x = x + out
        y = _norm(c, self.dtype, "ln_mlp")(x)

        def dense(name: str, size: int, axes: tuple[str, str], z: jnp.ndarray) -> jnp.ndarray:
            out = nn.Dense(size, use_bias=c.mlp_bias, dtype=self.dtype, name=name,
                           kernel_init=_axes(init, *axes), bias_init=_axes(_zeros, axes[1]))(z)
            adapted = lora_lib.delta(self, self.lora, name, z, size, self.dtype)
            return out if adapted is None else out + adapted

        a, g = jnp.split(dense("mlp_in", 2 * c.intermediate_size, ("embed", "mlp"), y), 2,
                         axis=-1)
        return x + dense("mlp_out", c.hidden_size, ("mlp", "embed"), gelu(a) * g)


class ModernBertTower(nn.Module):
    """ids [b, len] ([CLS] ... [SEP], right-padded), mask [b, len] -> float32
    [b, hidden_size]: the final states pooled. `extra` is refused."""
    config: ModernBertConfig
    dtype: Any = jnp.float32
    embed: nn.Module | None = None
    remat: bool = False  # each layer's activations recomputed in the backward pass
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        c = self.config
        if extra is not None:  # the config checks reject this earlier, naming the key
            raise ValueError("the modernbert tower has no layer above its states to feed "
                             "categorical features to")
        table = own_or_shared(self.embed, c.vocab_size, c.hidden_size, c.init_std)
        x = _norm(c, self.dtype, "ln_embed")(table(ids).astype(self.dtype))
        layer = nn.remat(ModernBertLayer) if self.remat else ModernBertLayer
        for i in range(c.num_layers):
            x = layer(c, i, self.dtype, self.lora, name=f"layer_{i}")(x, mask)
        x = _norm(c, self.dtype, "ln_final")(x)
        self.sow("intermediates", "hidden_states", x)
        return x[:, 0].astype(jnp.float32) if c.pooling == "cls" else masked_mean(x, mask)


def make_modernbert(vocab_size: int, name: str, embed: nn.Module | None = None, *,
                    architecture: ModernBertConfig, dtype: Any, lora: LoraSpec, remat: bool
                    ) -> nn.Module:
    """model.tower="modernbert": a ModernBERT of the pretrained start's sizes."""
    del vocab_size  # the start's own
    return ModernBertTower(architecture, dtype, embed, remat, lora, name=name)


towers.register("modernbert", make_modernbert, from_pretrained=True, lora_targets=LORA_TARGETS,
                remat=True, features=False, width=lambda s: s["architecture"].hidden_size)
