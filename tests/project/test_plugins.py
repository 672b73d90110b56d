"""Extending dualjax from outside the package: a plugin registered from this file alone
(no edit under dualjax/) is named by the config, validated, trained and evaluated.

A loss (`dualjax.losses.registry`), a tower (`dualjax.models.towers`), a searcher
(`dualjax.retrieval.searchers`), a data source (`dualjax.data.sources`), an evaluator
(`dualjax.eval.evaluators`) and a job of the retrieval evaluation
(`dualjax.eval.scoring.TOWER_JOBS`). docs/design.md shows the same examples."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, losses
from dualjax.data import clusters, sources
from dualjax.eval import evaluators, scoring
from dualjax.losses import matrix, streaming
from dualjax.losses.registry import LOSSES, Loss, register
from dualjax.models import towers
from dualjax.retrieval import ann, encoding, saved, searchers
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime import sharding


# ----------------------------------------------------------------------------- a toy loss
def _reference(q, d, scale, bias, extras=None, *, temperature=0.05,
               remove_accidental_hits=True):
    """The in-batch softmax at a fixed temperature (the model's scale and bias unused)."""
    extras = extras or {}
    dots, _, is_pos, neg, _ = matrix.full(q, d, extras, remove_accidental_hits)
    z = matrix.masked(dots / temperature, is_pos | neg, -jnp.inf)
    loss = -jnp.mean(jnp.diagonal(jax.nn.log_softmax(z, axis=1)))
    return loss, {"in_batch_p@1": jnp.mean(matrix.p_at_1(dots, is_pos, neg))}


def _stats(blk, pos, scale, bias, opts):
    z = blk.dots / opts["temperature"]
    return {"lse": streaming.lse(streaming.softmax_logits(z, blk)),
            "best": streaming.max_neg(jax.lax.stop_gradient(blk.dots), blk)}


def _finish(st, pos, scale, bias, opts, labels):
    z = pos.dots / opts["temperature"]
    return streaming.row_sums(st["lse"].value - z, pos.dots, st["best"].value)


def _resolve(opts):
    if opts["temperature"] <= 0:
        raise ValueError(f"temperature={opts['temperature']} must be > 0")
    return opts


TOY = Loss("toy_fixed_temperature", _reference, _stats, _finish,
           options={"temperature": 0.05, "remove_accidental_hits": True}, resolve=_resolve)


@pytest.fixture
def toy_loss():
    register(TOY)
    yield TOY
    del LOSSES[TOY.name]


# ----------------------------------------------------------------------------- a toy tower
class MaxPoolTower(nn.Module):
    """Each text: the elementwise max of its tokens' embeddings, then a dense layer."""
    vocab_size: int
    width: int
    output_dim: int
    embed: nn.Module | None = None

    @nn.compact
    def __call__(self, ids, mask, extra=None):
        table = self.embed or nn.Embed(self.vocab_size, self.width, name="embed")
        x = jnp.where(mask[..., None], table(ids), -1e9).max(axis=1)
        if extra is not None:
            x = jnp.concatenate([x, extra], axis=-1)
        return nn.Dense(self.output_dim, name="out")(x)


def make_max_pool(vocab_size, name, embed=None, *, output_dim, width=64):
    # output_dim: model.output_dim (a model-wide setting it names); width: model.max_pool's
    return MaxPoolTower(vocab_size, width, output_dim, embed, name=name)


@pytest.fixture
def toy_tower():
    towers.register("max_pool", make_max_pool)
    yield make_max_pool
    del towers.TOWERS["max_pool"]


# ----------------------------------------------------------------------------- a toy searcher
class NumpySearcher:
    """Brute force in numpy, saved as corpus.npy beside meta.json."""
    FILE = "corpus.npy"

    def __init__(self, corpus: np.ndarray):
        self.corpus, self.settings = corpus, {"threads": 1}

    @classmethod
    def build(cls, corpus, eval_settings, k):
        return cls(np.asarray(corpus, np.float32))

    def search(self, queries, k, exclude=None):
        scores = np.asarray(queries, np.float32) @ self.corpus.T
        if exclude is not None:
            rows = np.flatnonzero(np.asarray(exclude) >= 0)
            scores[rows, np.asarray(exclude)[rows]] = -np.inf
        ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(scores, ids, 1)
        return saved.pad(top, np.where(np.isinf(top), -1, ids), k)

    def save(self, directory, fingerprint):
        n, dim = self.corpus.shape
        saved.save_index(directory, "numpy", lambda tmp: np.save(
            os.path.join(tmp, self.FILE), self.corpus),
            {"fingerprint": fingerprint, "n": n, "dim": dim, "settings": self.settings})

    @classmethod
    def load(cls, directory, fingerprint, n, dim):
        meta = saved.saved_meta(directory, "numpy", {"fingerprint": fingerprint, "n": n,
                                                     "dim": dim})
        return None if meta is None else cls(np.load(os.path.join(directory, cls.FILE)))

    def tune(self, settings):
        self.settings.update(settings)


NUMPY = searchers.Kind("toy_numpy", NumpySearcher.build, load=NumpySearcher.load,
                       settings=lambda n, dim, k, cfg: {"threads": 1},
                       search_time=("threads",))


@pytest.fixture
def toy_searcher():
    searchers.register(NUMPY)
    yield NUMPY
    del searchers.SEARCHERS[NUMPY.name]


def test_a_registered_searcher_is_built_saved_and_loaded(toy_searcher, tmp_path):
    rng = np.random.default_rng(1)
    corpus = rng.normal(size=(50, 8)).astype(np.float32)
    queries = corpus[:5] + 0.01
    exclude = np.array([0, -1, 2, -1, -1])
    settings = {"query_chunk": 4, "corpus_chunk": 16}
    first, info = ann.make_index(NUMPY.name, corpus, settings, 10, str(tmp_path / "idx"))
    assert info["built"] and info["bytes_on_disk"] > 50 * 8 * 4
    assert sorted(os.listdir(tmp_path / "idx")) == ["corpus.npy", "meta.json"]
    again, info = ann.make_index(NUMPY.name, corpus, settings, 10, str(tmp_path / "idx"))
    assert not info["built"] and isinstance(again, NumpySearcher)
    exact, _ = ann.make_index("exact", corpus, settings, 10)
    for got in (first.search(queries, 10, exclude), again.search(queries, 10, exclude)):
        want = exact.search(queries, 10, exclude)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    _, info = ann.make_index(NUMPY.name, corpus[:40], settings, 10, str(tmp_path / "idx"))
    assert info["built"]  # another corpus: another fingerprint


# ----------------------------------------------------------------------------- a toy source
WORDS = ("red green blue black white pink gold grey tan navy plum teal mint rose lime sand "
         "jade ruby onyx opal").split()


def _items(rng, n):
    """n "documents" of 4 distinct colour words; each one's query is the same words, each
    spelled backwards ("red" -> "der"): nothing in common until the towers learn it."""
    docs = [" ".join(rng.choice(WORDS, 4, replace=False)) for _ in range(n)]
    return [(" ".join(w[::-1] for w in d.split()), d) for d in docs]


def _task(pairs):
    queries, corpus = [q for q, _ in pairs], [d for _, d in pairs]
    return RetrievalTask(corpus=corpus, queries=queries,
                         relevant=[frozenset({i}) for i in range(len(pairs))],
                         query_corpus_index=np.full(len(pairs), -1, np.int64))


def _toy_load(settings):
    rng = np.random.default_rng(settings["seed"])
    train, val, test = (_items(rng, n) for n in (settings["train"], 40, 60))
    return clusters.RawData(train, {"val": _task(val), "test": _task(test)})


def _toy_settings(data, seed):
    if data.get("toy_size", 600) < 10:
        raise errors.DataError(f"data.toy_size={data['toy_size']}: give at least 10")
    return {"seed": seed, "train": data.get("toy_size", 600)}


COLOURS = sources.Source("toy_colours", _toy_load, _toy_settings, reads_path=False)


@pytest.fixture
def toy_source():
    sources.register(COLOURS)
    yield COLOURS
    del sources.SOURCES[COLOURS.name]


# ----------------------------------------------------------------------------- a toy evaluator
class ByLength:
    """MRR@10 of the queries up to `words` words long and of the longer ones, per system,
    on the final evaluation only; its rows are written, not returned."""
    results = False

    def __init__(self, context, task, splits, options):
        self.context, self.task, self.splits = context, task, splits
        self.words = int(options.get("words", 4))

    def run(self, systems, step, final=False, splits=None, row_fields=None):
        if not final:
            return {}
        c, out = self.context, {}
        for split in splits or self.splits:
            data = self.task.eval_task(split)
            short = np.array([len(q.split()) <= self.words for q in data.queries])
            rows = []
            for name, (encode_queries, encode_documents) in systems.items():
                docs = encoding.encode_texts(encode_documents, data.corpus, c.inputs.document,
                                             c.spec.batch_size, c.mesh)
                queries = encoding.encode_texts(encode_queries, data.queries, c.inputs.query,
                                                c.spec.batch_size, c.mesh)
                _, ids = ann.exact_search(queries, docs, 10)
                rr = np.array([next((1 / (r + 1) for r, j in enumerate(row) if j in rel), 0.0)
                               for row, rel in zip(ids, data.relevant, strict=True)])
                mean = lambda x: float(x.mean()) if len(x) else 0.0
                row = {"system": name, "index": "by_length", "mrr@10_short": mean(rr[short]),
                       "mrr@10_long": mean(rr[~short]), "short_queries": int(short.sum())}
                c.log.write(step, split, row, **self.task.fields())
                rows.append(row)
            out[split] = rows
        return out


@pytest.fixture
def toy_evaluator():
    evaluators.register("by_length", ByLength)
    yield ByLength
    del evaluators.EVALUATORS["by_length"]


# ----------------------------------------------------------------------------- a toy evaluation job
def _centered(split, system, corpus, queries):
    """A tower job: `system` searched with its documents' mean taken out of both sides."""
    mean = corpus.mean(0, keepdims=True)
    found, _ = split.search("exact", corpus - mean, queries - mean)
    split.add(f"{system}-centered", "exact", found)


@pytest.fixture
def toy_job():
    scoring.TOWER_JOBS.add("centered", _centered)
    yield _centered
    del scoring.TOWER_JOBS["centered"]


def test_a_registered_loss_is_the_same_sharded_streamed_and_by_hand(toy_loss):
    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    q, d = (jnp.asarray(unit(rng.normal(size=(32, 8))), jnp.float32) for _ in range(2))
    ids = {"doc_ids": jnp.asarray(np.arange(32) % 30)}  # two accidental hits
    ref, ref_m = losses.reference(TOY.name, temperature=0.1)(q, d, 5.0, -1.0, ids)
    mesh = sharding.make_mesh()
    put = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))
    for block in (0, 12):  # all columns at once; 12 at a time, the last block padded
        fn = losses.sharded(TOY.name, mesh, block, temperature=0.1)
        got, got_m = jax.jit(fn)(put(q), put(d), 5.0, -1.0, {"doc_ids": put(ids["doc_ids"])})
        np.testing.assert_allclose(got, ref, rtol=1e-5)
        np.testing.assert_allclose(got_m["in_batch_p@1"], ref_m["in_batch_p@1"])
    # By hand: the in-batch softmax of logits = cos / 0.1 (scale 10, bias 0).
    same, _ = losses.reference("in_batch_softmax")(q, d, 10.0, 0.0, ids)
    np.testing.assert_allclose(ref, same, rtol=1e-5)
    with pytest.raises(ValueError, match="a loss named 'toy_fixed_temperature' is registered"):
        register(Loss(TOY.name, _reference, _stats, _finish))


