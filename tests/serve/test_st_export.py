"""`python -m dualjax.export --format=sentence-transformers` (issue 32): a BERT-family run
as a sentence-transformers folder. Without torch, the folder's files and tensor names
are checked and its weights read back through dualjax's own Hugging Face loader
(`pretrained.resolve`) give the run's vectors; with sentence-transformers installed,
`SentenceTransformer(DIR)` gives them too (scripts/bench/check_st_export.py records it)."""
import json
import os
import pathlib
import subprocess
import sys

import conftest
import jax
import numpy as np
import pytest
from conftest import load_config
from safetensors.numpy import load_file

from dualjax import export, pretrained
from dualjax.models import dual_encoder
from dualjax.models.bert import BertTower

FIXTURES = conftest.FIXTURES / "pretrained"
TINY = str(FIXTURES / "tiny_bert")
TEXTS = ["what is the capital of france", "paris is the capital and largest city of france",
         "a cat sat on the mat", "dual encoders embed queries and documents apart",
         "x" * 300]  # the last is cut at each side's max length


def _run(tmp_path, start: str = TINY, **model) -> str:
    """A 2-step run from the tiny BERT folder (or `start`); its workdir."""
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.model.update({"tower": "bert", "tokenizer": "hf", "pretrained": start, "max_len": 24,
                      **model})
    cfg.num_train_steps, cfg.checkpoint_every_steps = 2, 2
    cfg.optimizer.update(learning_rate=1e-3, warmup_steps=1)
    cfg.eval.update(index="exact", baselines="", untrained=False)
    workdir = str(tmp_path / "run")
    train.train_and_evaluate(cfg, workdir)
    return workdir


def _run_vectors(workdir: str, side: str) -> np.ndarray:
    from dualjax.train import trained
    run = trained.load_trained(workdir)
    method = {"query": "encode_queries", "document": "encode_documents"}[side]
    x = getattr(run.inputs, side).encode(TEXTS)
    return np.asarray(run.model.apply({"params": run.params}, **x, method=method))


def _folder_vectors(folder: str, max_len: int, pooling: str = "", prompt: str = ""
                    ) -> np.ndarray:
    """The vectors of a Transformer folder as dualjax reads a pretrained start: its
    config.json, tensor names and pooling (a route's is beside it: `pooling`), its own
    tokenizer.json, the texts after `prompt`."""
    start = pretrained.resolve(folder, pooling)
    params = start.tower_params()
    ids, mask = start.tokenizer().encode([prompt + t for t in TEXTS], max_len)
    out = BertTower(start.architecture).apply({"params": params}, ids, mask)
    return np.asarray(dual_encoder.l2_normalize(out))


@pytest.mark.slow
def test_separate_towers_become_a_router_whose_routes_give_each_sides_vectors(tmp_path):
    workdir = _run(tmp_path, shared_towers=False, query_max_len=12, doc_max_len=24)
    out = str(tmp_path / "st")
    record = export.export_sentence_transformers(workdir, out)
    assert record["step"] == 2
    modules = json.loads(pathlib.Path(out, "modules.json").read_text())
    assert [m["type"] for m in modules] == ["sentence_transformers.models.Router"]
    router = json.loads(pathlib.Path(out, "router_config.json").read_text())
    assert router["structure"]["query"][0] == "query_0_Transformer"
    assert router["parameters"]["default_route"] == "document"
    upstream = set(load_file(os.path.join(TINY, "model.safetensors")))
    for side, length in (("query", 12), ("document", 24)):
        folder = os.path.join(out, f"{side}_0_Transformer")
        assert set(load_file(os.path.join(folder, "model.safetensors"))) == upstream
        settings = json.loads(pathlib.Path(folder, "sentence_bert_config.json").read_text())
        assert settings["max_seq_length"] == length
        pooling = json.loads(pathlib.Path(out, f"{side}_1_Pooling", "config.json").read_text())
        assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
        np.testing.assert_allclose(_folder_vectors(folder, length, "mean"),
                                   _run_vectors(workdir, side), atol=1e-5)
    # Every file is recorded: --overwrite replaces the folder, another file stops it.
    assert sorted(record["files"]) == sorted(
        str(p.relative_to(out)) for p in pathlib.Path(out).rglob("*")
        if p.is_file() and p.name != export.ST_MARKER)
    with pytest.raises(ValueError, match="already holds a sentence-transformers folder"):
        export.export_sentence_transformers(workdir, out)
    export.export_sentence_transformers(workdir, out, overwrite=True)
    pathlib.Path(out, "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds notes.txt"):
        export.export_sentence_transformers(workdir, out, overwrite=True)


