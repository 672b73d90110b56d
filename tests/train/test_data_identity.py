"""A workdir records the input files it was made from (WORKDIR/data.json) and refuses to
resume on changed ones unless data.rebuild says to (issue 30)."""

import hashlib
import json
import os

import pytest
from conftest import files_of, load_config, tasks_of

from dualjax.errors import WorkdirError
from dualjax.train import loop as train
from dualjax.train import workdir

OLD = ("bike", "car", "phone")
NEW = ("kettle", "oven", "fridge")


def write_pairs(path, objects):
    """Ten clusters of paraphrase pairs per object: words of `objects` only."""
    path.write_text("".join(f"how do i fix my {o} {i}\thow can i repair my {o} {i}\n"
                            for i in range(10) for o in objects))
    return path


def pairs_run(pairs, steps, **overrides):
    """A tiny run on the pairs file, evaluated in the cheapest way."""
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({
        "data.name": "pairs", "data.path": str(pairs), "data.test_fraction": 0.2,
        "num_train_steps": steps, "checkpoint_every_steps": 0, "eval.index": "exact",
        "eval.untrained": False, "eval.baselines": "", **overrides})
    return cfg


def record(run):
    return json.loads((run / "data.json").read_text())["files"]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_rewritten_pairs_file_is_refused_before_anything_is_written(tmp_path):
    pairs, run = write_pairs(tmp_path / "pairs.tsv", OLD), tmp_path / "run"
    train.train_and_evaluate(pairs_run(pairs, 2), str(run))
    assert record(run)[str(pairs)]["sha256"] == sha256(pairs)
    before = {name: (run / name).read_bytes() for name in
              ("config.json", "data.json", "vocab.json", "metrics.jsonl")}
    write_pairs(pairs, NEW)  # same path, other words
    with pytest.raises(WorkdirError) as e:
        train.train_and_evaluate(pairs_run(pairs, 4), str(run))
    message = str(e.value)
    assert "\n" not in message
    assert f"{pairs} (data.path) changed" in message
    assert "a new --workdir" in message and "--config.data.rebuild=True" in message
    assert {name: (run / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(run / "checkpoints")) == ["2"]


@pytest.mark.slow
def test_data_rebuild_trains_on_the_new_pairs_with_the_old_vocabulary(tmp_path, caplog):
    pairs, run = write_pairs(tmp_path / "pairs.tsv", OLD), tmp_path / "run"
    train.train_and_evaluate(pairs_run(pairs, 2), str(run))
    vocab = (run / "vocab.json").read_text()
    write_pairs(pairs, NEW)
    caplog.set_level("WARNING")
    cfg = pairs_run(pairs, 4, **{"data.rebuild": True})
    train.train_and_evaluate(cfg, str(run))
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]  # resumed and went on
    assert (run / "vocab.json").read_text() == vocab  # tied to the checkpoint's rows
    assert not set(NEW) & set(json.loads(vocab)["vocab"])
    assert "(data.path) changed" in caplog.text
    assert record(run)[str(pairs)]["sha256"] == sha256(pairs)  # the new identity
    # The new pairs' table was built, beside the old one, and it is what trains now.
    assert len(list((run / "tfds" / "pairs_file").glob("pairs-*"))) == 2
    [task] = tasks_of(cfg, str(run))
    n = len(task.train_source)
    texts = {task.train_source[i][side].decode() for i in range(n)
             for side in ("query", "document")}
    assert {t.split()[-2] for t in texts} == set(NEW)
    # Of a pair's 7 + 7 tokens only its object (twice) is new: 2 n of 14 n unknown.
    assert f"data.rebuild: {2 * n} of the {14 * n} tokens" in caplog.text
    # Recorded: the next resume, without the flag, takes the new file as the workdir's.
    assert workdir.check_data(str(run), files_of(pairs_run(pairs, 6))) == []


def test_a_touched_or_same_bytes_file_is_accepted(tmp_path, monkeypatch):
    pairs, run = write_pairs(tmp_path / "pairs.tsv", OLD), tmp_path / "run"
    run.mkdir()
    (run / "vocab.json").write_text("{}")  # a workdir with state
    files = files_of(pairs_run(pairs, 2))
    assert [(f.key, f.path) for f in files] == [("data.path", str(pairs))]
    workdir.check_data(str(run), files)
    first = record(run)[str(pairs)]
    os.utime(pairs, ns=(first["mtime_ns"] + 10**9,) * 2)  # touch
    assert workdir.check_data(str(run), files) == []
    touched = record(run)[str(pairs)]
    assert touched == {**first, "mtime_ns": first["mtime_ns"] + 10**9}  # cheap from now on
    write_pairs(pairs, OLD)  # rewritten with the same bytes
    assert workdir.check_data(str(run), files) == []
    assert record(run)[str(pairs)]["sha256"] == first["sha256"]
    # Size and time as recorded: accepted without reading the file.
    monkeypatch.setattr(workdir, "_identity", lambda *a: pytest.fail("hashed"))
    assert workdir.check_data(str(run), files) == []


