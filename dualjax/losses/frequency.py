"""Sampling-frequency estimation for the logQ correction (Yi et al. 2019, "Sampling-bias-
corrected neural modeling"): in-batch negatives are sampled in proportion to how often a
document appears in the data, so softmax losses subtract log q_j from column j's logit.
These pure functions keep a streaming estimate of q in a small pytree that can live in
the train state; `losses` takes the resulting log q values as extras.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class StreamingFrequency(NamedTuple):
    """Yi et al. 2019's streaming estimate of how often each id is sampled, a pytree
    that can live in the train state. Ids are hashed into H buckets.

    last_step [H] int32: A, the last step each bucket was seen (0 at first).
    gap [H] float32: B, the moving average of the steps between sightings; q = 1 / B.
    """
    last_step: jnp.ndarray
    gap: jnp.ndarray


def init_frequency(num_buckets: int) -> StreamingFrequency:
    return StreamingFrequency(jnp.zeros((num_buckets,), jnp.int32),
                              jnp.zeros((num_buckets,), jnp.float32))


def _buckets(ids: jnp.ndarray, num_buckets: int) -> jnp.ndarray:
    """Multiplicative hash of int ids into [0, num_buckets)."""
    h = jnp.asarray(ids).astype(jnp.uint32) * jnp.uint32(2654435761)
    return (h % jnp.uint32(num_buckets)).astype(jnp.int32)


def update_frequency(state: StreamingFrequency, ids: jnp.ndarray, step: jnp.ndarray,
                     alpha: float = 0.01) -> StreamingFrequency:
    """One step of Yi et al.'s Algorithm: for each id seen at `step` (ids [n]),
    B[h] <- (1 - alpha) B[h] + alpha (step - A[h]), then A[h] <- step.

    An id seen several times in one step counts once (every copy writes the same value).
    """
    h = _buckets(ids, state.gap.shape[0])
    seen_gap = (step - state.last_step[h]).astype(jnp.float32)
    gap = state.gap.at[h].set((1 - alpha) * state.gap[h] + alpha * seen_gap)
    last = state.last_step.at[h].set(jnp.asarray(step, jnp.int32))
    return StreamingFrequency(last, gap)


def log_q(state: StreamingFrequency, ids: jnp.ndarray) -> jnp.ndarray:
    """log of the estimated per-step sampling probability of each id, [n]: -log B[h]
    (B floored at 1 step, so q <= 1)."""
    return -jnp.log(jnp.maximum(state.gap[_buckets(ids, state.gap.shape[0])], 1.0))
