"""Extending dualjax from outside the package: a plugin registered from this file alone
(no edit under dualjax/) is named by the config, validated, trained and evaluated.

Today: a loss (`dualjax.losses.registry`). docs/design.md shows the same example."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, losses
from dualjax.losses import matrix, streaming
from dualjax.losses.registry import LOSSES, Loss, register
from dualjax.runtime import sharding


# ----------------------------------------------------------------------------- a toy loss
def _reference(q, d, scale, bias, extras=None, *, temperature=0.05,
               remove_accidental_hits=True):
    """The in-batch softmax at a fixed temperature (the model's scale and bias unused)."""
    extras = extras or {}
    dots, _, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    z = matrix.masked(dots / temperature, is_pos | neg, -jnp.inf)
    loss = -jnp.mean(jnp.diagonal(jax.nn.log_softmax(z, axis=1)))
    return loss, {"in_batch_p@1": jnp.mean(matrix.p_at_1(dots, is_pos, neg))}


def _stats(blk, pos, scale, bias, opts):
    z = blk.dots / opts["temperature"]
    return {"lse": streaming.lse(streaming.softmax_logits(z, blk)),
            "best": streaming.max_neg(jax.lax.stop_gradient(blk.dots), blk)}


def _finish(st, pos, scale, bias, opts, labels):
    z = pos.dots / opts["temperature"]
    return streaming.row_sums(st["lse"].value - z, pos.dots, st["best"].value)


def _resolve(opts):
    if opts["temperature"] <= 0:
        raise ValueError(f"temperature={opts['temperature']} must be > 0")
    return opts


TOY = Loss("toy_fixed_temperature", _reference, _stats, _finish,
           options={"temperature": 0.05, "remove_accidental_hits": True}, resolve=_resolve)


@pytest.fixture
def toy_loss():
    register(TOY)
    yield TOY
    del LOSSES[TOY.name]


def test_a_registered_loss_is_the_same_sharded_streamed_and_by_hand(toy_loss):
    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    q, d = (jnp.asarray(unit(rng.normal(size=(32, 8))), jnp.float32) for _ in range(2))
    ids = {"doc_ids": jnp.asarray(np.arange(32) % 30)}  # two accidental hits
    ref, ref_m = losses.reference(TOY.name, temperature=0.1)(q, d, 5.0, -1.0, ids)
    mesh = sharding.make_mesh()
    put = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))
    for block in (0, 12):  # all columns at once; 12 at a time, the last block padded
        fn = losses.sharded(TOY.name, mesh, block, temperature=0.1)
        got, got_m = jax.jit(fn)(put(q), put(d), 5.0, -1.0, {"doc_ids": put(ids["doc_ids"])})
        np.testing.assert_allclose(got, ref, rtol=1e-5)
        np.testing.assert_allclose(got_m["in_batch_p@1"], ref_m["in_batch_p@1"])
    # By hand: the in-batch softmax of logits = cos / 0.1 (scale 10, bias 0).
    same, _ = losses.reference("in_batch_softmax")(q, d, 10.0, 0.0, ids)
    np.testing.assert_allclose(ref, same, rtol=1e-5)
    with pytest.raises(ValueError, match="a loss named 'toy_fixed_temperature' is registered"):
        register(Loss(TOY.name, _reference, _stats, _finish))


@pytest.mark.slow
def test_a_registered_loss_trains_and_evaluates_from_the_config(toy_loss, tmp_path):
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.eval.baselines = ""
    cfg.loss.name = TOY.name
    cfg.loss.temperature = -1.0  # the plugin's own option, read from config.loss
    with pytest.raises(errors.ConfigError, match=r"config\.loss\.temperature=-1.0 must be > 0"):
        train.train_and_evaluate(cfg, str(tmp_path / "bad"))
    cfg.loss.temperature = 0.05
    results = train.train_and_evaluate(cfg, str(tmp_path / "run"))
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "run", "metrics.jsonl"))]
    losses_logged = [r["loss"] for r in rows if r["split"] == "train"]
    assert len(losses_logged) >= 2 and losses_logged[-1] < losses_logged[0]
    trained, untrained = (results[f"{s} [exact]"]["map@100"] for s in ("dual_encoder",
                                                                         "untrained"))
    assert trained > untrained + 0.02, (trained, untrained)  # 0.20 against 0.16
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["loss"]["name"] == TOY.name and saved["loss"]["temperature"] == 0.05


def test_an_unregistered_loss_is_refused_by_name():
    from dualjax.config import validation
    cfg = load_config("tiny")
    cfg.loss.name = TOY.name
    with pytest.raises(errors.ConfigError, match="config.loss.name='toy_fixed_temperature' is "
                                                 "not one of: in_batch_softmax"):
        validation.validate(cfg, 8)
