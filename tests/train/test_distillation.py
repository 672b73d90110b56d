"""Distillation (data.tasks="distill", issue 34 part 5): the losses against hand-computed
values and on 8 devices against one, the teacher's mining by hand, and a run whose
student learns a tiny MPNet teacher's scores."""
import json
import pathlib

import conftest
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config, stop_at, write_beir_folder

from dualjax import errors, losses
from dualjax.config import validation as config_lib
from dualjax.data.pretraining import QueryWords
from dualjax.errors import DataError
from dualjax.losses import distill as distillation
from dualjax.runtime import sharding
from dualjax.runtime.files import read_records, write_records
from dualjax.train import teacher

FIXTURES = conftest.FIXTURES / "pretrained"


# --- the losses ---------------------------------------------------------------------------
def test_listwise_kl_and_margin_mse_hand_computed():
    student = jnp.array([[2.0, 0.0, 1.0]])
    teacher_logits = jnp.array([[1.0, 1.0, 0.0]])
    p = np.exp([1.0, 1.0, 0.0]) / np.exp([1.0, 1.0, 0.0]).sum()
    log_q = np.array([2.0, 0.0, 1.0]) - np.log(np.exp([2.0, 0.0, 1.0]).sum())
    want = float(np.sum(p * (np.log(p) - log_q)))
    assert float(distillation.listwise_kl(student, teacher_logits)[0]) == pytest.approx(want,
                                                                                        1e-6)
    assert float(distillation.listwise_kl(teacher_logits, teacher_logits)[0]) == pytest.approx(
        0.0, abs=1e-7)
    # margins: student (2-0, 2-1) = (2, 1), teacher (0, 1): ((2-0)^2 + (1-1)^2) / 2 = 2
    assert float(distillation.margin_mse(student, teacher_logits)[0]) == pytest.approx(2.0)
    # adding a constant to a row changes neither
    assert float(distillation.margin_mse(student + 5, teacher_logits - 3)[0]) == pytest.approx(2.0)
    assert float(distillation.listwise_kl(student + 5, teacher_logits)[0]) == pytest.approx(want,
                                                                                           1e-5)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
