"""The "transformer" tower (Chang et al. 2020 §4.1), trained from scratch. Its settings:
the group model.transformer (num_layers, width, num_heads, mlp_dim, max_positions,
pooling, init_std, or a preset: `spec.TransformerSpec`) and model.output_dim; its token
table is model.transformer.width wide."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from dualjax.models import towers
from dualjax.models.layers import SelfAttention, _axes, _layer_norm, _zeros, feed_forward
from dualjax.models.spec import TransformerSpec


class EncoderLayer(nn.Module):
    """Pre-LN Transformer layer: x + attn(LN(x)), then x + MLP(LN(x)) (GELU)."""
    num_heads: int
    mlp_dim: int
    init_std: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        x = x + SelfAttention(self.num_heads, self.init_std, self.dtype, name="attn")(
                _layer_norm(self.dtype, "ln_attn")(x), mask)
        return x + feed_forward(_layer_norm(self.dtype, "ln_mlp")(x), self.mlp_dim,
                                self.init_std, self.dtype)


class TransformerTower(nn.Module):
    """Chang et al. 2020 §4.1: token + learned position embeddings, a learned [CLS] vector
    prepended (inside the tower: the tokenizer knows nothing of it), pre-LN encoder layers
    with attention masked by the padding mask, a final LayerNorm, and a linear layer to
    output_dim on the [CLS] state (pooling="cls") or on the mean of the text's token states
    (pooling="mean", accumulated in float32). Activations in `dtype` (model.dtype), params
    float32, softmax and LayerNorm statistics in float32, output float32.

    Texts may have any length up to max_positions (the [CLS] vector has no position).
    """
    vocab_size: int
    num_layers: int
    width: int
    num_heads: int
    mlp_dim: int
    output_dim: int
    max_positions: int = 512
    pooling: str = "cls"
    init_std: float = 0.02
    dtype: Any = jnp.float32
    embed: nn.Module | None = None

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray, extra: jnp.ndarray | None = None,
                 replace: jnp.ndarray | None = None, replacement: jnp.ndarray | None = None,
                 return_states: bool = False) -> jnp.ndarray | tuple[jnp.ndarray, jnp.ndarray]:
        """The text vectors [b, output_dim]; with `replace` (bool [b, len]) those tokens'
        embeddings are `replacement` [width] instead (MLM's [MASK]); with
        `return_states`, also the final token states [b, len, width] (float32)."""
        batch, length = ids.shape
        if length > self.max_positions:
            raise ValueError(f"transformer tower: texts of {length} tokens are longer than "
                             f"model.transformer.max_positions={self.max_positions}")
        init = nn.initializers.normal(stddev=self.init_std)
        table = towers.own_or_shared(self.embed, self.vocab_size, self.width, self.init_std)
        pos = self.param("pos_embed", _axes(init, "position", "embed"),
                         (self.max_positions, self.width))
        cls = self.param("cls", _axes(init, "embed"), (self.width,))
        tokens = table(ids)
        if replace is not None:
            assert replacement is not None, "replace comes with its replacement"
            tokens = jnp.where(replace[..., None], replacement.astype(tokens.dtype), tokens)
        x = tokens.astype(self.dtype) + pos[None, :length].astype(self.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls.astype(self.dtype), (batch, 1, self.width)),
                             x], axis=1)  # [b, 1 + len, width]
        keys = jnp.concatenate([jnp.ones((batch, 1), bool), mask], axis=1)
        for i in range(self.num_layers):
            x = EncoderLayer(self.num_heads, self.mlp_dim, self.init_std, self.dtype,
                             name=f"layer_{i}")(x, keys)
        x = _layer_norm(self.dtype, "ln_final")(x).astype(jnp.float32)
        pooled = x[:, 0] if self.pooling == "cls" else towers.masked_mean(x[:, 1:], mask)
        pooled = towers.concat(pooled, extra)
        out = nn.Dense(self.output_dim, dtype=self.dtype, name="output",
                       kernel_init=_axes(init, "embed", "output"),
                       bias_init=_axes(_zeros, "output"))(pooled.astype(self.dtype))
        return (out.astype(jnp.float32), x[:, 1:]) if return_states else out.astype(jnp.float32)


def make_transformer(vocab_size: int, name: str, embed: nn.Module | None = None, *,
                     transformer: TransformerSpec, output_dim: int, dtype: Any) -> nn.Module:
    t = transformer
    return TransformerTower(vocab_size, t.num_layers, t.width, t.num_heads, t.mlp_dim,
                            output_dim, t.max_positions, t.pooling, t.init_std, dtype, embed,
                            name=name)


def _check(settings: towers.Settings, max_lens: Mapping[str, int]) -> None:
    max_positions = settings["transformer"].max_positions
    for key, length in max_lens.items():
        if length > max_positions:
            raise ValueError(f"model.{key}={length} is longer than "
                             f"model.transformer.max_positions={max_positions}")


towers.register("transformer", make_transformer, check=_check,
                table=lambda s: (s["transformer"].width, s["transformer"].init_std))
