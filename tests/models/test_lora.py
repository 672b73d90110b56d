"""LoRA on the decoder tower: the adapters start at zero and fold into the weights
exactly; a run trains the adapters alone (the tower's weights stay as the start's, in
bfloat16, with no optimizer state), on 4 x 2 data x model as on 8 x 1, resumes
bit-equal and exports merged weights (a bundle, a sentence-transformers folder) that
give the run's vectors."""

import dataclasses
import os

import conftest
import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, pretrained
from dualjax.config import validation as config_lib
from dualjax.models import lora
from dualjax.models.decoder import LORA_TARGETS, DecoderTower
from dualjax.models.lora import LoraSpec

QWEN2 = str(conftest.FIXTURES / "pretrained" / "tiny_qwen2")


def overlay(ours, theirs):
    if isinstance(theirs, dict):
        return {**ours, **{k: overlay(ours.get(k), v) for k, v in theirs.items()}}
    return theirs


@pytest.mark.slow
def test_adapters_start_at_zero_and_fold_into_the_weights():
    start = pretrained.resolve(QWEN2)
    tok = start.tokenizer()
    ids, mask = tok.encode(["a text to encode", "and another, longer one to encode"], 16)
    spec = LoraSpec(rank=4, alpha=8.0, targets=LORA_TARGETS, base_dtype="float32")
    adapted = DecoderTower(start.architecture, lora=spec)
    params = nn.meta.unbox(adapted.init(jax.random.PRNGKey(0), ids, mask)["params"])
    params = overlay(params, start.tower_params())  # the start's weights, adapters kept
    plain = DecoderTower(start.architecture)
    base = plain.apply({"params": start.tower_params()}, ids, mask)
    np.testing.assert_allclose(adapted.apply({"params": params}, ids, mask), base, atol=1e-6)

    rng = np.random.default_rng(0)  # B moved off zero: the adapters change the vectors
    moved = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)
        if str(path[-1].key).endswith("_lora_b") else x, params)
    out = adapted.apply({"params": moved}, ids, mask)
    assert np.abs(out - base).max() > 1e-2
    folded = lora.merge(moved, spec)
    assert not any(str(p[-1].key).endswith(lora.SUFFIXES)
                   for p, _ in jax.tree_util.tree_leaves_with_path(folded))
    np.testing.assert_allclose(plain.apply({"params": folded}, ids, mask), out, atol=1e-5)


def lora_config(**model):
    cfg = load_config("tiny")
    cfg.model.update(pretrained=QWEN2, tower="decoder", tokenizer="hf", max_len=24,
                     lora_rank=4, lora_alpha=8.0, **model)
    cfg.num_train_steps, cfg.checkpoint_every_steps = 4, 2
    cfg.eval.index, cfg.eval.baselines = "exact", ""
    cfg.optimizer.update(learning_rate=1e-2, warmup_steps=1)
    return cfg


@pytest.mark.parametrize("model, match", [
    ({"tower": "bow_mlp", "pretrained": "", "tokenizer": "word"},
     "the bow_mlp tower takes no adapters"),
    ({"lora_targets": "q_proj,wq"}, "'wq' names no weight of the tower"),
    ({"lora_rank": -1}, "lora_rank=-1 must be 0"),
    ({"lora_base_dtype": "float16"}, "model.lora_base_dtype"),
])
def test_settings_that_cannot_work_are_refused_by_key(model, match):
    cfg = lora_config()
    cfg.model.update(**model)
    with pytest.raises(errors.ConfigError, match=match):
        config_lib.validate(cfg, 8)


