"""Evaluators built from the config (`dualjax.eval.evaluators`): given encode functions (never
params or the trainer), they write their rows and return them."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest
from conftest import load_config

from dualjax.config import specs
from dualjax.data.clusters import RetrievalTask, task_from_clusters
from dualjax.eval import evaluators, scoring
from dualjax.eval.metrics_log import MetricsLog
from dualjax.runtime import sharding
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import build_word_tokenizer

# Pairs of paraphrases sharing rare words, and distractors: BM25 finds the partners.
TEXTS = ["cheap flights paris", "cheap flights today", "bake sourdough bread",
         "sourdough bread recipe", "learn python programming", "python programming course",
         "repair bicycle chain", "bicycle chain broken", "cheap hotels rome",
         "bread flour types", "python snake facts"]
TASK = task_from_clusters(TEXTS, [0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6])
TOKENIZER = build_word_tokenizer(TEXTS, vocab_size=100, num_oov_buckets=8)
INPUTS = Inputs(Side(TOKENIZER, 6), Side(TOKENIZER, 6))
TABLE = jax.random.normal(jax.random.PRNGKey(0), (TOKENIZER.vocab_size, 8))


@jax.jit
def encode(x):
    """Unit-norm sum of fixed random word vectors: [batch, len] ids -> [batch, 8]."""
    v = (TABLE[x["ids"]] * x["mask"][..., None]).sum(1)
    return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-6)


SYSTEMS = {"dual_encoder": (encode, encode), "untrained": (encode, encode)}


@dataclasses.dataclass
class FakeTask:
    """What an evaluator reads of a `tasks.Task`: its name, splits' data and row fields."""
    name: str
    data: dict[str, RetrievalTask]

    def eval_task(self, split: str) -> RetrievalTask:
        return self.data[split]

    def fields(self) -> dict[str, str]:
        return {"task": self.name} if self.name else {}


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh()


# hybrid_weight 0.55 is not on the grid val chooses from: a row with it was not chosen.
BASE = dict(index="exact", top_k=100, batch_size=16, hybrid="bm25", hybrid_rrf_k=60.0,
            hybrid_weight=0.55, select_by="", baselines=("bm25",), system="dual_encoder")
CHUNKS = dict(query_chunk=8, corpus_chunk=16)


def _eval_cfg(**overrides) -> scoring.EvalSpec:
    chunks = {k: overrides.pop(k) for k in ("query_chunk", "corpus_chunk") if k in overrides}
    return scoring.EvalSpec(**{**BASE, **overrides}, index_settings={**CHUNKS, **chunks})


def _retrieval(tmp_path, mesh, main=True, splits=("val", "test"), name=""):
    os.makedirs(tmp_path, exist_ok=True)
    log = MetricsLog(str(tmp_path))
    task = FakeTask(name, {s: TASK for s in splits})
    return evaluators.Retrieval(task, splits, INPUTS, _eval_cfg(), mesh, str(tmp_path), log,
                                main=main), log


def _labels(rows):
    return [scoring.row_label(r) for r in rows]


def test_during_training_only_val_is_evaluated_without_baselines(tmp_path, mesh):
    ev, log = _retrieval(tmp_path, mesh)
    results = ev.run(SYSTEMS, step=5)
    assert list(results) == ["val"]
    assert _labels(results["val"]) == [
        "dual_encoder [exact]", "untrained [exact]", "dual_encoder+bm25 [exact]",
        "dual_encoder+bm25_interp [exact]"]
    assert [(r["step"], r["split"], scoring.row_label(r)) for r in log.read()] == [
        (5, "val", label) for label in _labels(results["val"])]
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]  # no report before the end
    test_only, _ = _retrieval(tmp_path / "t", mesh, splits=("test",))
    assert test_only.run(SYSTEMS, step=5) == {}


