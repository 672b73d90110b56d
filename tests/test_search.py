"""The search command: a trained workdir answers typed queries with its saved index."""

import subprocess
import sys

import pytest

from conftest import load_config
from dualjax import search, train


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("trained")
    cfg = load_config("tiny")
    cfg.eval.untrained, cfg.eval.baselines = False, ""
    train.train_and_evaluate(cfg, str(path))
    return path


def test_searcher_reuses_the_saved_index_and_ranks_by_score(workdir):
    searcher = search.Searcher(str(workdir), "test", k=5)
    assert searcher.info["built"] is False  # the final evaluation's index, loaded
    query = searcher.corpus[7]
    results = searcher.search([query, "something else entirely"])
    assert len(results) == 2 and all(len(r) == 5 for r in results)
    scores = [s for s, _ in results[0]]
    assert scores == sorted(scores, reverse=True)
    assert results[0][0] == (pytest.approx(1.0, abs=1e-4), query)  # itself, cosine 1


def test_a_changed_corpus_fingerprint_rebuilds(workdir, monkeypatch):
    from dualjax import index
    real = index.corpus_fingerprint
    monkeypatch.setattr(index, "corpus_fingerprint", lambda c, extra="": real(c, extra + "x"))
    assert search.Searcher(str(workdir), "test", k=5).info["built"] is True


def test_search_command_line(workdir):
    out = subprocess.run(
        [sys.executable, "-m", "dualjax.search", f"--workdir={workdir}", "--k=3",
         "--query=how do i repair my car", "--query=best way to cook rice"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n> ") == 2
    assert "  1. +" in out.stdout and "  3. " in out.stdout