@pytest.mark.slow
def test_a_lora_run_trains_the_adapters_alone_resumes_and_exports_merged(tmp_path):
    from dualjax import export
    from dualjax.train import checkpoints, trained
    from dualjax.train import loop as train
    cfg = lora_config(lora_targets="q_proj,v_proj,mlp_down")
    workdir = str(tmp_path / "run")
    rows = train.train_and_evaluate(cfg, workdir)
    assert rows["dual_encoder [exact]"]["map@100"] != rows["start [exact]"]["map@100"]
    step, saved = checkpoints.latest_params(workdir)
    start = pretrained.resolve(QWEN2).tower_params()
    tower = saved["tower"]
    attn = tower["layer_0"]["attn"]
    # The start's weights, frozen in bfloat16; the adapters of the targets alone, moved.
    assert attn["query_kernel"].dtype == np.dtype("bfloat16")
    np.testing.assert_array_equal(attn["query_kernel"],
                                  start["layer_0"]["attn"]["query_kernel"].astype("bfloat16"))
    assert np.abs(attn["query_lora_b"]).max() > 0 and "key_lora_a" not in attn
    assert {k for k in tower["layer_1"] if k.endswith(lora.SUFFIXES)} == {
        "mlp_down_lora_a", "mlp_down_lora_b"}
    assert saved["alpha"] != 10.0  # the similarity trains too

    # Optimizer state for the adapters (and the similarity) alone.
    raw = checkpoints._restore_numpy(os.path.join(workdir, "checkpoints", str(step), "state"))
    opt_leaves = [x for x in jax.tree.leaves(raw["opt_state"]) if hasattr(x, "shape")]
    adapter_size = sum(x.size for p, x in jax.tree_util.tree_leaves_with_path(saved)
                       if str(p[-1].key).endswith(lora.SUFFIXES))
    assert 0 < sum(x.size for x in opt_leaves) <= 2 * adapter_size + 16

    # 2 steps, then 2 more from the checkpoint: bit-equal to the 4 steps in one run.
    half = str(tmp_path / "half")
    again = lora_config(lora_targets="q_proj,v_proj,mlp_down")
    again.num_train_steps = 2
    train.train_and_evaluate(again, half)
    again.num_train_steps = 4
    train.train_and_evaluate(again, half)
    jax.tree.map(np.testing.assert_array_equal, checkpoints.latest_params(half)[1], saved)
    # (Another mesh than 8 x 1 gives the same weights: the data-by-model test below.)

    run = trained.load_trained(workdir)
    encoder = export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    texts = ["what is the capital of france", "Paris is the capital of France."]
    fn = jax.jit(lambda p, x: run.model.apply({"params": p}, **x, method="encode_documents"))
    want = np.asarray(fn(run.params, run.inputs.document.encode(texts)))
    np.testing.assert_allclose(encoder.encode_documents(texts), want, atol=1e-5)
    assert not any(str(p[-1].key).endswith(lora.SUFFIXES)  # the bundle holds plain weights
                   for p, _ in jax.tree_util.tree_leaves_with_path(encoder.params))
    assert dataclasses.asdict(run.model.spec.lora)["rank"] == 4

    # The sentence-transformers folder: merged weights, last-token pooling and a tokenizer
    # that appends the end-of-text token itself; read back as a plain Qwen2 folder (no
    # torch here), it gives the run's vectors.
    folder = str(tmp_path / "st")
    export.export_sentence_transformers(workdir, folder)
    back = pretrained.resolve(folder)
    assert (back.kind, back.architecture.pooling) == ("decoder", "last_token")
    assert not back.tokenizer().appends_end  # its post-processor does
    tok = back.tokenizer()
    assert tok.token_ids(texts[0]) == run.inputs.document.tokenizer.token_ids(texts[0])
    tower = DecoderTower(back.architecture)
    ids, mask = tok.encode(texts, 24)
    vectors = np.array(tower.apply({"params": back.tower_params()}, ids, mask))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, want, atol=1e-5)


@pytest.mark.slow
def test_a_data_by_model_mesh_trains_the_lora_decoder_as_the_data_mesh(tmp_path):
    """4 (data) x 2 (model): the query heads and MLP columns of the frozen weights split
    2 ways (the 2 key/value heads whole), the adapters beside them; 4 steps end within
    1e-5 of the 8 x 1 run, loss and every parameter (beta and the key bias aside: their
    gradients are rounding noise, which Adam scales to steps)."""
    import json

    from dualjax.train import checkpoints
    from dualjax.train import loop as train
    cfg = lora_config()
    cfg.num_train_steps, cfg.checkpoint_every_steps = 4, 4
    train.train_and_evaluate(cfg, str(tmp_path / "data"))
    cfg.mesh.model_axis = 2
    train.train_and_evaluate(cfg, str(tmp_path / "dm"))
    losses = lambda w: [r["loss"] for r in map(json.loads, open(tmp_path / w / "metrics.jsonl"))
                        if r["split"] == "train"]
    np.testing.assert_allclose(losses("dm"), losses("data"), atol=1e-5)
    (_, a), (_, b) = (checkpoints.latest_params(str(tmp_path / w)) for w in ("data", "dm"))
    bad = [(jax.tree_util.keystr(path), float(np.max(np.abs(np.asarray(x, np.float32)
                                                            - np.asarray(y, np.float32)))))
           for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                                   strict=True)
           if "beta" not in jax.tree_util.keystr(path) and not np.allclose(
               np.asarray(x, np.float32), np.asarray(y, np.float32), atol=1e-5, rtol=0)]
    assert not bad, bad


