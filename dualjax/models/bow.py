"""The bag-of-words towers: "bow", the mean of a text's token vectors (Gillick et al.
2018), and "bow_mlp", that mean through a 2-layer tanh MLP (Chang et al. 2020). Their
settings: model.embed_dim, model.embed_init_std, and for bow_mlp model.hidden_dim and
model.output_dim (a bow tower's vectors are embed_dim wide)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from dualjax.models import towers


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
        if extra is not None:  # the config checks reject this earlier, with the key to change
            raise ValueError("the bow tower has no layer above the mean to feed categorical "
                             "features to; use bow_mlp, cnn or transformer")
        table = towers.own_or_shared(self.embed, self.vocab_size, self.embed_dim, self.init_std)
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
        x = towers.concat(x, extra)
        x = jnp.tanh(nn.Dense(self.hidden_dim, dtype=self.dtype, name="hidden")(x))
        return jnp.tanh(nn.Dense(self.output_dim, dtype=self.dtype, name="output")(x)
                        ).astype(jnp.float32)


def make_bow(vocab_size: int, name: str, embed: nn.Module | None = None, *, embed_dim: int,
             embed_init_std: float, dtype: Any) -> nn.Module:
    return BowTower(vocab_size, embed_dim, embed_init_std, embed, dtype, name=name)


def make_bow_mlp(vocab_size: int, name: str, embed: nn.Module | None = None, *,
                 embed_dim: int, hidden_dim: int, output_dim: int, embed_init_std: float,
                 dtype: Any) -> nn.Module:
    return BowMlpTower(vocab_size, embed_dim, hidden_dim, output_dim, embed_init_std, embed,
                       dtype, name=name)


towers.register("bow", make_bow, features=False, width=lambda s: s["embed_dim"])
towers.register("bow_mlp", make_bow_mlp)
