"""MLM (the token-level pre-training baseline): masking statistics, BERT's exact count of
predicted tokens per text, the head against a hand computation, and an MLM pre-training
run that a dual encoder fine-tunes from."""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config
from helpers import ARTICLES

from dualjax import objectives
from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec
from dualjax.errors import ConfigError
from dualjax.models import dual_encoder
from dualjax.train import checkpoints
from dualjax.train import loop as train

TRANSFORMER = {"model.tower": "transformer", "model.transformer.num_layers": 1,
               "model.transformer.width": 16, "model.transformer.num_heads": 2,
               "model.transformer.mlp_dim": 32, "model.transformer.max_positions": 16,
               "model.output_dim": 16}


def tiny(**overrides):
    cfg = load_config("tiny")
    cfg.eval.untrained, cfg.eval.baselines, cfg.eval.index = False, "", "exact"
    # 2 devices: still a sharded batch, and much faster to compile than 8
    cfg.update_from_flattened_dict({**TRANSFORMER, "mesh.num_devices": 2, **overrides})
    return cfg


@pytest.mark.slow
def test_mask_tokens_statistics():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 41, 4000)
    mask = np.arange(40)[None] < lengths[:, None]
    ids = np.where(mask, rng.integers(1, 1000, mask.shape), 0).astype(np.int32)
    m = objectives.mlm.mask_tokens(jax.random.key(0), jnp.asarray(ids), jnp.asarray(mask),
                               rate=0.15, vocab_size=1000, k=12)
    positions, weights = np.asarray(m.positions), np.asarray(m.weights)
    predicted = np.zeros_like(mask)
    np.put_along_axis(predicted, positions, weights > 0, axis=1)
    assert not (predicted & ~mask).any()                  # never a pad
    assert abs(predicted.sum() / mask.sum() - 0.15) < 0.01  # 15% of the real tokens
    assert (weights.sum(1) <= 12).all()                    # at most k per text
    np.testing.assert_array_equal(np.asarray(m.targets)[weights > 0],
                                  np.take_along_axis(ids, positions, 1)[weights > 0])
    replace, inputs = np.asarray(m.replace), np.asarray(m.ids)
    assert not (replace & ~predicted).any() and (inputs[~predicted] == ids[~predicted]).all()
    n = predicted.sum()
    randomised = predicted & ~replace & (inputs != ids)
    assert abs(replace.sum() / n - 0.8) < 0.02            # [MASK]
    assert abs(randomised.sum() / n - 0.1) < 0.02          # random token (rarely the same)


def test_mask_tokens_predicts_bert_s_exact_count_per_text():
    # BERT: min(max_predictions, max(1, int(round(len x rate)))) real tokens of each text,
    # none of an empty one; Python's round halves to even (30 x 0.15 = 4.5 -> 4, 10 x 0.15
    # = 1.5 -> 2). Each length 64 times, so that chance counts would show.
    lengths = np.repeat([0, 1, 2, 3, 4, 7, 10, 13, 17, 30, 37, 40], 64)
    want = {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 7: 1, 10: 2, 13: 2, 17: 3, 30: 4, 37: 6, 40: 6}
    mask = np.arange(40)[None] < lengths[:, None]
    ids = np.where(mask, np.arange(1, 41)[None], 0).astype(np.int32)
    m = jax.jit(objectives.mlm.mask_tokens, static_argnums=(3, 4, 5))(
        jax.random.key(3), jnp.asarray(ids), jnp.asarray(mask), 0.15, 1000, 6)  # k = 6 slots
    positions, weights = np.asarray(m.positions), np.asarray(m.weights)
    assert positions.shape == weights.shape == (len(lengths), 6)
    np.testing.assert_array_equal(weights.sum(1), [want[n] for n in lengths])
    real = weights > 0
    assert (positions[real] < np.repeat(lengths, 6).reshape(-1, 6)[real]).all()  # real tokens
    assert all(len(set(p[w])) == w.sum() for p, w in zip(positions, real, strict=True))  # distinct
    # Chosen at random: texts of one length predict different tokens.
    full = [frozenset(p[w]) for p, w, n in zip(positions, real, lengths, strict=True) if n == 40]
    assert len(set(full)) > 50
    assert all(objectives.mlm.num_to_predict(n, 0.15, 6) == c for n, c in want.items())


