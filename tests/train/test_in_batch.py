"""What joins a training batch, end to end: documents repeated in a batch and paraphrases
of a row masked as accidental hits, mixed and mined negatives, the log-q correction,
several tasks sharing the encoder (each resumed bit-equal)."""

import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import preempt_at, tiny, train_rows

from dualjax import errors
from dualjax.config.specs import dataset_spec
from dualjax.train import loop as train
from dualjax.train import tasks


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
