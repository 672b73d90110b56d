"""What a trained workdir holds, loaded without its optimizer state: the config, the
inputs (tokenizer, max lengths, categorical fields), the model and the latest params.
`search` and `export` read workdirs through it."""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import jax
import ml_collections

from dualjax import models, pretrained
from dualjax.config import specs
from dualjax.models import dual_encoder
from dualjax.runtime import sharding
from dualjax.runtime.files import folder_kind
from dualjax.text import sides
from dualjax.train import checkpoints, warm_start
from dualjax.train import inputs as inputs_lib
from dualjax.train import tasks as tasks_lib


class Trained(NamedTuple):
    """What a trained workdir holds: its config, inputs (tokenizer, max lengths,
    categorical fields), model and latest params."""
    config: ml_collections.ConfigDict
    inputs: sides.Inputs
    model: Any  # models.make_model's: a DualEncoder or Pses
    params: dict
    step: int


def load_trained(workdir: str, config: ml_collections.ConfigDict | None = None) -> Trained:
    """The latest checkpoint's params of `workdir` (an evaluation-only run of a start: the
    start's, step 0), replicated over all devices, with the config (WORKDIR/config.json
    unless given), the saved tokenizer and categorical field vocabularies."""
    if config is None:
        path = os.path.join(workdir, "config.json")
        if not os.path.isdir(workdir):
            raise FileNotFoundError(f"{workdir}: no such folder")
        if not os.path.isfile(path):
            kind = folder_kind(workdir)
            raise FileNotFoundError(
                f"{workdir}: {'is a ' + kind + ', not' if kind else 'not'} a training "
                f"workdir (no config.json){': give the run it came from' if kind else ''}")
        with open(path) as f:
            config = ml_collections.ConfigDict(json.load(f))

    def not_saved(name: str):
        raise FileNotFoundError(f"{workdir}/{name}: not found; is this a trained workdir?")

    # The saved vocabularies: nothing is built here (the texts and fields are not read).
    start = pretrained.load(workdir)  # the bert tower's sizes and prompts, if it has one
    inputs = inputs_lib.load_inputs(specs.inputs_spec(config.model), workdir,
                                    lambda: not_saved("vocab.json"),
                                    lambda: not_saved("features.json"), start)
    model = models.make_model(specs.model_spec(config.model),
                              inputs.query.tokenizer.vocab_size, inputs.feature_sizes(),
                              num_tasks=len(tasks_lib.task_configs(config)),
                              bert=start.bert if start else None)
    try:
        step, params = checkpoints.latest_params(workdir)  # the params alone, as numpy arrays
    except FileNotFoundError:
        if config.num_train_steps or not (start or config.init_from):
            raise
        step, params = 0, start_params(config, model, start)
    params = jax.device_put(params, sharding.replicated(sharding.make_mesh()))
    return Trained(config, inputs, model, params, step)


def start_params(config: ml_collections.ConfigDict, model, start) -> dict:
    """An evaluation-only run's towers (num_train_steps=0, no checkpoint): its start as
    the run evaluated it (model.pretrained's or init_from's, over the initialisation of
    config.seed), so that the start itself can be exported and served."""
    if config.model.name != "dual_encoder":
        raise FileNotFoundError(f"config.model.name={config.model.name!r}: an evaluation-only "
                                "run of it has no checkpoint to read")
    init = dual_encoder.init_params(model, jax.random.PRNGKey(config.seed),
                                    max(specs.max_lens(config.model)))
    return jax.device_get(warm_start.start_params(config, start, init,
                                                  sharding.replicated(sharding.make_mesh())))
