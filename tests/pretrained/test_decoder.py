"""Decoder-LLM starts (Llama, Mistral, Qwen2, Qwen3): the tower equals transformers on
tiny random folders (fixtures made by scripts/fixtures/make_decoder_fixtures.py; no
torch here), the tokenizer appends the end-of-text token as these embedders read it,
sharded weights load, bad folders are refused in one line, and a run from one trains,
resumes and exports a bundle."""

import dataclasses
import json
import pathlib
import shutil

import conftest
import jax
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, pretrained
from dualjax.models.decoder import DecoderConfig, DecoderTower
from dualjax.pretrained.decoder_weights import hf_tensors

FIXTURES = conftest.FIXTURES / "pretrained"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="module")
def reference() -> dict:
    with np.load(FIXTURES / "tiny_decoders_reference.npz") as z:
        return {k: z[k] for k in z.files}


def folder(family: str) -> str:
    return str(FIXTURES / f"tiny_{family}")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_equals_transformers_with_either_padding_and_pooling(family, reference):
    """Every position's final state and both poolings within 1e-5 of transformers', the
    texts padded on the right and on the left (as sentence-transformers pads them)."""
    ref = {k.split("/", 1)[1]: v for k, v in reference.items() if k.startswith(family + "/")}
    start = pretrained.resolve(folder(family))
    assert start.kind == "decoder" and start.architecture.family == family
    params = start.tower_params()
    for pooling in ("last_token", "mean"):
        tower = DecoderTower(dataclasses.replace(start.architecture, pooling=pooling))
        apply = jax.jit(lambda ids, mask, t=tower: t.apply(
            {"params": params}, ids, mask, mutable="intermediates"))
        for side in ("right", "left"):
            ids, mask = ref[f"{side}_ids"], ref[f"{side}_mask"]
            pooled, inter = apply(ids, mask)
            states = np.asarray(inter["intermediates"]["hidden_states"][0])[mask]
            np.testing.assert_allclose(states, ref[f"{side}_states"], atol=1e-5)
            np.testing.assert_allclose(pooled, ref[pooling], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_appends_the_end_of_text_token_once(family, reference):
    """The ids transformers read: the tokenizer's own (<s> first for Llama and Mistral),
    then <|endoftext|>, appended unless the post-processor put it there (qwen3's); a
    truncated text keeps it last."""
    start = pretrained.resolve(folder(family))
    tok = start.tokenizer()
    want = [row[row >= 0].tolist() for row in reference[f"{family}/ids"]]
    ids, mask = tok.encode(list(reference[f"{family}/texts"]), 128)
    assert [row[m].tolist() for row, m in zip(ids, mask, strict=True)] == want
    assert tok.token_ids(str(reference[f"{family}/texts"][0])) == want[0]
    eos = start.architecture.eos_token_id
    short, short_mask = tok.encode(list(reference[f"{family}/texts"]), 8)
    assert short_mask.all() and (short[:, -1] == eos).all()
    assert (short[:, :7] == np.array([w[:7] for w in want])).all()


def test_sharded_weights_load_as_one_file(tmp_path):
    """model.safetensors.index.json and its shards give the same params; a shard that is
    missing is named."""
    from safetensors.numpy import load_file, save_file
    src = pathlib.Path(folder("qwen2"))
    dst = tmp_path / "sharded"
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, dst / file)
    (dst / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    whole, sharded = pretrained.resolve(str(src)), pretrained.resolve(str(dst))
    assert sharded.architecture == whole.architecture and sharded.sha256 != whole.sha256
    jax.tree.map(np.testing.assert_array_equal, sharded.tower_params(), whole.tower_params())
    (dst / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(errors.PretrainedError, match="model-00002-of-00002.safetensors"):
        pretrained.resolve(str(dst))


def test_weights_go_back_to_their_hugging_face_names():
    from safetensors.numpy import load_file
    start = pretrained.resolve(folder("qwen3"))
    back = hf_tensors(start.tower_params(), start.architecture)
    theirs = {k.removeprefix("model."): v
              for k, v in load_file(pathlib.Path(folder("qwen3"), "model.safetensors")).items()}
    assert set(back) == set(theirs)
    for name, value in back.items():
        np.testing.assert_array_equal(value, theirs[name])


def _copy(tmp_path, family: str, config: dict | None = None, tokenizer_config=None) -> str:
    dst = tmp_path / family
    shutil.copytree(folder(family), dst)
    if config is not None:
        hf = json.loads((dst / "config.json").read_text())
        hf.update(config)
        (dst / "config.json").write_text(json.dumps(hf))
    if tokenizer_config is not None:
        (dst / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(dst)


@pytest.mark.parametrize("config, match", [
    ({"model_type": "gemma2"}, "model_type 'gemma2' is not one model.pretrained reads: "
                               "bert, mpnet, llama, mistral, qwen2, qwen3"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope_type='yarn'"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
])
def test_folders_it_cannot_read_are_refused_in_one_line(tmp_path, config, match):
    with pytest.raises(errors.PretrainedError, match=match):
        pretrained.resolve(_copy(tmp_path, "llama", config))


def test_last_token_pooling_needs_an_end_of_text_token(tmp_path):
    path = _copy(tmp_path, "qwen2", {"eos_token_id": None}, tokenizer_config={})
    with pytest.raises(errors.PretrainedError, match="no end-of-text token for last-token"):
        pretrained.resolve(path)
    start = pretrained.resolve(path, "mean")  # mean pooling reads every token
    assert start.architecture.pooling == "mean" and "end_token" not in start.tokenizer_settings


def test_an_old_record_of_a_bert_start_still_loads(tmp_path):
    """WORKDIR/pretrained.json written before the decoder tower names the architecture
    "bert"; a decoder start's round-trips."""
    bert = pretrained.resolve(str(FIXTURES / "tiny_bert"))
    old = bert.to_json()
    old["bert"] = old.pop("architecture")
    assert pretrained.Pretrained.from_json(old) == bert
    start = pretrained.resolve(folder("mistral"))
    again = pretrained.Pretrained.from_json(json.loads(json.dumps(start.to_json())))
    assert again == start and isinstance(again.architecture, DecoderConfig)
    assert again.architecture.windows == (4, 4)


@pytest.mark.slow
def test_a_run_from_a_tiny_qwen2_trains_and_exports(tmp_path):
    """tower="decoder": the start row is the folder's model as is, training moves it, and
    the bundle encodes as the workdir's model."""
    from dualjax import export
    from dualjax.train import checkpoints, trained
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.model.update(pretrained=folder("qwen2"), tower="decoder", tokenizer="hf", max_len=24)
    cfg.num_train_steps, cfg.checkpoint_every_steps = 4, 2
    cfg.eval.index, cfg.eval.baselines = "exact", ""
    cfg.optimizer.update(learning_rate=1e-3, warmup_steps=1)
    workdir = str(tmp_path / "run")
    rows = train.train_and_evaluate(cfg, workdir)
    assert set(rows) == {"dual_encoder [exact]", "start [exact]"}
    assert rows["dual_encoder [exact]"]["map@100"] != rows["start [exact]"]["map@100"]
    step, saved = checkpoints.latest_params(workdir)
    start = pretrained.load(workdir)
    assert step == 4 and start.kind == "decoder"
    assert not np.allclose(saved["tower"]["layer_0"]["mlp_up"]["kernel"],
                           start.tower_params()["layer_0"]["mlp_up"]["kernel"])
    # (A resumed decoder run ends where one run does: tests/models/test_lora.py's run.)

    run = trained.load_trained(workdir)
    encoder = export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    texts = ["what is the capital of france", "Paris is the capital of France."]
    fn = jax.jit(lambda p, x: run.model.apply({"params": p}, **x, method="encode_documents"))
    want = np.asarray(fn(run.params, run.inputs.document.encode(texts)))
    np.testing.assert_allclose(encoder.encode_documents(texts), want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_exports_with_a_symbolic_batch_and_length(family, reference):
    """As a bundle lowers it (jax.export, batch and length symbolic; Mistral's sliding
    window among them): the exported function gives the tower's vectors."""
    start = pretrained.resolve(folder(family))
    tower, params = DecoderTower(start.architecture), start.tower_params()
    b, n = jax.export.symbolic_shape("b, l", constraints=("l <= 128", "l >= 1"))
    shapes = [jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params),
              jax.ShapeDtypeStruct((b, n), np.int32), jax.ShapeDtypeStruct((b, n), np.bool_)]
    exported = jax.export.export(jax.jit(lambda p, i, m: tower.apply({"params": p}, i, m)),
                                 platforms=("cpu",))(*shapes)
    ids, mask = reference[f"{family}/right_ids"], reference[f"{family}/right_mask"]
    np.testing.assert_allclose(exported.call(params, ids, mask),
                               reference[f"{family}/last_token"], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exported_tokenizer_appends_the_end_token_itself(family, reference):
    """`with_end_token`'s tokenizers JSON, read alone (as sentence-transformers reads an
    exported folder), encodes every text as the tokenizer that appends the token does,
    truncated too (Llama's and Mistral's <s> first: one template, not two)."""
    from dualjax.text.hf import HFTokenizer
    tok = pretrained.resolve(folder(family)).tokenizer()
    alone = HFTokenizer(tok.with_end_token())
    assert not alone.appends_end
    texts = list(reference[f"{family}/texts"])
    for length in (128, 8):
        for ours, theirs in zip(tok.encode(texts, length), alone.encode(texts, length),
                                strict=True):
            np.testing.assert_array_equal(ours, theirs)


def write_safetensors(path, tensors: dict, dtype: str) -> None:
    """A safetensors file by hand (safetensors.numpy writes no bfloat16)."""
    import struct

    import ml_dtypes
    kinds = {"BF16": ml_dtypes.bfloat16, "F16": np.float16}
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        blob = np.ascontiguousarray(value, kinds[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_weights_published_in_bfloat16_or_float16_load(tmp_path, dtype, reference):
    """Decoder LLMs are published in bfloat16, which safetensors.numpy cannot read: the
    weights are mapped from the file and widened to float32 (the vectors within the
    narrow type's rounding of the float32 fixture's); a file cut short is named."""
    from safetensors.numpy import load_file
    dst = tmp_path / "qwen2"
    shutil.copytree(folder("qwen2"), dst)
    write_safetensors(dst / "model.safetensors", load_file(dst / "model.safetensors"), dtype)
    start = pretrained.resolve(str(dst))
    params = start.tower_params()
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    pooled = DecoderTower(start.architecture).apply(
        {"params": params}, reference["qwen2/right_ids"], reference["qwen2/right_mask"])
    np.testing.assert_allclose(pooled, reference["qwen2/last_token"],
                               atol=0.08 if dtype == "BF16" else 0.01)  # (0.037, 0.0048)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(errors.PretrainedError, match="not a whole safetensors file"):
        pretrained.resolve(str(dst)).tower_params()


def test_a_template_that_ends_with_a_special_token_is_taken_as_is(tmp_path, reference):
    """Qwen3-Embedding's tokenizer template appends <|endoftext|> while its
    tokenizer_config names <|im_end|>: the template is how it was trained, so nothing
    more is appended (here <s> stands for the other token)."""
    path = _copy(tmp_path, "qwen3", tokenizer_config={"eos_token": "<s>"})
    tok = pretrained.resolve(path).tokenizer()
    want = [row[row >= 0].tolist() for row in reference["qwen3/ids"]]
    assert tok.token_ids(str(reference["qwen3/texts"][0])) == want[0]
    assert not tok.appends_end
