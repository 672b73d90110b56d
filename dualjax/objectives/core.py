"""What an objective is: a parameter init and a pure loss, optionally with a second player.

`step.make_train_step` differentiates `Objective.loss` and applies the optimizer,
whatever the objective. An objective with a `Critic` (PSES's adversary) trains that
critic first, in the same jitted step: `Critic.steps` updates of its own parameters with
its own optimizer on the step's batch, each followed by clipping every critic weight to
[-clip, clip] (WGAN), then the objective's loss reads the updated critic from
`extras["critic"]`. The critic's parameters, optimizer state and update count live in
the train state under "critic", so they are checkpointed and resumed with the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

Params = dict
LossFn = Callable[[Params, dict, jax.Array, dict], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class Critic:
    """The second player: `init(rng) -> critic params`; `inputs(params, batch, rng)`: what
    it reads of a batch, computed once per step from the objective's params (no gradient
    flows to them); `loss(critic_params, inputs) -> (loss, metrics)`, minimised by `tx`."""
    init: Callable[[jax.Array], Params]
    inputs: Callable[[Params, dict, jax.Array], Any]
    loss: Callable[[Params, Any], tuple[jax.Array, dict]]
    tx: optax.GradientTransformation
    steps: int = 1       # critic updates per update of the objective's params
    clip: float = 0.0    # every critic weight clipped to [-clip, clip] after each update (0: off)


@dataclasses.dataclass(frozen=True)
class Objective:
    """`init(rng) -> params`; `loss(params, batch, rng, extras) -> (loss, metrics)`;
    `trainable(params)`: a bool tree, False where the optimizer leaves a param as it is
    (None: every param trains); `critic`: a second player, or None; `tables(params)`:
    {token table's module path: the batch's id fields that index it} when every read of
    those tables is a lookup of those ids, so that a step may update only the rows a batch
    reads (`dualjax.train.lazy_rows`); None: it may not."""
    init: Callable[[jax.Array], Params]
    loss: LossFn
    trainable: Callable[[Params], Any] | None = None
    critic: Critic | None = None
    tables: Callable[[Params], dict] | None = None


def init_critic_state(critic: Critic, rng: jax.Array) -> dict:
    """{"params", "opt_state", "step"} of a fresh critic, its weights already clipped."""
    params = clip_weights(critic.init(rng), critic.clip)
    return {"params": params, "opt_state": critic.tx.init(params), "step": jnp.int32(0)}


def clip_weights(params: Params, clip: float) -> Params:
    return jax.tree.map(lambda w: jnp.clip(w, -clip, clip), params) if clip else params


def update_critic(critic: Critic, state: dict, params: Params, batch: dict,
                  rng: jax.Array) -> tuple[dict, dict]:
    """`critic.steps` updates of the critic on this batch (each clipped); returns its new
    state and the metrics of its last update (with "critic_loss"), plus
    "critic_weight_max": the largest |weight| the critic held after any of this step's
    updates (at most `critic.clip` when clipping is on)."""
    inputs = jax.lax.stop_gradient(critic.inputs(params, batch, rng))
    grad_fn = jax.value_and_grad(critic.loss, has_aux=True)

    def one(state, _):
        (loss, metrics), grads = grad_fn(state["params"], inputs)
        updates, opt_state = critic.tx.update(grads, state["opt_state"], state["params"])
        new = clip_weights(optax.apply_updates(state["params"], updates), critic.clip)
        weight_max = jnp.max(jnp.stack([jnp.abs(w).max() for w in jax.tree.leaves(new)]))
        return ({"params": new, "opt_state": opt_state, "step": state["step"] + 1},
                {"critic_loss": loss, **metrics, "critic_weight_max": weight_max})

    state, history = jax.lax.scan(one, state, None, length=critic.steps)
    last = jax.tree.map(lambda x: x[-1], history)
    return state, {**last, "critic_weight_max": history["critic_weight_max"].max()}


def restrict(tx: optax.GradientTransformation, objective: Objective
             ) -> optax.GradientTransformation:
    """`tx` for the params `objective.trainable` marks; the others get no update."""
    if objective.trainable is None:
        return tx
    labels = lambda params: jax.tree.map(lambda t: "train" if t else "frozen",
                                         objective.trainable(params))
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
