"""What a trained workdir holds, loaded without its optimizer state: the run's spec, the
inputs (tokenizer, max lengths, categorical fields), the model and the latest params.
`search` and `export` read workdirs through it."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from dualjax import models, pretrained
from dualjax.config import run as run_lib
from dualjax.config.run import RunSpec
from dualjax.runtime import sharding
from dualjax.text import sides
from dualjax.train import checkpoints, warm_start
from dualjax.train import inputs as inputs_lib


class Trained(NamedTuple):
    """What a trained workdir holds: its run's spec, inputs (tokenizer, max lengths,
    categorical fields), model and latest params."""
    spec: RunSpec
    inputs: sides.Inputs
    model: Any  # models.make_model's: a DualEncoder or Pses
    params: dict
    step: int


def load_trained(workdir: str, spec: RunSpec | None = None) -> Trained:
    """The latest checkpoint's params of `workdir` (an evaluation-only run of a start: the
    start's, step 0), replicated over all devices, with the run's spec (of
    WORKDIR/config.json, `config.run.saved`, unless given), the saved tokenizer and
    categorical field vocabularies. FileNotFoundError for a folder that is not a trained
    workdir, naming what it is."""
    if spec is None:
        spec = run_lib.saved(workdir)

    def not_saved(name: str):
        raise FileNotFoundError(f"{workdir}/{name}: not found; is this a trained workdir?")

    # The saved vocabularies: nothing is built here (the texts and fields are not read).
    start = pretrained.load(workdir)  # its pretrained tower's sizes and prompts, if any
    inputs = inputs_lib.load_inputs(spec.inputs, workdir, lambda: not_saved("vocab.json"),
                                    lambda: not_saved("features.json"), start)
    model = models.make_model(spec.model, inputs.query.tokenizer.vocab_size,
                              inputs.feature_sizes(), num_tasks=len(spec.tasks),
                              architecture=start.architecture if start else None)
    try:
        step, params = checkpoints.latest_params(workdir)  # the params alone, as numpy arrays
    except FileNotFoundError:
        if spec.schedule.num_train_steps or not (start or spec.start.init_from):
            raise
        step, params = 0, start_params(spec, model, start)
    params = jax.device_put(params, sharding.replicated(sharding.make_mesh()))
    return Trained(spec, inputs, model, params, step)


def start_params(spec: RunSpec, model, start) -> dict:
    """An evaluation-only run's towers (num_train_steps=0, no checkpoint): its start as
    the run evaluated it (model.pretrained's or init_from's, over the initialisation of
    its seed, `warm_start.start_towers`: what the start gives is never initialised
    at random), so that the start itself can be exported and served."""
    if spec.system != "dual_encoder":
        raise FileNotFoundError(f"config.model.name={spec.system!r}: an evaluation-only "
                                "run of it has no checkpoint to read")
    return jax.device_get(warm_start.start_towers(
        model, spec.schedule.seed, max(spec.inputs.max_lens), sharding.make_mesh(),
        spec.start.init_from, spec.as_dict("model"), start))
