"""A BERT-family encoder tower (`model.tower="bert"`), shaped to take pretrained weights.

BERT (Devlin et al. 2019) as Hugging Face's BertModel computes it: token + absolute
position + token-type-0 embeddings, LayerNorm, then post-LN layers (x = LN(x +
attention(x)); x = LN(x + W2 gelu(W1 x))), GELU exact (erf), LayerNorm epsilon from the
model's config. The tokenizer puts [CLS] and [SEP] into the ids (`model.tokenizer="hf"`),
so the tower adds nothing; it pools the final states by the mask's mean
(sentence-transformers' mean pooling: [CLS] and [SEP] included, padding excluded) or
takes the first ([CLS]) state, and has no layer above: its vectors are the encoder's,
of size `hidden_size`.

Its sizes come from the pretrained folder's config.json (`BertConfig.from_hf`), never
from the run's config, and are saved with the run (WORKDIR/pretrained.json). Parameters
carry the same logical axis names as `towers.TransformerTower`'s, so FSDP shards them
alike; compute dtype as every tower's (`model.dtype`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from dualjax.models.layers import SelfAttention, _axes, _layer_norm, feed_forward
from dualjax.models.towers import _own_or_shared, masked_mean

POOLINGS = ("mean", "cls")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT encoder's sizes and pooling (hashable: a Flax module field)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    layer_norm_eps: float = 1e-12
    pooling: str = "mean"
    init_std: float = 0.02

    @classmethod
    def from_hf(cls, hf: dict, pooling: str) -> BertConfig:
        """From a Hugging Face BERT config.json's fields."""
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act={hf.get('hidden_act')!r}: only BERT's exact 'gelu' "
                             "is implemented")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("position_embedding_type="
                             f"{hf.get('position_embedding_type')!r}: only 'absolute' is "
                             "implemented")
        return cls(vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
                   num_layers=int(hf["num_hidden_layers"]),
                   num_heads=int(hf["num_attention_heads"]),
                   intermediate_size=int(hf["intermediate_size"]),
                   max_positions=int(hf["max_position_embeddings"]),
                   layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), pooling=pooling,
                   init_std=float(hf.get("initializer_range", 0.02)))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BertConfig:
        return cls(**data)


class BertLayer(nn.Module):
    """Post-LN: x = LN(x + attention(x)); x = LN(x + mlp_out(gelu(mlp_in(x))))."""
    num_heads: int
    intermediate_size: int
    eps: float
    init_std: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        x = _layer_norm(self.dtype, "ln_attn", self.eps)(
            x + SelfAttention(self.num_heads, self.init_std, self.dtype, name="attn")(x, mask))
        y = feed_forward(x, self.intermediate_size, self.init_std, self.dtype, approximate=False)
        return _layer_norm(self.dtype, "ln_mlp", self.eps)(x + y)


class BertTower(nn.Module):
    """ids [b, len] (with [CLS]/[SEP], from the hf tokenizer), mask [b, len] -> float32
    [b, hidden_size]: the pooled final states. `extra` (categorical feature vectors) has
    no layer to go to and is refused."""
    config: BertConfig
    dtype: Any = jnp.float32
    embed: nn.Module | None = None

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        c = self.config
        if extra is not None:  # config_lib rejects this earlier, naming the key
            raise ValueError("the bert tower has no layer above the encoder to feed "
                             "categorical features to")
        length = ids.shape[1]
        if length > c.max_positions:
            raise ValueError(f"bert tower: texts of {length} tokens are longer than its "
                             f"{c.max_positions} positions")
        init = nn.initializers.normal(stddev=c.init_std)
        table = _own_or_shared(self.embed, c.vocab_size, c.hidden_size, c.init_std)
        pos = self.param("pos_embed", _axes(init, "position", "embed"),
                         (c.max_positions, c.hidden_size))
        token_type = self.param("type_embed", _axes(init, "embed"), (c.hidden_size,))
        x = table(ids) + pos[None, :length] + token_type
        x = _layer_norm(self.dtype, "ln_embed", c.layer_norm_eps)(x.astype(self.dtype))
        for i in range(c.num_layers):
            x = BertLayer(c.num_heads, c.intermediate_size, c.layer_norm_eps, c.init_std,
                          self.dtype, name=f"layer_{i}")(x, mask)
        x = x.astype(jnp.float32)
        return x[:, 0] if c.pooling == "cls" else masked_mean(x, mask)

