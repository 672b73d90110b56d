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


def test_the_plan_names_the_layout_it_was_made_for():
    """The plan's line says the mesh, the parameters' layout, the chunks, the activations'
    dtype, remat and LoRA: each is a way to make a step fit."""
    from dualjax.config import run
    cfg = tiny(model={"dtype": "bfloat16", "remat": True, "lora_rank": 4})
    spec = run.resolve(cfg, checked=False)
    line = memory_plan._layout(spec, sharding.make_mesh(8, model=2), 4)
    assert line == ("4 x 2 data x model mesh, replicated params, encode_chunks 4, bfloat16 "
                    "activations, each layer recomputed (remat), LoRA rank 4"), line


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


def test_chunk_choices_split_the_batch_over_the_devices():
    assert memory_plan.chunk_choices(256, 0, 8) == [1, 2, 4, 8, 16, 32]
    assert memory_plan.chunk_choices(8192, 0, 1) == [2 ** i for i in range(11)]
    assert memory_plan.chunk_choices(48, 16, 8) == [1, 2]
    assert memory_plan.chunk_choices(24, 0, 8) == [1]


class _Compiled:
    def __init__(self, peak):
        self.peak = peak

    def memory_analysis(self):
        return type("M", (), dict(temp_size_in_bytes=self.peak, argument_size_in_bytes=0,
                                  output_size_in_bytes=0, alias_size_in_bytes=0))


def _choose(monkeypatch, peaks: dict, limit: int):
    """choose_chunks over fake steps whose compiled peaks are `peaks` (by chunks)."""
    import types
    monkeypatch.setattr(memory_plan, "device_limit", lambda device: limit)
    monkeypatch.setattr(memory_plan, "compiles", lambda mode, device=None: True)
    compiled = []

    def step_with(k):
        def compile(state, batch):
            compiled.append(k)
            return _Compiled(peaks[k])
        return types.SimpleNamespace(k=k, compile=compile)
    spec = types.SimpleNamespace(
        mesh=types.SimpleNamespace(memory_plan="compile", param_sharding="replicated"),
        model=types.SimpleNamespace(lora=types.SimpleNamespace(rank=0), dtype="float32",
                                 remat=False),
        objective=types.SimpleNamespace(kind="in_batch"), num_mixed_negatives=0,
        schedule=types.SimpleNamespace(global_batch_size=64))
    mesh = sharding.make_mesh(8)
    state = {"params": {}, "opt_state": {}}
    k, step, _ = memory_plan.choose_chunks(spec, mesh, state, lambda: {}, step_with)
    assert step.k == k
    return k, compiled


def test_encode_chunks_minus_one_searches_for_the_fewest_chunks_that_fit(monkeypatch):
    """Over 1, 2, 4, 8 chunks (64 pairs on 8 devices): one chunk is compiled first and
    kept when it fits; else the most chunks, then a binary search between; a limit that
    even the most do not fit is one ConfigError line with the figures."""
    peaks = {1: 800, 2: 420, 4: 230, 8: 150}
    assert _choose(monkeypatch, peaks, 1000) == (1, [1])
    assert _choose(monkeypatch, peaks, 500) == (2, [1, 8, 4, 2])
    assert _choose(monkeypatch, peaks, 300) == (4, [1, 8, 4, 2])
    assert _choose(monkeypatch, peaks, 200) == (8, [1, 8, 4])
    with pytest.raises(errors.ConfigError, match=r"^config.train.encode_chunks=-1: even 8 "
                                                 r"chunks do not fit: memory per device .*peak"):
        _choose(monkeypatch, peaks, 100)


@pytest.mark.slow
def test_encode_chunks_minus_one_compiles_the_run_s_steps(tmp_path, monkeypatch):
    """The search on a real run (a transformer at 64 tokens; a CPU has no limit, so one is
    set that nothing fits): the steps of one chunk and of the most are compiled, and the
    run is refused before its first step with the figures."""
    cfg = tiny(mesh={"memory_plan": "compile"}, global_batch_size=256)
    cfg.num_train_steps = cfg.checkpoint_every_steps = 1
    cfg.model.update(max_len=64, tower="transformer")
    cfg.model.transformer.update(num_layers=2, width=64, num_heads=4, mlp_dim=256)
    cfg.train.encode_chunks = -1
    monkeypatch.setattr(memory_plan, "device_limit", lambda device: 2 ** 20)
    with pytest.raises(errors.ConfigError, match=r"even 32 chunks do not fit: .* encode_chunks "
                                                 r"32, float32 activations\): .*peak [0-9.]+ "
                                                 r"GiB of the compiled"):
        train.train_and_evaluate(cfg, str(tmp_path / "tight"))
