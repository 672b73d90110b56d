"""Operator drills on the tiny config: kill -9 and SIGTERM at random moments, then resume;
two runs started at once on one workdir. Counts what BENCHMARKS.md's RELIABILITY section
reports.

    python scripts/drills/drill.py --out=runs/drill [--kills=20] [--terms=5] [--concurrent=5]
        [--full_disk] [--seed=0] [--json=out.json]
    python scripts/drills/drill.py --serving --out=runs/drill_serving [--json=out.json] [--only=RE]
    python scripts/drills/drill.py --tour --out=runs/drill_tour [--json=out.json]

--serving runs the serving drill instead (scripts/drills/serving_drill.py, issue 30's cases in
scripts/drills/odd_input_drill.py and issue 43's in scripts/drills/round3_drill.py): export, index,
search and training given odd input, damaged files, races, signals and processes that
disagree or die, each case refused in one line or answered correctly (--only: the cases
whose name matches RE).

Every run is `python -m dualjax.main --config=configs/tiny.py` with 40 steps, a checkpoint
every 5 and no evaluation before the last step (the issue's drill). One uninterrupted
reference run gives the final parameters and the metrics rows; then:

- kill: start a run, kill -9 it at a uniform random moment within the reference's wall
  time (start-up, data preparation, training and the final evaluation are all targets),
  then run the same command to the end;
- term: the same with SIGTERM; the interrupted run must exit 143 (or 0 if it had already
  finished) and print no traceback;
- concurrent: two runs on one new workdir at the same moment; one must be refused with
  one line (exit 1) while the other finishes;
- full disk (--full_disk, root only): the workdir on a 700 KB tmpfs that fills at a
  checkpoint, and on a 64 KB one that fills while the data tables are written; one line
  and exit 1, then, with the file system grown, a resume.

Each drilled workdir must end with parameters bit-equal to the reference's and with each
(step, split, system, index, task) row once in metrics.jsonl.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from dualjax.eval.metrics_log import row_key  # noqa: E402
from dualjax.train import checkpoints  # noqa: E402

FLAGS = ("--config=configs/tiny.py", "--config.num_train_steps=40",
         "--config.checkpoint_every_steps=5", "--config.eval_every_steps=1000",
         "--config.eval.index=exact")


def command(workdir: str) -> list[str]:
    return [sys.executable, "-m", "dualjax.main", f"--workdir={workdir}", *FLAGS]


def start(workdir: str, log: str) -> subprocess.Popen:
    return subprocess.Popen(command(workdir), stdout=subprocess.DEVNULL,
                            stderr=open(log, "a"), start_new_session=True)


def finish(workdir: str) -> tuple[int, str]:
    """Runs the command to its end; (exit status, stderr)."""
    out = subprocess.run(command(workdir), capture_output=True, text=True)
    return out.returncode, out.stderr


def final_params(workdir: str):
    step, params = checkpoints.latest_params(workdir)
    return step, [np.asarray(x) for x in jax.tree.leaves(params)]


def duplicated_rows(workdir: str) -> int:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        counts = collections.Counter(row_key(json.loads(line)) for line in f)
    return sum(n - 1 for n in counts.values())


def check(workdir: str, reference) -> dict:
    step, params = final_params(workdir)
    equal = step == reference[0] and all(np.array_equal(a, b)
                                         for a, b in zip(params, reference[1], strict=True))
    return {"bit_equal": bool(equal), "duplicated_rows": duplicated_rows(workdir)}


def interrupt(args, name: str, sig: int, at: float, reference) -> dict:
    workdir = os.path.join(args.out, name)
    log = workdir + ".log"
    proc = start(workdir, log)
    time.sleep(at)
    status = proc.poll()
    if status is None:
        os.killpg(proc.pid, sig)  # the session: grain threads and all
        status = proc.wait()
    with open(log) as f:
        interrupted_stderr = f.read()
    code, stderr = finish(workdir)
    result = {"name": name, "signal": signal.Signals(sig).name, "at_s": round(at, 2),
              "interrupted_exit": status, "resume_exit": code,
              "traceback": "Traceback" in interrupted_stderr + stderr, **check(workdir, reference)}
    if sig == signal.SIGTERM:
        result["clean_exit"] = status in (0, 143) and not result["traceback"]
        lines = interrupted_stderr.strip().splitlines()
        result["message"] = lines[-1] if status == 143 and lines else ""
    return result


def concurrent(args, name: str, reference) -> dict:
    workdir = os.path.join(args.out, name)
    procs = [subprocess.Popen(command(workdir), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [(p.wait(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in outs)
    refused = [err for code, err in outs if code == 1]
    one_line = len(refused) == 1 and len(refused[0].strip().splitlines()) == 1
    return {"name": name, "exits": codes, "refused_in_one_line": one_line,
            "refusal": refused[0].strip() if refused else "",
            "traceback": any("Traceback" in err for _, err in outs), **check(workdir, reference)}


def full_disk(args, reference, size: str = "700k", tables_elsewhere: bool = True
              ) -> dict | None:
    """A workdir on a `size` tmpfs fills: at the fifth checkpoint (700 KB, the data
    prepared elsewhere), or while TFDS writes the data tables into it (64 KB). The run
    must end with one line and exit 1; with the file system grown, the same command
    resumes. Needs root to mount; None (skipped) otherwise."""
    mount = os.path.join(os.path.abspath(args.out), f"full_disk_{size}")
    os.makedirs(mount, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount],
                      capture_output=True).returncode:
        return None
    try:
        workdir = os.path.join(mount, "w")
        cmd = command(workdir) + ["--config.keep_checkpoints=20"]
        if tables_elsewhere:
            cmd.append(f"--config.data.tfds_dir={os.path.join(args.out, 'full_tfds')}")
        first = subprocess.run(cmd, capture_output=True, text=True)
        said = [line for line in first.stderr.splitlines() if not line.startswith("I")]
        subprocess.run(["mount", "-o", "remount,size=8m", mount], check=True)
        second = subprocess.run(cmd, capture_output=True, text=True)
        return {"name": f"full_disk_{size}", "exit": first.returncode, "lines": len(said),
                "message": said[-1] if said else "", "resume_exit": second.returncode,
                "traceback": "Traceback" in first.stderr + second.stderr,
                **check(workdir, reference)}
    finally:
        subprocess.run(["umount", mount], capture_output=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="A new folder for the drilled workdirs.")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--terms", type=int, default=5)
    p.add_argument("--concurrent", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full_disk", action="store_true",
                   help="also fill a 700 KB tmpfs at a checkpoint (needs root)")
    p.add_argument("--json", default="")
    p.add_argument("--serving", action="store_true", help="the serving drill instead")
    p.add_argument("--tour", action="store_true", help="the README's quick start and tour, "
                   "in order, from a fresh clone (scripts/drills/tour_drill.py) instead")
    p.add_argument("--only", default="", help="--serving: the cases whose name matches")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.serving:
        return serving(args)
    if args.tour:
        import tour_drill
        return tour_drill.main(args.out, args.json)
    rng = random.Random(args.seed)

    t0 = time.time()
    code, stderr = finish(os.path.join(args.out, "reference"))
    wall = time.time() - t0
    if code:
        sys.exit(f"the reference run failed:\n{stderr}")
    reference = final_params(os.path.join(args.out, "reference"))
    print(f"reference run: {wall:.1f} s, step {reference[0]}", flush=True)

    results = []
    for kind, sig, n in (("kill", signal.SIGKILL, args.kills),
                         ("term", signal.SIGTERM, args.terms)):
        for i in range(n):
            r = interrupt(args, f"{kind}_{i}", sig, rng.uniform(0.5, wall), reference)
            print(json.dumps(r), flush=True)
            results.append(r)
    for i in range(args.concurrent):
        r = concurrent(args, f"concurrent_{i}", reference)
        print(json.dumps(r), flush=True)
        results.append(r)

    disks = [full_disk(args, reference), full_disk(args, reference, "64k", False)
             ] if args.full_disk else []
    for disk in filter(None, disks):
        print(json.dumps(disk), flush=True)
        results.append(disk)

    kills = [r for r in results if r["name"].startswith("kill")]
    terms = [r for r in results if r["name"].startswith("term")]
    pairs = [r for r in results if r["name"].startswith("concurrent")]
    summary = {
        "reference_wall_s": round(wall, 1),
        "kills": len(kills), "kills_resumed_bit_equal": sum(r["bit_equal"] for r in kills),
        "terms": len(terms), "terms_resumed_bit_equal": sum(r["bit_equal"] for r in terms),
        "terms_clean_exit": sum(r["clean_exit"] for r in terms),
        "concurrent": len(pairs),
        "concurrent_refused_in_one_line": sum(r["refused_in_one_line"] for r in pairs),
        "concurrent_bit_equal": sum(r["bit_equal"] for r in pairs),
        "duplicated_rows": sum(r["duplicated_rows"] for r in results),
        "tracebacks": sum(r["traceback"] for r in results),
        **{f"full_disk_{where}": ("skipped (needs root to mount a tmpfs)" if disk is None
                                  else f"exit {disk['exit']}, {disk['lines']} line(s), resumed "
                                  f"{'bit-equal' if disk['bit_equal'] else 'DIFFERENT'}")
           for where, disk in zip(("checkpoint", "tables"), disks or [None, None], strict=True)},
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": results}, f, indent=1)


def serving(args) -> None:
    import odd_input_drill
    import round3_drill
    import serving_drill
    t0 = time.time()
    setup = serving_drill.prepare(os.path.abspath(args.out))
    every = serving_drill.CASES + odd_input_drill.cases() + round3_drill.cases()
    cases = [c for c in every
             if re.search(args.only, c.name)]
    results = serving_drill.run_cases(setup, cases)
    print(serving_drill.table(results))
    bad = [r["case"] for r in results if not r["ok"]]
    print(f"\n{len(results) - len(bad)} of {len(results)} cases refused in one line or "
          f"answered correctly; {sum(r['traceback'] for r in results)} tracebacks; "
          f"{time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if bad:
        sys.exit(f"not as expected: {', '.join(bad)}")


if __name__ == "__main__":
    main()