@pytest.mark.slow
def test_mlm_head_logits_through_the_tied_table():
    head = objectives.mlm.MlmHead(width=4, vocab_size=7)
    table = jax.random.normal(jax.random.key(1), (7, 4))
    states = jax.random.normal(jax.random.key(2), (3, 4))
    params = head.init(jax.random.key(0), states, table)["params"]
    assert params["mask_embed"].shape == (4,)
    got = head.apply({"params": params}, states, table)
    h = np.asarray(states) @ np.asarray(params["transform"]["kernel"]) + params["transform"]["bias"]
    h = np.asarray(nn.gelu(jnp.asarray(h)))
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6)
    h = h * params["ln"]["scale"] + params["ln"]["bias"]
    np.testing.assert_allclose(got, h @ np.asarray(table).T + params["output_bias"], atol=1e-5)


@pytest.mark.slow
def test_mlm_loss_is_the_mean_nll_of_the_predicted_tokens():
    cfg = tiny(**{"data.name": "pretrain", "data.tasks": "mlm", "data.path": "x.jsonl"})
    model = dual_encoder.make_model(model_spec(cfg.model), 50)
    objective = objectives.mlm.objective(model, max_len=16, width=16)
    params = jax.jit(objective.init)(jax.random.key(0))  # jitted: eager ops compile one by one
    ids = jax.random.randint(jax.random.key(1), (6, 16), 1, 50)
    mask = jnp.arange(16)[None] < jnp.array([[16], [9], [3], [12], [1], [7]])
    batch = {"d_ids": jnp.where(mask, ids, 0), "d_mask": mask}
    loss, aux = jax.jit(objective.loss)(params, batch, jax.random.key(5), {})
    m = jax.jit(objectives.mlm.mask_tokens, static_argnums=(3, 4, 5))(
        jax.random.key(5), batch["d_ids"], mask, 0.15, 50, 3)
    states = jax.jit(functools.partial(model.apply, method="document_token_states"))(
        {"params": params}, m.ids, mask, m.replace, params["mlm"]["mask_embed"])
    logits = jax.jit(objectives.mlm.MlmHead(16, 50).apply)(
        {"params": params["mlm"]}, np.take_along_axis(np.asarray(states),
                                                      np.asarray(m.positions)[..., None], 1),
        params["tower"]["embed"]["embedding"])
    logits = np.asarray(logits, np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    w = np.asarray(m.weights)
    nll = -np.take_along_axis(logp, np.asarray(m.targets)[..., None], -1)[..., 0]
    assert w.sum() > 0 and float(aux["masked_tokens"]) == w.sum()
    np.testing.assert_allclose(loss, (nll * w).sum() / w.sum(), rtol=1e-5)
    assert float(loss) > np.log(50) - 1.5  # untrained: near uniform over 50 ids


@pytest.mark.slow
def test_mlm_pretraining_then_fine_tuning(tmp_path):
    path = tmp_path / "articles.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in ARTICLES))
    pretrain = tmp_path / "mlm"
    cfg = tiny(**{"data.name": "pretrain", "data.tasks": "mlm", "data.path": str(path),
                  "num_train_steps": 10, "log_every_steps": 10, "model.max_len": 16})
    train.train_and_evaluate(cfg, str(pretrain))
    [row] = [json.loads(line) for line in open(pretrain / "metrics.jsonl")]
    assert np.isfinite(row["loss"]) and 0 <= row["mlm_accuracy"] <= 1 and row["masked_tokens"] > 0
    _, saved = checkpoints.latest_params(str(pretrain))
    assert "mlm" in saved
    finetune = tmp_path / "finetune"
    train.train_and_evaluate(tiny(**{"init_from": str(pretrain), "num_train_steps": 1,
                                     "model.max_len": 16}), str(finetune))
    _, tuned = checkpoints.latest_params(str(finetune))
    assert "mlm" not in tuned  # the head stays behind; the towers come along
    jax.tree.map(np.testing.assert_array_equal, saved["tower"], tuned["tower"])


def test_mlm_needs_a_transformer_and_no_other_task():
    for overrides, fragment in (({"model.tower": "bow_mlp"}, "needs a transformer"),
                                ({"data.tasks": "mlm,ict"}, "mlm alone")):
        cfg = tiny(**{"data.name": "pretrain", "data.tasks": "mlm", "data.path": "x.jsonl",
                      **overrides})
        with pytest.raises(ConfigError, match=fragment):
            config_lib.validate(cfg, 8)
