"""A BERT-family encoder tower (`model.tower="bert"`), shaped to take pretrained weights:
BERT, and MPNet (Song et al. 2020; all-mpnet-base-v2) as its two differences from BERT.

BERT (Devlin et al. 2019) as Hugging Face's BertModel computes it: token + absolute
position + token-type-0 embeddings, LayerNorm, then post-LN layers (x = LN(x +
attention(x)); x = LN(x + W2 gelu(W1 x))), GELU exact (erf), LayerNorm epsilon from the
model's config. The tokenizer puts [CLS] and [SEP] into the ids (`model.tokenizer="hf"`),
so the tower adds nothing; it pools the final states by the mask's mean
(sentence-transformers' mean pooling: [CLS] and [SEP] included, padding excluded) or
takes the first ([CLS]) state, and has no layer above: its vectors are the encoder's,
of size `hidden_size`.

MPNet (`BertConfig.family="mpnet"`, Hugging Face's MPNetModel) has no token-type
embedding, numbers positions from padding_idx + 1 (2: its positions table's first two
rows are never read for a text's tokens), and adds to every layer's attention logits one
learned bias per head and relative-position bucket (`relative_buckets`), shared by the
layers. Otherwise the layers are BERT's.

Its sizes come from the pretrained folder's config.json (`BertConfig.from_hf`), never
from the run's config, and are saved with the run (WORKDIR/pretrained.json). Parameters
carry the same logical axis names as `transformer.TransformerTower`'s, so FSDP shards them
alike; compute dtype as every tower's (`model.dtype`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from dualjax.models import towers
from dualjax.models.layers import SelfAttention, _axes, _layer_norm, feed_forward
from dualjax.models.lora import LoraSpec
from dualjax.models.spec import Architecture
from dualjax.models.towers import masked_mean, own_or_shared

POOLINGS = ("mean", "cls")
FAMILIES = ("bert", "mpnet")  # Hugging Face model_type values the tower reads


@dataclasses.dataclass(frozen=True)
class BertConfig(Architecture):
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
    family: str = "bert"  # "mpnet": no token type, shifted positions, relative bias
    relative_buckets: int = 0  # MPNet's relative-position buckets (32); 0: none
    position_offset: int = 0  # MPNet: padding_idx + 1, the first text position's row

    @classmethod
    def from_hf(cls, hf: dict, pooling: str) -> BertConfig:
        """From a Hugging Face BERT or MPNet config.json's fields."""
        family = hf.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"model_type {family!r} is not one of {', '.join(FAMILIES)}")
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
                   init_std=float(hf.get("initializer_range", 0.02)), family=family,
                   relative_buckets=int(hf.get("relative_attention_num_buckets", 32))
                   if family == "mpnet" else 0,
                   position_offset=int(hf.get("pad_token_id", 1)) + 1 if family == "mpnet"
                   else 0)

    @property
    def max_length(self) -> int:
        """The longest text (special tokens included) the positions table numbers."""
        return self.max_positions - self.position_offset



class BertLayer(nn.Module):
    """Post-LN: x = LN(x + attention(x)); x = LN(x + mlp_out(gelu(mlp_in(x))))."""
    num_heads: int
    intermediate_size: int
    eps: float
    init_std: float
    dtype: Any = jnp.float32
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray,
                 bias: jnp.ndarray | None = None) -> jnp.ndarray:
        x = _layer_norm(self.dtype, "ln_attn", self.eps)(
            x + SelfAttention(self.num_heads, self.init_std, self.dtype, self.lora,
                              name="attn")(x, mask, bias))
        y = feed_forward(x, self.intermediate_size, self.init_std, self.dtype, approximate=False,
                         module=self, lora=self.lora)
        return _layer_norm(self.dtype, "ln_mlp", self.eps)(x + y)


