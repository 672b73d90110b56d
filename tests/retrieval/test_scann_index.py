"""Tests for the ScaNN searcher, make_index and the fingerprint in dualjax.index.

ScaNN is checked against ExactIndex (itself checked against numpy in test_index.py).
"""
import json
import logging
import os
import shutil

import conftest
import ml_collections
import numpy as np
import pytest

from dualjax import errors
from dualjax.retrieval import ann

N, DIM, NQ, K = 3000, 32, 200, 10


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _random(n=N, dim=DIM, seed=0) -> np.ndarray:
    """[n, dim] unit vectors, uniform on the sphere: the hardest case for quantization."""
    return _unit(np.random.default_rng(seed).normal(size=(n, dim)))


def _clustered(n=N, dim=DIM, clusters=100, noise=0.5, seed=0) -> np.ndarray:
    """[n, dim] unit vectors around `clusters` centres, so neighbours are meaningful."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    return _unit(centres[rng.integers(clusters, size=n)] + noise * rng.normal(size=(n, dim)))


def _cfg(mode: str = "auto", **overrides):
    cfg = ann.default_scann_config()
    cfg["mode"] = mode
    cfg.update(overrides)
    return cfg


def _recall(ids: np.ndarray, reference: np.ndarray) -> float:
    """Mean fraction of each reference row's (valid) ids found in the same row of ids."""
    return float(np.mean([len(set(a) & set(b[b >= 0])) / (b >= 0).sum()
                          for a, b in zip(ids, reference, strict=True)]))


def _eval_cfg(**scann):
    cfg = ann.default_scann_config()
    cfg.update(scann)
    return ml_collections.ConfigDict({"query_chunk": 64, "corpus_chunk": 1024,
                                            "scann": cfg})


def _assert_same_ranking(queries, corpus, scores, ids, ref_scores, ref_ids):
    """ids equal ref_ids [nq, k + 1] but for float32 near ties (gap < 1e-5), where either
    order is right; every returned score is that id's dot product."""
    k = ids.shape[1]
    gaps = -np.diff(np.where(ref_ids >= 0, ref_scores, -9.0), axis=1)  # [nq, k]
    tied = np.zeros(ids.shape, bool)
    tied |= gaps[:, :k] < 1e-5  # with the next one
    tied[:, 1:] |= gaps[:, :k - 1] < 1e-5  # with the previous one
    assert tied.mean() < 0.01  # the comparison below is nearly exact
    assert ((ids == ref_ids[:, :k]) | tied).all()
    np.testing.assert_allclose(scores, ref_scores[:, :k], rtol=0, atol=1e-5)
    valid = ids >= 0
    true = np.einsum("qd,qkd->qk", queries.astype(np.float64), corpus[ids].astype(np.float64))
    np.testing.assert_allclose(scores[valid], true[valid], rtol=0, atol=1e-5)
    assert all(len(set(row[row >= 0])) == (row >= 0).sum() for row in ids)


def test_brute_force_matches_exact():
    corpus, queries = _random(), _random(NQ, seed=1)
    ref_scores, ref_ids = ann.ExactIndex(corpus).search(queries, K + 1)
    searcher = ann.ScannIndex.build(corpus, _cfg("brute_force"), K)
    assert searcher.settings["mode"] == "brute_force"
    scores, ids = searcher.search(queries, K)
    assert scores.shape == ids.shape == (NQ, K)
    assert scores.dtype == np.float32 and ids.dtype == np.int32
    _assert_same_ranking(queries, corpus, scores, ids, ref_scores, ref_ids)


def test_brute_force_exclusion_matches_exact():
    """Queries are corpus rows; excluding their own row (or nothing, -1) as ExactIndex does."""
    corpus = _random()
    exclude = np.arange(NQ)
    exclude[::3] = -1
    exclude[1::7] = NQ + 5  # some other row, mid-ranked or absent from the top k
    exact = ann.ExactIndex(corpus)
    searcher = ann.ScannIndex.build(corpus, _cfg("brute_force"), K)
    ref_scores, ref_ids = exact.search(corpus[:NQ], K + 1, exclude)
    scores, ids = searcher.search(corpus[:NQ], K, exclude)
    _assert_same_ranking(corpus[:NQ], corpus, scores, ids, ref_scores, ref_ids)
    assert not (ids == exclude[:, None]).any()
    np.testing.assert_array_equal(ids[::3, 0], np.arange(NQ)[::3])  # unit vectors: self first
    assert (ids >= 0).all() and np.isfinite(scores).all()