@pytest.mark.slow
def test_registered_plugins_of_every_kind_train_and_evaluate_from_the_config(
        toy_loss, toy_tower, toy_searcher, toy_source, toy_evaluator, toy_job, tmp_path):
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.eval.baselines = ""
    cfg.eval.index = NUMPY.name
    cfg.loss.name = TOY.name
    cfg.data.name = COLOURS.name
    cfg.model.tower = "max_pool"
    cfg.model.max_pool = {"width": 48}  # its options, a group named after it
    cfg.eval.evaluators = "by_length"
    cfg.eval.by_length = {"words": 3}  # its options, a group named after it
    cfg.loss.temperature = -1.0  # the plugin's own option, read from config.loss
    with pytest.raises(errors.ConfigError, match=r"config\.loss\.temperature=-1.0 must be > 0"):
        train.train_and_evaluate(cfg, str(tmp_path / "bad"))
    cfg.loss.temperature = 0.05
    results = train.train_and_evaluate(cfg, str(tmp_path / "run"))
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "run", "metrics.jsonl"))]
    losses_logged = [r["loss"] for r in rows if r["split"] == "train"]
    assert len(losses_logged) >= 2 and losses_logged[-1] < losses_logged[0]
    trained, untrained = (results[f"{s} [exact]"]["map@100"] for s in ("dual_encoder",
                                                                         "untrained"))
    assert trained > untrained + 0.05, (trained, untrained)  # 0.15 against 0.07
    assert results["dual_encoder [exact]"]["num_queries"] == 60  # the source's test split
    # The job's row comes after each tower's own rows, before the next tower's.
    assert list(results) == ["dual_encoder [exact]", f"dual_encoder [{NUMPY.name}]",
                             "dual_encoder-centered [exact]", "untrained [exact]",
                             "untrained-centered [exact]"]
    assert 0 < results["dual_encoder-centered [exact]"]["map@100"] <= 1
    by_length = [r for r in rows if r.get("index") == "by_length"]
    assert {(r["split"], r["system"]) for r in by_length} == {
        (split, s) for split in ("val", "test") for s in ("dual_encoder", "untrained")}
    # Every query has 4 words: none is short at the option's 3 (at the default 4, all are).
    assert all(r["short_queries"] == 0 and r["mrr@10_long"] > 0 for r in by_length)
    import orbax.checkpoint as ocp
    step = max(int(n) for n in os.listdir(tmp_path / "run" / "checkpoints"))
    params = ocp.PyTreeCheckpointer().restore(
        str(tmp_path / "run" / "checkpoints" / str(step) / "state"))["params"]
    tables = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
              if "embedding" in jax.tree_util.keystr(path)]
    assert tables and all(t.shape[1] == 48 for t in tables)  # the option, model.max_pool
    tables = os.listdir(tmp_path / "run" / "tfds")
    assert COLOURS.name in tables, tables  # (the tables under its own name)
    searched = results[f"dual_encoder [{NUMPY.name}]"]  # the same ranking, by the plugin
    assert searched["ann_recall@10"] == 1.0
    assert searched["map@100"] == pytest.approx(trained, abs=1e-6)
    assert os.path.isfile(tmp_path / "run" / "index" / "test" / "corpus.npy")
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["loss"]["name"] == TOY.name and saved["loss"]["temperature"] == 0.05


