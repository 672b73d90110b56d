"""Text towers: Flax linen modules mapping token ids to one vector per text.

Each tower takes `ids` int32 [batch, len] and `mask` bool [batch, len] (True on real
tokens), and optionally `extra` float [batch, e] (categorical feature vectors, appended
to the text vector before the tower's dense layers: bow_mlp's MLP, cnn's and the
transformer's output layer), and returns float32 [batch, dim]. Towers are looked up by
name in `TOWERS`
(`model.tower`, or `model.query_tower` / `model.doc_tower` per side); each constructor
takes the `ModelSpec` (models/spec.py), the vocabulary size, the module name and optionally a
token-embedding module to use instead of its own table (`model.shared_embedding`: one
table for both sides, built by `make_embedding`).

Compute dtype (`model.dtype`, `compute_dtype`): "bfloat16" runs every tower's activations
in bfloat16 (token vectors cast after the lookup, Dense / Conv / attention matmuls with
bfloat16 operands) while every parameter stays float32 (flax param_dtype); masked means
accumulate in float32, and each tower returns float32, so the normalised embeddings and
the loss are float32 whatever the compute dtype.

Padding never changes a text's vector: every tower reads only the positions where mask
is True, and appending pads to a text leaves its vector as it was.

Parameters carry logical axis names (`nn.with_logical_partitioning`): the token table
("vocab", "embed") in every tower, and every Transformer weight (("embed", "mlp"),
("embed", "heads", "kv"), ...), so a second mesh axis can shard them later.
`dual_encoder.init_params` returns them unboxed (plain arrays); `dual_encoder.logical_axes`
gives the names.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models.layers import SelfAttention, _axes, _layer_norm, _zeros, feed_forward
from dualjax.models.spec import ModelSpec
from dualjax.runtime.registry import Registry

DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

def masked_mean(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Mean of x [batch, len, dim] over the positions where mask [batch, len] is True, as
    float32 [batch, dim] whatever x's dtype (a bfloat16 x is summed in float32: its 8-bit
    mantissa would drop small terms of a long running sum).

    A row with no real token (an empty text) gives the zero vector.
    """
    m = mask[..., None]
    total = jnp.where(m, x, 0).sum(axis=1, dtype=jnp.float32)
    return total / jnp.maximum(m.sum(axis=1, dtype=jnp.float32), 1.0)


