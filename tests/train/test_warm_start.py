"""Pre-train, then fine-tune: config.init_from restores towers and vocabulary, refuses a
mismatch, and a pre-training run trains on generated pairs."""

import json
import os
import re

import jax
import numpy as np
import pytest
from conftest import load_config
from helpers import ARTICLES

from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec
from dualjax.errors import ConfigError
from dualjax.models import dual_encoder
from dualjax.train import checkpoints, warm_start
from dualjax.train import loop as train


def tiny(**overrides):
    cfg = load_config("tiny")
    cfg.eval.untrained = False
    cfg.eval.baselines = ""
    cfg.eval.index = "exact"
    cfg.update_from_flattened_dict(overrides)
    return cfg


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A 4-step pre-training run (ICT+BFS+WLP, learned temperature) on the test articles."""
    root = tmp_path_factory.mktemp("pretrain")
    path = root / "articles.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in ARTICLES))
    workdir = root / "run"
    cfg = tiny(**{"data.name": "pretrain", "data.path": str(path), "num_train_steps": 4,
                  "model.similarity": "cosine_learned_temperature"})
    assert train.train_and_evaluate(cfg, str(workdir)) == {}  # nothing to evaluate
    return workdir


@pytest.mark.slow
def test_pretraining_run_trains_on_generated_pairs(pretrained):
    rows = [json.loads(line) for line in open(pretrained / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [4] and rows[0]["split"] == "train"
    assert np.isfinite(rows[0]["loss"])
    vocab = json.load(open(pretrained / "vocab.json"))
    assert "satellite" in json.dumps(vocab)  # built from the collection's passages
    assert os.listdir(pretrained / "checkpoints") == ["4"]


@pytest.mark.slow
def test_init_from_restores_towers_and_vocabulary(pretrained, tmp_path):
    # One fine-tuning step at learning rate 0 (warmup starts there) keeps the towers.
    cfg = tiny(**{"init_from": str(pretrained), "num_train_steps": 1})
    train.train_and_evaluate(cfg, str(tmp_path))
    assert (tmp_path / "vocab.json").read_bytes() == (pretrained / "vocab.json").read_bytes()
    _, before = checkpoints.latest_params(str(pretrained))
    _, after = checkpoints.latest_params(str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, before["tower"], after["tower"])
    # The similarity differs (learned temperature there, alpha/beta here): not carried.
    assert "log_temperature" not in after and float(after["alpha"]) == cfg.model.init_scale
    # Resuming the fine-tuning run resumes it (its own checkpoint), whatever init_from says.
    cfg.num_train_steps = 2
    train.train_and_evaluate(cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


@pytest.mark.slow
def test_init_from_carries_the_same_similarity(pretrained):
    cfg = tiny(**{"model.similarity": "cosine_learned_temperature"})
    model = dual_encoder.make_model(model_spec(cfg.model), 100)
    step, saved = checkpoints.latest_params(str(pretrained))
    fresh = dual_encoder.init_params(model, jax.random.key(1), 16)
    fresh["tower"] = jax.tree.map(np.zeros_like, saved["tower"])  # the saved vocabulary's size
    got = warm_start.tower_params(str(pretrained), fresh, cfg.model)
    assert step == 4
    np.testing.assert_array_equal(got["log_temperature"], saved["log_temperature"])
    jax.tree.map(np.testing.assert_array_equal, got["tower"], saved["tower"])


@pytest.mark.slow
def test_init_from_refuses_other_towers(pretrained, tmp_path):
    cfg = tiny(**{"init_from": str(pretrained), "model.embed_dim": 32})
    with pytest.raises(ConfigError) as e:
        train.train_and_evaluate(cfg, str(tmp_path))
    message = str(e.value)
    assert "its towers do not match" in message
    assert "['tower']['bow']['embed']['embedding']" in message  # the first param that differs
    assert "model.embed_dim: 16 (init_from) vs 32 (this run)" in message
    assert not os.listdir(tmp_path / "checkpoints")  # nothing trained, nothing saved


@pytest.mark.parametrize("make, fragment", [
    (lambda tmp: str(tmp / "nowhere"), "no such workdir"),
    (lambda tmp: str(tmp), "has no vocab.json"),
])
def test_init_from_a_workdir_that_is_not_a_run(tmp_path, make, fragment):
    with pytest.raises(ConfigError, match=fragment):
        warm_start.copy_vocabularies(make(tmp_path), str(tmp_path / "new"))


def test_pretraining_config_checks():
    for overrides, fragment in (
            ({"data.tasks": "ict,mlm"}, "data.tasks='ict,mlm'"),
            ({"data.ict_mask_rate": 1.5}, "ict_mask_rate=1.5"),
            ({"data.max_query_words": 3}, "max_query_words=3 must be 0 (queries whole) or "
                                           "at least data.min_query_words (5)"),
            ({"data.max_query_words": -1}, "max_query_words=-1"),
            ({"num_train_steps": 0}, "nothing to evaluate"),
            ({"loss.num_mixed_negatives": 8}, "mixed negatives"),
            ({"model.temperature": 5.0, "model.similarity": "cosine_learned_temperature"},
             "model.temperature=5.0")):
        cfg = tiny(**{"data.name": "pretrain", "data.path": "x.jsonl", **overrides})
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            config_lib.validate(cfg, 8)


@pytest.mark.parametrize("key, value", [("model.vocab_size", 800), ("model.tokenizer", "bigram"),
                                        ("model.num_oov_buckets", 7)])
@pytest.mark.slow
def test_init_from_refuses_another_vocabulary(pretrained, tmp_path, key, value):
    """The run reads init_from's vocab.json: a vocabulary setting that differs is refused,
    naming it, not silently ignored."""
    cfg = tiny(**{"init_from": str(pretrained), key: value})
    with pytest.raises(ConfigError, match=f"built its vocabulary with {key}=.* this run asks "
                                          f"for {value!r}"):
        train.train_and_evaluate(cfg, str(tmp_path))


def test_an_init_from_saved_before_a_vocabulary_key_is_read_at_that_keys_old_value(tmp_path):
    """An init_from whose config.json predates model.feature_dim built its feature tables
    at 32 (what dualjax did then): a run asking for 64 is refused by name, one asking
    for 32 is not."""
    from dualjax.errors import ConfigError
    from dualjax.train import warm_start
    old = tmp_path / "old"
    old.mkdir()
    (old / "vocab.json").write_text("{}")
    (old / "config.json").write_text(json.dumps({"model": {"tokenizer": "word"}}))
    model = {"tokenizer": "word", "feature_dim": 64}
    with pytest.raises(ConfigError, match=r"model.feature_dim=32, this run asks for 64"):
        warm_start.copy_vocabularies(str(old), str(tmp_path / "new"), model)
    (tmp_path / "new").mkdir()
    warm_start.copy_vocabularies(str(old), str(tmp_path / "new"), {**model, "feature_dim": 32})
    assert (tmp_path / "new" / "vocab.json").exists()


def test_given_weights_replace_their_random_initialisation_which_is_never_computed():
    """`step.make_init_state`'s `given` (a start's weights): those params are the given
    arrays, every other leaf of the state is what the plain initialisation makes, and the
    compiled initialisation no longer draws the given params' random values."""
    import optax

    from dualjax import losses
    from dualjax.objectives import in_batch
    from dualjax.runtime import sharding
    from dualjax.train import step as step_lib
    cfg = tiny(**{"model.tower": "bow_mlp"})
    mesh = sharding.make_mesh()
    model = dual_encoder.make_model(model_spec(cfg.model), 300)
    objective = in_batch.objective(model, losses.sharded("in_batch_softmax", mesh), 16)
    init = jax.jit(step_lib.make_init_state(objective, optax.adam(1e-3)), static_argnums=0)
    plain = init(3)
    towers = {jax.tree_util.keystr(p): np.full(x.shape, 0.5, x.dtype) for p, x in
              jax.tree_util.tree_leaves_with_path(plain["params"])
              if p[0].key in ("query_tower", "doc_tower", "tower")}
    assert towers
    state = init(3, towers)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(state),
                            jax.tree.leaves(plain), strict=True):
        given = towers.get(jax.tree_util.keystr(path[1:])) if path[0].key == "params" else None
        np.testing.assert_array_equal(x, y if given is None else given,
                                      err_msg=jax.tree_util.keystr(path))
    # Threefry's rounds are xors: the towers' random values are what the plain
    # initialisation spends them on, and nothing computes them when they are given.
    xors = lambda *args: init.lower(*args).compile().as_text().count(" xor(")
    assert xors(3, towers) < xors(3) / 4, (xors(3, towers), xors(3))
