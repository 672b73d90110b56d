"""Which step a run keeps and when it stops: eval.select_by's best step, a cut best.json,
early stopping, max_epochs."""

import json
import os

import pytest
from helpers import tiny

from dualjax import errors
from dualjax.config import validation as config_lib
from dualjax.train import loop as train
from dualjax.train import tasks as tasks_lib


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
    steps = lambda spec, tasks: tasks_lib.capped_steps(spec, tasks).schedule.num_train_steps
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
    assert tasks_lib.capped_steps(spec, [big]) is spec
    cfg.max_epochs = 0.0
    off = run.resolve(cfg, checked=False)
    assert tasks_lib.capped_steps(off, [docs]) is off
    saved = {k: v for k, v in cfg.to_dict().items() if k != "max_epochs"}
    assert workdir_lib.config_changes(saved, cfg.to_dict()) == ([], [])
    cfg.max_epochs = 2.0
    assert workdir_lib.config_changes(saved, cfg.to_dict())[0] == ["max_epochs: 0.0 -> 2.0"]
