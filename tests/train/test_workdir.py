"""One workdir, one run, one config: config changes on resume, the lock, rows once."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import conftest
import pytest
from conftest import load_config

from dualjax import errors
from dualjax.errors import WorkdirError
from dualjax.eval import scoring
from dualjax.eval.metrics_log import MetricsLog
from dualjax.train import loop as train
from dualjax.train import workdir


def tiny(**overrides):
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict(overrides)
    return cfg


def started(path, cfg):
    """A workdir as a run with `cfg` leaves it after its first checkpoint."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    (path / "vocab.json").write_text("{}")
    (path / "checkpoints" / "5").mkdir(parents=True)
    return path


@pytest.mark.parametrize("key, old, new", [
    ("model.embed_dim", 16, 32), ("model.tokenizer", "word", "char_trigram"),
    ("global_batch_size", 32, 64), ("data.num_train_clusters", 150, 100), ("seed", 0, 1)])
def test_a_changed_config_is_refused_before_any_file_is_touched(tmp_path, key, old, new):
    run = started(tmp_path / "run", tiny())
    before = (run / "config.json").read_text()
    with pytest.raises(WorkdirError) as e:
        train.train_and_evaluate(tiny(**{key: new}), str(run))
    assert f"{key}: {old!r} -> {new!r}" in str(e.value)
    assert "cannot change when it resumes" in str(e.value)
    assert (run / "config.json").read_text() == before
    assert sorted(os.listdir(run)) == [".lock", "checkpoints", "config.json", "vocab.json"]


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_takes_a_corrected_config(tmp_path):
    """A run that diverged before its first checkpoint left its vocabulary, and the
    corrected command was refused ("cannot change ... optimizer.learning_rate"): the
    workdir was stuck. Now nothing is trained there yet, so the run starts over, and
    what it made from the changed keys (here model.vocab_size: the vocabulary) is made
    again."""
    from dualjax.errors import NonFiniteLossError
    run = tmp_path / "run"
    quick = {"eval.untrained": False, "eval.baselines": "", "eval.index": "exact"}
    with pytest.raises(NonFiniteLossError):
        train.train_and_evaluate(tiny(**quick, **{"optimizer.learning_rate": 1e38}), str(run))
    assert {"vocab.json", "config.json"} <= set(os.listdir(run))
    assert not any(n.isdigit() for n in os.listdir(run / "checkpoints"))
    vocab_before = len(json.loads((run / "vocab.json").read_text())["vocab"])
    results = train.train_and_evaluate(tiny(**quick, **{"model.vocab_size": 300}), str(run))
    assert "dual_encoder [exact]" in results
    assert len(json.loads((run / "vocab.json").read_text())["vocab"]) < vocab_before
    assert json.loads((run / "config.json").read_text())["model"]["vocab_size"] == 300


def test_cadences_steps_and_eval_settings_may_change_and_are_recorded(tmp_path):
    run = started(tmp_path / "run", tiny())
    changed = tiny(**{"num_train_steps": 40, "eval.top_k": 50, "log_every_steps": 1,
                      "mesh.num_devices": 4})
    workdir.check_and_write_config(str(run), changed.to_dict())
    assert json.loads((run / "config.json").read_text()) == changed.to_dict()


def test_a_fresh_workdir_takes_any_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny().to_dict()))  # nothing trained yet
    workdir.check_and_write_config(str(tmp_path), tiny(**{"model.embed_dim": 8}).to_dict())
    assert json.loads((tmp_path / "config.json").read_text())["model"]["embed_dim"] == 8