@pytest.mark.slow
def test_distillation_on_8_devices_equals_the_plain_sum(kind):
    """in_batch_weight x the in-batch loss + weight x the term over each row's [d_i,
    n_i1..n_ik], computed by hand from the vectors; on 8 devices as on one, gradients
    too."""
    rng = np.random.default_rng(0)
    b, k, dim = 16, 3, 8
    q = jnp.asarray(unit(rng.normal(size=(b, dim))), jnp.float32)
    d = jnp.asarray(unit(rng.normal(size=(b, dim))), jnp.float32)
    n = jnp.asarray(unit(rng.normal(size=(b, k, dim))), jnp.float32)
    scores = jnp.asarray(rng.random((b, 1 + k)), jnp.float32)
    scale, bias = jnp.float32(20.0), jnp.float32(0.0)
    extras = {"hard_negatives": n, "teacher_scores": scores}

    cands = np.concatenate([np.asarray(d)[:, None], np.asarray(n)], 1)
    student = 20.0 * np.einsum("bd,bcd->bc", np.asarray(q), cands)
    teach = np.asarray(scores) / 0.1
    if kind == "kl":
        p = np.exp(teach - teach.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        log_q = student - np.log(np.exp(student).sum(1, keepdims=True))
        term = np.mean(np.sum(p * (np.log(p) - log_q), 1))
    else:
        term = np.mean(((student[:, :1] - student[:, 1:]) - (teach[:, :1] - teach[:, 1:])) ** 2)
    in_batch = losses.reference("in_batch_softmax")(q, d, scale, bias, {"hard_negatives": n})[0]
    want = 0.5 * float(in_batch) + 2.0 * term

    ref = distillation.distillation(losses.reference("in_batch_softmax"), kind, 2.0, 0.1, 0.5)
    value, metrics = ref(q, d, scale, bias, extras)
    assert float(value) == pytest.approx(want, rel=1e-5)
    assert float(metrics["distill_loss"]) == pytest.approx(term, rel=1e-5)

    mesh = sharding.make_mesh()
    assert mesh.devices.size == 8
    sharded = distillation.distillation(losses.sharded("in_batch_softmax", mesh), kind, 2.0,
                                        0.1, 0.5)
    grad = lambda fn: jax.jit(jax.grad(lambda q, d, n: fn(q, d, scale, bias, {
        "hard_negatives": n, "teacher_scores": scores})[0], argnums=(0, 1, 2)))(q, d, n)
    assert float(jax.jit(lambda: sharded(q, d, scale, bias, extras)[0])()) == pytest.approx(
        want, rel=1e-5)
    for a, b_ in zip(grad(sharded), grad(ref), strict=True):
        np.testing.assert_allclose(a, b_, atol=1e-5)
    # the term reaches the negatives: with weight 0 their gradient is the in-batch one only
    plain = distillation.distillation(losses.reference("in_batch_softmax"), kind, 0.0, 0.1, 0.5)
    assert not np.allclose(grad(plain)[2], grad(ref)[2])


def test_distillation_refuses_what_it_cannot_score():
    fn = distillation.distillation(losses.reference("in_batch_softmax"), "kl")
    q = jnp.ones((2, 4)) / 2
    with pytest.raises(ValueError, match="needs extras\\['teacher_scores'\\]"):
        fn(q, q, 1.0, 0.0, {"hard_negatives": jnp.ones((2, 1, 4)) / 2})
    with pytest.raises(ValueError, match="do not match 2 rows of 1 \\+ 1"):
        fn(q, q, 1.0, 0.0, {"hard_negatives": jnp.ones((2, 1, 4)) / 2,
                            "teacher_scores": jnp.ones((2, 3))})
    with pytest.raises(ValueError, match="is not one of: kl, margin_mse"):
        distillation.distillation(fn, "mse")


# --- mining -------------------------------------------------------------------------------
def test_mining_takes_the_fused_first_drops_near_ties_and_never_the_own_document():
    """Dense-only teacher (weight 1) with hand-made vectors: query i's positive is the
    teacher's first other document; a candidate within the margin of it is dropped; the
    k negatives come from the rest in the teacher's order, with their scaled scores."""
    docs = [f"doc {i}" for i in range(6)]
    queries = [f"query {i}" for i in range(6)]
    # query 0 prefers doc 1, then doc 2 (almost as much), then 3, 4, 5; its own doc 0 best.
    q_vec = np.zeros((6, 6), np.float32)
    q_vec[:, 0] = 1.0
    d_vec = np.eye(6, dtype=np.float32)
    d_vec[:, 0] = [1.0, 0.9, 0.89, 0.5, 0.3, 0.1]
    d_vec = unit(d_vec)
    enc_q = lambda texts: q_vec[[queries.index(t) for t in texts]]
    enc_d = lambda texts: d_vec[[docs.index(t) for t in texts]]
    spec = teacher.TeacherSpec("t", weight=1.0, negatives=2, depth=5, margin=0.05)
    records = teacher.mine(queries, docs, enc_q, enc_d, spec, seed=0)
    first = records[0]
    assert first["query"] == "query 0" and first["documents"][0] == 1
    assert 0 not in first["documents"] and 2 not in first["documents"]  # own; a near tie
    assert sorted(first["documents"][1:]) == first["documents"][1:]  # teacher's order
    assert set(first["documents"][1:]) <= {3, 4, 5} and len(first["documents"]) == 3
    assert first["scores"][0] == 1.0 and all(s <= 0.95 for s in first["scores"][1:])
    assert all(r["documents"][0] != int(r["query"].split()[1]) for r in records)
    with pytest.raises(DataError, match="6 documents are too few to mine a positive and "
                                        "distill.negatives=5"):
        teacher.mine(queries, docs, enc_q, enc_d, teacher.TeacherSpec("t", negatives=5), 0)


def test_several_queries_of_a_passage_never_get_it_as_a_candidate():
    """distill.queries_per_passage: mining leaves out each query's own passage (`own`),
    not the passage of the query's index."""
    # Six queries, three of passage 0 and three of passage 3; every query ranks the
    # documents 0 > 1 > 2 > ... (dense only): passage 0's positive is 1, passage 3's is 0.
    docs = [f"doc {i}" for i in range(6)]
    queries = [f"query {i}" for i in range(6)]
    d_vec = np.eye(6, dtype=np.float32)
    d_vec[:, 0] = [1.0, 0.8, 0.6, 0.4, 0.2, 0.1]
    d_vec = unit(d_vec)
    enc_q = lambda texts: np.tile(np.eye(6, dtype=np.float32)[:1], (len(texts), 1))
    enc_d = lambda texts: d_vec[[docs.index(t) for t in texts]]
    spec = teacher.TeacherSpec("t", weight=1.0, negatives=2, depth=5, margin=0.0)
    records = teacher.mine(queries, docs, enc_q, enc_d, spec, 0, own=np.array([0, 0, 0, 3, 3, 3]))
    assert [r["documents"][0] for r in records] == [1, 1, 1, 0, 0, 0]
    assert not any(0 in r["documents"] for r in records[:3])
    assert not any(3 in r["documents"] for r in records[3:])


def teacher_encoders(cfg, spec):
    """`teacher.encoders` as a run of `cfg` calls it (its model spec, eval.batch_size)."""
    import dataclasses

    from dualjax.config import run
    resolved = run.resolve(cfg, checked=False)
    spec = dataclasses.replace(spec, default_max_len=cfg.model.max_len)
    return teacher.encoders(resolved.model, spec, resolved.eval.batch_size, sharding.make_mesh())


@pytest.mark.parametrize("name, fixture, max_len", [
    (str(FIXTURES / "tiny_mpnet"), "tiny_mpnet", 0),  # 0: the teacher's own (60)
    ("wordllama:l2_supercat_256", "wordllama", 360)])
@pytest.mark.slow
def test_a_teachers_vectors_are_its_reference_librarys(name, fixture, max_len):
    """The teacher encodes as the library it comes from: the tiny MPNet as
    sentence-transformers, WordLlama's static table as the wordllama package."""
    from dualjax.pretrained import sources
    if not name.startswith("/"):
        sources.fetch(name)
    with np.load(FIXTURES / f"{fixture}_reference.npz") as z:
        texts = [str(t) for t in z["texts"]]
        want = z["st_vectors"] if "st_vectors" in z.files else z["vectors"]
    encode_queries, encode_documents = teacher_encoders(
        load_config("tiny"), teacher.TeacherSpec(name, max_len=max_len))
    np.testing.assert_allclose(encode_documents(texts), want, atol=1e-5)
    np.testing.assert_allclose(encode_queries(texts), want, atol=1e-5)


def test_a_teacher_that_does_not_fit_or_a_foreign_scores_file_is_one_line(tmp_path):
    """A teacher whose tokenizer has pieces its table has no row for is refused before
    anything is encoded; a teacher_scores.jsonl that is not this collection's is named
    by file:line."""
    import shutil
    folder = tmp_path / "teacher"
    shutil.copytree(FIXTURES / "tiny_mpnet", folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab.update({f"extra{i}": len(vocab) + i for i in range(3)})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    cfg = load_config("tiny")
    with pytest.raises(errors.PretrainedError, match=r"distill.teacher=.*tokenizer.json has "
                                                      r"\d+ pieces but its embedding table"):
        teacher_encoders(cfg, teacher.TeacherSpec(str(folder)))

    from dualjax.data import documents
    collection = documents.read_collection(str(beir_folder(tmp_path)), str(tmp_path / "tfds"),
                                           288, False)
    (tmp_path / "run").mkdir()
    bad = {"query": "q", "documents": [0, len(collection.passages)], "scores": [1.0, 0.5]}
    write_records(tmp_path / "run" / teacher.FILE,
                  [{"query": "q", "documents": [0, 1], "scores": [1.0, 0.5]}, bad])
    with pytest.raises(DataError, match=r"teacher_scores.jsonl:2: not a teacher record of "
                                        r"this collection"):
        teacher.load_or_make(str(tmp_path / "run"), collection, 0, QueryWords(),
                             teacher.TeacherSpec("t"), lambda: pytest.fail("encoded"))


def test_a_teacher_file_cut_short_is_scored_again_not_trained_on(tmp_path, caplog):
    """teacher_scores.jsonl cut to 40 of its records, then resumed, was taken as it was
    ("DISTILL: 40 items"): its end record (a count and a digest) now says it is not
    whole, the log names it, and the teacher scores the candidates again."""
    from dualjax.data import documents
    collection = documents.read_collection(str(beir_folder(tmp_path)), str(tmp_path / "tfds"),
                                           288, False)
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1000, 8))
    encode = lambda texts: np.stack([table[hash(t) % 1000] / np.linalg.norm(table[hash(t) % 1000])
                                     for t in texts])
    calls = []

    def encoders():
        calls.append(1)
        return encode, encode

    workdir = tmp_path / "run"
    workdir.mkdir()
    spec = teacher.TeacherSpec("t", negatives=1, depth=4, margin=0.0)
    made = teacher.load_or_make(str(workdir), collection, 0, QueryWords(), spec, encoders)
    assert len(made) > 4 and calls == [1]
    assert teacher.load_or_make(str(workdir), collection, 0, QueryWords(), spec,
                                encoders) == made and calls == [1]  # whole: read back
    lines = (workdir / teacher.FILE).read_text().splitlines(True)
    for cut in (lines[:len(made) // 2], lines[:-1], lines[:3] + lines[4:]):
        (workdir / teacher.FILE).write_text("".join(cut))
        again = teacher.load_or_make(str(workdir), collection, 0, QueryWords(), spec, encoders)
        assert again == made and read_records(workdir / teacher.FILE)[0] == made
    assert calls == [1, 1, 1, 1]
    assert f"{workdir / teacher.FILE}: no end record" in caplog.text


# --- a run --------------------------------------------------------------------------------
def beir_folder(tmp_path) -> pathlib.Path:
    """The tiny fixtures' texts, as a BEIR folder with one query each (its first words)."""
    texts = []
    for name in ("tiny_bert", "tiny_mpnet"):
        with np.load(FIXTURES / f"{name}_reference.npz") as z:
            texts += [str(t) for t in z["texts"]]
    write_beir_folder(tmp_path / "beir", list(dict.fromkeys(texts)))
    return tmp_path / "beir"


def distill_config(folder, teacher_name: str = str(FIXTURES / "tiny_mpnet")):
    cfg = load_config("tiny")
    cfg.model.update(pretrained=str(FIXTURES / "tiny_bert"), tower="bert", tokenizer="hf",
                     max_len=32)
    cfg.data.update(name="pretrain", path=str(folder), tasks="distill",
                    ignore_identical_ids=False)
    cfg.distill.update(teacher=teacher_name, negatives=2, depth=6, margin=0.0)
    cfg.update(num_train_steps=2, checkpoint_every_steps=1, global_batch_size=8)
    cfg.eval.update(index="exact", baselines="")
    return cfg


@pytest.mark.slow
def test_a_student_learns_a_tiny_mpnet_teachers_scores(tmp_path, monkeypatch):
    """data.tasks="distill": the teacher (a tiny MPNet) scores each pseudo-query's
    candidates once (teacher_scores.jsonl, reused on resume without the teacher), the
    student (a tiny BERT) trains on the in-batch loss plus the KL term, both logged."""
    import shutil

    from dualjax.train import loop as train
    folder = beir_folder(tmp_path)
    shutil.copytree(FIXTURES / "tiny_mpnet", tmp_path / "teacher")
    cfg = distill_config(folder, str(tmp_path / "teacher"))
    cfg.data.max_query_words = 5
    workdir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train.train_and_evaluate(cfg, str(workdir), hooks=[stop_at(1)])
    records, _ = read_records(workdir / teacher.FILE)
    assert records and all(len(r["documents"]) == 3 == len(r["scores"]) for r in records)
    assert all(len(r["query"].split()) <= 5 for r in records)  # cut as data.max_query_words says
    assert all(r["scores"][0] >= max(r["scores"][1:]) for r in records)
    monkeypatch.setattr(teacher, "encoders", lambda *a, **k: pytest.fail("scored again"))
    shutil.rmtree(tmp_path / "teacher")  # gone: a resumed run does not need it
    with pytest.raises(errors.ConfigError, match="config.distill.teacher: .*teacher"):
        config_lib.validate(cfg, 8)
    rows = train.train_and_evaluate(cfg, str(workdir))
    assert {"dual_encoder [exact]", "start [exact]"} <= set(rows)
    logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in logged if r.get("split") == "train" and "distill_loss" in r]
    assert train_rows and all(r["distill_loss"] >= 0 and "in_batch_loss" in r
                              for r in train_rows)


def test_distill_config_refusals(tmp_path, monkeypatch):
    folder = beir_folder(tmp_path)
    monkeypatch.setenv("DUALJAX_PRETRAINED_DIR", str(tmp_path / "empty"))
    cases = [({"distill.teacher": ""}, "config.distill.teacher must name the teacher"),
             ({"distill.teacher": "all-mpnet-base-v2"},
              "config.distill.teacher: model.pretrained='all-mpnet-base-v2' is not fetched yet; "
              "run: python -m dualjax.pretrained fetch all-mpnet-base-v2"),
             ({"distill.loss": "mse"}, "config.distill.loss='mse' is not one of: kl, margin_mse"),
             ({"distill.depth": 2}, "config.distill.depth=2 must be above distill.negatives"),
             ({"distill.queries_per_passage": 0},
              "config.distill.queries_per_passage=0 must be >= 1"),
             ({"data.tasks": "distill,ict"}, "or mlm alone or distill alone")]
    for changes, message in cases:
        cfg = distill_config(folder)
        for key, value in changes.items():
            group, name = key.split(".")
            cfg[group][name] = value
        with pytest.raises(errors.ConfigError, match=message.replace("(", "\\(").replace(
                ")", "\\)").replace("+", "\\+")):
            config_lib.validate(cfg, 8)
    cfg = distill_config(folder)
    cfg.data.tasks = "pseudo"
    with pytest.raises(errors.ConfigError, match="distill.teacher is read only with"):
        config_lib.validate(cfg, 8)
