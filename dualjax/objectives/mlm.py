"""Masked language modelling (Devlin et al. 2019), the token-level pre-training baseline
of Chang et al. 2020, for a Transformer document tower: as BERT's create_pretraining_data,
each text predicts exactly min(k, max(1, round(rate x its real tokens))) of them (k =
ceil(rate x max_len), the static number of slots), chosen at random, from the tower's
token states through the tied token table; of those, 80% are replaced by a learned
[MASK] vector, 10% by a random token and 10% kept. Its head (transform, LayerNorm,
output bias, [MASK] vector) lives under params["mlm"] and is dropped when fine-tuning.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models import dual_encoder
from dualjax.objectives.core import Objective, Params


class MlmHead(nn.Module):
    """BERT's prediction head: dense + GELU + LayerNorm on a token state, then logits
    over the vocabulary through the tied token table, plus an output bias. Also holds the
    learned [MASK] vector that replaces masked tokens' embeddings."""
    width: int
    vocab_size: int
    init_std: float = 0.02

    @nn.compact
    def __call__(self, states: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
        """states [..., width], table [vocab, width] -> logits [..., vocab]."""
        self.param("mask_embed", nn.initializers.normal(self.init_std), (self.width,))
        h = nn.Dense(self.width, name="transform",
                     kernel_init=nn.initializers.normal(self.init_std))(states)
        h = nn.LayerNorm(name="ln")(nn.gelu(h))
        bias = self.param("output_bias", nn.initializers.zeros_init(), (self.vocab_size,))
        return h @ table.T.astype(h.dtype) + bias


class Masked(NamedTuple):
    """Which tokens one MLM step predicts and how their inputs are corrupted."""
    ids: jnp.ndarray        # int32 [b, L]: the inputs, 10% of the predicted tokens random
    replace: jnp.ndarray    # bool [b, L]: inputs replaced by the [MASK] vector (80%)
    positions: jnp.ndarray  # int32 [b, k]: the predicted positions (slots)
    targets: jnp.ndarray    # int32 [b, k]: their original ids
    weights: jnp.ndarray    # float32 [b, k]: 1 for a real prediction, 0 for an empty slot


def num_to_predict(length: int, rate: float, k: int) -> int:
    """How many of a text's `length` real tokens MLM predicts: BERT's
    min(max_predictions, max(1, int(round(length x rate)))) (Python's round, half to
    even), none of an empty text."""
    return min(k, max(1, int(round(length * rate)))) if length else 0


def mask_tokens(rng: jax.Array, ids: jnp.ndarray, mask: jnp.ndarray, rate: float,
                vocab_size: int, k: int) -> Masked:
    """Each text predicts exactly `num_to_predict` (of its number of real tokens) of its
    real tokens, chosen uniformly at random (the smallest of one uniform draw per token);
    only those are corrupted. The slots past a text's count have weight 0."""
    choose, corrupt, random_ids = jax.random.split(rng, 3)
    k = min(k, ids.shape[1])
    u = jax.random.uniform(choose, ids.shape)
    # The real tokens first, in random order; then the pads.
    positions = jnp.argsort(jnp.where(mask, u, 2.0), axis=1)[:, :k].astype(jnp.int32)
    # The count per length, by Python's rounding (static: one entry per possible length).
    counts = jnp.asarray(np.array([num_to_predict(n, rate, k) for n in range(ids.shape[1] + 1)],
                                  np.int32))
    weights = jnp.arange(k)[None] < counts[mask.sum(axis=1)][:, None]
    rows = jnp.arange(ids.shape[0])[:, None]
    predicted = jnp.zeros(ids.shape, bool).at[rows, positions].max(weights)
    r = jax.random.uniform(corrupt, ids.shape)
    randomised = predicted & (r >= 0.8) & (r < 0.9)
    inputs = jnp.where(randomised, jax.random.randint(random_ids, ids.shape, 1, vocab_size), ids)
    return Masked(inputs, predicted & (r < 0.8), positions,
                  jnp.take_along_axis(ids, positions, axis=1), weights.astype(jnp.float32))


def token_table(params: Params) -> jnp.ndarray:
    """The document tower's token table [vocab, width] (tied to the MLM output)."""
    for key in ("embed", "tower", "doc_tower"):  # shared table, one tower, two towers
        if key in params:
            return params[key]["embedding"] if key == "embed" else params[key]["embed"]["embedding"]
    raise KeyError("no token table in the params")


def objective(model: dual_encoder.DualEncoder, max_len: int, width: int,
              rate: float = 0.15) -> Objective:
    """Masked language modelling on the documents of a batch (d_ids, d_mask)."""
    k = max(1, math.ceil(rate * max_len))
    head = MlmHead(width, model.vocab_size)

    def init(rng):
        towers, head_rng = jax.random.split(rng)
        params = dual_encoder.init_params(model, towers, max_len)
        params["mlm"] = head.init(head_rng, jnp.zeros((1, width)),
                                  token_table(params))["params"]
        return params

    def loss(params, batch, rng, extras):
        del extras
        m = mask_tokens(rng, batch["d_ids"], batch["d_mask"], rate, model.vocab_size, k)
        states = model.apply({"params": params}, m.ids, batch["d_mask"], m.replace,
                             params["mlm"]["mask_embed"], method="document_token_states")
        picked = jnp.take_along_axis(states, m.positions[..., None], axis=1)  # [b, k, width]
        logits = head.apply({"params": params["mlm"]}, picked, token_table(params))
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, m.targets[..., None], axis=-1)[..., 0]
        total = jnp.maximum(m.weights.sum(), 1.0)
        correct = (jnp.argmax(logits, axis=-1) == m.targets) * m.weights
        return (nll * m.weights).sum() / total, {"mlm_accuracy": correct.sum() / total,
                                                 "masked_tokens": m.weights.sum()}

    return Objective(init, loss)
