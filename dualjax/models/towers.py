"""Text towers: the registry (`TOWERS`, `register`, `build`) and what the towers share.

A tower is a Flax linen module mapping token ids to one vector per text, and one module of
dualjax/models/ defines it and registers it: bow.py ("bow", "bow_mlp"), cnn.py,
transformer.py, bert.py, decoder.py, modernbert.py; a plugin registers its own the same
way (docs/design.md). A tower's factory takes the vocabulary size, the module name, the
shared token table (or None) and its settings as keyword arguments: the model-wide
settings it names in its signature (`model_settings`: model.embed_dim, model.output_dim,
the compute dtype, ...), the start's `architecture` for a tower built from a pretrained
start, and for a plugin the config group named after it (model.<name>).

Each tower takes `ids` int32 [batch, len] and `mask` bool [batch, len] (True on real
tokens), and optionally `extra` float [batch, e] (categorical feature vectors, appended
to the text vector before the tower's dense layers: bow_mlp's MLP, cnn's and the
transformer's output layer), and returns float32 [batch, dim]. Towers are looked up by
name in `TOWERS` (`model.tower`, or `model.query_tower` / `model.doc_tower` per side).

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
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models.layers import _axes
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


def compute_dtype(spec: ModelSpec) -> Any:
    """The towers' activation dtype (model.dtype)."""
    return DTYPES[spec.dtype]


def token_table(vocab_size: int, dim: int, std: float, name: str | None) -> TokenTable:
    """A token table [vocab_size, dim] initialised from N(0, std), its axes named."""
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


def own_or_shared(embed: nn.Module | None, vocab_size: int, dim: int, std: float
                  ) -> nn.Module:
    """`embed` if given, else the tower's own table "embed" (call inside nn.compact)."""
    return embed if embed is not None else token_table(vocab_size, dim, std, "embed")


def concat(x: jnp.ndarray, extra: jnp.ndarray | None) -> jnp.ndarray:
    """x [b, d] with the categorical feature vectors extra [b, e] appended (if any), in x's
    dtype (the feature tables are float32 params; their vectors join the compute dtype)."""
    return x if extra is None else jnp.concatenate([x, extra.astype(x.dtype)], axis=-1)


# ----------------------------------------------------------------------------- registry
# factory(vocab_size, name, embed=None, **settings) -> the tower module.
TowerFactory = Callable[..., nn.Module]
Settings = Mapping[str, Any]


def _output_dim(settings: Settings) -> int:
    return settings["output_dim"]


def _embed_table(settings: Settings) -> tuple[int, float]:
    return settings["embed_dim"], settings["embed_init_std"]


class Tower(NamedTuple):
    """A registered tower, as its module declares it.

    make: its factory (`register`'s docstring).
    from_pretrained: built from a pretrained start's architecture (model.pretrained: its
      sizes, then its weights), which the factory gets as `architecture=`.
    lora_targets: the names of the projections LoRA may adapt (`models.lora`; empty: it
      takes no adapters).
    remat: it has layers that model.remat recomputes in the backward pass.
    features: it has a layer above its pooled vector for categorical feature vectors
      (model.query_features / doc_features) to join.
    width: the size of its vectors, from its settings (`tower_settings`).
    table: (width, init std) of its token table, from its settings: what a table shared
      by both sides (model.shared_embedding) is made with.
    check: its settings' checks, given the sides' max lengths by the key that set each
      ({"query_max_len": 64, "doc_max_len": 256}, or {"max_len": 128}): ValueError
      naming the key of a value that cannot work; None: none.
    """
    make: TowerFactory
    from_pretrained: bool = False
    lora_targets: tuple[str, ...] = ()
    remat: bool = False
    features: bool = True
    width: Callable[[Settings], int] = _output_dim
    table: Callable[[Settings], tuple[int, float]] = _embed_table
    check: Callable[[Settings, Mapping[str, int]], None] | None = None


TOWERS: Registry[Tower] = Registry(
    "tower", lambda name, known: ValueError(f"model.tower={name!r} is not one of: {known}"))
# dualjax's own (models/bow.py, cnn.py, transformer.py, bert.py, decoder.py,
# modernbert.py), whose settings are the model-wide keys (`model_settings`) or a
# pretrained start's; a plugin's own settings are its group model.<name>.
BUILT_IN = ("bow", "bow_mlp", "cnn", "transformer", "bert", "decoder", "modernbert")