class BertTower(nn.Module):
    """ids [b, len] (with [CLS]/[SEP], from the hf tokenizer), mask [b, len] -> float32
    [b, hidden_size]: the pooled final states. `extra` (categorical feature vectors) has
    no layer to go to and is refused."""
    config: BertConfig
    dtype: Any = jnp.float32
    embed: nn.Module | None = None
    lora: LoraSpec = LoraSpec()  # adapters on its projections (models/lora.py)

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        c = self.config
        if extra is not None:  # config_lib rejects this earlier, naming the key
            raise ValueError("the bert tower has no layer above the encoder to feed "
                             "categorical features to")
        length = ids.shape[1]
        if length > c.max_length:
            raise ValueError(f"bert tower: texts of {length} tokens are longer than its "
                             f"{c.max_length} positions")
        init = nn.initializers.normal(stddev=c.init_std)
        table = own_or_shared(self.embed, c.vocab_size, c.hidden_size, c.init_std)
        pos = self.param("pos_embed", _axes(init, "position", "embed"),
                         (c.max_positions, c.hidden_size))
        x = table(ids) + pos[None, c.position_offset:c.position_offset + length]
        if c.family == "bert":
            x = x + self.param("type_embed", _axes(init, "embed"), (c.hidden_size,))
        x = _layer_norm(self.dtype, "ln_embed", c.layer_norm_eps)(x.astype(self.dtype))
        bias = None
        if c.relative_buckets:  # [heads, keys, queries], as the attention's logits
            rel = self.param("rel_bias", _axes(init, None, "heads"),
                             (c.relative_buckets, c.num_heads))
            bias = jnp.transpose(jnp.asarray(rel)[relative_buckets(length, c.relative_buckets)],
                                 (2, 1, 0))
        for i in range(c.num_layers):
            x = BertLayer(c.num_heads, c.intermediate_size, c.layer_norm_eps, c.init_std,
                          self.dtype, self.lora, name=f"layer_{i}")(x, mask, bias)
        x = x.astype(jnp.float32)
        return x[:, 0] if c.pooling == "cls" else masked_mean(x, mask)



def relative_buckets(length, num_buckets: int, max_distance: int = 128) -> jnp.ndarray:
    """int32 [queries, keys]: MPNet's bucket of key position - query position, as
    Hugging Face's MPNetEncoder.relative_position_bucket computes it: half the buckets
    for keys after the query; within each half, exact distances below num_buckets / 4,
    logarithmic ones up to max_distance, the last bucket beyond. `length` may be a
    symbolic dimension (an exported encoder's), so the logarithmic buckets are counted
    against thresholds fixed here (`_log_thresholds`) rather than computed per pair."""
    half = num_buckets // 2
    max_exact = half // 2
    positions = jnp.arange(length)
    n = positions[:, None] - positions[None, :]  # query - key
    ret = (n < 0).astype(jnp.int32) * half
    n = jnp.abs(n)
    thresholds = jnp.asarray(_log_thresholds(num_buckets, max_distance))
    large = max_exact + (n[..., None] >= thresholds).sum(-1, dtype=jnp.int32)
    return ret + jnp.where(n < max_exact, n, large)


def _log_thresholds(num_buckets: int, max_distance: int) -> np.ndarray:
    """The smallest distance of each logarithmic bucket after the first, from torch's
    formula max_exact + trunc(log(n / max_exact) / log(max_distance / max_exact) *
    (half - max_exact)) evaluated in float32 as it does (so a boundary falls where its
    rounding puts it), capped at half - 1."""
    half = num_buckets // 2
    max_exact = half // 2
    n = np.arange(max_exact, 2 * max_distance + 1)
    bucket = max_exact + (np.log(n.astype(np.float32) / np.float32(max_exact))
                          / np.float32(np.log(max_distance / max_exact))
                          * np.float32(half - max_exact)).astype(np.int64)
    bucket = np.minimum(bucket, half - 1)
    return np.array([n[np.argmax(bucket >= b)] for b in range(max_exact + 1, half)], np.int32)


def make_bert(vocab_size: int, name: str, embed: nn.Module | None = None, *,
              architecture: BertConfig, dtype: Any, lora: LoraSpec) -> nn.Module:
    """model.tower="bert": a BERT-family encoder of the pretrained start's sizes
    (`architecture`; its weights replace the initialisation, `train.warm_start`)."""
    del vocab_size  # the start's own (architecture.vocab_size)
    return BertTower(architecture, dtype, embed, lora, name=name)


# The projections LoRA may adapt (model.lora_targets)
LORA_TARGETS = ("query", "key", "value", "out", "mlp_in", "mlp_out")
towers.register("bert", make_bert, from_pretrained=True, lora_targets=LORA_TARGETS,
                features=False, width=lambda s: s["architecture"].hidden_size)
