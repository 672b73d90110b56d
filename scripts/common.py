"""What the scripts share: the repository's paths, the configs, the MiniLM workload, the
machine's name, and one runner of `python -m dualjax.main` with its metrics read back.
A script imports shared things from here, never from another script:

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import common

scripts/bench/ holds the benchmarks (their figures: BENCHMARKS.md), scripts/drills/ the
reliability drills (drill.py runs them), scripts/fixtures/ the makers of the tests'
pretrained fixtures, scripts/docs/ the generator of docs/config.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import runpy
import subprocess
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
# The four small BEIR collections, beside the checkout (../shared/data).
SHARED = [f"../shared/data/{c}" for c in ("npl", "med", "time", "adi")]
# all-MiniLM-L6-v2's sizes (its config.json): the "MiniLM" workload, one tower for queries
# and documents on both sides (as sentence-transformers trains it), random weights.
MINILM_SIZES = {"vocab_size": 30522, "hidden_size": 384, "num_layers": 6, "num_heads": 12,
                "intermediate_size": 1536, "max_positions": 512}
# The flags that start a run from all-MiniLM-L6-v2 itself.
MINILM_START = {"model.pretrained": "all-MiniLM-L6-v2", "model.tower": "bert",
                "model.tokenizer": "hf"}


def default_config():
    """configs/default.py's get_config(), loaded by path as dualjax.main does."""
    return runpy.run_path(os.path.join(REPO, "configs", "default.py"))["get_config"]()


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, else platform.processor(), else '?'."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def slug(label: str) -> str:
    """A folder name for `label`; a long one is cut and ends in a hash of the whole, so
    labels that differ only at their end (a train fraction) keep their own folders."""
    s = "".join(c if c.isalnum() else "_" for c in label).strip("_")
    if len(s) <= 60:
        return s
    return s[:51] + "_" + hashlib.sha1(label.encode()).hexdigest()[:8]


def read_rows(workdir: str) -> list[dict]:
    """A workdir's metrics.jsonl rows ([] before it has one)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rows_of(workdir: str) -> dict[str, dict]:
    """{system: its test row} of the run's final evaluation (exact search)."""
    rows = [r for r in read_rows(workdir) if r.get("split") == "test" and "system" in r]
    last = max(r["step"] for r in rows)
    return {r["system"]: r for r in rows if r["step"] == last and r["index"] == "exact"}


def run_main(config: str, workdir: str, flags: dict, devices: int = 0) -> float:
    """Runs `python -m dualjax.main` as a user does (the command printed, its output in
    WORKDIR.log; `devices` > 1: that many fake CPU devices); its wall seconds. The one
    runner of a training run the benchmarks share."""
    env = dict(os.environ)
    if devices > 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={devices}").strip()
    cmd = [sys.executable, "-m", "dualjax.main", f"--config={config}", f"--workdir={workdir}",
           *(f"--config.{k}={v}" for k, v in flags.items())]
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    with open(workdir + ".log", "w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    return time.time() - start


def run_worker(cmd: list[str], env: dict | None = None) -> dict:
    """Runs one measurement in a fresh process (`cmd`, from the repository's root) and
    returns the JSON of its last stdout line; WorkerFailed with the tail of its stderr
    if it fails. The one runner of the benchmarks' worker processes."""
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise WorkerFailed(f"{' '.join(cmd[:3])} ... exited {out.returncode}:\n"
                           f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class WorkerFailed(RuntimeError):
    """A benchmark's worker process failed (`run_worker`)."""


def dualjax_run(args, name: str, config: str, flags: dict) -> tuple[str, float | None]:
    """Runs (or reuses) one workdir, args.out/<slug(name)> (`run_main`); (workdir, wall
    seconds or None if reused)."""
    workdir = os.path.abspath(os.path.join(args.out, slug(name)))
    if os.path.exists(os.path.join(workdir, "report.md")):
        return workdir, None
    return workdir, run_main(config, workdir, flags)


def load_task(workdir: str):
    """The test split's RetrievalTask of a dualjax workdir, as its run read it."""
    from dualjax.config import run
    from dualjax.train import tasks as tasks_lib
    spec = run.saved(workdir)
    return tasks_lib.make_tasks(spec.tasks, spec.schedule.seed)[0].eval_task("test")
