"""The optimizer a step applies: `OptimizerSpec` (config.optimizer resolved once by
`config.specs.optimizer_spec`) and `make_optimizer`, its optax transformation and
learning-rate schedule."""
from __future__ import annotations

import dataclasses

import optax

OPTIMIZERS = ("sgd", "adam", "adamw")
DECAYS = ("linear", "constant")
TABLE_UPDATES = ("dense", "lazy")  # (train/lazy_rows.py)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """config.optimizer (configs/default.py says what each key does).

    Attributes:
        name: "sgd" | "adam" | "adamw".
        learning_rate: the peak rate (sgd: the constant one).
        momentum: sgd's (0: none).
        warmup_steps: adam/adamw: linear warmup from 0 to the peak.
        decay: adam/adamw after warmup: "linear" (to 0 at the end) or "constant".
        weight_decay: adamw's decoupled weight decay.
        grad_clip_norm: clip the global gradient norm to this (0: off).
        table_updates: "dense", or "lazy" (a step updates only the token-table rows its
            batch reads).
    """
    name: str = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.0
    warmup_steps: int = 0
    decay: str = "linear"
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    table_updates: str = "dense"


def make_optimizer(spec: OptimizerSpec, num_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """SGD with momentum (constant rate, as Gillick et al.) or Adam/AdamW with linear
    warmup then linear decay to zero or a constant rate (as Chang et al.), over a run of
    `num_steps`."""
    if spec.name == "sgd":
        schedule = optax.constant_schedule(spec.learning_rate)
        tx = optax.sgd(schedule, momentum=spec.momentum or None)
    else:
        warmup = min(spec.warmup_steps, num_steps)
        after = (optax.linear_schedule(spec.learning_rate, 0.0, max(num_steps - warmup, 1))
                 if spec.decay == "linear" else optax.constant_schedule(spec.learning_rate))
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, spec.learning_rate, warmup), after], [warmup])
        tx = (optax.adamw(schedule, weight_decay=spec.weight_decay) if spec.name == "adamw"
              else optax.adam(schedule))
    if spec.grad_clip_norm:
        tx = optax.chain(optax.clip_by_global_norm(spec.grad_clip_norm), tx)
    return tx, schedule