@pytest.mark.parametrize("mode,data,dim,overrides", [
    ("ah", "random", DIM, {}),
    ("ah", "random", 33, {}),  # odd dim: ScaNN makes the last AH block 1-dimensional
    ("ah", "clustered", DIM, {"dims_per_block": 4}),
    ("tree_ah", "clustered", DIM, {"num_leaves": 16}),
    ("tree_ah", "clustered", 33, {"num_leaves": 24, "num_leaves_to_search": 6}),
])
def test_approximate_modes_recall_against_exact(mode, data, dim, overrides):
    corpus = (_random if data == "random" else _clustered)(dim=dim)
    exclude = np.arange(NQ)  # self-retrieval, as evaluation does
    _, ref_ids = ann.ExactIndex(corpus).search(corpus[:NQ], K, exclude)
    searcher = ann.ScannIndex.build(corpus, _cfg(mode, **overrides), K)
    assert searcher.settings["mode"] == mode
    scores, ids = searcher.search(corpus[:NQ], K, exclude)
    assert ids.shape == (NQ, K) and ids.dtype == np.int32 and scores.dtype == np.float32
    assert _recall(ids, ref_ids) >= 0.9
    assert not (ids == exclude[:, None]).any()
    assert (ids >= 0).all() and (np.diff(scores, axis=1) <= 1e-6).all()  # best first
    # Reordered scores are exact dot products.
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", corpus[:NQ], corpus[ids]),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", ["brute_force", "ah"])
def test_k_larger_than_corpus_pads(mode):
    corpus, queries = _random(50, 8, seed=2), _random(4, 8, seed=3)
    searcher = ann.ScannIndex.build(corpus, _cfg(mode), 60)
    ref_scores, ref_ids = ann.ExactIndex(corpus).search(queries, 60)
    scores, ids = searcher.search(queries, 60)
    assert ids.shape == (4, 60)
    np.testing.assert_array_equal(np.sort(ids[:, :50], axis=1), np.tile(np.arange(50), (4, 1)))
    np.testing.assert_allclose(scores[:, :50], ref_scores[:, :50], rtol=0, atol=1e-5)
    assert (ids[:, 50:] == -1).all() and np.isneginf(scores[:, 50:]).all()
    # With an exclusion one fewer is real; -1 excludes nothing.
    exclude = np.array([ref_ids[0, 0], -1, 49, 0])
    scores, ids = searcher.search(queries, 60, exclude)
    assert ((ids >= 0).sum(axis=1) == [49, 50, 49, 49]).all()
    for row, ex in zip(ids, exclude, strict=True):
        assert ex not in row[row >= 0] and len(set(row[row >= 0])) == (row >= 0).sum()
    assert (ids[:, 50:] == -1).all() and np.isneginf(scores[:, 50:]).all()


def test_fewer_found_than_asked_pads_instead_of_repeating_id_zero():
    """One leaf of 16 holds ~190 rows < k: ScaNN fills with NaN scores and id 0."""
    corpus = _random()
    searcher = ann.ScannIndex.build(
        corpus, _cfg("tree_ah", num_leaves=16, num_leaves_to_search=1), 500)
    scores, ids = searcher.search(corpus[:5], 500, exclude=np.arange(5))
    found = (ids >= 0).sum(axis=1)
    assert (found > 50).all() and (found < 500).all()
    for row, score, f in zip(ids, scores, found, strict=True):
        assert (row[:f] >= 0).all() and (row[f:] == -1).all()  # real results first
        assert len(set(row[:f])) == f
        assert np.isfinite(score[:f]).all() and np.isneginf(score[f:]).all()


