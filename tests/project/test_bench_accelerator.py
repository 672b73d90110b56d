"""scripts/bench/bench_accelerator.py at toy size, so that it never rots: it writes its
random-weight BERT folder and data, trains as a user does, exports, indexes, and prints
its table and JSON with the figures it names."""

import importlib.util
import json
import os

import conftest
import pytest

ROOT = str(conftest.REPO)


@pytest.mark.slow
def test_the_accelerator_bench_runs_at_toy_size(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_accelerator", os.path.join(ROOT, "scripts", "bench", "bench_accelerator.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
