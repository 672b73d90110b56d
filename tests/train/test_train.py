"""Training end to end: a tiny run, kill-and-resume equality, bad values and bad input."""

import inspect
import json
import os
import signal
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import CONFIGS
from helpers import preempt_at, tiny, train_rows
from jax import monitoring

from dualjax import errors, models
from dualjax.config import validation as config_lib
from dualjax.config.specs import dataset_spec
from dualjax.errors import DataError
from dualjax.train import loop as train
from dualjax.train import step as step_lib
from dualjax.train import tasks
from dualjax.train.rows import AHEAD_SECONDS, TrainRows, steps_ahead


def final_params(workdir, step):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.PyTreeCheckpointer().restore(path)["params"]


def first_train_losses(tmp_path, key, values, **overrides):
    """{value: the first logged training loss} of a tiny run per value of config `key`;
    each run's workdir is tmp_path / f"{key}_{value}"."""
    out = {}
    for value in values:
        workdir = tmp_path / f"{key}_{value}"
        train.train_and_evaluate(tiny(**{key: value, "eval.index": "exact", **overrides}),
                                 str(workdir))
        out[value] = train_rows(workdir)[0]["loss"]
    return out


@pytest.mark.slow
def test_tiny_run_writes_the_workdir_contract(tmp_path):
    cfg = tiny()
    cfg.eval.untrained, cfg.eval.baselines = True, "bm25,tfidf,identity"
    lowered = []  # the programs lowered (made) during the run, by name

    def listen(event, duration, fun_name="", **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(fun_name)
    monitoring.register_event_duration_secs_listener(listen)
    try:
        results = train.train_and_evaluate(cfg, str(tmp_path))
    finally:
        monitoring.unregister_event_duration_listener(listen)
    # One program of the initial state: the untrained row's towers reuse the run's.
    assert sum("init_state" in name for name in lowered) == 1, lowered
    systems = [("dual_encoder", "exact"), ("dual_encoder", "scann"), ("untrained", "exact"),
               ("bm25", "exact"), ("tfidf", "exact"), ("identity", "exact")]
    assert list(results) == [f"{s} [{i}]" for s, i in systems]
    with open(tmp_path / "config.json") as f:
        assert json.load(f) == cfg.to_dict()
    assert (tmp_path / "vocab.json").exists()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10", "20"]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    assert train_steps == [5, 10, 15, 20]
    for r in rows:
        if r["split"] == "train":
            assert {"loss", "in_batch_p@1", "grad_norm", "learning_rate"} <= set(r)
            assert r["pairs_per_second"] > 0
            assert np.isfinite(r["loss"]) and 0 <= r["in_batch_p@1"] <= 1
    evals = {(r["split"], r["system"], r["index"]) for r in rows if r["split"] != "train"}
    assert evals == {(split, s, i) for split in ("val", "test") for s, i in systems}
    test_row = results["dual_encoder [exact]"]
    assert {"map@100", "recall@1", "recall@10", "recall@100", "mrr@10", "success@1",
            "success@10", "ndcg@10"} <= set(test_row)
    ann = results["dual_encoder [scann]"]  # brute force on this small corpus: same as exact
    assert ann["ann_recall@10"] == 1.0 and ann["map@100_gap"] == pytest.approx(0, abs=1e-9)
    assert (tmp_path / "index" / "test" / "meta.json").exists()
    report = (tmp_path / "report.md").read_text()
    for s, i in systems:
        assert f"| {s} [{i}] | {results[f'{s} [{i}]']['map@100']:.4f} |" in report
    assert (tmp_path / "recall_at_k.png").stat().st_size > 10_000
    # 20 steps of training already lower the in-batch loss.
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert losses[-1] < losses[0]


def read_events(workdir) -> tuple[dict[str, dict[int, float]], list[str]]:
    """WORKDIR/tensorboard's scalars {tag: {step: value}} as TensorBoard shows them (a
    SessionLog START at step s drops what earlier files logged at s or later), and its
    text summaries. Read from the TFRecord files with tensorboardX's protos (no TF)."""
    import struct

    from tensorboardX.proto import event_pb2
    scalars, texts = {}, []
    folder = os.path.join(workdir, "tensorboard")
    for name in sorted(os.listdir(folder)):  # events.out.tfevents.<time>...: in write order
        data = open(os.path.join(folder, name), "rb").read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == 1:  # START
                for values in scalars.values():
                    for step in [s for s in values if s >= event.step]:
                        del values[step]
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    scalars.setdefault(v.tag, {})[event.step] = v.simple_value
                elif v.tag.startswith("config"):
                    texts.append(v.tensor.string_val[0].decode())
    return scalars, texts


def test_a_run_resumed_within_the_same_second_keeps_the_earlier_events(tmp_path, monkeypatch):
    # tensorboardX names event files by the second only; CI once resumed within it and
    # the resumed run's file replaced the killed one's.
    from tensorboardX import event_file_writer

    from dualjax.eval.metrics_log import MetricsLog
    monkeypatch.setattr(event_file_writer.time, "time", lambda: 1_700_000_000.0)
    for first, steps in [(0, [5, 7, 9]), (8, [10])]:  # killed after its checkpoint at 7
        with MetricsLog(str(tmp_path), tensorboard=True) as log:
            log.start_events(first)
            for step in steps:
                log.write(step, "train", {"loss": step / 10})
    assert len(os.listdir(tmp_path / "tensorboard")) == 2
    scalars, _ = read_events(str(tmp_path))
    assert scalars["train/loss"] == pytest.approx({5: 0.5, 7: 0.7, 10: 1.0})


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path):
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    train.train_and_evaluate(tiny(), whole)

    with pytest.raises(errors.Preempted, match="SIGTERM: saved a checkpoint at step 7"):
        train.train_and_evaluate(tiny(), split, hooks=[preempt_at(7)])
    assert sorted(os.listdir(os.path.join(split, "checkpoints"))) == ["7"]
    assert not any(r["step"] > 7 for r in train_rows(split))
    # Step 7 writes no train row of its own (log_every_steps 5), so it ran without the
    # norms; the signal's save measures the param norm first (checked finite).
    (row7,) = [r for r in train_rows(split) if r["step"] == 7]
    assert row7["param_norm"] > 0 and "grad_norm" not in row7
    train.train_and_evaluate(tiny(), split)  # the same command again resumes at step 7

    a, b = final_params(whole, 20), final_params(split, 20)
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(x, y)
    def later(rows):  # steps 10, 15, 20; wall-clock throughput differs between runs
        return [{k: v for k, v in r.items() if k != "pairs_per_second"}
                for r in rows if r["step"] >= 10]

    assert later(train_rows(whole)) == later(train_rows(split))

    # TensorBoard shows what metrics.jsonl holds: the steps the killed run logged after
    # its checkpoint are purged, each scalar once per step.
    scalars, texts = read_events(split)
    for r in train_rows(split):
        assert scalars["train/loss"][r["step"]] == pytest.approx(r["loss"])
    assert (sorted(scalars["train/loss"]) == [r["step"] for r in train_rows(split)]
            == [5, 7, 10, 15, 20])
    final = {r["system"]: r for r in map(json.loads, open(os.path.join(split, "metrics.jsonl")))
             if r["split"] == "test"}
    assert scalars["test/dual_encoder/exact/map_100"] == {
        20: pytest.approx(final["dual_encoder"]["map@100"])}
    assert texts and '"global_batch_size": 32' in texts[0]


