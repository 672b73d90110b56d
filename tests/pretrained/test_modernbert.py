"""ModernBERT starts: the tower equals transformers on a tiny random folder (global and
local layers; fixture made by scripts/fixtures/make_decoder_fixtures.py, no torch here),
and a run from it trains and exports a sentence-transformers folder that reads back as
the run's model."""

import json

import conftest
import jax
import numpy as np
import pytest
from conftest import load_config
from safetensors.numpy import load_file

from dualjax import pretrained
from dualjax.models.modernbert import ModernBertConfig, ModernBertTower
from dualjax.pretrained import modernbert_weights

FOLDER = conftest.FIXTURES / "pretrained" / "tiny_modernbert"


@pytest.fixture(scope="module")
def reference() -> dict:
    with np.load(conftest.FIXTURES / "pretrained" / "tiny_decoders_reference.npz") as z:
        return {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("modernbert/")}


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_tower_equals_transformers(pooling, reference):
    start = pretrained.resolve(str(FOLDER), pooling)
    assert start.kind == "modernbert" and start.architecture.local == (False, True, True)
    ids, mask = start.tokenizer().encode(list(reference["texts"]), reference["right_ids"].shape[1])
    np.testing.assert_array_equal(ids[mask], reference["right_ids"][reference["right_mask"]])
    pooled, inter = ModernBertTower(start.architecture).apply(
        {"params": start.tower_params()}, reference["right_ids"], reference["right_mask"],
        mutable="intermediates")
    states = np.asarray(inter["intermediates"]["hidden_states"][0])[reference["right_mask"]]
    np.testing.assert_allclose(states, reference["right_states"], atol=1e-5)
    np.testing.assert_allclose(pooled, reference[pooling], atol=1e-5)


def test_weights_and_config_go_back_to_their_hugging_face_form():
    start = pretrained.resolve(str(FOLDER))
    back = modernbert_weights.hf_tensors(start.tower_params(), start.architecture)
    theirs = load_file(FOLDER / "model.safetensors")
    assert set(back) == set(theirs)
    for name, value in back.items():
        np.testing.assert_array_equal(value, theirs[name])
    hf = json.loads((FOLDER / "config.json").read_text())
    again = ModernBertConfig.from_hf(modernbert_weights.hf_config(start.architecture), "cls")
    assert again == start.architecture == ModernBertConfig.from_hf(hf, "cls")


@pytest.mark.slow
def test_a_run_from_the_tiny_modernbert_trains_and_exports(tmp_path):
    from dualjax import export
    from dualjax.train import loop as train
    from dualjax.train import trained
    cfg = load_config("tiny")
    cfg.model.update(pretrained=str(FOLDER), tower="modernbert", tokenizer="hf", max_len=24,
                     pretrained_pooling="mean")
    cfg.num_train_steps, cfg.checkpoint_every_steps = 3, 3
    cfg.eval.update(index="exact", baselines="")
    cfg.optimizer.update(learning_rate=1e-3, warmup_steps=1)
    workdir = str(tmp_path / "run")
    rows = train.train_and_evaluate(cfg, workdir)
    assert rows["dual_encoder [exact]"]["map@100"] != rows["start [exact]"]["map@100"]
    run = trained.load_trained(workdir)
    texts = ["what is the capital of france", "Paris is the capital of France."]
    fn = jax.jit(lambda p, x: run.model.apply({"params": p}, **x, method="encode_documents"))
    want = np.asarray(fn(run.params, run.inputs.document.encode(texts)))
    folder = str(tmp_path / "st")
    export.export_sentence_transformers(workdir, folder)
    back = pretrained.resolve(folder)
    assert (back.kind, back.architecture.pooling) == ("modernbert", "mean")
    ids, mask = back.tokenizer().encode(texts, 24)
    vectors = np.array(ModernBertTower(back.architecture).apply(
        {"params": back.tower_params()}, ids, mask))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_modernbert"])
def test_recomputed_layers_give_the_same_loss_and_gradient(name):
    """model.remat: each layer's activations recomputed in the backward pass; the loss
    and every gradient as without it (to float32 rounding of sums of ~2,000)."""
    from dualjax.models.decoder import DecoderTower
    start = pretrained.resolve(str(conftest.FIXTURES / "pretrained" / name))
    cls = DecoderTower if start.kind == "decoder" else ModernBertTower
    params = start.tower_params()
    ids = np.random.default_rng(0).integers(5, 300, (16, 48)).astype(np.int32)
    mask = np.arange(48) < np.random.default_rng(1).integers(8, 48, (16, 1))
    out = []
    for remat in (False, True):
        tower = cls(start.architecture, remat=remat)
        loss = lambda p, t=tower: (t.apply({"params": p}, ids, mask) ** 2).sum()
        out.append(jax.jit(jax.value_and_grad(loss))(params))
    assert "remat" in str(jax.make_jaxpr(jax.grad(loss))(params))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4), *[
        o[1] for o in out])


def test_remat_on_a_tower_without_layers_is_refused():
    from dualjax import errors
    from dualjax.config import validation as config_lib
    cfg = load_config("tiny")
    cfg.model.remat = True
    with pytest.raises(errors.ConfigError, match="model.remat: the bow_mlp tower has no layers"):
        config_lib.validate(cfg, 8)