@pytest.mark.slow
def test_what_sentence_transformers_cannot_compute_is_refused_before_writing(tmp_path):
    from dualjax.train import loop as train
    cfg = load_config("tiny")  # bow_mlp towers over dualjax's own trigram vocabulary
    cfg.num_train_steps, cfg.checkpoint_every_steps = 1, 1
    cfg.eval.update(index="exact", baselines="", untrained=False)
    workdir = str(tmp_path / "run")
    train.train_and_evaluate(cfg, workdir)
    out = tmp_path / "st"
    with pytest.raises(ValueError, match=r"the query tower is model.tower='bow_mlp': only "
                                         r"BERT-family and decoder towers"):
        export.export_sentence_transformers(workdir, str(out))
    assert not out.exists() and not list(tmp_path.glob("st.tmp*"))
    result = subprocess.run(
        [sys.executable, "-m", "dualjax.export", f"--workdir={workdir}", f"--out={out}",
         "--format=sentence-transformers"], capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(
        "dualjax.export: --format=sentence-transformers: the query tower is")


def test_sentence_transformers_loads_the_folder_with_the_runs_vectors(tmp_path):
    st = pytest.importorskip("sentence_transformers",
                             reason="sentence-transformers is not installed (torch): "
                                    "scripts/bench/check_st_export.py runs this check")
    workdir = _run(tmp_path, shared_towers=False, query_max_len=12, doc_max_len=24,
                   query_prompt="query: ", document_prompt="passage: ")
    out = str(tmp_path / "st")
    export.export_sentence_transformers(workdir, out)
    model = st.SentenceTransformer(out, device="cpu")  # encode_query puts "query: " first
    np.testing.assert_allclose(model.encode_query(TEXTS), _run_vectors(workdir, "query"),
                               atol=1e-5)
    np.testing.assert_allclose(model.encode_document(TEXTS),
                               _run_vectors(workdir, "document"), atol=1e-5)


def _static_model(tmp_path, lengths=(8, 24), shared=True):
    """A bow dual encoder over the tiny BERT's WordPiece vocabulary, lowercasing, no
    special tokens (as WordLlama's), with a random table: (spec, inputs, params)."""
    from dualjax.config.specs import model_spec
    from dualjax.text.hf import HFTokenizer
    from dualjax.text.sides import Inputs, Side
    cfg = load_config("tiny")
    cfg.model.update(tower="bow", tokenizer="hf", embed_dim=16, shared_towers=shared)
    tok = HFTokenizer.from_file(os.path.join(TINY, "tokenizer.json"), lowercase=True,
                                add_special_tokens=False)
    inputs = Inputs(Side(tok, lengths[0]), Side(tok, lengths[1]))
    model = dual_encoder.make_model(model_spec(cfg.model), tok.vocab_size)
    params = dual_encoder.init_params(model, jax.random.PRNGKey(1), 8)
    return model, inputs, params


def _static_reference(folder: str, texts) -> np.ndarray:
    """StaticEmbedding's computation in numpy: the mean of the table's rows over the
    pieces its tokenizer.json gives (no special tokens), normalised."""
    from tokenizers import Tokenizer
    table = load_file(os.path.join(folder, "model.safetensors"))["embedding.weight"]
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    rows = [table[e.ids].mean(0) for e in tok.encode_batch(texts, add_special_tokens=False)]
    return np.asarray(dual_encoder.l2_normalize(np.stack(rows)))


@pytest.mark.parametrize("lengths, shared, layout", [
    ((24, 24), True, "plain"), ((8, 24), True, "router"), ((24, 24), False, "router")])
def test_a_static_table_becomes_a_static_embedding(tmp_path, lengths, shared, layout):
    from dualjax.serve import st_folder
    model, inputs, params = _static_model(tmp_path, lengths, shared)
    assert st_folder.refusal(model.spec, inputs, None) is None
    out = str(tmp_path / "st")
    os.makedirs(out)
    st_folder.write(out, model.spec, inputs, params, None)
    modules = json.loads(pathlib.Path(out, "modules.json").read_text())
    texts = [t.upper() for t in TEXTS]  # lowercasing is in the exported tokenizer
    for side, _length in zip(("query", "document"), lengths, strict=True):
        folder = out if layout == "plain" else os.path.join(out, f"{side}_0_StaticEmbedding")
        if layout == "plain":
            assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["StaticEmbedding",
                                                                        "Normalize"]
        method = {"query": "encode_queries", "document": "encode_documents"}[side]
        x = {k: jax.numpy.asarray(v) for k, v in getattr(inputs, side).encode(texts).items()}
        want = model.apply({"params": params}, **x, method=method)
        np.testing.assert_allclose(_static_reference(folder, texts), want, atol=1e-5)


def test_a_static_tower_that_drops_unknown_pieces_is_refused(tmp_path):
    from dualjax.serve import st_folder
    from dualjax.text.hf import HFTokenizer
    from dualjax.text.sides import Inputs, Side
    model, _, _ = _static_model(tmp_path)
    tok = HFTokenizer.from_file(os.path.join(TINY, "tokenizer.json"), add_special_tokens=False,
                                drop_unknown=True)
    assert "drops unknown pieces" in st_folder.refusal(model.spec,
                                                       Inputs(Side(tok, 8), Side(tok, 8)), None)


def test_sentence_transformers_loads_a_static_folder_with_the_models_vectors(tmp_path):
    st = pytest.importorskip("sentence_transformers",
                             reason="sentence-transformers is not installed (torch): "
                                    "scripts/bench/check_st_export.py runs this check")
    from dualjax.serve import st_folder
    model, inputs, params = _static_model(tmp_path, (8, 24))
    out = str(tmp_path / "st")
    os.makedirs(out)
    st_folder.write(out, model.spec, inputs, params, None)
    loaded = st.SentenceTransformer(out, device="cpu")
    texts = [t.upper() for t in TEXTS]
    for side, encode in (("query", loaded.encode_query), ("document", loaded.encode_document)):
        method = {"query": "encode_queries", "document": "encode_documents"}[side]
        x = {k: jax.numpy.asarray(v) for k, v in getattr(inputs, side).encode(texts).items()}
        want = model.apply({"params": params}, **x, method=method)
        np.testing.assert_allclose(encode(texts), want, atol=1e-5)


@pytest.mark.slow
def test_one_tower_with_the_starts_prompts_is_a_plain_folder(tmp_path):
    """Shared towers at one max length: the model files at the top, as a Hugging Face
    BertModel folder, whose weights go round dualjax's loader exactly. The start's
    config_sentence_transformers.json declares prompts (E5's names: "query", "passage"),
    which the run brings along (model.query_prompt overrides the start's): every text of
    a side is read with its prompt in front, in the run, the bundle and the folder."""
    import shutil

    from dualjax.train import trained
    start = tmp_path / "start"
    shutil.copytree(TINY, start)
    (start / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}}))
    assert pretrained.resolve(str(start)).prompts == {"query": "query: ",
                                                      "document": "passage: "}
    workdir = _run(tmp_path, pretrained=str(start), query_prompt="question: ")
    prompts = {"query": "question: ", "document": "passage: "}
    run = trained.load_trained(workdir)
    assert (run.inputs.query.prompt, run.inputs.document.prompt) == tuple(prompts.values())
    bare = run.inputs.document.tokenizer.encode(["passage: " + t for t in TEXTS], 24)
    assert (run.inputs.document.encode(TEXTS)["ids"] == bare[0]).all()

    encoder = export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    assert encoder.meta["prompts"] == prompts
    np.testing.assert_allclose(encoder.encode_queries(TEXTS), _run_vectors(workdir, "query"),
                               atol=1e-5)
    out = str(tmp_path / "st")
    export.export_sentence_transformers(workdir, out)
    modules = json.loads(pathlib.Path(out, "modules.json").read_text())
    assert [(m["path"], m["type"].rsplit(".", 1)[1]) for m in modules] == [
        ("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    config = json.loads(pathlib.Path(out, "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    saved = json.loads(pathlib.Path(out, "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == prompts
    again = pretrained.resolve(out)  # the folder, as a start, brings them along too
    assert again.prompts == prompts and again.architecture == run.model.architecture
    assert again.max_seq_length == 24
    jax.tree.map(np.testing.assert_array_equal, again.tower_params(),
                 jax.tree.map(np.asarray, run.params["tower"]))
    for side in ("query", "document"):
        np.testing.assert_allclose(_folder_vectors(out, 24, prompt=prompts[side]),
                                   _run_vectors(workdir, side), atol=1e-5)


LONG = ("Represent this question for retrieving the paragraphs that answer it best among "
        "all the documents of the collection taking every word into account")


@pytest.mark.parametrize("tokenizer", ["word", "char_trigram", "hf"])
def test_a_prompt_that_leaves_no_room_for_the_text_is_refused_before_anything_is_written(
        tmp_path, tokenizer):
    """A 36-word model.query_prompt at max_len 16 was taken without a word: every query
    was the prompt alone (all query vectors equal, map@100 as untrained). Now the config
    check counts its tokens with the run's tokenizer (its kind's, for one built from the
    data), names the numbers and writes nothing; the start's own prompts too."""
    from dualjax.errors import ConfigError
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.model.update(query_prompt=LONG, max_len=16, tokenizer=tokenizer)
    if tokenizer == "hf":
        cfg.model.update(tower="bert", pretrained=TINY)
    with pytest.raises(ConfigError, match=r"^config.model.query_prompt='Represent this question "
                                          r"for retrieving t...' takes (\d+) of the side's 16 "
                                          r"tokens \(its max length\), leaving 0 for the text; "
                                          r"at least 8 are needed"):
        train.train_and_evaluate(cfg, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()
    cfg.model.update(query_prompt="question: ")  # a short one is fine
    from dualjax.config import validation
    validation.validate(cfg, 8)


def test_a_starts_prompt_too_long_for_the_side_names_the_start(tmp_path):
    import shutil

    from dualjax.config.validation import validate
    from dualjax.errors import ConfigError
    start = tmp_path / "start"
    shutil.copytree(TINY, start)
    (start / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": LONG}}))
    cfg = load_config("tiny")
    cfg.model.update(tower="bert", tokenizer="hf", pretrained=str(start), doc_max_len=20)
    with pytest.raises(ConfigError, match=rf"^the document prompt of model.pretrained="
                                          rf"'{start}' \(set config.model.document_prompt to "
                                          r"replace it\)=.* takes \d+ of the side's 20 tokens"):
        validate(cfg, 8)


@pytest.mark.slow
def test_export_refuses_a_workdirs_prompt_that_leaves_no_room(tmp_path):
    """A workdir trained before the check (its config.json edited here): export names
    the prompt instead of writing a bundle whose queries are the prompt alone."""
    workdir = _run(tmp_path)
    config = json.loads(pathlib.Path(workdir, "config.json").read_text())
    config["model"]["query_prompt"] = LONG
    pathlib.Path(workdir, "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"^config.model.query_prompt=.* takes \d+ of the "
                                         r"side's 24 tokens"):
        export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_export_says_what_the_workdir_is_when_it_is_not_one(tmp_path):
    """export --workdir=<a bundle> said "[Errno 2] ... config.json"; --platforms was
    silently ignored with --format=sentence-transformers."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "encoder.json").write_text("{}")
    for workdir, message in ((bundle, f"{bundle}: is a bundle, not a training workdir (no "
                                      "config.json): give the run it came from"),
                             (tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: no such folder")):
        out = subprocess.run([sys.executable, "-m", "dualjax.export", f"--workdir={workdir}",
                              f"--out={tmp_path / 'x'}"], capture_output=True, text=True)
        assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (
            1, f"dualjax.export: {message}"), out.stderr
    out = subprocess.run([sys.executable, "-m", "dualjax.export", f"--workdir={bundle}",
                          f"--out={tmp_path / 'x'}", "--format=sentence-transformers",
                          "--platforms=cpu"], capture_output=True, text=True)
    assert out.stderr.strip().splitlines()[-1] == (
        "dualjax.export: --platforms is for --format=bundle (jax.export); a "
        "sentence-transformers folder runs wherever PyTorch does")