def test_the_weight_chosen_on_val_is_carried_to_test(tmp_path, mesh, monkeypatch):
    ev, log = _retrieval(tmp_path, mesh, name="quora")
    real, given = scoring.evaluate_split, {}

    def spy(task, towers, *args, **kwargs):
        given[len(given)] = kwargs["hybrid_weights"]
        assert towers is SYSTEMS  # the encode functions, as given
        return real(task, towers, *args, **kwargs)

    monkeypatch.setattr(scoring, "evaluate_split", spy)
    results = ev.run(SYSTEMS, step=9, final=True,
                     row_fields={"untrained": {"selected_step": 3}})
    assert list(results) == ["val", "test"]
    weight = {s: next(r["hybrid_weight"] for r in rows if "hybrid_weight" in r)
              for s, rows in results.items()}
    assert weight["val"] != 0.55 and weight["test"] == weight["val"]
    assert given == {0: None, 1: {"dual_encoder": weight["val"]}}  # chosen on val, then kept
    assert ev.hybrid_weights == {"dual_encoder": weight["val"]}
    assert "bm25 [exact]" in _labels(results["test"])  # the baselines, in the final one
    assert all(("selected_step" in r) == (r["system"] == "untrained")
               for rows in results.values() for r in rows)
    assert {(r["split"], r["task"]) for r in log.read()} == {("val", "quora"), ("test", "quora")}
    assert {"report_quora.md", "recall_at_k_quora.png"} <= set(os.listdir(tmp_path))
    # Without a val split the configured weight is used.
    no_val, _ = _retrieval(tmp_path / "t", mesh, splits=("test",))
    rows = no_val.run(SYSTEMS, step=9, final=True)["test"]
    assert [r["hybrid_weight"] for r in rows if "hybrid_weight" in r] == [0.55]


def test_only_the_main_process_writes_files(tmp_path, mesh, capsys):
    ev, log = _retrieval(tmp_path, mesh, main=False)
    sweep = evaluators.TypoSweep(ev, probs=(0.0, 0.5), seed=1)
    ev.run(SYSTEMS, step=2, final=True)
    sweep.run(SYSTEMS, step=2, final=True)
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]
    assert capsys.readouterr().out == ""  # the table too is process 0's
    ev.main = sweep.retrieval.main = True
    ev.run(SYSTEMS, step=2, final=True)
    sweep.run(SYSTEMS, step=2, final=True)
    assert {"report.md", "recall_at_k.png", "typo_robustness.png"} <= set(os.listdir(tmp_path))
    assert "test split, step 2" in capsys.readouterr().out


def test_the_typo_sweep_runs_at_the_end_on_the_last_split_with_vals_weight(tmp_path, mesh):
    ev, log = _retrieval(tmp_path, mesh)
    sweep = evaluators.TypoSweep(ev, probs=(0.0, 0.5), seed=1)
    assert sweep.run(SYSTEMS, step=4) == {} and not log.read()
    ev.run(SYSTEMS, step=4)  # val chooses the weight
    results = sweep.run(SYSTEMS, step=4, final=True)
    assert list(results) == ["test"]
    rows = results["test"]
    assert [r["typo_p"] for r in rows] == [0.0] * 5 + [0.5] * 5  # 2 towers, bm25, 2 fusions
    assert {r["hybrid_weight"] for r in rows if "hybrid_weight" in r} == {
        ev.hybrid_weights["dual_encoder"]}
    assert len([r for r in log.read() if r["split"] == "test" and "typo_p" in r]) == 10


def test_make_builds_a_retrieval_evaluator_per_task_and_the_typo_sweep_if_set(
        tmp_path, mesh):
    config = load_config("tiny")
    tasks = [FakeTask("docs", {}), FakeTask("a", {"test": TASK}),
             FakeTask("b", {"val": TASK, "test": TASK})]
    splits = {"docs": (), "a": ("test",), "b": ("val", "test")}
    log = MetricsLog(str(tmp_path))
    config.eval.typo_probs = ""
    built = evaluators.make(specs.eval_spec(config), tasks, splits, INPUTS, mesh,
                            str(tmp_path), log, main=True)
    assert [type(e).__name__ for e in built] == ["Retrieval", "Retrieval"]
    assert [(e.task.name, e.splits) for e in built] == [("a", ("test",)), ("b", ("val", "test"))]
    assert built[0].system == config.model.name
    config.eval.typo_probs = "0, 0.25"
    built = evaluators.make(specs.eval_spec(config), tasks, splits, INPUTS, mesh,
                            str(tmp_path), log, main=True)
    assert [type(e).__name__ for e in built] == ["Retrieval", "Retrieval", "TypoSweep"]
    assert built[2].retrieval is built[0] and built[2].splits == ("test",)
    assert built[2].probs == (0.0, 0.25) and built[2].seed == config.eval.typo_seed
    assert evaluators.make(specs.eval_spec(config), tasks[:1], splits, INPUTS, mesh,
                           str(tmp_path), log, main=True) == []
