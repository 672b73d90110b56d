"""Training end to end: a tiny run, kill-and-resume equality, bad values and bad input."""

import inspect
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import CONFIGS
from helpers import preempt_at, tiny, train_rows
from jax import monitoring

from dualjax import errors, models
from dualjax.data import pipeline
from dualjax.errors import DataError
from dualjax.train import loop as train
from dualjax.train import step as step_lib
from dualjax.train.rows import AHEAD_SECONDS, TrainRows, steps_ahead


def final_params(workdir, step):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.PyTreeCheckpointer().restore(path)["params"]


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
def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch):
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
    # The same command again resumes at step 7, its pairs' tokens read back from
    # WORKDIR/tokenized (data/token_cache.py), none encoded again.
    def encoded(*_):
        raise AssertionError("the resumed run encoded its training pairs again")
    monkeypatch.setattr(pipeline, "encode_pairs", encoded)
    train.train_and_evaluate(tiny(), split)
    monkeypatch.undo()

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