def test_a_folder_of_other_files_is_not_taken_over(tmp_path):
    """A --workdir holding a user's own files (a config.json and metrics.jsonl of their
    own) is refused in one line before anything is written; an empty folder, a workdir
    with the marker, and one an older run made (dualjax's config.json) are taken."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"name": "my experiment"}')
    (mine / "metrics.jsonl").write_text('{"accuracy": 0.9}\n')
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    with pytest.raises(errors.WorkdirError, match=r"holds files that are not a dualjax "
                       r"run's \(config.json, metrics.jsonl, ...\)"):
        train.train_and_evaluate(tiny(), str(mine))
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(tiny().to_dict()))  # before the marker
    workdir.check_is_workdir(str(old))
    (tmp_path / "empty").mkdir()
    workdir.check_is_workdir(str(tmp_path / "empty"))
    with workdir.guard(str(tmp_path / "new"), tiny().to_dict()):
        assert (tmp_path / "new" / workdir.MARKER).exists()


def test_a_second_run_on_a_workdir_is_refused(tmp_path):
    lock = workdir.Lock(str(tmp_path))
    lock.acquire()
    try:
        with pytest.raises(WorkdirError, match=f"is in use by pid {os.getpid()} on "):
            train.train_and_evaluate(tiny(), str(tmp_path))
    finally:
        lock.release()
    with workdir.guard(str(tmp_path), tiny().to_dict()):  # free again
        pass


def test_the_lock_of_a_killed_run_is_free(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dualjax.train import workdir; "
         f"workdir.Lock({str(tmp_path)!r}).acquire(); print('locked', flush=True); "
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirError, match=f"pid {holder.pid}"):
        workdir.Lock(str(tmp_path)).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = workdir.Lock(str(tmp_path))
    lock.acquire()  # taken over from the dead holder
    lock.release()


def test_unwritable_workdir_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WorkdirError, match="cannot use it as a workdir"):
        train.train_and_evaluate(tiny(), str(blocker / "run"))


def test_metrics_rows_are_written_once(tmp_path):
    log = MetricsLog(str(tmp_path))
    log.write(5, "train", {"loss": 1.0})
    log.write(20, "test", {"map@100": 0.1}, system="bm25", index="exact")
    log.write(20, "test", {"map@100": 0.2}, system="dual_encoder", index="exact")
    log.write(20, "test", {"map@100": 0.3}, system="bm25", index="exact")  # evaluated again
    log.write(20, "test", {"recall@10": 0.4}, system="bm25", index="exact", typo_p=0.5)
    rows = MetricsLog(str(tmp_path)).read()
    assert [(r["step"], r.get("system"), r.get("typo_p")) for r in rows] == [
        (5, None, None), (20, "dual_encoder", None), (20, "bm25", None), (20, "bm25", 0.5)]
    assert rows[2]["map@100"] == 0.3
    log.truncate_after(0)  # a run killed before its first checkpoint starts over
    assert MetricsLog(str(tmp_path)).read() == []


@pytest.mark.slow
def test_fewer_steps_than_the_checkpoint_say_so_and_evaluate_once(tmp_path, caplog,
                                                                  monkeypatch):
    """num_train_steps below the checkpoint's step: a warning that says which step is
    evaluated; a rerun finds it finished and evaluates nothing."""
    cfg = tiny(**{"num_train_steps": 4, "checkpoint_every_steps": 2, "eval_every_steps": 0,
                  "eval.index": "exact", "eval.untrained": False, "eval.baselines": ""})
    train.train_and_evaluate(cfg, str(tmp_path))
    caplog.set_level("WARNING")
    cfg.num_train_steps = 2
    cfg.eval.rerun = True
    rows = train.train_and_evaluate(cfg, str(tmp_path))
    assert "num_train_steps=2 is below the checkpoint's step 4" in caplog.text
    assert {r["step"] for r in MetricsLog(str(tmp_path)).read() if r["split"] == "test"} == {4}
    cfg.eval.rerun = False
    monkeypatch.setattr(scoring, "evaluate_split",
                        lambda *a, **k: pytest.fail("evaluated again"))
    again = train.train_and_evaluate(cfg, str(tmp_path))
    assert {k: r["map@100"] for k, r in again.items()} == \
        {k: r["map@100"] for k, r in rows.items()}


def test_a_torn_last_row_is_cut_back_and_a_bad_row_named(tmp_path, caplog):
    """A run killed while appending leaves a torn last row: the next writer cuts it back to
    the last complete row, with a warning; a bad row elsewhere is named by file:line."""
    log = MetricsLog(str(tmp_path))
    log.write(5, "train", {"loss": 1.0})
    log.write(10, "train", {"loss": 0.5})
    with open(log.path, "a") as f:
        f.write('{"step": 15, "split": "tr')
    caplog.set_level("WARNING")
    rows = MetricsLog(str(tmp_path)).read()
    assert [r["step"] for r in rows] == [5, 10]
    assert "its last row was torn" in caplog.text
    with open(log.path) as f:
        assert f.read().endswith('"loss": 0.5}\n')
    with open(log.path, "a") as f:
        f.write("not json\n" + '{"step": 20, "split": "train", "loss": 0.1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:3: not a JSON row"):
        MetricsLog(str(tmp_path))


@pytest.mark.slow
def test_rows_of_a_run_killed_before_its_first_checkpoint_are_not_repeated(tmp_path):
    cfg = tiny(**{"eval.untrained": False, "eval.baselines": "", "eval.index": "exact",
                  "num_train_steps": 5, "checkpoint_every_steps": 0})
    workdir.check_and_write_config(str(tmp_path), cfg.to_dict())  # the killed run's, written first
    MetricsLog(str(tmp_path)).write(5, "train", {"loss": 9.0})  # from the killed run
    train.train_and_evaluate(cfg, str(tmp_path))
    rows = MetricsLog(str(tmp_path)).read()
    [trained] = [r for r in rows if r["split"] == "train"]  # step 5, once, from this run
    assert trained["step"] == 5 and trained["loss"] != 9.0
    assert len({(r["step"], r["split"], r.get("system"), r.get("index"))
                for r in rows}) == len(rows)
    # Rerunning the finished workdir says so and returns its results, evaluating nothing.
    again = train.train_and_evaluate(cfg, str(tmp_path))
    assert MetricsLog(str(tmp_path)).read() == rows
    assert {k: v["map@100"] for k, v in again.items()} == {
        f"{r['system']} [{r['index']}]": r["map@100"] for r in rows
        if r["split"] == "test"}
    cfg.eval.rerun = True  # asked to: evaluates again, each row still once
    train.train_and_evaluate(cfg, str(tmp_path))
    assert len(MetricsLog(str(tmp_path)).read()) == len(rows)


@pytest.mark.slow
def test_a_signal_outside_training_stops_at_once_with_one_message(tmp_path, monkeypatch, ctrl_c,
                                                                  caplog):
    """Data preparation and evaluation have nothing to save: SIGTERM / SIGINT there stop
    the run at once (Preempted, exit 143 from the command line) and say what was kept.
    Output is not a terminal here, so training progress comes as log lines."""
    caplog.set_level("INFO")
    cfg = tiny(**{"num_train_steps": 4, "checkpoint_every_steps": 2, "eval_every_steps": 0,
                  "log_every_steps": 2,
                  "eval.index": "exact", "eval.untrained": False, "eval.baselines": ""})
    make_tasks, evaluate_split = train.tasks_lib.make_tasks, scoring.evaluate_split

    def signalled(original, sig):
        def f(*args, **kwargs):
            os.kill(os.getpid(), sig)
            return original(*args, **kwargs)
        return f

    run = tmp_path / "run"
    monkeypatch.setattr(train.tasks_lib, "make_tasks", signalled(make_tasks, signal.SIGTERM))
    with pytest.raises(errors.Preempted, match="SIGTERM: stopped before training; nothing was "
                                              "saved; run the same command again"):
        train.train_and_evaluate(cfg, str(run))
    monkeypatch.setattr(train.tasks_lib, "make_tasks", make_tasks)
    monkeypatch.setattr(scoring, "evaluate_split", signalled(evaluate_split, signal.SIGINT))
    with pytest.raises(errors.Preempted, match="SIGINT: stopped during the final evaluation; "
                                              "training is finished and saved at step 4"):
        train.train_and_evaluate(cfg, str(run))
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    progress = [m for m in caplog.messages if m.startswith("step ")]
    assert [m.split(":")[0] for m in progress] == ["step 2/4", "step 4/4"]
    assert "pairs/s" in progress[0]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    monkeypatch.setattr(scoring, "evaluate_split", evaluate_split)
    results = train.train_and_evaluate(cfg, str(run))  # evaluates the finished run
    assert results["dual_encoder [exact]"]["num_queries"] > 0
    rows = MetricsLog(str(run)).read()
    assert len([r for r in rows if r["split"] == "test"]) == 1


@pytest.mark.slow
def test_a_signal_as_the_last_step_is_saved_stops_before_the_final_evaluation(tmp_path,
                                                                              monkeypatch):
    """A SIGTERM that lands while the last step's checkpoint is written comes after that
    step's check: the run went on to its whole final evaluation (minutes at 1M pairs; a
    preempted VM has seconds). It stops there now, the step saved, in one line; the same
    command then evaluates the finished run."""
    cfg = tiny(**{"num_train_steps": 4, "checkpoint_every_steps": 2, "eval_every_steps": 0,
                  "log_every_steps": 2,
                  "eval.index": "exact", "eval.untrained": False, "eval.baselines": ""})
    run, save = tmp_path / "run", train.Progress.save

    def signalled(self, step, tasks):
        save(self, step, tasks)
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(train.Progress, "save", signalled)
    with pytest.raises(errors.Preempted, match="SIGTERM: saved a checkpoint at step 4 in "):
        train.train_and_evaluate(cfg, str(run))
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    assert not [r for r in MetricsLog(str(run)).read() if r["split"] in ("val", "test")]
    monkeypatch.setattr(train.Progress, "save", save)
    results = train.train_and_evaluate(cfg, str(run))
    assert results["dual_encoder [exact]"]["num_queries"] > 0


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_earlier_ones_resume(tmp_path,
                                                                               monkeypatch):
    """Orbax reports a full disk as a ValueError carrying TensorStore's status (seen on a
    full tmpfs); the run ends with one SaveError line naming the kept checkpoints."""
    from dualjax.train import checkpoints
    cfg = tiny(**{"num_train_steps": 6, "checkpoint_every_steps": 2, "keep_checkpoints": 5,
                  "eval.index": "exact", "eval.untrained": False, "eval.baselines": ""})
    save = checkpoints.ocp.CheckpointManager.save

    def full_at_4(self, step, *args, **kwargs):
        if step == 4:
            raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "x/_sharding": '
                             "Failed to write 5690 bytes to file 13: No space left on device "
                             "[os_error_code='28']")
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(checkpoints.ocp.CheckpointManager, "save", full_at_4)
    run = tmp_path / "run"
    with pytest.raises(errors.SaveError) as e:
        train.train_and_evaluate(cfg, str(run))
    assert str(e.value) == (f"{run}/checkpoints: cannot save the checkpoint of step 4 (no "
                            "space left on the device); the checkpoint of step 2 is kept; "
                            "free some space and run the same command again to resume")
    assert isinstance(e.value, WorkdirError)  # the command line prints it as one line
    monkeypatch.setattr(checkpoints.ocp.CheckpointManager, "save", save)
    train.train_and_evaluate(cfg, str(run))
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4", "6"]


def test_a_signal_while_the_command_starts_is_one_line_and_exit_143(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "dualjax.main", f"--workdir={tmp_path / 'w'}",
                             "--config=configs/tiny.py"], stderr=subprocess.PIPE, text=True,
                            cwd=str(conftest.REPO))
    time.sleep(0.5)  # importing jax takes longer: the signal lands among the imports
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[:3000]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("dualjax: SIGTERM: stopped")


def test_a_signal_swallowed_by_a_finalizer_is_delivered_again():
    """A SIGTERM whose handler ran inside a `__del__` raised there, was printed as an
    ignored exception, and the command went on to exit 0 (seen once in the drill during
    the final evaluation). The commands' unraisable hook delivers it again; and once
    the command is done, a signal during the interpreter's teardown is ignored."""
    from dualjax import cli

    class Finalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    previous = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT),
                sys.unraisablehook)
    done = []
    try:
        def main(argv):
            Finalizer()  # made and collected at once: its __del__ gets the signal
            for _ in range(200):
                time.sleep(0.01)
            done.append("went on")

        with pytest.raises(SystemExit) as e:
            cli._stoppable(main, "dualjax.test")([])
        assert e.value.code == 143 and done == []
        cli._stoppable(lambda argv: None, "dualjax.test")([])
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        sys.unraisablehook = previous[2]