@pytest.mark.parametrize("key, name, message", [
    ("loss.name", TOY.name,
     "config.loss.name='toy_fixed_temperature' is not one of: in_batch_softmax"),
    ("eval.index", NUMPY.name, "config.eval.index='toy_numpy' is not one of: exact, scann, hnsw"),
    ("data.name", COLOURS.name,
     "config.data.name='toy_colours' is not one of: synthetic_paraphrase, pairs, quora"),
    ("model.tower", "max_pool",
     "config.model.tower='max_pool' is not one of: bow, bow_mlp, cnn, transformer, bert"),
    ("eval.evaluators", "by_length", "config.eval.evaluators='by_length' is not one of"),
])
def test_an_unregistered_plugin_is_refused_by_name(key, name, message):
    from dualjax.config import validation
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({key: name})
    with pytest.raises(errors.ConfigError, match=message):
        validation.validate(cfg, 8)


def test_a_registered_source_checks_its_settings_by_key(toy_source, tmp_path):
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.data.name = COLOURS.name
    cfg.data.toy_size = 3
    with pytest.raises(errors.DataError, match=r"data.toy_size=3: give at least 10"):
        train.train_and_evaluate(cfg, str(tmp_path))


def test_a_tower_factory_gets_the_model_settings_it_names_and_its_group_by_key(toy_tower):
    from dualjax.config import specs, validation
    cfg = load_config("tiny")
    cfg.model.tower = "max_pool"
    cfg.model.output_dim = 24
    cfg.model.max_pool = {"width": 48}
    tower = towers.build("max_pool", specs.model_spec(cfg.model), 100, "tower")
    assert (tower.width, tower.output_dim) == (48, 24)  # its group's, the model's
    cfg.model.max_pool = {"width": 48, "depth": 2}
    with pytest.raises(errors.ConfigError, match=r"config\.model\.max_pool\.depth: the "
                       r"max_pool tower takes no such setting \(it takes: output_dim, width\)"):
        validation.validate(cfg, 8)