def masked_max(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Max of x [batch, len, dim] over the positions where mask [batch, len] is True.

    Pads are -inf before the max, so they never win (even over all-negative values); a row
    with no real token gives the zero vector (not -inf), with zero gradient.
    """
    x = jnp.where(mask[..., None], x, -jnp.inf).max(axis=1)
    return jnp.where(mask.any(axis=1, keepdims=True), x, 0.0)


def parse_windows(windows: str) -> tuple[int, ...]:
    """model.cnn_windows ("3,4,5") as a tuple of distinct positive ints; ValueError if not."""
    try:
        out = tuple(int(w) for w in windows.split(",") if w.strip())
    except ValueError:
        out = ()
    if not out or min(out) <= 0 or len(set(out)) != len(out):
        raise ValueError(f"model.cnn_windows={windows!r} must be distinct positive window sizes "
                         "separated by commas, like '5' or '3,4,5'")
    return out


def compute_dtype(spec: ModelSpec) -> Any:
    """The towers' activation dtype (model.dtype)."""
    return DTYPES[spec.dtype]


def embedding_dim(spec: ModelSpec, tower: str) -> int:
    """Width of the token table of tower `tower` (the Transformer's width, else embed_dim)."""
    return spec.transformer.width if tower == "transformer" else spec.embed_dim


def output_dim(spec: ModelSpec, tower: str) -> int:
    """Size of the vectors tower `tower` returns (embed_dim for bow, else output_dim)."""
    return spec.embed_dim if tower == "bow" else spec.output_dim


def make_embedding(spec: ModelSpec, vocab_size: int, tower: str,
                   name: str | None = "embed") -> TokenTable:
    """The token table [vocab_size, embedding_dim] that tower `tower` would make for itself
    (its width and init), for `model.shared_embedding`."""
    std = spec.transformer.init_std if tower == "transformer" else spec.embed_init_std
    return _table(vocab_size, embedding_dim(spec, tower), std, name)


def _table(vocab_size: int, dim: int, std: float, name: str | None) -> TokenTable:
    return TokenTable(vocab_size, dim, name=name,
                      embedding_init=_axes(nn.initializers.normal(stddev=std), "vocab", "embed"))


def bag_sum(table: jnp.ndarray, ids: jnp.ndarray, mask: jnp.ndarray,
            dtype: Any = jnp.float32) -> jnp.ndarray:
    """sum over l of table[ids[:, l]] (each row cast to `dtype`) where mask[:, l], as
    float32 [batch, dim]: a bag of words without the [batch, len, dim] array of its
    token vectors.

    Equal to `masked_mean`'s sum of `table[ids].astype(dtype)`, but computed one position
    at a time (a loop of [batch, dim] gathers), and its gradient w.r.t. the table is a
    loop of [batch, dim] scatter-adds into it: XLA on CPU would otherwise write the
    [batch, len, dim] token vectors in the forward pass and their broadcast cotangent in
    the backward pass (scripts/bench/bench_train.py: 5,000-word tables, the whole step 2x
    faster)."""
    return _bag_sum(table, ids, mask, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _bag_sum(table, ids, mask, dtype):
    def add(pos, total):
        rows = table[ids[:, pos]].astype(dtype).astype(jnp.float32)
        return total + jnp.where(mask[:, pos, None], rows, 0.0)
    return jax.lax.fori_loop(0, ids.shape[1], add,
                             jnp.zeros((ids.shape[0], table.shape[1]), jnp.float32))


def _bag_sum_fwd(table, ids, mask, dtype):
    return _bag_sum(table, ids, mask, dtype), (ids, mask, jnp.zeros((0,), table.dtype),
                                                table.shape[0], table.shape[1])


def _bag_sum_bwd(dtype, residuals, cotangent):
    ids, mask, like, rows, dim = residuals
    # d/d(row) of row.astype(dtype).astype(float32) is the cotangent through both casts.
    ct = cotangent.astype(dtype).astype(like.dtype)
    where = jnp.where(mask, ids, rows)  # pads point past the table and are dropped

    def add(pos, grad):
        return grad.at[where[:, pos]].add(ct, mode="drop")
    grad = jax.lax.fori_loop(0, ids.shape[1], add, jnp.zeros((rows, dim), like.dtype))
    zero = lambda x: np.zeros(x.shape, jax.dtypes.float0)
    return grad, zero(ids), zero(mask)


_bag_sum.defvjp(_bag_sum_fwd, _bag_sum_bwd)


class TokenTable(nn.Embed):
    """A tower's token table: nn.Embed (params "embedding" [rows, dim]) that also sums a
    text's token vectors (`bag`). Both read the table through `source`, the one place a
    train step that updates only the rows its batch touches (`dualjax.train.lazy_rows`) swaps
    the table for those rows."""

    def source(self, ids: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(the array to read, the ids into it): the table and `ids`."""
        return self.embedding, ids

    def __call__(self, ids: jnp.ndarray) -> jnp.ndarray:
        table, ids = self.source(ids)
        return jnp.take(table, ids, axis=0)

    def bag(self, ids: jnp.ndarray, mask: jnp.ndarray, dtype: Any = jnp.float32
            ) -> jnp.ndarray:
        """`bag_sum` of this table: float32 [batch, dim]."""
        table, ids = self.source(ids)
        return bag_sum(table, ids, mask, dtype)


def _own_or_shared(embed: nn.Module | None, vocab_size: int, dim: int, std: float
                   ) -> nn.Module:
    """`embed` if given, else the tower's own table "embed" (call inside nn.compact)."""
    return embed if embed is not None else _table(vocab_size, dim, std, "embed")


def _concat(x: jnp.ndarray, extra: jnp.ndarray | None) -> jnp.ndarray:
    """x [b, d] with the categorical feature vectors extra [b, e] appended (if any), in x's
    dtype (the feature tables are float32 params; their vectors join the compute dtype)."""
    return x if extra is None else jnp.concatenate([x, extra.astype(x.dtype)], axis=-1)


class BowTower(nn.Module):
    """Mean of word embeddings over non-pad tokens (Gillick et al. 2018); the token vectors
    in `dtype`, their mean accumulated and returned in float32."""
    vocab_size: int
    embed_dim: int
    init_std: float = 1.0
    embed: nn.Module | None = None  # a shared token table instead of this tower's own
    dtype: Any = jnp.float32  # activations (model.dtype); the table stays float32

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        if extra is not None:  # config_lib rejects this earlier, with the key to change
            raise ValueError("the bow tower has no layer above the mean to feed categorical "
                             "features to; use bow_mlp, cnn or transformer")
        table = _own_or_shared(self.embed, self.vocab_size, self.embed_dim, self.init_std)
        return table.bag(ids, mask, self.dtype) / jnp.maximum(
            mask.sum(axis=1, keepdims=True, dtype=jnp.float32), 1.0)


class BowMlpTower(nn.Module):
    """Mean-pooled word embeddings, then a 2-layer tanh MLP (Chang et al. 2020)."""
    vocab_size: int
    embed_dim: int
    hidden_dim: int
    output_dim: int
    init_std: float = 1.0
    embed: nn.Module | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        x = BowTower(self.vocab_size, self.embed_dim, self.init_std, self.embed, self.dtype,
                     name="bow")(ids, mask).astype(self.dtype)
        x = _concat(x, extra)
        x = jnp.tanh(nn.Dense(self.hidden_dim, dtype=self.dtype, name="hidden")(x))
        return jnp.tanh(nn.Dense(self.output_dim, dtype=self.dtype, name="output")(x)
                        ).astype(jnp.float32)


class CnnTower(nn.Module):
    """Bonadiman et al. 2019 §2.1.1: word embeddings -> 1-D convolutions ('SAME') of each
    window size with `filters` filters -> tanh -> max over the text's positions ->
    concatenated [batch, len(windows) * filters] -> linear [batch, output_dim].

    Pad embeddings are zeroed before the convolutions, so a window running past the text's
    end sees the same zeros as the 'SAME' padding of a text without pads.
    """
    vocab_size: int
    embed_dim: int
    windows: tuple[int, ...]
    filters: int
    output_dim: int
    init_std: float = 1.0
    embed: nn.Module | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        table = _own_or_shared(self.embed, self.vocab_size, self.embed_dim, self.init_std)
        x = jnp.where(mask[..., None], table(ids).astype(self.dtype), 0)  # [b, len, embed]
        pooled = [masked_max(jnp.tanh(nn.Conv(self.filters, (w,), padding="SAME",
                                              dtype=self.dtype, name=f"conv_{w}")(x)), mask)
                  for w in self.windows]  # each [b, filters]
        return nn.Dense(self.output_dim, dtype=self.dtype, name="output")(
            _concat(jnp.concatenate(pooled, axis=-1), extra)).astype(jnp.float32)


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
        table = _own_or_shared(self.embed, self.vocab_size, self.width, self.init_std)
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
        pooled = x[:, 0] if self.pooling == "cls" else masked_mean(x[:, 1:], mask)
        pooled = _concat(pooled, extra)
        out = nn.Dense(self.output_dim, dtype=self.dtype, name="output",
                       kernel_init=_axes(init, "embed", "output"),
                       bias_init=_axes(_zeros, "output"))(pooled.astype(self.dtype))
        return (out.astype(jnp.float32), x[:, 1:]) if return_states else out.astype(jnp.float32)


# ----------------------------------------------------------------------------- registry
def _bow(spec: ModelSpec, vocab_size: int, name: str,
         embed: nn.Module | None = None) -> nn.Module:
    return BowTower(vocab_size, spec.embed_dim, spec.embed_init_std, embed, compute_dtype(spec),
                    name=name)


def _bow_mlp(spec: ModelSpec, vocab_size: int, name: str,
             embed: nn.Module | None = None) -> nn.Module:
    return BowMlpTower(vocab_size, spec.embed_dim, spec.hidden_dim, spec.output_dim,
                       spec.embed_init_std, embed, compute_dtype(spec), name=name)


def _cnn(spec: ModelSpec, vocab_size: int, name: str,
         embed: nn.Module | None = None) -> nn.Module:
    return CnnTower(vocab_size, spec.embed_dim, spec.cnn_windows, spec.cnn_filters,
                    spec.output_dim, spec.embed_init_std, embed, compute_dtype(spec), name=name)


def _transformer(spec: ModelSpec, vocab_size: int, name: str,
                 embed: nn.Module | None = None) -> nn.Module:
    t = spec.transformer
    return TransformerTower(vocab_size, t.num_layers, t.width, t.num_heads, t.mlp_dim,
                            spec.output_dim, t.max_positions, t.pooling, t.init_std,
                            compute_dtype(spec), embed, name=name)


# name -> factory(spec, vocab_size, name, embed=None, **options) -> the tower module.
TowerFactory = Callable[..., nn.Module]


class Tower(NamedTuple):
    """A registered tower: its factory, and whether it is built from a pretrained
    start's architecture (model.pretrained: its sizes, then its weights), which the
    factory then gets as `architecture=` (a `BertConfig` for "bert", a `DecoderConfig`
    for "decoder"); and the names of the projections LoRA may adapt (`models.lora`;
    empty: it takes no adapters)."""
    make: TowerFactory
    from_pretrained: bool = False
    lora_targets: tuple[str, ...] = ()


TOWERS: Registry[Tower] = Registry(
    "tower", lambda name, known: ValueError(f"model.tower={name!r} is not one of: {known}"))
for _name, _factory in (("bow", _bow), ("bow_mlp", _bow_mlp), ("cnn", _cnn),
                        ("transformer", _transformer)):
    TOWERS.add(_name, Tower(_factory))
# dualjax's own, whose settings are ModelSpec's fields or a pretrained start's ("bert",
# "decoder": models/bert.py and models/decoder.py register them)
BUILT_IN = (*TOWERS, "bert", "decoder", "modernbert")


def register(name: str, factory: TowerFactory, from_pretrained: bool = False,
             lora_targets: tuple[str, ...] = ()) -> TowerFactory:
    """Adds tower `name` (ValueError if the name is taken); returns `factory`.

    factory(spec, vocab_size, name, embed=None, **options) -> a Flax module whose
    __call__(ids [b, len] int32, mask [b, len] bool, extra=None) gives the text vectors
    [b, spec.output_dim] (the model normalises them); `embed`: the token table the two
    sides share (model.shared_embedding), else None; `options`: the config group
    model.<name>, when the config has one (`ModelSpec.options_of`), and with
    `from_pretrained` the start's architecture (`architecture=`, model.pretrained's).
    lora_targets: the names of its projections that take LoRA adapters
    (model.lora_targets; the module adds `models.lora.delta` where it projects, reading
    `spec.lora`). docs/design.md walks through one; tests/project/test_plugins.py
    registers one from a test file."""
    TOWERS.add(name, Tower(factory, from_pretrained, lora_targets))
    return factory


def build(kind: str, spec: ModelSpec, vocab_size: int, name: str,
          embed: nn.Module | None = None, architecture: Any = None) -> nn.Module:
    """Tower `kind`'s module, with its settings (`spec.options_of`) and, for a tower built
    from a pretrained start, the start's `architecture` (ValueError without one)."""
    tower = TOWERS[kind]
    extra = {}
    if tower.from_pretrained:
        if architecture is None:  # the config checks say so earlier, naming the keys
            raise ValueError(f"model.tower={kind!r} takes its sizes from model.pretrained")
        extra = {"architecture": architecture}
    return tower.make(spec, vocab_size, name, embed, **spec.options_of(kind), **extra)