@pytest.mark.parametrize("soar_lambda", [0.0, 1.5])
def test_leaves_to_search_per_call_and_soar_spilling(soar_lambda):
    """A per-call leaves_to_search overrides the built one; with SOAR every point sits in
    two leaves, yet no id comes back twice, and more leaves never lose recall."""
    corpus = _clustered()
    exclude = np.arange(NQ)
    _, ref_ids = ann.ExactIndex(corpus).search(corpus[:NQ], K, exclude)
    searcher = ann.ScannIndex.build(
        corpus, _cfg("tree_ah", num_leaves=32, num_leaves_to_search=2, soar_lambda=soar_lambda),
        K)
    assert searcher.settings["soar_lambda"] == soar_lambda
    recalls = []
    for leaves in (1, None, 8, 32):
        _, ids = searcher.search(corpus[:NQ], K, exclude, leaves_to_search=leaves)
        for row in ids:
            assert len(set(row[row >= 0].tolist())) == (row >= 0).sum()
        assert not (ids == exclude[:, None]).any()
        recalls.append(_recall(ids, ref_ids))
    assert recalls == sorted(recalls) and recalls[-1] >= 0.99  # all leaves: AH + reorder only
    assert recalls[0] < recalls[-1]


def test_k_above_reorder_k_still_returns_k_results():
    """ScaNN silently returns NaN past reorder_k unless asked to rescore at least k."""
    corpus = _clustered()
    searcher = ann.ScannIndex.build(corpus, _cfg("ah", reorder_k=20), K)
    assert searcher.settings["reorder_k"] == 20
    ref_scores, ref_ids = ann.ExactIndex(corpus).search(corpus[:NQ], 51)
    scores, ids = searcher.search(corpus[:NQ], 50)
    assert (ids >= 0).all() and np.isfinite(scores).all()
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", corpus[:NQ], corpus[ids]),
                               rtol=0, atol=1e-5)
    # Rescoring only the 50 asked for costs recall; the default reorder_k (1000) does not.
    low = _recall(ids, ref_ids[:, :50])
    default = ann.ScannIndex.build(corpus, _cfg("ah"), K)
    high = _recall(default.search(corpus[:NQ], 50)[1], ref_ids[:, :50])
    assert 0.7 <= low < high and high >= 0.98


def test_empty_queries():
    searcher = ann.ScannIndex.build(_random(100, 8), _cfg("brute_force"), 5)
    scores, ids = searcher.search(np.zeros((0, 8), np.float32), 5, np.zeros(0, np.int64))
    assert scores.shape == ids.shape == (0, 5)


def test_auto_settings_follow_scann_rules_of_thumb():
    cfg = ann.default_scann_config()
    assert ann.scann_settings(19_999, 64, 100, cfg)["mode"] == "brute_force"
    ah = ann.scann_settings(20_000, 64, 100, cfg)
    assert ah["mode"] == "ah" and ah["dims_per_block"] == 2
    assert ah["anisotropic_threshold"] == 0.2 and ah["reorder_k"] == 1000
    assert ah["training_sample_size"] == 20_000
    tree = ann.scann_settings(1_000_000, 64, 200, cfg)
    assert tree["mode"] == "tree_ah" and tree["num_leaves"] == 1000
    assert tree["num_leaves_to_search"] == 100 and tree["training_sample_size"] == 250_000
    assert tree["soar_lambda"] == 1.5 and tree["overretrieve_factor"] == 2.0
    assert tree["reorder_k"] == 2000
    assert ann.scann_settings(100_000, 64, 10, cfg)["num_leaves"] == 316
    assert ann.scann_settings(300, 8, 100, _cfg("ah"))["reorder_k"] == 300  # at most n
    custom = ann.scann_settings(1_000_000, 64, 10, _cfg(
        "auto", num_leaves=50, num_leaves_to_search=7, training_sample_size=9000, reorder_k=33,
        dims_per_block=4, anisotropic_threshold=0.3, num_threads=3, spherical=False,
        soar_lambda=0.0))
    assert custom == {"mode": "tree_ah", "num_threads": 3, "dims_per_block": 4,
                      "anisotropic_threshold": 0.3, "reorder_k": 33,
                      "training_sample_size": 9000, "num_leaves": 50, "num_leaves_to_search": 7,
                      "spherical": False, "soar_lambda": 0.0}
    assert ann.scann_settings(10, 4, 1, cfg)["num_threads"] >= 1  # 0: all cores


@pytest.mark.parametrize("overrides,message", [
    ({"mode": "hnsw"}, "mode"),
    ({"mode": "tree_ah", "num_leaves": 20, "num_leaves_to_search": 21}, "num_leaves_to_search"),
    ({"mode": "tree_ah", "num_leaves": 200, "training_sample_size": 100}, "num_leaves"),
    ({"mode": "ah", "dims_per_block": 0}, "dims_per_block"),
    ({"mode": "tree_ah", "soar_lambda": -1.0}, "soar_lambda"),
])
def test_bad_settings_raise_naming_the_knob(overrides, message):
    with pytest.raises(ValueError, match=message):
        ann.scann_settings(1000, 8, 10, _cfg(**overrides))