def test_the_host_queues_only_a_few_seconds_of_steps():
    """Steps dispatch asynchronously; keeping a step's metrics waits for the step `ahead`
    before it (1 until a train row measures the step time, then AHEAD_SECONDS' worth),
    so a signal's checkpoint waits for seconds of steps, not log_every_steps of them."""

    class Leaf:  # a metric on the device: records when the host waited for it
        def __init__(self, step):
            self.step = step

        def block_until_ready(self):
            waited.append(self.step)
            return self

    waited = []
    rows = TrainRows(4, 0, 8, log=None)
    for step in range(1, 5):
        rows.add(step, {"loss": Leaf(step)})
        assert waited == list(range(1, step))  # every step before the newest, and not it
    waited.clear()
    rows.ahead = 3  # measured: 3 steps take AHEAD_SECONDS
    rows.pending = []
    for step in range(1, 7):
        rows.add(step, {"loss": Leaf(step)})
    assert waited == [1, 2, 3]  # before steps 4, 5 and 6: three in flight at most
    rows.close()
    assert steps_ahead(8.0) == 1 == steps_ahead(AHEAD_SECONDS)  # MiniLM
    assert steps_ahead(0.002) == int(AHEAD_SECONDS / 0.002)  # the quick start


@pytest.mark.slow
def test_ctrl_c_saves_like_sigterm_and_a_second_one_stops_at_once(tmp_path, ctrl_c):
    with pytest.raises(errors.Preempted, match="SIGINT: saved a checkpoint at step 3"):
        train.train_and_evaluate(tiny(), str(tmp_path / "once"),
                                 hooks=[preempt_at(3, signal.SIGINT)])
    assert sorted(os.listdir(tmp_path / "once" / "checkpoints")) == ["3"]
    twice = [preempt_at(3, signal.SIGINT), preempt_at(3, signal.SIGINT)]
    with pytest.raises(KeyboardInterrupt):
        train.train_and_evaluate(tiny(), str(tmp_path / "twice"), hooks=twice)
    assert not os.listdir(tmp_path / "twice" / "checkpoints")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


