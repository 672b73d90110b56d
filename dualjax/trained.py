"""What a trained workdir holds, loaded without its optimizer state: the config, the
inputs (tokenizer, max lengths, categorical fields), the model and the latest params.
`search` and `export` read workdirs through it."""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import jax
import ml_collections

from dualjax import checkpoints, features, models, pretrained, sharding, specs, train
from dualjax import tasks as tasks_lib


class Trained(NamedTuple):
    """What a trained workdir holds: its config, inputs (tokenizer, max lengths,
    categorical fields), model and latest params."""
    config: ml_collections.ConfigDict
    inputs: features.Inputs
    model: Any  # models.make_model's: a DualEncoder or Pses
    params: dict
    step: int


def load_trained(workdir: str, config: ml_collections.ConfigDict | None = None) -> Trained:
    """The latest checkpoint's params of `workdir`, replicated over all devices, with the
    config (WORKDIR/config.json unless given), the saved tokenizer and categorical field
    vocabularies."""
    if config is None:
        with open(os.path.join(workdir, "config.json")) as f:
            config = ml_collections.ConfigDict(json.load(f))

    def not_saved(name: str):
        raise FileNotFoundError(f"{workdir}/{name}: not found; is this a trained workdir?")

    # The saved vocabularies: nothing is built here (the texts and fields are not read).
    start = pretrained.load(workdir)  # the bert tower's sizes, if it has one
    inputs = train.load_inputs(config, workdir, lambda: not_saved("vocab.json"),
                               lambda: not_saved("features.json"))
    model = models.make_model(specs.model_spec(config.model),
                              inputs.query.tokenizer.vocab_size, inputs.feature_sizes(),
                              num_tasks=len(tasks_lib.task_configs(config)),
                              bert=start.bert if start else None)
    step, params = checkpoints.latest_params(workdir)  # the params alone, as numpy arrays
    params = jax.device_put(params, sharding.replicated(sharding.make_mesh()))
    return Trained(config, inputs, model, params, step)