def test_corpus_fingerprint():
    corpus = _random(100, 8)
    base = ann.corpus_fingerprint(corpus)
    assert base == ann.corpus_fingerprint(corpus.copy())
    changed = corpus.copy()
    changed[57, 3] = np.nextafter(changed[57, 3], np.float32(2))  # one ulp in one value
    assert ann.corpus_fingerprint(changed) != base
    assert ann.corpus_fingerprint(corpus, extra="step=100") != base
    assert ann.corpus_fingerprint(corpus.reshape(200, 4)) != base  # same bytes, other shape
    assert ann.corpus_fingerprint(corpus.view(np.int32)) != base  # same bytes, other dtype
    assert ann.corpus_fingerprint(np.asfortranarray(corpus)) == base  # same values


def test_save_load_round_trip(tmp_path, caplog):
    corpus = _clustered()
    searcher = ann.ScannIndex.build(corpus, _cfg("tree_ah", num_leaves=16), K)
    fingerprint = ann.corpus_fingerprint(corpus)
    directory = str(tmp_path / "idx")
    searcher.save(directory, fingerprint)
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    assert meta["fingerprint"] == fingerprint and (meta["n"], meta["dim"]) == (N, DIM)
    assert meta["settings"] == searcher.settings and meta["scann"]
    moved = str(tmp_path / "moved")  # asset paths are relative: the directory can move
    shutil.move(directory, moved)
    loaded = ann.ScannIndex.load(moved, fingerprint, n=N, dim=DIM)
    assert loaded is not None and loaded.settings == searcher.settings
    exclude = np.arange(NQ)
    (got_scores, got_ids), (scores, ids) = (s.search(corpus[:NQ], K, exclude)
                                            for s in (loaded, searcher))
    np.testing.assert_array_equal(got_ids, ids)
    # The reloaded SOAR tree rescores in another summation order: the last bit may differ.
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-6)
    caplog.set_level(logging.WARNING)
    for kwargs, why in [(dict(fingerprint="0" * 64), "fingerprint"),
                        (dict(fingerprint=fingerprint, n=N - 1), "corpus size"),
                        (dict(fingerprint=fingerprint, dim=DIM + 1), "dim")]:
        caplog.clear()
        assert ann.ScannIndex.load(moved, **kwargs) is None
        assert why in caplog.text
    caplog.clear()
    assert ann.ScannIndex.load(str(tmp_path / "nothing"), fingerprint) is None
    assert "nothing saved" in caplog.text
    for key, value, why in [("scann", "0.0.1", "scann version"), ("n", N + 1, "holds")]:
        caplog.clear()
        with open(os.path.join(moved, "meta.json"), "w") as f:
            json.dump({**meta, key: value}, f)
        assert ann.ScannIndex.load(moved, fingerprint) is None
        assert why in caplog.text
    os.remove(os.path.join(moved, "meta.json"))  # e.g. a save killed before its end
    assert ann.ScannIndex.load(moved, fingerprint) is None
    # Saving over a saved index replaces it; over anything else it refuses.
    searcher.save(moved, fingerprint)
    assert ann.ScannIndex.load(moved, fingerprint) is not None
    other = tmp_path / "workdir"
    other.mkdir()
    (other / "checkpoint").write_text("keep me")
    with pytest.raises(ValueError, match="not a ScaNN index"):
        searcher.save(str(other), fingerprint)
    assert (other / "checkpoint").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    searcher.save(str(tmp_path / "empty"), fingerprint)  # an empty (or absent) one is fine
    assert ann.ScannIndex.load(str(tmp_path / "empty"), fingerprint) is not None
    assert sorted(os.listdir(tmp_path)) == ["empty", "moved", "workdir"]  # no temporary left


