"""One training update: the initial train state (`make_init_state`) and the jitted step
(`make_train_step` -> `TrainStep`; the optimizer: `objectives.optimizer`), with the
check that stops a run whose loss, gradient or params stop being finite.

`train.py` runs these in its loop; the benchmarks (scripts/bench/bench_train.py,
bench_scale.py) time the same step alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualjax import objectives
from dualjax.errors import NonFiniteLossError  # noqa: F401 (raised here)
from dualjax.losses import frequency
from dualjax.train import lazy_rows

State = dict[str, Any]  # {"params", "opt_state", "step", "rng"[, "critic", "frequency"]}


# ----------------------------------------------------------------------------- state
def make_init_state(objective: objectives.Objective, tx: optax.GradientTransformation,
                    log_q_buckets: int = 0) -> Callable[..., State]:
    """(seed, given) -> the initial train state {"params", "opt_state", "step", "rng"},
    plus "critic" ({"params", "opt_state", "step"}) for an objective with a second player
    and "frequency" (the streaming document-frequency estimate) when `log_q_buckets` > 0.

    `given` ({key path of a param (`jax.tree_util.keystr`): its array}, e.g. a
    pretrained start's weights, `warm_start.given`) replaces those params' random
    initialisation: jitted, the random values of those params are never computed (XLA
    drops what no output reads), so a start's weights cost no initialisation and no
    second copy of the towers."""

    def init_state(seed: int, given: Mapping[str, jax.Array] | None = None) -> State:
        params = with_given(objective.init(jax.random.PRNGKey(seed)), given)
        state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0),
                 "rng": jax.random.PRNGKey(seed + 1)}
        if objective.critic is not None:
            state["critic"] = objectives.init_critic_state(objective.critic,
                                                           jax.random.PRNGKey(seed + 2))
        if log_q_buckets:
            state["frequency"] = frequency.init_frequency(log_q_buckets)
        return state

    return init_state


def with_given(params: Any, given: Mapping[str, jax.Array] | None) -> Any:
    """`params` with the leaves `given` names (by `jax.tree_util.keystr` of their path)
    replaced: under jit, the values they replace are never computed."""
    if not given:
        return params
    paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    assert paths >= set(given), f"not params: {sorted(set(given) - paths)[:3]}"
    return jax.tree_util.tree_map_with_path(
        lambda path, x: given.get(jax.tree_util.keystr(path), x), params)


# ----------------------------------------------------------------------------- step
def make_train_step(objective: objectives.Objective, tx, schedule, state_sharding,
                    batch_sharding, replicated, log_q_alpha: float = 0.01,
                    table_updates: str = "dense"):
    """The jitted update: state, global batch -> new state, flat dict of metrics.
    table_updates="lazy": the token tables' gradient and update cover only the rows the
    batch reads (`dualjax.train.lazy_rows`; the objective must name its tables)."""
    if table_updates == "lazy" and objective.tables is None:
        raise ValueError("optimizer.table_updates='lazy' needs an objective whose token "
                         "tables are read only by lookups of the batch's ids")

    def step(state: State, batch: dict, norms: jax.Array) -> tuple[State, dict]:
        rng = jax.random.fold_in(state["rng"], state["step"])

        # Ids of the documents let the loss mask a document that is twice in the batch.
        extras = {"doc_ids": batch["doc_ids"]} if "doc_ids" in batch else {}
        new_state = {**state, "step": state["step"] + 1}
        if "frequency" in state:  # logQ: frequencies as seen up to and including this batch
            new_state["frequency"] = frequency.update_frequency(
                state["frequency"], batch["doc_ids"], state["step"] + 1, log_q_alpha)
            extras["log_q_pos"] = frequency.log_q(new_state["frequency"], batch["doc_ids"])

        critic_metrics: dict[str, jnp.ndarray] = {}
        if objective.critic is not None:  # the second player moves first, on this batch
            rng, critic_rng = jax.random.split(rng)
            new_state["critic"], critic_metrics = objectives.update_critic(
                objective.critic, state["critic"], state["params"], batch, critic_rng)
            extras["critic"] = new_state["critic"]["params"]

        if table_updates == "lazy":
            assert objective.tables is not None, "validated: lazy updates need token tables"
            (loss, aux), grads, touched_rows = lazy_rows.value_and_grad(
                objective.loss, state["params"], batch, rng, extras,
                objective.tables(state["params"]))
            params, opt_state = lazy_rows.update(tx, grads, state["opt_state"],
                                                 state["params"], touched_rows)
        else:
            (loss, aux), grads = _value_and_grad(objective, state["params"], batch, rng,
                                                 extras)
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
        new_state.update(params=params, opt_state=opt_state)
        grad_norm, param_norm = jax.lax.cond(  # only the branch taken runs
            norms, lambda: (optax.tree.norm(grads), optax.tree.norm(params)),
            lambda: (jnp.float32(NOT_MEASURED), jnp.float32(NOT_MEASURED)))
        metrics = {"loss": loss, **aux, **critic_metrics, "grad_norm": grad_norm,
                   "param_norm": param_norm, "learning_rate": schedule(state["step"])}
        return new_state, metrics

    return TrainStep(jax.jit(step, in_shardings=(state_sharding, batch_sharding, replicated),
                             out_shardings=(state_sharding, replicated), donate_argnums=(0,)))


def _value_and_grad(objective: objectives.Objective, params, batch, rng, extras):
    """((loss, metrics), grads) of the objective's loss; with `objective.trainable`, the
    gradient of the trainable params alone (zero for the others, which no pass computes:
    LoRA's frozen towers get no gradient array of their size)."""
    grad = jax.value_and_grad(objective.loss, has_aux=True)
    if objective.trainable is None:
        return grad(params, batch, rng, extras)
    leaves, treedef = jax.tree.flatten(params)
    mask = jax.tree.leaves(objective.trainable(params))
    moving = [x for x, m in zip(leaves, mask, strict=True) if m]

    def loss(moving):
        it = iter(moving)
        full = [next(it) if m else x for x, m in zip(leaves, mask, strict=True)]
        return objective.loss(jax.tree.unflatten(treedef, full), batch, rng, extras)

    value, moved = jax.value_and_grad(loss, has_aux=True)(moving)
    it = iter(moved)
    grads = [next(it) if m else jnp.zeros_like(x) for x, m in zip(leaves, mask, strict=True)]
    return value, jax.tree.unflatten(treedef, grads)


NOT_MEASURED = -1.0  # a step's grad_norm and param_norm when it was not asked for them


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """The jitted update: (state, global batch, norms) -> (new state, metrics). With
    norms=False the metrics' grad_norm and param_norm are NOT_MEASURED: each is a pass
    over every param (over the token tables and their gradient: a tenth of a bag-of-words
    step at 50,000 rows, a fifth with lazy updates at 500,000), and only the steps that
    write a train row need them.

    `compile` compiles it ahead of time for one batch's shapes (the memory plan reads
    that executable); a batch of those shapes then runs it, any other the jitted step."""
    jitted: jax.stages.Wrapped
    _compiled: dict = dataclasses.field(default_factory=dict)  # batch signature -> it

    def __call__(self, state: State, batch: dict, norms: bool = True) -> tuple[State, dict]:
        compiled = self._compiled.get(_signature(batch)) if self._compiled else None
        if compiled is not None:
            return compiled(state, batch, np.bool_(norms))
        return self.jitted(state, batch, np.bool_(norms))

    def compile(self, state: State, batch: dict) -> jax.stages.Compiled:
        """The step compiled for `batch`'s shapes, kept for the batches that have them."""
        compiled = self.lower(state, batch).compile()
        self._compiled[_signature(batch)] = compiled
        return compiled

    def lower(self, state: State, batch: dict, norms: bool = True):
        return self.jitted.lower(state, batch, np.bool_(norms))


def _signature(batch: dict) -> tuple:
    return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))


def check_finite(pending: list[tuple[int, dict]], last_saved: int | None) -> None:
    """Raises NonFiniteLossError if any pending step had a non-finite loss, gradient or
    parameter norm (parameters can overflow while the loss stays finite)."""
    for step, m in pending:
        loss, gnorm, pnorm = (float(m.get(k, 0.0)) for k in ("loss", "grad_norm", "param_norm"))
        if not (np.isfinite(loss) and np.isfinite(gnorm) and np.isfinite(pnorm)):
            where = (f"the last good checkpoint is step {last_saved}" if last_saved is not None
                     else "no checkpoint was written")
            raise NonFiniteLossError(
                f"non-finite training at step {step} (loss={loss}, grad_norm={gnorm}, "
                f"param_norm={pnorm}); "
                f"stopped without saving this state ({where}). Try a lower "
                "optimizer.learning_rate or optimizer.grad_clip_norm.")