def test_what_a_tower_declares_is_what_the_config_checks_allow(monkeypatch):
    from dualjax.config import validation
    monkeypatch.setitem(towers.TOWERS, "max_pool", towers.Tower(make_max_pool, remat=True,
                                                                features=False))
    cfg = load_config("tiny")
    cfg.model.tower = "max_pool"
    cfg.model.remat = True
    validation.validate(cfg, 8)  # it has layers to recompute
    cfg.model.query_features = cfg.model.doc_features = "colour:4"
    with pytest.raises(errors.ConfigError, match=r"the max_pool tower has no layer above its "
                       "pooled vector .* bow_mlp, cnn or transformer"):
        validation.validate(cfg, 8)
    cfg.model.tower, cfg.model.query_features, cfg.model.doc_features = "bow_mlp", "", ""
    with pytest.raises(errors.ConfigError, match=r"config\.model\.remat: the bow_mlp tower has "
                       "no layers it recomputes \\(the decoder and modernbert and max_pool"):
        validation.validate(cfg, 8)


def test_dualjax_own_towers_take_their_settings_as_keyword_arguments():
    """Every built-in factory is (vocab_size, name, embed, **its settings), each setting a
    model-wide one (`towers.model_settings`): none reads a ModelSpec or a config."""
    from dualjax.models.spec import ModelSpec
    wide = towers.model_settings(ModelSpec())
    for kind in towers.BUILT_IN:
        named, anything = towers.takes(kind)
        assert named and not anything and set(named) <= set(wide), (kind, named)