def test_another_process_stopping_swallowed_by_a_gc_callback_is_delivered_again():
    """PeerStopped is raised in the main thread by SIGUSR1's handler wherever it is;
    inside a gc callback (jax's `_xla_gc_callback`) Python prints it as ignored and goes
    on (seen once in the suite: the process still ended, by the grace timer, with a
    traceback before its one line). The commands' unraisable hook sends the signal
    again instead, and prints nothing."""
    from dualjax import cli
    printed, got = [], []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        hook = cli._signals_again(printed.append)
        hook(SimpleNamespace(exc_type=errors.PeerStopped, exc_value=errors.PeerStopped("x")))
        for _ in range(200):
            if got:
                break
            time.sleep(0.01)
        assert got == [signal.SIGUSR1] and printed == []
        hook(SimpleNamespace(exc_type=ValueError, exc_value=ValueError("x")))
        assert len(printed) == 1  # anything else: the hook it wraps
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_workdir_saved_before_keys_with_non_off_defaults_resumes():
    """A config.json written before model.lora_alpha (16.0), data.pseudo_weight (0.5) and
    the like existed recorded a run that did what those defaults do: resuming it under
    today's config changes nothing, and a real change is still refused, by its values."""
    cfg = tiny()
    saved = cfg.to_dict()
    for group, key in (("model", "lora_alpha"), ("model", "lora_base_dtype"),
                       ("model", "feature_dim"), ("loss", "log_q_alpha"),
                       ("data", "pseudo_weight"), ("data", "candidate_unit")):
        del saved[group][key]
    assert workdir.config_changes(saved, cfg.to_dict()) == ([], [])
    cfg.model.lora_base_dtype = "float32"
    assert workdir.config_changes(saved, cfg.to_dict())[0] == [
        "model.lora_base_dtype: 'bfloat16' -> 'float32'"]
