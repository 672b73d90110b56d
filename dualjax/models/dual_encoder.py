"""The dual encoder: a query tower and a document tower (one shared, or two), L2-
normalised outputs, and the similarity's scale and bias that turn cosines into logits.

Pure-functional: build the module with `make_model(config.model, vocab_size)`, get the
params pytree from `init_params`, and call `model.apply({"params": p}, ids, mask,
method="encode_queries")` and friends.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from dualjax.models.towers import TOWERS

SIMILARITIES = ("cosine_affine", "cosine_temperature")


def l2_normalize(x: jnp.ndarray, eps: float = 1e-12) -> jnp.ndarray:
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


class DualEncoder(nn.Module):
    """Two towers over token ids; embeddings are unit vectors [batch, dim].

    similarity = "cosine_affine": logits = alpha * cos + beta with learned alpha, beta
    (Gillick et al. 2018); "cosine_temperature": logits = cos / temperature, fixed
    (Mościcki 2022 uses 0.1).
    """
    config: ml_collections.ConfigDict
    vocab_size: int

    def setup(self):
        cfg = self.config
        make = TOWERS[cfg.tower]
        self.query_tower = make(cfg, self.vocab_size, "query_tower" if not cfg.shared_towers else "tower")
        self.doc_tower = self.query_tower if cfg.shared_towers else make(cfg, self.vocab_size, "doc_tower")
        if cfg.similarity == "cosine_affine":
            self.alpha = self.param("alpha", nn.initializers.constant(cfg.init_scale), ())
            self.beta = self.param("beta", nn.initializers.constant(cfg.init_bias), ())

    def encode_queries(self, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        return l2_normalize(self.query_tower(ids, mask))

    def encode_documents(self, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
        return l2_normalize(self.doc_tower(ids, mask))

    def scale_and_bias(self) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(scale, bias) such that logits = scale * cosine + bias."""
        if self.config.similarity == "cosine_affine":
            return self.alpha, self.beta
        return jnp.float32(1.0 / self.config.temperature), jnp.float32(0.0)

    def __call__(self, q_ids, q_mask, d_ids, d_mask):
        """Both towers and the similarity (used to create every parameter at init)."""
        q = self.encode_queries(q_ids, q_mask)
        d = self.encode_documents(d_ids, d_mask)
        scale, bias = self.scale_and_bias()
        return q, d, scale, bias


def make_model(model_config: ml_collections.ConfigDict, vocab_size: int) -> DualEncoder:
    return DualEncoder(ml_collections.FrozenConfigDict(model_config), vocab_size)


def init_params(model: DualEncoder, rng: jax.Array, max_len: int) -> dict:
    """The params pytree for `model`, from dummy inputs of length `max_len`."""
    ids = jnp.ones((1, max_len), jnp.int32)
    mask = jnp.ones((1, max_len), bool)
    return model.init(rng, ids, mask, ids, mask)["params"]
