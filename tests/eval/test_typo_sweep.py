"""Typo robustness (issue 5; Moscicki 2022, section 4.4): `scoring.typo_sweep`, its plot,
the `eval.typo_probs` config check and the sweep at the end of a tiny training run."""

import json

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors
from dualjax.config import specs
from dualjax.config import validation as config_lib
from dualjax.data.clusters import task_from_clusters
from dualjax.eval import report, scoring
from dualjax.runtime import sharding
from dualjax.text import typos
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import build_word_tokenizer
from dualjax.train import loop as train

# A small hand-made task: each pair of paraphrases shares two rare words and differs in a
# common one; the singletons are distractors sharing one rare word with a pair. Clean,
# every query's best lexical match is its partner; typos in the rare words break that.
PAIRS = [
    ("cheap flights paris", "cheap flights today"),
    ("bake sourdough bread", "sourdough bread recipe"),
    ("learn python programming", "python programming course"),
    ("repair bicycle chain", "bicycle chain broken"),
    ("train puppy fast", "puppy training fast"),
    ("grow tomato plants", "tomato plants garden"),
    ("winter jacket sale", "winter jacket cheap"),
    ("guitar chords beginner", "beginner guitar chords"),
    ("mortgage interest rates", "interest rates today"),
    ("marathon running shoes", "running shoes review"),
    ("chess opening theory", "chess opening best"),
    ("pizza dough recipe", "homemade pizza dough"),
]
DISTRACTORS = ["cheap hotels rome", "bread flour types", "python snake facts",
               "bicycle helmet size", "tomato soup recipe", "guitar amplifier review",
               "running injury knee", "chess world champion", "pizza oven outdoor"]
TEXTS = [t for pair in PAIRS for t in pair] + DISTRACTORS
TASK = task_from_clusters(TEXTS, [i // 2 for i in range(2 * len(PAIRS))]
                          + list(range(len(PAIRS), len(PAIRS) + len(DISTRACTORS))))
TOKENIZER = build_word_tokenizer(TEXTS, vocab_size=1000, num_oov_buckets=64)
MAX_LEN = 8
INPUTS = Inputs(Side(TOKENIZER, MAX_LEN), Side(TOKENIZER, MAX_LEN))


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh()


def _bag_of_words_encoder(dim: int = 32, seed: int = 0):
    """A jitted encoder: unit-norm sum of fixed random word vectors (typo'd words fall
    into hashed OOV buckets, so they stop matching their clean corpus word)."""
    table = jax.random.normal(jax.random.PRNGKey(seed), (TOKENIZER.vocab_size, dim))

    @jax.jit
    def encode(x):
        v = (table[x["ids"]] * x["mask"][..., None]).sum(1)
        return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-6)

    return encode


ENCODE = _bag_of_words_encoder()
TOWERS = {"bow_random": (ENCODE, ENCODE)}


BASE = dict(index="exact", top_k=100, batch_size=16)
CHUNKS = dict(query_chunk=8, corpus_chunk=16)


def _eval_cfg(**overrides) -> scoring.EvalSpec:
    chunks = {k: overrides.pop(k) for k in ("query_chunk", "corpus_chunk") if k in overrides}
    return scoring.EvalSpec(**{**BASE, **overrides}, index_settings={**CHUNKS, **chunks})


def _metrics(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("system", "index", "typo_p", "step", "split")}


def test_sweep_at_p0_equals_the_plain_evaluation(mesh):
    assert len(TASK.queries) == 24 and len(TASK.corpus) == 33
    # eval.index = "scann" is ignored: the sweep searches exactly.
    cfg = _eval_cfg(index="scann")
    plain, _ = scoring.evaluate_split(TASK, TOWERS, INPUTS, _eval_cfg(), mesh,
                                       baselines=("identity", "bm25"))
    rows = scoring.typo_sweep(TASK, TOWERS, INPUTS, cfg, mesh, probs=(0.0,),
                               seed=7, baselines=("identity", "bm25"))
    assert [(r["system"], r["index"], r["typo_p"]) for r in rows] == [
        ("bow_random", "exact", 0.0), ("identity", "exact", 0.0), ("bm25", "exact", 0.0)]
    assert [list(r)[:3] for r in rows] == [["system", "index", "typo_p"]] * 3
    assert [_metrics(r) for r in rows] == [_metrics(r) for r in plain]
    # Clean, every query's partner is its best lexical match.
    assert rows[1]["recall@1"] == 1.0 and rows[1]["num_queries"] == 24


