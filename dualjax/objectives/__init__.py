"""Training objectives: each a parameter init and a pure loss (`core.Objective`), so the
train step is one whatever the objective.

- `in_batch`: both towers, then an in-batch loss of `losses` over the global batch;
- `mlm`: masked language modelling for a Transformer document tower (pre-training);
- `pses`: partially shared embedding spaces (Li & Jia 2018), with a WGAN critic as a
  second player (`core.Critic`).

`make` builds the run's from an `ObjectiveSpec` (`config.specs.objective_spec` resolves
it from the config).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from dualjax import losses
from dualjax.models import lora
from dualjax.objectives import in_batch, mlm, pses
from dualjax.objectives.core import Critic, Objective, init_critic_state, restrict, update_critic
from dualjax.objectives.pses import PsesLoss

__all__ = ["Critic", "Objective", "ObjectiveSpec", "PRETRAINING_HEADS", "PsesLoss", "in_batch",
           "init_critic_state", "make", "mlm", "pses", "restrict", "update_critic"]
PRETRAINING_HEADS = ("mlm",)  # params a fine-tuning run does not take over
KINDS = ("in_batch", "mlm", "pses")


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """What a step learns. kind: "in_batch" (the dual encoder with an in-batch loss), "mlm"
    (data.tasks="mlm") or "pses" (model.name="pses"); loss, loss_options, column_block:
    `losses.sharded`'s (config.loss); max_len: the longer side's, in tokens."""
    kind: str = "in_batch"
    loss: str = "in_batch_softmax"
    loss_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    column_block: int = 0
    remove_query_hits: bool = True
    remove_cluster_hits: bool = True
    max_len: int = 32
    encode_chunks: int = 0  # config.train.encode_chunks (GradCache; 0 or 1: off)
    matryoshka_dims: tuple[int, ...] = ()  # in_batch: the loss also on these prefixes
    pses: PsesLoss = PsesLoss()
    # in_batch with a teacher's scores (data.tasks="distill"): `losses.distillation`'s
    distill: str = ""  # "kl" | "margin_mse"; "": none
    distill_weight: float = 1.0
    teacher_temperature: float = 1.0
    in_batch_weight: float = 1.0


def make(spec: ObjectiveSpec, model, mesh: jax.sharding.Mesh) -> Objective:
    """The objective of `spec` for `model` (a dual encoder, or a `Pses` for kind "pses");
    with LoRA (`model.spec.lora`) only the adapters and the similarity train, the towers'
    own weights kept in the base dtype (`models.lora`)."""
    objective = _make(spec, model, mesh)
    adapters = model.spec.lora
    if not adapters.rank:
        return objective
    base = lora.BASE_DTYPES[adapters.base_dtype]
    init = objective.init
    return dataclasses.replace(objective, init=lambda rng: lora.frozen_to(init(rng), base),
                               trainable=lora.trainable)


def _make(spec: ObjectiveSpec, model, mesh: jax.sharding.Mesh) -> Objective:
    if spec.kind == "mlm":
        return mlm.objective(model, spec.max_len, model.spec.transformer.width)
    loss_fn = losses.sharded(spec.loss, mesh, spec.column_block, **spec.loss_options)
    hits = spec.remove_query_hits, spec.remove_cluster_hits
    if spec.kind == "pses":
        return pses.objective(model, spec.pses, mesh, spec.max_len, loss_fn, *hits)
    if spec.distill:
        loss_fn = losses.distillation(loss_fn, spec.distill, spec.distill_weight,
                                      spec.teacher_temperature, spec.in_batch_weight)
    loss_fn = losses.matryoshka(loss_fn, spec.matryoshka_dims)
    return in_batch.objective(model, loss_fn, spec.max_len, *hits,
                              encode_chunks=spec.encode_chunks)
