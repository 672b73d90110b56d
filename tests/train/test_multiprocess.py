"""Two processes with 2 CPU devices each (jax.distributed, gloo) train as one process with
8 devices does, and stop and resume together when one of them gets a signal."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import conftest
import jax
import numpy as np
import pytest
from conftest import COMPILE_FLAGS, load_config

from dualjax.train import checkpoints
from dualjax.train import loop as train

OVERRIDES = {
    "num_train_steps": 40, "checkpoint_every_steps": 0, "log_every_steps": 5,
    # cosine_temperature: the affine bias of cosine_affine gets a zero gradient under the
    # softmax, and Adam turns its rounding noise (a sum over processes is ordered
    # differently) into steps of the learning rate's size.
    "model.similarity": "cosine_temperature",
    "eval.untrained": False, "eval.baselines": "", "eval.index": "exact",
}
REPO = str(conftest.REPO)


def launch(workdir: str) -> list[subprocess.Popen]:
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XLA_FLAGS": f"{COMPILE_FLAGS} --xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    args = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    return [subprocess.Popen(
        [sys.executable, "-m", "dualjax.main", f"--config={REPO}/configs/tiny.py",
         f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
         "--num_processes=2", f"--process_id={i}", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for i in range(2)]


def finish(procs) -> list[tuple[int, str]]:
    return [(p.wait(timeout=300), p.stdout.read()) for p in procs]


def train_rows(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r for r in map(json.loads, open(path)) if r["split"] == "train"]


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_together(tmp_path):
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict(OVERRIDES)
    one = train.train_and_evaluate(cfg, str(tmp_path / "one"))

    two = str(tmp_path / "two")
    procs = launch(two)
    deadline = time.time() + 240
    while not train_rows(two) and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)  # one process only: both must stop at one step
    (code0, out0), (code1, out1) = finish(procs)
    assert (code0, code1) == (143, 143), out0[-2000:] + out1[-2000:]
    assert "a signal to another process: saved a checkpoint at step" in out0
    assert "SIGTERM: saved a checkpoint at step" in out1
    saved = sorted(int(s) for s in os.listdir(os.path.join(two, "checkpoints")) if s.isdigit())
    assert len(saved) == 1 and saved[0] % 5 == 0 and saved[0] < 40

    results = finish(launch(two))  # the same command again: they resume and finish
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:]
    assert "Resumed from" in results[0][1] and "Resumed from" in results[1][1]
    assert "test split, step 40" in results[0][1]  # process 0 prints the table
    assert "test split" not in results[1][1]

    step_a, a = checkpoints.latest_params(str(tmp_path / "one"))
    step_b, b = checkpoints.latest_params(two)
    assert step_a == step_b == 40
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    rows = {r["system"]: r for r in map(json.loads, open(os.path.join(two, "metrics.jsonl")))
            if r["split"] == "test"}
    assert rows["dual_encoder"]["map@100"] == one["dual_encoder [exact]"]["map@100"]
    # Each train row once (process 0 writes), the steps the killed pair logged after its
    # checkpoint replaced by the resumed run's.
    steps = [r["step"] for r in train_rows(two)]
    assert steps == sorted(set(steps)) and steps[-1] == 40
