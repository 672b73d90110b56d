"""Text towers: Flax linen modules mapping token ids to one vector per text.

Each tower takes `ids` int32 [batch, len] and `mask` bool [batch, len] (True on real
tokens) and returns float32 [batch, dim]. Towers are looked up by name in `TOWERS`
(`model.tower` in the config); each constructor takes the `model` config group.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections


def masked_mean(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Mean of x [batch, len, dim] over the positions where mask [batch, len] is True.

    A row with no real token (an empty text) gives the zero vector.
    """
    m = mask[..., None].astype(x.dtype)
    return (x * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)


class BowTower(nn.Module):
    """Mean of word embeddings over non-pad tokens (Gillick et al. 2018)."""
    vocab_size: int
    embed_dim: int
    init_std: float = 1.0

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        emb = nn.Embed(self.vocab_size, self.embed_dim, name="embed",
                       embedding_init=nn.initializers.normal(stddev=self.init_std))(ids)
        return masked_mean(emb, mask)


class BowMlpTower(nn.Module):
    """Mean-pooled word embeddings, then a 2-layer tanh MLP (Chang et al. 2020)."""
    vocab_size: int
    embed_dim: int
    hidden_dim: int
    output_dim: int
    init_std: float = 1.0

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        x = BowTower(self.vocab_size, self.embed_dim, self.init_std, name="bow")(ids, mask)
        x = jnp.tanh(nn.Dense(self.hidden_dim, name="hidden")(x))
        return jnp.tanh(nn.Dense(self.output_dim, name="output")(x))


def _bow(cfg: ml_collections.ConfigDict, vocab_size: int, name: str) -> nn.Module:
    return BowTower(vocab_size, cfg.embed_dim, cfg.embed_init_std, name=name)


def _bow_mlp(cfg: ml_collections.ConfigDict, vocab_size: int, name: str) -> nn.Module:
    return BowMlpTower(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.output_dim,
                       cfg.embed_init_std, name=name)


TOWERS: dict[str, Callable[[ml_collections.ConfigDict, int, str], nn.Module]] = {
        "bow": _bow,
        "bow_mlp": _bow_mlp,
}