def test_sweep_changes_only_the_queries(mesh, monkeypatch):
    seen = []
    real = scoring.evaluate_split

    def spy(task, *args, **kwargs):
        seen.append(task)
        assert kwargs["ann_systems"] == ()  # never ScaNN
        return real(task, *args, **kwargs)

    monkeypatch.setattr(scoring, "evaluate_split", spy)
    probs = (0.0, 0.5, 1.0)
    rows = scoring.typo_sweep(TASK, {}, INPUTS, _eval_cfg(), mesh, probs, seed=3,
                               baselines=("identity",))
    assert [r["typo_p"] for r in rows] == list(probs)
    assert len(seen) == 3
    for task, p in zip(seen, probs, strict=True):
        assert task.corpus == TASK.corpus and task.relevant == TASK.relevant
        np.testing.assert_array_equal(task.query_corpus_index, TASK.query_corpus_index)
        assert task.queries == typos.typo_texts(TASK.queries, p, 3)
    # Words keep their count and order; count the changed ones (72 in all).
    changed = [sum(a != b for q, clean in zip(t.queries, TASK.queries, strict=True)
                   for a, b in zip(q.split(), clean.split(), strict=False)) for t in seen]
    # p = 0: none; p = 0.5: about half; p = 1: all but equal-letter transpositions (e.g.
    # the "ee" of "cheap" swapped).
    assert changed[0] == 0 and 20 < changed[1] < 52 and changed[2] >= 66, changed
    # Same seed, same rows; another seed, other typos.
    assert scoring.typo_sweep(TASK, {}, INPUTS, _eval_cfg(), mesh, probs, seed=3,
                               baselines=("identity",)) == rows
    assert typos.typo_texts(TASK.queries, 0.5, 4) != seen[1].queries


def test_metrics_drop_as_typos_grow(mesh):
    """Averaged over seeds, every system's map@100 and recall@10 fall with p."""
    probs = (0.0, 0.25, 0.5, 0.75, 1.0)
    systems = ("bow_random", "identity", "bm25")
    totals = {(s, key): np.zeros(len(probs)) for s in systems for key in ("map@100", "recall@10")}
    seeds = range(4)
    for seed in seeds:
        rows = scoring.typo_sweep(TASK, TOWERS, INPUTS, _eval_cfg(), mesh, probs,
                                   seed, baselines=("identity", "bm25"))
        assert len(rows) == len(probs) * len(systems)
        for row in rows:
            for key in ("map@100", "recall@10"):
                totals[row["system"], key][probs.index(row["typo_p"])] += row[key] / len(seeds)
    for (system, key), curve in totals.items():
        assert np.all(np.diff(curve) < 0), (system, key, curve)
        assert curve[0] > 0.9 and curve[-1] < 0.6 * curve[0], (system, key, curve)


def test_plot_typo_robustness_writes_a_two_panel_png(tmp_path):
    rows = [{"system": s, "index": "exact", "typo_p": p, "recall@10": r10, "recall@100": r100}
            for s, drop in (("dual_encoder", 0.2), ("bm25", 0.6))
            for p, r10, r100 in ((0.5, 0.8 - drop / 2, 0.9), (0.0, 0.8, 1.0),
                                 (1.0, 0.8 - drop, 0.7))]
    path = tmp_path / "typo_robustness.png"
    report.plot_typo_robustness(str(path), rows, title="test split")
    image = matplotlib.image.imread(str(path))
    assert image.shape[:2] == (480, 1200)  # two 5 x 4 inch panels at 120 dpi
    assert image[..., :3].std() > 0.05  # not blank


@pytest.mark.parametrize("value", ["0,abc", "1.5", "0,-0.25", "nan"])
def test_config_rejects_bad_typo_probs(value):
    cfg = load_config("tiny")
    cfg.eval.typo_probs = value
    with pytest.raises(errors.ConfigError, match="config.eval.typo_probs="):
        config_lib.validate(cfg, 8)


def test_config_parses_typo_probs():
    cfg = load_config("tiny")
    assert cfg.eval.typo_probs == "" and specs.typo_probs(cfg) == ()
    cfg.eval.typo_probs = "0, 0.25,0.5 ,0.75"
    config_lib.validate(cfg, 8)
    assert specs.typo_probs(cfg) == (0.0, 0.25, 0.5, 0.75)


@pytest.mark.slow
def test_training_run_writes_typo_rows_and_plot(tmp_path):
    cfg = load_config("tiny")
    cfg.num_train_steps = 4
    cfg.mesh.num_devices = 2  # still sharded; faster than 8
    cfg.eval.baselines, cfg.eval.untrained, cfg.eval.index = "identity", False, "exact"
    cfg.eval.typo_probs = "0,0.5"
    results = train.train_and_evaluate(cfg, str(tmp_path))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    typo_rows = [r for r in rows if "typo_p" in r]
    assert [(r["split"], r["step"], r["system"], r["typo_p"]) for r in typo_rows] == [
        ("test", 4, s, p) for p in (0.0, 0.5) for s in ("dual_encoder", "identity")]
    # p = 0 repeats the plain test evaluation; p = 0.5 costs the lexical baseline recall.
    for r in typo_rows[:2]:
        assert _metrics(r) == pytest.approx(_metrics(results[f"{r['system']} [exact]"]))
    assert typo_rows[3]["recall@10"] < typo_rows[1]["recall@10"]
    assert (tmp_path / "typo_robustness.png").stat().st_size > 10_000