def register(name: str, factory: TowerFactory, **declared: Any) -> TowerFactory:
    """Adds tower `name` (ValueError if the name is taken); returns `factory`.

    factory(vocab_size, name, embed=None, **settings) -> a Flax module whose
    __call__(ids [b, len] int32, mask [b, len] bool, extra=None) gives the text vectors
    [b, width] (the model normalises them); `embed`: the token table the two sides share
    (model.shared_embedding), else None. Its keyword arguments are its settings: each
    one named like a model-wide setting (`model_settings`: output_dim, dtype, lora, ...)
    gets the run's value; the config group model.<name> (a plugin's own settings) is
    passed whole, and a key of it the factory does not take is a config error. `declared`:
    the `Tower` fields beyond `make` (from_pretrained, lora_targets, remat, features,
    width, table, check). docs/design.md walks through one; tests/project/test_plugins.py
    registers one from a test file."""
    TOWERS.add(name, Tower(factory, **declared))
    return factory


def model_settings(spec: ModelSpec, architecture: Any = None) -> dict[str, Any]:
    """The model-wide settings a tower's factory may name: the `ModelSpec` fields the
    towers read (the model.* keys of today's configs), the compute dtype as a jnp dtype,
    and a pretrained start's `architecture` (None without one)."""
    return {"embed_dim": spec.embed_dim, "hidden_dim": spec.hidden_dim,
            "output_dim": spec.output_dim, "embed_init_std": spec.embed_init_std,
            "cnn_windows": spec.cnn_windows, "cnn_filters": spec.cnn_filters,
            "transformer": spec.transformer, "dtype": compute_dtype(spec),
            "remat": spec.remat, "lora": spec.lora, "architecture": architecture}


def tower_settings(spec: ModelSpec, kind: str, architecture: Any = None) -> dict[str, Any]:
    """Every setting tower `kind` could read: the model-wide ones with its own group's
    (model.<kind>) over them."""
    return {**model_settings(spec, architecture), **spec.options_of(kind)}


def takes(kind: str) -> tuple[tuple[str, ...], bool]:
    """(the keyword arguments tower `kind`'s factory names beyond its first three,
    whether it also takes any others (**kwargs))."""
    params = list(inspect.signature(TOWERS[kind].make).parameters.values())[3:]
    named = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


def unknown_options(kind: str, options: Mapping[str, Any]) -> list[str]:
    """The keys of tower `kind`'s group model.<kind> its factory does not take."""
    named, anything = takes(kind)
    return [] if anything else [k for k in options if k not in named]


def build(kind: str, spec: ModelSpec, vocab_size: int, name: str,
          embed: nn.Module | None = None, architecture: Any = None) -> nn.Module:
    """Tower `kind`'s module, its factory given the settings it names (`register`) and,
    for a tower built from a pretrained start, the start's `architecture` (ValueError
    without one)."""
    tower = TOWERS[kind]
    if tower.from_pretrained and architecture is None:  # the config checks say so first
        raise ValueError(f"model.tower={kind!r} takes its sizes from model.pretrained")
    wide, own = model_settings(spec, architecture), spec.options_of(kind)
    named, _ = takes(kind)
    kwargs = {k: wide[k] for k in named if k in wide and k not in own}
    return tower.make(vocab_size, name, embed, **kwargs, **own)


def output_dim(spec: ModelSpec, kind: str, architecture: Any = None) -> int:
    """The size of the vectors tower `kind` returns (`Tower.width`)."""
    return TOWERS[kind].width(tower_settings(spec, kind, architecture))


def embedding_dim(spec: ModelSpec, kind: str) -> int:
    """The width of tower `kind`'s token table (`Tower.table`)."""
    return TOWERS[kind].table(tower_settings(spec, kind))[0]


def make_embedding(spec: ModelSpec, vocab_size: int, kind: str,
                   name: str | None = "embed") -> TokenTable:
    """The token table [vocab_size, width] that tower `kind` would make for itself (its
    width and init: `Tower.table`), for `model.shared_embedding`."""
    dim, std = TOWERS[kind].table(tower_settings(spec, kind))
    return token_table(vocab_size, dim, std, name)