@pytest.mark.slow
def test_bert_adapters_fold_into_its_weights():
    """The bert tower (MiniLM, MPNet) takes adapters on its attention and MLP too."""
    from dualjax.models.bert import LORA_TARGETS as BERT_TARGETS
    from dualjax.models.bert import BertTower
    start = pretrained.resolve(str(conftest.FIXTURES / "pretrained" / "tiny_bert"))
    ids, mask = start.tokenizer().encode(["a text to encode", "and another one"], 16)
    spec = LoraSpec(rank=2, alpha=4.0, targets=BERT_TARGETS, base_dtype="float32")
    adapted = BertTower(start.architecture, lora=spec)
    params = overlay(nn.meta.unbox(adapted.init(jax.random.PRNGKey(0), ids, mask)["params"]),
                     start.tower_params())
    layer = params["layer_0"]
    assert {"query_lora_a", "out_lora_b"} <= set(layer["attn"])
    assert {"mlp_in_lora_a", "mlp_out_lora_b"} <= set(layer)
    rng = np.random.default_rng(0)
    moved = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)
        if str(path[-1].key).endswith("_lora_b") else x, params)
    out = adapted.apply({"params": moved}, ids, mask)
    plain = BertTower(start.architecture)
    assert np.abs(out - plain.apply({"params": start.tower_params()}, ids, mask)).max() > 1e-2
    np.testing.assert_allclose(plain.apply({"params": lora.merge(moved, spec)}, ids, mask),
                               out, atol=1e-5)


@pytest.mark.slow
def test_modernbert_adapters_fold_into_its_weights():
    """The modernbert tower takes adapters on its fused qkv, attention out and GeGLU MLP
    projections; they fold into its weights exactly, and Hugging Face's (PEFT's) names
    Wqkv, Wo, Wi name them ("Wo": the attention's and the MLP's output)."""
    from dualjax.models.modernbert import LORA_TARGETS as MB_TARGETS
    from dualjax.models.modernbert import ModernBertTower
    start = pretrained.resolve(str(conftest.FIXTURES / "pretrained" / "tiny_modernbert"))
    ids, mask = start.tokenizer().encode(["a text to encode", "and another one"], 16)
    assert lora.parse_targets("Wqkv,Wo,Wi", MB_TARGETS) == ("qkv", "out", "mlp_out", "mlp_in")
    spec = LoraSpec(rank=2, alpha=4.0, targets=MB_TARGETS, base_dtype="float32")
    adapted = ModernBertTower(start.architecture, lora=spec)
    params = overlay(nn.meta.unbox(adapted.init(jax.random.PRNGKey(0), ids, mask)["params"]),
                     start.tower_params())
    assert {"qkv_lora_a", "out_lora_b", "mlp_in_lora_a", "mlp_out_lora_b"} <= set(
        params["layer_1"])
    plain = ModernBertTower(start.architecture)
    base = plain.apply({"params": start.tower_params()}, ids, mask)
    np.testing.assert_allclose(adapted.apply({"params": params}, ids, mask), base, atol=1e-6)
    rng = np.random.default_rng(0)
    moved = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)
        if str(path[-1].key).endswith("_lora_b") else x, params)
    out = adapted.apply({"params": moved}, ids, mask)
    assert np.abs(out - base).max() > 1e-2
    np.testing.assert_allclose(plain.apply({"params": lora.merge(moved, spec)}, ids, mask),
                               out, atol=1e-5)


def test_a_start_is_read_in_the_frozen_weights_dtype(monkeypatch):
    """A LoRA run keeps its frozen weights in bfloat16: the start's are read in bfloat16
    (each converted once from the mapped file), never widened to a float32 tree first (a
    7B start: 28 GB of host memory). A float32 run reads float32 as before."""
    from dualjax.train import warm_start
    start = pretrained.resolve(QWEN2)
    asked = []
    real = pretrained.Pretrained.tower_params
    monkeypatch.setattr(pretrained.Pretrained, "tower_params",
                        lambda self, dtype=np.float32: asked.append(np.dtype(dtype))
                        or real(self, dtype))
    full = real(start)
    adapter = {"query_lora_a": np.zeros((2, 2), np.float32)}  # (adapters stay float32)
    for base in ("bfloat16", "float32"):
        frozen = jax.tree.map(lambda x, b=base: x.astype(b), full)
        frozen["layer_0"]["attn"].update(adapter)
        params = {"tower": frozen, "alpha": np.float32(10.0)}
        out = warm_start.pretrained_params(start, params)["tower"]
        assert asked[-1] == np.dtype(base)
        assert out["layer_0"]["attn"]["query_lora_a"] is adapter["query_lora_a"]
        jax.tree.map(lambda got, want, b=base: np.testing.assert_array_equal(
            got, want.astype(b)), {k: v for k, v in out.items() if k != "layer_0"},
            {k: v for k, v in full.items() if k != "layer_0"})
        assert {x.dtype for x in jax.tree.leaves({k: v for k, v in out.items()
                                                  if k != "layer_0"})} == {np.dtype(base)}