def test_make_index_loads_when_unchanged_and_rebuilds_otherwise(tmp_path):
    corpus = _random()
    directory = str(tmp_path / "idx")
    eval_cfg = _eval_cfg(mode="ah")
    first, info = ann.make_index("scann", corpus, eval_cfg, K, directory)
    assert info["built"] and info["build_seconds"] > 0 and info["bytes_on_disk"] > 0
    assert info["settings"]["mode"] == "ah" and info["settings"]["reorder_k"] == 1000
    second, info = ann.make_index("scann", corpus, eval_cfg, K, directory)
    assert not info["built"] and info["bytes_on_disk"] > 0
    for got, want in zip(second.search(corpus[:NQ], K), first.search(corpus[:NQ], K), strict=True):
        np.testing.assert_array_equal(got, want)
    # Another model or corpus (one value), another checkpoint, other settings: rebuild.
    changed = corpus.copy()
    changed[0, 0] += 1e-3
    cases = [((changed, eval_cfg), {}), ((corpus, eval_cfg), {"extra": "step=5"}),
             ((corpus, _eval_cfg(mode="ah", reorder_k=64)), {}),
             ((corpus[:-1], eval_cfg), {}), ((corpus[:, :-1], eval_cfg), {})]
    for i, (args, kwargs) in enumerate(cases):
        copy = shutil.copytree(directory, str(tmp_path / f"copy{i}"))  # the first index
        _, info = ann.make_index("scann", *args, K, copy, **kwargs)
        assert info["built"], i
        assert ann.make_index("scann", *args, K, copy, **kwargs)[1]["built"] is False
    # The thread count is a search-time knob: changing it reuses the saved index.
    _, info = ann.make_index("scann", corpus, _eval_cfg(mode="ah", num_threads=1),
                               K, directory)
    assert not info["built"] and info["settings"]["num_threads"] == 1


def test_make_index_without_directory_and_exact():
    corpus = _random(500, 8)
    searcher, info = ann.make_index("scann", corpus, _eval_cfg(), K)
    assert isinstance(searcher, ann.ScannIndex) and info["built"]
    assert info["bytes_on_disk"] == 0 and info["settings"]["mode"] == "brute_force"
    exact, info = ann.make_index("exact", corpus, _eval_cfg(), K)
    assert isinstance(exact, ann.ExactIndex) and info["built"] and info["bytes_on_disk"] == 0
    assert info["settings"] == {"query_chunk": 64, "corpus_chunk": 1024}
    exclude = np.arange(20) - 1
    for got, want in zip(exact.search(corpus[:20], K, exclude),
                         ann.exact_search(corpus[:20], corpus, K, exclude), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(searcher.search(corpus[:20], K, exclude)[1],
                                  exact.search(corpus[:20], K, exclude)[1])
    with pytest.raises(ValueError, match="faiss"):
        ann.make_index("faiss", corpus, _eval_cfg(), K)


# --- an install without ScaNN (issue 32): its wheels are for Linux only ----------------
def test_scann_is_a_dependency_on_linux_only():
    import tomllib

    from packaging.requirements import Requirement
    pyproject = conftest.REPO / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    (scann,) = [Requirement(r) for r in project["dependencies"] if r.startswith("scann")]
    assert scann.marker.evaluate({"sys_platform": "linux"})
    for platform in ("darwin", "win32"):
        assert not scann.marker.evaluate({"sys_platform": platform})
    assert project["optional-dependencies"]["scann"] == ["scann>=1.4.2"]


def test_without_scann_each_way_in_says_what_to_install_and_exact_search_works(
        monkeypatch, tmp_path):
    import importlib.util
    import sys

    from conftest import load_config

    from dualjax import index
    from dualjax.config import validation
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scann" else find_spec(name, *a))
    for name in [m for m in sys.modules if m == "scann" or m.startswith("scann.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "scann", None)  # `import scann` raises ImportError
    cfg = load_config("tiny")
    cfg.eval.index = "scann"
    with pytest.raises(errors.ConfigError, match=r"config.eval.index='scann': ScaNN is "
                                                     r"not installed .* pip install "
                                                     r"'dualjax\[scann\]' on Linux"):
        validation.validate(cfg, 8)
    cfg.eval.index = "exact"
    validation.validate(cfg, 8)
    corpus = _unit(np.random.default_rng(0).normal(size=(50, 8)))
    with pytest.raises(ImportError, match="ScaNN is not installed"):
        ann.make_index("scann", corpus, _eval_cfg(), K, str(tmp_path / "idx"))
    with pytest.raises(ImportError, match="ScaNN is not installed"):
        index.check_build("scann", 16)
    searcher, _ = ann.make_index("exact", corpus, _eval_cfg(), K)
    assert searcher.search(corpus[:2], 1)[1][:, 0].tolist() == [0, 1]
