"""The memory plan (mesh.memory_plan): the state's bytes per device under the mesh's
layout, the compiled step's peak, a run refused in one line before its first step when
the plan does not fit, and the plan's compiled step being the one the run takes."""

import logging
import os

import jax
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors
from dualjax.runtime import sharding
from dualjax.train import checkpoints, memory_plan
from dualjax.train import loop as train


def tiny(**changes):
    cfg = load_config("tiny")
    cfg.num_train_steps, cfg.checkpoint_every_steps = 3, 3
    cfg.model.max_len = 6  # every batch has a text this long: no batch is trimmed shorter
    cfg.eval.update(index="exact", baselines="", untrained=False)
    cfg.update(changes)
    return cfg


def test_state_bytes_per_device_follow_the_layout():
    mesh = sharding.make_mesh(8)
    big = jax.ShapeDtypeStruct((1024, 64), np.float32)
    small = jax.ShapeDtypeStruct((64,), np.float32)
    state = {"params": {"w": big, "b": small}, "opt_state": {"mu": big}}
    for strategy, rows in (("replicated", 1024), ("fsdp", 128)):
        placed = jax.tree.map(lambda x, s=strategy: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=jax.sharding.NamedSharding(
                mesh, sharding.param_spec(x.shape, mesh, s))), state)
        plan = memory_plan.plan(placed)
        assert plan.params == rows * 64 * 4 + 64 * 4  # the bias stays whole (small)
        assert plan.optimizer == rows * 64 * 4 and plan.peak is None and plan.fits


@pytest.mark.slow
def test_a_compiled_plan_is_logged_and_the_run_takes_its_step(tmp_path, caplog):
    """mesh.memory_plan=compile on CPU: the plan line, with a peak at least the state's;
    the weights equal a run without the plan (the compiled step computes as the jitted)."""
    with caplog.at_level(logging.INFO):
        train.train_and_evaluate(tiny(mesh={"memory_plan": "compile"}), str(tmp_path / "a"))
    lines = [r.getMessage() for r in caplog.records if "Memory plan" in r.getMessage()]
    assert len(lines) == 1 and "peak" in lines[0] and "encode_chunks 1" in lines[0], lines
    train.train_and_evaluate(tiny(mesh={"memory_plan": "off"}), str(tmp_path / "b"))
    jax.tree.map(np.testing.assert_array_equal,
                 checkpoints.latest_params(str(tmp_path / "a"))[1],
                 checkpoints.latest_params(str(tmp_path / "b"))[1])


@pytest.mark.slow
def test_a_plan_that_does_not_fit_is_refused_before_the_first_step(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_plan, "device_limit", lambda device: 2 ** 16)
    workdir = str(tmp_path / "run")
    with pytest.raises(errors.ConfigError, match=r"does not fit: memory per device .*peak "
                                                 r"[0-9.]+ GiB of the compiled step of 0.00 GiB"):
        train.train_and_evaluate(tiny(mesh={"memory_plan": "compile"}), workdir)
    assert not os.path.isdir(os.path.join(workdir, "checkpoints")) or not os.listdir(
        os.path.join(workdir, "checkpoints"))
