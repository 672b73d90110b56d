"""scripts/bench/bench_accelerator.py at toy size, so that it never rots: it writes its
random-weight BERT folder and data, trains as a user does, exports, indexes, and prints
its table and JSON with the figures it names."""

import importlib.util
import json
import os
import sys

import conftest
import pytest

ROOT = str(conftest.REPO)


@pytest.mark.slow
def test_the_accelerator_bench_runs_at_toy_size(tmp_path):
    bench = _bench()
    out = tmp_path / "bench"
    results = bench.main(["--toy", f"--out={out}", "--parts=data,train,encode",
                          f"--json={tmp_path / 'r.json'}"])
    assert json.loads((tmp_path / "r.json").read_text())["batch"] == 32
    data = results["data"]
    assert data["pairs"] == 1600 and data["pairs_per_s"] > 0 and data["tokenized_s"] > 0
    [run] = results["train"]
    assert run["exit"] == 0, run.get("error")
    assert run["pairs_per_s"] > 0 and 0 < run["data_ready_s"] < run["first_step_s"]
    assert run["gflop_per_pair"] == round(bench.flops_per_pair("toy") / 1e9, 2)
    encode = results["encode"]
    assert encode["exit"] == 0 and encode["docs"] == 400 and encode["docs_per_s"] > 0
    assert set(encode["profile"]) >= {"prepare", "dispatch", "wait_host", "wait_device"}
    assert os.path.isfile(out / "toy" / "modules.json")  # sentence-transformers reads it
    table = bench.table(results)
    assert "| train toy, batch 32 (pairs/s) |" in table and "encode 400 documents" in table
    assert "| data, 1600 pairs: read + eval tables" in table


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_accelerator", os.path.join(ROOT, "scripts", "bench", "bench_accelerator.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_static_row_sets_dualjax_beside_sentence_transformers_static_embedding(tmp_path):
    bench = _bench()
    results = {"device": {"kind": "cpu", "devices": 1, "platform": "cpu", "jax": "x"},
               "machine": "vm", "static": {
                   "docs_per_s": 6000.0, "tokenizer_alone_docs_per_s": 7500.0,
                   "peer": {"docs_per_s": 4000.0}}}
    lines = bench.table(results).splitlines()
    assert "| static tower (WordLlama) docs/s; the tokenizer alone | 6000.0; 7500.0 (0.80x) | | |" \
        in lines
    assert ("| static tower (WordLlama) docs/s: dualjax.index; StaticEmbedding.encode | 6000.0 "
            "| 4000.0 | 1.50x |") in lines
    del results["static"]["peer"]  # sentence-transformers not installed: no row
    assert "StaticEmbedding" not in bench.table(results)
    # A Python without sentence-transformers (the test install's) gives no figure.
    args = type("Args", (), {"peer_python": sys.executable, "encode_batch": 8})
    assert bench.static_peer(args, str(tmp_path), str(tmp_path / "corpus.jsonl")) == {}