@pytest.mark.slow
def test_non_finite_loss_stops_without_saving(tmp_path):
    cfg = tiny(**{"optimizer.name": "sgd", "optimizer.learning_rate": 1e38,
                  "model.init_scale": 1e38})
    with pytest.raises(errors.NonFiniteLossError, match="non-finite training at step"):
        train.train_and_evaluate(cfg, str(tmp_path))
    assert not os.path.exists(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.slow
def test_exploding_parameters_stop_the_run_though_the_loss_is_finite(tmp_path):
    # At learning rate 1e30 the loss stays finite (cosines are bounded) while the
    # parameters overflow.
    cfg = tiny(**{"optimizer.learning_rate": 1e30, "optimizer.warmup_steps": 0})
    with pytest.raises(errors.NonFiniteLossError, match="param_norm=inf"):
        train.train_and_evaluate(cfg, str(tmp_path))
    assert not os.path.exists(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.parametrize("key, value, message", [
    ("model.tower", "cnnx", "config.model.tower='cnnx' is not one of: bow, bow_mlp"),
    ("loss.name", "hinge", "config.loss.name='hinge' is not one of"),
    ("global_batch_size", 30, "config.global_batch_size=30 must be divisible by the 8 devices"),
    ("data.name", "nope", "config.data.name='nope' is not one of: synthetic_paraphrase, pairs"),
    ("eval.top_k", 0, "config.eval.top_k=0 must be > 0"),
    ("eval.top_k", 5, "config.eval.top_k=5 is below the metrics' deepest cutoff (100"),
    ("eval.bm25_stemmer", "lancaster", "config.eval.bm25_stemmer='lancaster' is not one of"),
    ("eval.bm25_b", 1.5, "config.eval.bm25_b=1.5 must be between 0 and 1"),
    ("seed", -1, "config.seed=-1 must be in "),
    ("loss.num_mixed_negatives", 12, "num_mixed_negatives=12 must be a multiple of the 8"),
])
def test_bad_config_values_fail_before_any_work(tmp_path, key, value, message):
    with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(")):
        train.train_and_evaluate(tiny(**{key: value}), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_pairs_file_run_and_bad_line(tmp_path):
    lines = [f"how do i fix my {obj} {i} ?\thow can i repair my {obj} {i} ?"
             for i in range(40) for obj in ("bike", "car", "phone")]
    good = tmp_path / "pairs.tsv"
    good.write_text("\n".join(lines) + "\n")
    results = train.train_and_evaluate(
        tiny(**{"data.name": "pairs", "data.path": str(good), "data.test_fraction": 0.2}),
        str(tmp_path / "run"))
    assert results["dual_encoder [exact]"]["num_queries"] > 10

    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines[:3] + ["no tab on this line"] + lines[3:]) + "\n")
    cfg = tiny(**{"data.name": "pairs", "data.path": str(bad)})
    with pytest.raises(DataError, match=f"{bad}:4: "):
        train.train_and_evaluate(cfg, str(tmp_path / "bad_run"))
    cfg.data.skip_bad_lines = True
    assert train.train_and_evaluate(cfg, str(tmp_path / "skip_run"))["dual_encoder [exact]"]


@pytest.mark.slow
def test_categorical_fields_and_side_lengths_train_evaluate_and_search(tmp_path, monkeypatch):
    """A pairs JSONL whose documents carry a category (some missing): the field's
    vocabulary is saved, training and evaluation read it, and search reloads it; queries
    and documents are cut at their own lengths. Trained with lazy table updates
    (optimizer.table_updates): the shared token table by the rows a batch reads, the
    category table (not a token table) as every other param."""
    lines = [{"query": f"how do i fix my {obj} {i} ?",
              "document": f"how can i repair my {obj} {i} ?",
              **({"document_fields": {"category": obj}} if i % 5 else {})}
             for i in range(40) for obj in ("bike", "car", "phone")]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    workdir = str(tmp_path / "run")
    cfg = tiny(**{"data.name": "pairs", "data.path": str(path), "data.test_fraction": 0.2,
                  "model.tower": "bow_mlp", "model.shared_towers": False,
                  "model.shared_embedding": True, "model.doc_features": "category:8",
                  "model.query_max_len": 6, "model.doc_max_len": 12,
                  "optimizer.table_updates": "lazy"})
    step_options, make_step = [], step_lib.make_train_step

    def spy(*args, **kwargs):
        bound = inspect.signature(make_step).bind(*args, **kwargs)
        step_options.append(bound.arguments.get("table_updates"))
        return make_step(*args, **kwargs)

    monkeypatch.setattr(step_lib, "make_train_step", spy)
    results = train.train_and_evaluate(cfg, workdir)
    assert step_options == ["lazy"]
    assert results["dual_encoder [exact]"]["num_queries"] > 10
    from dualjax import search
    from dualjax.text import features
    from dualjax.train import trained as trained_lib
    _, doc_side = features.load(os.path.join(workdir, "features.json"))
    assert sorted(doc_side.fields[0].vocab) == ["bike", "car", "phone"]
    assert final_params(workdir, cfg.num_train_steps)["doc_feature_0"]["embedding"].shape == (
        1 + 3 + cfg.model.feature_buckets, 8)
    trained = trained_lib.load_trained(workdir)
    assert (trained.inputs.query.max_len, trained.inputs.document.max_len) == (6, 12)
    assert trained.inputs.document.features == doc_side
    hits = search.from_workdir(workdir, k=3).search(["how do i fix my bike 7 ?"])[0]
    assert len(hits) == 3 and all("bike" in text for _, text in hits[:1])

    # The serving bundle encodes as the model does, fields included, from its own folder.
    from dualjax import export
    bundle = str(tmp_path / "bundle")
    export.export(workdir, bundle, platforms=("cpu",))
    import shutil
    moved = str(tmp_path / "elsewhere")
    shutil.move(bundle, moved)
    import dualjax
    encoder = dualjax.Encoder.load(moved)
    assert sorted(os.listdir(moved)) == ["document.jax_export", "encoder.json", "features.json",
                                         "params.msgpack", "query.jax_export", "vocab.json"]
    docs = [line["document"] for line in lines[:7]]
    fields = [line.get("document_fields") for line in lines[:7]]
    encode_q, encode_d = models.make_encoders(trained.model)
    want_d = encode_d(trained.params, trained.inputs.document.encode(docs, fields))
    np.testing.assert_allclose(encoder.encode_documents(docs, fields, batch_size=4), want_d,
                               atol=1e-6)
    queries = [line["query"] for line in lines[:5]]
    want_q = encode_q(trained.params, trained.inputs.query.encode(queries))
    np.testing.assert_allclose(encoder.encode_queries(queries), want_q, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(encoder.encode_queries(queries), axis=1), 1.0,
                               rtol=1e-5)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "dualjax.main", f"--config={CONFIGS / 'tiny.py'}", *args],
        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_rejects_unknown_key_and_wrong_type_by_name(tmp_path):
    unknown = _cli(f"--workdir={tmp_path / 'a'}", "--config.model.towr=bow")
    assert unknown.returncode != 0
    assert "--config.model.towr: no such config key 'towr'; did you mean 'tower'?" in unknown.stderr
    wrong_type = _cli(f"--workdir={tmp_path / 'b'}", "--config.num_train_steps=abc")
    assert wrong_type.returncode != 0 and "num_train_steps" in wrong_type.stderr
    missing = _cli(f"--workdir={tmp_path / 'c'}", "--config.data.name=pairs",
                   f"--config.data.path={tmp_path / 'nowhere.tsv'}")
    assert missing.returncode == 1
    assert f"dualjax: {tmp_path / 'nowhere.tsv'}: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr + unknown.stderr
    assert missing.stderr.count("nowhere.tsv: no such file") == 1  # said once
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(:\n")
    for config, message in ((tmp_path / "none.py", "no such file"),
                            (bad, "cannot load it (line 1): SyntaxError")):
        out = subprocess.run([sys.executable, "-m", "dualjax.main", f"--config={config}",
                              f"--workdir={tmp_path / 'd'}"], capture_output=True, text=True)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"dualjax: --config={config}: {message}"), lines
    assert not any((tmp_path / d).exists() for d in "ab")


@pytest.mark.parametrize("tokenizer", ["word+char_trigram", "sentencepiece", "bigram"])
@pytest.mark.slow
def test_every_tokenizer_trains_and_is_reloaded(tmp_path, tokenizer):
    cfg = tiny(**{"model.tokenizer": tokenizer, "model.vocab_size": 300,
                  "model.trigram_vocab_size": 300, "model.max_len": 48,
                  "num_train_steps": 10, "eval.index": "exact"})
    first = train.train_and_evaluate(cfg, str(tmp_path))["dual_encoder [exact]"]
    with open(tmp_path / "vocab.json") as f:
        assert json.load(f)["type"] == tokenizer
    cfg.num_train_steps = 10  # the same run again: resumes at the end, reloads the tokenizer
    again = train.train_and_evaluate(cfg, str(tmp_path))["dual_encoder [exact]"]
    assert again["map@100"] == first["map@100"] and first["num_queries"] > 10


@pytest.mark.slow
def test_duplicate_documents_in_a_batch_are_masked_as_accidental_hits(tmp_path):
    # Every pair's document is one of 20 answers (15 in training), so a batch of 32 holds
    # each about twice. A duplicate column scores exactly as the positive, adding a term
    # as large as the positive's to the softmax denominator unless it is masked.
    lines = [f"question number {i} about topic {i % 20} ?\tthe answer for topic {i % 20}"
             for i in range(200)]
    (tmp_path / "p.tsv").write_text("\n".join(lines) + "\n")
    first_loss = {}
    for remove in (True, False):
        cfg = tiny(**{"data.name": "pairs", "data.path": str(tmp_path / "p.tsv"),
                      "num_train_steps": 1, "loss.remove_accidental_hits": remove,
                      "eval.index": "exact", "data.test_fraction": 0.2})
        workdir = tmp_path / f"run_{remove}"
        train.train_and_evaluate(cfg, str(workdir))
        first_loss[remove] = train_rows(workdir)[0]["loss"]
    assert first_loss[True] < first_loss[False] - 0.05  # measured: 3.407 vs 3.539


@pytest.mark.slow
def test_mixed_negatives_join_the_columns_and_resume_exactly(tmp_path):
    """U uniformly drawn documents per step add U columns: the first step's loss grows
    (more negatives), and a run stopped and resumed draws the same documents."""
    first = first_train_losses(tmp_path, "loss.num_mixed_negatives", (0, 64), num_train_steps=10)
    assert first[64] > first[0] + 0.1  # log(32 + 64) vs log(32) at the start
    cfg = tiny(**{"loss.num_mixed_negatives": 64, "eval.index": "exact", "num_train_steps": 10})
    split = str(tmp_path / "split")
    with pytest.raises(errors.Preempted):
        train.train_and_evaluate(cfg, split, hooks=[preempt_at(4)])
    train.train_and_evaluate(cfg, split)
    for x, y in zip(jax.tree.leaves(final_params(tmp_path / "loss.num_mixed_negatives_64", 10)),
                    jax.tree.leaves(final_params(split, 10)), strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(errors.ConfigError, match="does not combine"):
        train.train_and_evaluate(tiny(**{"loss.num_mixed_negatives": 8,
                                         "loss.log_q_buckets": 64}), str(tmp_path / "bad"))


@pytest.mark.slow
def test_mined_hard_negatives_join_every_row(tmp_path):
    """data.hard_negatives=2: the pairs table holds 2 BM25-mined documents of other
    clusters per pair, and training adds them as columns (the first loss grows)."""
    first = first_train_losses(tmp_path, "data.hard_negatives", (0, 2), num_train_steps=5)
    assert first[2] > first[0] + 0.3  # 32 + 64 columns against 32, hard ones among them
    from dualjax.data import builders
    cfg = tiny(**{"data.hard_negatives": 2})
    source = builders.train_source(dataset_spec(cfg.data, cfg.seed),
                                   str(tmp_path / "data.hard_negatives_2" / "tfds"))
    record = source[0]
    assert len(record["hard_negatives"]) == 2
    assert record["document"] not in list(record["hard_negatives"])
    with pytest.raises(errors.ConfigError, match="hard_negatives does not combine"):
        train.train_and_evaluate(tiny(**{"data.hard_negatives": 1, "loss.log_q_buckets": 64}),
                                 str(tmp_path / "bad"))


def _two_tasks(tmp_path, **overrides):
    """Synthetic paraphrases and a pairs file, weights 3:1."""
    lines = [f"how do i fix my {obj} {i} ?\thow can i repair my {obj} {i} ?"
             for i in range(40) for obj in ("bike", "car", "phone")]
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n")
    cfg = tiny(**overrides)
    pairs = ml_collections.ConfigDict(cfg.data.to_dict())
    pairs.update(name="pairs", path=str(tmp_path / "pairs.tsv"), test_fraction=0.2)
    cfg.tasks = ml_collections.ConfigDict({
        "para": {"data": ml_collections.ConfigDict(cfg.data.to_dict()), "weight": 3.0},
        "fix": {"data": pairs, "weight": 1.0}})
    return cfg


@pytest.mark.slow
def test_multi_task_shares_the_encoder_with_a_scale_per_task_and_resumes(tmp_path):
    whole = str(tmp_path / "whole")
    results = train.train_and_evaluate(_two_tasks(tmp_path), whole)
    assert {"para: dual_encoder [exact]", "fix: dual_encoder [exact]"} <= set(results)
    params = final_params(whole, 20)
    assert params["alpha"].shape == params["beta"].shape == (2,)
    assert "tower" in params  # one encoder for both tasks
    rows = [json.loads(line) for line in open(os.path.join(whole, "metrics.jsonl"))]
    evals = {(r["task"], r["split"]) for r in rows if r["split"] != "train"}
    assert evals == {(t, s) for t in ("para", "fix") for s in ("val", "test")}
    assert os.path.exists(os.path.join(whole, "report_fix.md"))
    # Batches are drawn 3:1 (a function of seed and step only).
    drawn = [tasks.task_at_step(s, [3.0, 1.0], 0) for s in range(1, 2001)]
    assert 0.70 < drawn.count(0) / len(drawn) < 0.80
    # Stopped at step 7 and resumed: both iterators and the schedule continue exactly.
    split = str(tmp_path / "split")

    with pytest.raises(errors.Preempted):
        train.train_and_evaluate(_two_tasks(tmp_path), split, hooks=[preempt_at(7)])
    train.train_and_evaluate(_two_tasks(tmp_path), split)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(final_params(split, 20)), strict=True):
        np.testing.assert_array_equal(x, y)
    from dualjax import search
    hits = search.from_workdir(whole, k=2, task="fix").search(["how do i fix my car 3 ?"])[0]
    assert len(hits) == 2
    with pytest.raises(errors.ConfigError, match="tasks.fix.weight"):
        cfg = _two_tasks(tmp_path)
        cfg.tasks.fix.weight = 0.0
        train.train_and_evaluate(cfg, str(tmp_path / "bad"))


@pytest.mark.slow
def test_log_q_correction_keeps_its_frequency_estimate_in_the_checkpoint(tmp_path):
    cfg = tiny(**{"loss.log_q_buckets": 512, "eval.index": "exact"})
    train.train_and_evaluate(cfg, str(tmp_path))
    state = ocp.PyTreeCheckpointer().restore(str(tmp_path / "checkpoints" / "20" / "state"))
    freq = state["frequency"]
    last_step, gap = np.asarray(freq["last_step"]), np.asarray(freq["gap"])
    assert last_step.max() == 20 and (gap > 0).sum() > 50  # documents seen, gaps estimated
    assert all(np.isfinite(r["loss"]) for r in train_rows(tmp_path))
    with pytest.raises(errors.ConfigError, match="logQ correction applies to"):
        train.train_and_evaluate(
            tiny(**{"loss.log_q_buckets": 512, "loss.name": "in_batch_sigmoid"}),
            str(tmp_path / "bad"))


@pytest.mark.slow
def test_paraphrases_of_the_row_are_masked_as_accidental_hits(tmp_path):
    # Chains (variant v, variant v + 1) of 10 topics: 10 clusters of 21 questions by
    # transitive closure, so a batch of 32 holds ~3 paraphrases of each row's pair as
    # other columns; with remove_cluster_hits they leave the row's softmax.
    lines = [f"how to fix topic {t} variant {v}\thow to fix topic {t} variant {v + 1}"
             for t in range(10) for v in range(20)]
    (tmp_path / "p.tsv").write_text("\n".join(lines) + "\n")
    first_loss = {}
    for remove in (True, False):
        cfg = tiny(**{"data.name": "pairs", "data.path": str(tmp_path / "p.tsv"),
                      "num_train_steps": 1, "loss.remove_cluster_hits": remove,
                      "eval.index": "exact", "eval.baselines": "", "eval.untrained": False,
                      "data.test_fraction": 0.2, "data.val_fraction": 0.1})
        workdir = tmp_path / f"run_{remove}"
        train.train_and_evaluate(cfg, str(workdir))
        first_loss[remove] = train_rows(workdir)[0]["loss"]
    from dualjax.data import builders
    source = builders.train_source(dataset_spec(cfg.data, cfg.seed),
                                   str(tmp_path / "run_False" / "tfds"))
    seen = {(r["query"].decode().split()[4], int(r["cluster"]))
            for r in (source[i] for i in range(len(source)))}
    assert len(seen) == len({t for t, _ in seen}) == len({c for _, c in seen}) == 7
    assert first_loss[True] < first_loss[False] - 0.05


@pytest.mark.slow
def test_select_by_keeps_and_evaluates_the_best_validation_step(tmp_path):
    """eval.select_by=map@100: WORKDIR/best holds the params of the step with the best val
    MAP (the earliest on a tie), and the final evaluation scores them beside the last
    step's. A learning rate of 0.3 overshoots after its best step here."""
    cfg = tiny(**{"eval_every_steps": 5, "eval.select_by": "map@100", "eval.index": "exact",
                  "optimizer.learning_rate": 0.3, "mesh.num_devices": 2, "eval.hybrid": "bm25"})
    results = train.train_and_evaluate(cfg, str(tmp_path))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    # The hybrid interpolation's weight is chosen on val, and the test split uses it.
    weights = {r["split"]: r["hybrid_weight"] for r in rows
               if r["step"] == 20 and r.get("system") == "dual_encoder+bm25_interp"}
    assert weights["test"] == weights["val"] and set(weights) == {"val", "test"}
    val = {r["step"]: r["map@100"] for r in rows
           if r["split"] == "val" and r["system"] == "dual_encoder" and r["index"] == "exact"}
    assert sorted(val) == [5, 10, 15, 20]
    expected = max(sorted(val), key=lambda s: (val[s], -s))
    saved = json.loads((tmp_path / "best" / "best.json").read_text())
    assert saved == {"metric": "map@100", "step": expected, "value": val[expected]}
    assert sorted(os.listdir(tmp_path / "best")) == sorted(["best.json", f"{expected}.msgpack"])
    assert expected != 20
    best = results["dual_encoder_best [exact]"]
    assert best["selected_step"] == expected
    assert best["map@100"] != results["dual_encoder [exact]"]["map@100"]
    test_rows = [r for r in rows if r["split"] == "test" and r["system"] == "dual_encoder_best"]
    assert [r["selected_step"] for r in test_rows] == [expected]
    for overrides, match in (({"eval.select_by": "map@5"}, "eval.select_by"),
                             ({"eval_every_steps": 0}, "eval_every_steps")):
        with pytest.raises(errors.ConfigError, match=match):
            config_lib.validate(tiny(**{"eval.select_by": "map@100", "eval_every_steps": 5,
                                        **overrides}), 8)


def test_a_best_json_cut_short_is_named(tmp_path):
    from dualjax.errors import WorkdirError
    from dualjax.train import checkpoints
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text('{"metric": "map@100", "st')
    with pytest.raises(WorkdirError, match=r"best/best.json: unreadable .*remove .*best to "
                                           "choose again"):
        checkpoints.BestParams(str(tmp_path), "map@100")


@pytest.mark.slow
def test_early_stopping_ends_training_once_val_stops_improving(tmp_path, capsys):
    """eval.early_stopping=1: training stops at the first evaluation that is not a new
    best; the final evaluation is of that step, and the same command again finds the run
    finished. The run without it shows where that step is."""
    common = {"eval_every_steps": 5, "eval.select_by": "map@100", "eval.index": "exact",
              "optimizer.learning_rate": 0.3, "mesh.num_devices": 2, "num_train_steps": 30,
              "eval.baselines": "", "eval.untrained": False}
    train.train_and_evaluate(tiny(**common), str(tmp_path / "full"))
    val = {r["step"]: r["map@100"]
           for r in map(json.loads, open(tmp_path / "full" / "metrics.jsonl"))
           if r["split"] == "val" and r.get("system") == "dual_encoder"}
    best, stop = -1.0, None
    for step in sorted(val):
        if val[step] <= best and step < 30:
            stop = step
            break
        best = max(best, val[step])
    assert stop is not None and stop < 30  # the learning rate overshoots in this run

    cfg = tiny(**common, **{"eval.early_stopping": 1})
    results = train.train_and_evaluate(cfg, str(tmp_path / "early"))
    rows = [json.loads(line) for line in open(tmp_path / "early" / "metrics.jsonl")]
    assert max(r["step"] for r in rows) == stop
    assert {r["step"]: r["map@100"] for r in rows if r["split"] == "val"
            and r.get("system") == "dual_encoder" and r["step"] < stop} == {
                s: v for s, v in val.items() if s < stop}
    assert [r["step"] for r in rows if r["split"] == "test"
            and r.get("system") == "dual_encoder"] == [stop]
    assert str(stop) in os.listdir(tmp_path / "early" / "checkpoints")
    capsys.readouterr()
    again = train.train_and_evaluate(cfg, str(tmp_path / "early"))
    assert ({k: r["map@100"] for k, r in again.items()}
            == {k: r["map@100"] for k, r in results.items()})
    assert f"finished at step {stop}" in capsys.readouterr().out
    # Killed during the evaluation of the best step (its checkpoint is saved first): the
    # same command evaluates that step again, so it is still the best, and stops as above.
    from dualjax.eval import scoring
    real, calls = scoring.evaluate_split, []

    def dies(task, *args, **kwargs):
        calls.append(1)
        if len(calls) == (stop - 5) // 5:
            raise RuntimeError("killed")
        return real(task, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(scoring, "evaluate_split", dies)
        with pytest.raises(RuntimeError, match="killed"):
            train.train_and_evaluate(cfg, str(tmp_path / "killed"))
    assert not any(r["step"] == stop - 5 and r["split"] == "val"
                   for r in map(json.loads, open(tmp_path / "killed" / "metrics.jsonl")))
    resumed = train.train_and_evaluate(cfg, str(tmp_path / "killed"))
    assert ({k: r["map@100"] for k, r in resumed.items()}
            == {k: r["map@100"] for k, r in results.items()})
    with pytest.raises(errors.ConfigError, match="eval.early_stopping"):
        config_lib.validate(tiny(**{"eval.early_stopping": 2}), 8)


def test_max_epochs_caps_the_steps_by_the_training_items():
    """max_epochs passes over every task's pairs (a pre-training collection: its
    passages), rounded up, when that is fewer than num_train_steps; resuming computes the
    same. A workdir saved before the key existed resumes (absent = off)."""
    import dataclasses
    import types

    from dualjax.config import run
    from dualjax.train import workdir as workdir_lib
    cfg = tiny(**{"num_train_steps": 300, "global_batch_size": 64, "max_epochs": 2.0})
    spec = run.resolve(cfg, checked=False)
    steps = lambda spec, tasks: train.capped_steps(spec, tasks).schedule.num_train_steps
    pairs = types.SimpleNamespace(pretraining=False, train_source=[None] * 100)
    docs = types.SimpleNamespace(pretraining=True, needs_teacher=False,
                                 collection=types.SimpleNamespace(passages=[""] * 82))
    assert steps(spec, [docs]) == 3  # ceil(2 * 82 / 64)
    distill = types.SimpleNamespace(**{**vars(docs), "needs_teacher": True})
    # distill: passes over distill.queries_per_passage=3 queries of each passage
    three = dataclasses.replace(spec, teacher=run.TeacherSpec("t", queries_per_passage=3))
    assert steps(three, [distill]) == 8  # ceil(2 * 246 / 64)
    assert steps(three, [docs]) == 3
    assert steps(spec, [pairs, docs]) == 6  # ceil(2 * 182 / 64)
    assert spec.schedule.num_train_steps == 300  # the caller's spec is left as it was
    big = types.SimpleNamespace(pretraining=False, train_source=[None] * 100_000)
    assert train.capped_steps(spec, [big]) is spec
    cfg.max_epochs = 0.0
    off = run.resolve(cfg, checked=False)
    assert train.capped_steps(off, [docs]) is off
    saved = {k: v for k, v in cfg.to_dict().items() if k != "max_epochs"}
    assert workdir_lib.config_changes(saved, cfg.to_dict()) == ([], [])
    cfg.max_epochs = 2.0
    assert workdir_lib.config_changes(saved, cfg.to_dict())[0] == ["max_epochs: 0.0 -> 2.0"]
