"""The run resolved once (`config.run`): a frozen RunSpec the loop takes without reading
the config again, and `upgrade`, which gives an older config today's keys."""
import dataclasses
import json

import pytest
from conftest import load_config

from dualjax.config import run, specs, validation
from dualjax.train import loop as train

# Keys added after the first saved configs, each read today by the stage that needs it.
NEWER = ["model.dtype", "model.query_tower", "model.doc_tower", "model.shared_embedding",
         "model.query_prompt", "model.document_prompt", "model.query_max_len",
         "model.pretrained", "mesh.model_axis", "mesh.param_sharding", "max_epochs", "tasks",
         "train", "loss.remove_query_hits", "loss.remove_cluster_hits",
         "loss.matryoshka_dims", "loss.column_block", "eval.hybrid", "eval.select_by",
         "eval.early_stopping", "eval.dims", "eval.evaluators", "eval.bm25_stemmer",
         "data.pseudo_weight", "data.hard_negatives", "data.tfds_dir", "data.rebuild"]


def without(config: dict, keys) -> dict:
    out = json.loads(json.dumps(config))
    for key in keys:
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node[p]
        del node[last]
    return out


def test_an_old_saved_config_resolves_as_it_ran_before_its_newer_keys(tmp_path):
    """A config.json from before the newer keys: each takes the value that meant "as
    before" (not today's default where they differ: loss.remove_query_hits is on today,
    and was not done before the key existed)."""
    cfg = load_config("tiny")
    old = without(cfg.to_dict(), NEWER)
    (tmp_path / "config.json").write_text(json.dumps(old))
    spec = run.saved(str(tmp_path))
    assert (spec.model.query_tower, spec.model.doc_tower) == (cfg.model.tower,) * 2
    assert spec.model.dtype == "float32" and not spec.model.shared_embedding
    assert spec.inputs.prompts == ("", "")
    assert spec.inputs.max_lens == (cfg.model.max_len, cfg.model.doc_max_len or
                                    cfg.model.max_len)
    assert spec.mesh == run.MeshSpec(cfg.mesh.num_devices, 1, "replicated")
    assert spec.schedule.max_epochs == 0.0 and spec.schedule.early_stopping == 0
    assert not spec.objective.remove_query_hits and not spec.objective.remove_cluster_hits
    assert spec.objective.encode_chunks == 0 and spec.objective.matryoshka_dims == ()
    assert (spec.eval.hybrid, spec.eval.select_by, spec.eval.dims) == ("", "", ())
    assert spec.eval.evaluators == ()
    [task] = spec.tasks
    assert task.name == "" and task.tfds_dir == str(tmp_path / "tfds") and not task.rebuild
    assert task.data["pseudo_weight"] == 0.5 and task.data["hard_negatives"] == 0
    assert spec.as_dict() == old  # what config.json said, as given


def test_upgrade_fills_only_what_is_missing_and_copies():
    cfg = load_config("tiny")
    cfg.model.dtype = "bfloat16"
    old = without(cfg.to_dict(), ["model.query_tower", "data.rebuild"])
    up = run.upgrade(old)
    assert up.model.dtype == "bfloat16"  # given: kept
    assert up.model.query_tower == "" and up.data.rebuild is False
    assert "query_tower" not in old["model"]  # the saved dict is left as it was
    assert run.upgrade(cfg).to_dict() == run.upgrade(cfg.to_dict()).to_dict()


def test_the_spec_is_frozen_and_its_data_groups_read_only():
    spec = run.resolve(load_config("tiny"), "/tmp/w", checked=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.schedule.num_train_steps = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.tasks[0].data["path"] = "elsewhere"  # type: ignore[index]
    assert spec.with_steps(3).schedule.num_train_steps == 3
    assert spec.schedule.num_train_steps == load_config("tiny").num_train_steps


@pytest.mark.slow
def test_the_loop_never_resolves_the_config_again(tmp_path, monkeypatch):
    """`train_and_evaluate(spec)` trains and evaluates with the spec alone: every spec
    builder and the validation fail if called after `resolve`."""
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({"num_train_steps": 2, "eval_every_steps": 0,
                                    "checkpoint_every_steps": 0, "eval.untrained": False,
                                    "eval.baselines": "", "eval.index": "exact"})
    spec = run.resolve(cfg, str(tmp_path))
    for module, name in [(validation, "validate"), *((specs, n) for n in (
            "model_spec", "inputs_spec", "objective_spec", "optimizer_spec", "eval_spec",
            "dataset_spec", "task_configs", "max_lens"))]:
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} called"))
    results = train.train_and_evaluate(spec, str(tmp_path))
    assert results["dual_encoder [exact]"]["num_queries"] > 0
    assert json.loads((tmp_path / "config.json").read_text()) == cfg.to_dict()
