"""Training objectives: each a parameter init and a pure loss (`core.Objective`), so the
train step is one whatever the objective.

- `in_batch`: both towers, then an in-batch loss of `losses` over the global batch;
- `mlm`: masked language modelling for a Transformer document tower (pre-training);
- `pses`: partially shared embedding spaces (Li & Jia 2018), with a WGAN critic as a
  second player (`core.Critic`).
"""

from __future__ import annotations

import jax

from dualjax import losses
from dualjax.config import specs
from dualjax.config import validation as config_lib
from dualjax.objectives import in_batch, mlm, pses
from dualjax.objectives.core import Critic, Objective, init_critic_state, restrict, update_critic

__all__ = ["Critic", "Objective", "PRETRAINING_HEADS", "in_batch", "from_config",
           "init_critic_state", "is_mlm", "mlm", "pses", "restrict", "update_critic"]
PRETRAINING_HEADS = ("mlm",)  # params a fine-tuning run does not take over


def is_mlm(config) -> bool:
    """Whether the run pre-trains with MLM (data.name="pretrain", data.tasks="mlm")."""
    return any(d.name == specs.PRETRAIN and d.tasks.strip() == "mlm"
               for _, d, _ in specs.task_configs(config))


def from_config(config, model, mesh: jax.sharding.Mesh) -> Objective:
    """The run's objective: MLM when data.tasks="mlm", PSES when model.name="pses", else
    the dual encoder with `config.loss`."""
    q_len, d_len = config_lib.max_lens(config.model)
    if is_mlm(config):
        width = model.spec.transformer.width
        return mlm.objective(model, d_len, width)
    loss_fn = losses.sharded(config.loss.name, mesh, config.loss.column_block,
                             **config_lib.loss_options(config.loss))
    hits = config.loss.remove_query_hits, config.loss.remove_cluster_hits
    if config.model.name == "pses":
        return pses.objective(model, config.loss.pses, mesh, max(q_len, d_len), loss_fn, *hits)
    return in_batch.objective(model, loss_fn, max(q_len, d_len), *hits,
                                  encode_chunks=config.get("train", {}).get("encode_chunks", 0))