@pytest.mark.slow
def test_a_workdir_from_before_the_record_resumes_and_is_recorded(tmp_path):
    pairs, run = write_pairs(tmp_path / "pairs.tsv", OLD), tmp_path / "run"
    train.train_and_evaluate(pairs_run(pairs, 2), str(run))
    os.remove(run / "data.json")  # as a run before data.json left it
    os.utime(pairs, ns=(os.stat(pairs).st_mtime_ns + 10**9,) * 2)
    train.train_and_evaluate(pairs_run(pairs, 4), str(run))
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    assert record(run)[str(pairs)]["sha256"] == sha256(pairs)  # the data as found
    write_pairs(pairs, NEW)
    with pytest.raises(WorkdirError, match="changed"):
        workdir.check_data(str(run), files_of(pairs_run(pairs, 6)))


def test_every_input_file_of_every_task_is_recorded_and_named_by_its_key(tmp_path):
    """Multi-task: each task's files under its own key (a BEIR folder: its corpus, queries
    and qrels, not other files there), accepted by its own rebuild flag."""
    import ml_collections
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "README.md"):
        (beir / name).write_text(f"{name}\n")
    pairs, queries = write_pairs(tmp_path / "pairs.tsv", OLD), tmp_path / "queries.txt"
    queries.write_text("how do i fix my bike\n")
    cfg = load_config("tiny")
    base = cfg.data.to_dict()
    cfg.tasks = ml_collections.ConfigDict({
        "mine": {"data": {**base, "name": "pairs", "path": str(pairs), "pseudo_labels": 2,
                          "pseudo_label_queries": str(queries)}},
        "zs": {"data": {**base, "name": "beir", "path": str(beir)}}})
    files = files_of(cfg)
    assert [(f.key, f.path) for f in files] == [
        ("tasks.mine.data.path", str(pairs)),
        ("tasks.mine.data.pseudo_label_queries", str(queries)),
        ("tasks.zs.data.path", str(beir / "corpus.jsonl")),
        ("tasks.zs.data.path", str(beir / "queries.jsonl")),
        ("tasks.zs.data.path", str(beir / "qrels" / "test.tsv"))]
    run = tmp_path / "run"
    run.mkdir()
    (run / "vocab.json").write_text("{}")
    workdir.check_data(str(run), files)
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(WorkdirError, match=r"dev\.tsv \(tasks\.zs\.data\.path\) is new.*"
                                           r"--config\.tasks\.zs\.data\.rebuild=True"):
        workdir.check_data(str(run), files_of(cfg))
    queries.write_text("how do i fix my car\n")
    cfg.tasks.zs.data.rebuild = True  # the beir task's only: the query file is refused
    with pytest.raises(WorkdirError, match=r"queries\.txt \(tasks\.mine\.data\."
                                           r"pseudo_label_queries\) changed"):
        workdir.check_data(str(run), files_of(cfg))
    cfg.data.rebuild = True  # the run's: every task's
    assert workdir.check_data(str(run), files_of(cfg)) == sorted(
        [str(beir / "qrels" / "dev.tsv"), str(queries)])
    assert set(record(run)) == {f.path for f in files_of(cfg)}


def test_the_pairs_table_is_written_while_process_0_goes_first(tmp_path):
    """Every table a run reads is written inside `main_first` (process 0 first, the other
    processes then read it): the evaluation tables and the training pairs' too, also
    where no vocabulary is built from the pairs (a pretrained start's tokenizer)."""
    from conftest import FIXTURES

    from dualjax.config import run
    from dualjax.train import tasks as tasks_lib
    cfg = load_config("tiny")
    cfg.model.update(tower="bert", tokenizer="hf",
                     pretrained=str(FIXTURES / "pretrained" / "tiny_bert"))
    spec = run.resolve(cfg, str(tmp_path))
    tasks = tasks_lib.make_tasks(spec.tasks, spec.schedule.seed)
    train._prepare_input(spec, str(tmp_path), tasks)
    (task,) = tasks
    written = os.listdir(os.path.join(task.tfds_dir, "synthetic_paraphrase"))
    assert any(name.startswith("pairs-") for name in written), written
    assert "train_source" in vars(task)  # (read there, not later outside main_first)
