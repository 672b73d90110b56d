"""Indexing a large corpus with bounded memory: documents/s and peak resident memory of
`python -m dualjax.index` at growing corpus sizes, so that the growth per document shows.

    python scripts/bench/bench_index_scale.py --work=runs/bench_index_scale \
        [--sizes=1000000,5000000] [--simulate=20000000] [--kind=exact] [--json=FILE]

The encoder is the tiny config's 16-d bundle (a few training steps, exported once under
--work). Each size is a TSV of short generated questions ("d<i><TAB>how do i ...", 5 to
14 words), written once under --work and indexed by the command as a user runs it, in a
fresh process whose peak RSS is the kernel's (wait4's ru_maxrss). --simulate=N runs the
same build code in a fresh process over N generated documents that are never written as
a corpus file (the index's own files are written), to show the growth at a size whose
input file would not be worth writing. Vectors alone take N x 16 x 4 bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
WORDS = ("bike car rice bread engine wheel oven pasta chain brake tyre flour garden window "
         "paint roof river coffee guitar python swim train music school phone garden lamp "
         "table chair shirt shoes money bank loan house rent city road map").split()


def questions(n: int, seed: int = 0):
    """(id, text) of n generated questions, made a block at a time."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        lengths = rng.integers(5, 15, size=m)
        picks = rng.integers(0, len(words), size=(m, 14))
        for j in range(m):
            yield f"d{start + j}", "how do i " + " ".join(words[picks[j, :lengths[j]]])


def write_corpus(path: str, n: int) -> str:
    if os.path.isfile(path):
        return path
    with open(path + ".part", "w") as f:
        f.writelines(f"{i}\t{t}\n" for i, t in questions(n))
    os.replace(path + ".part", path)
    return path


def make_bundle(work: str) -> str:
    bundle = os.path.join(work, "bundle")
    if os.path.isfile(os.path.join(bundle, "encoder.json")):
        return bundle
    code = ("import sys; sys.path.insert(0, {!r})\n"
            "from ml_collections import config_flags\n"
            "import importlib.util\n"
            "spec = importlib.util.spec_from_file_location('c', {!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "cfg = m.get_config(); cfg.num_train_steps = 20; cfg.eval.untrained = False\n"
            "cfg.eval.baselines = ''; cfg.eval.every_steps = 0\n"
            "from dualjax.train import loop\n"
            "loop.train_and_evaluate(cfg, {!r})\n"
            "from dualjax import export\n"
            "export.export({!r}, {!r}, platforms=('cpu',))\n").format(
        REPO, os.path.join(REPO, "configs", "tiny.py"), os.path.join(work, "run"),
        os.path.join(work, "run"), bundle)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    return bundle


def measured(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in GB, output tail) of a command in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
    return seconds, usage.ru_maxrss / 1e6, out[-600:]


SIMULATE = """
import sys; sys.path.insert(0, {repo!r})
sys.argv = ["x"]
from absl import flags; flags.FLAGS(["x"])
sys.path.insert(0, {scripts!r})
from bench_index_scale import questions
from dualjax import index
from dualjax.data.corpus_file import Line
from dualjax.serve.bundle import Encoder
encoder = Encoder.load({bundle!r})
def docs():
    return ((Line("", 0, n, [0]), i, t) for n, (i, t) in enumerate(questions({n}), 1))
m = index._build(encoder, index.Source(docs, docs, "generated"), {out!r},
                 index.Settings({kind!r}), 256, True)
print("indexed", m["n"])
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="runs/bench_index_scale")
    p.add_argument("--sizes", default="1000000,5000000")
    p.add_argument("--simulate", type=int, default=20_000_000, help="0: none")
    p.add_argument("--kind", default="exact")
    p.add_argument("--json", default="")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    bundle = make_bundle(args.work)
    rows = []
    for n in [int(s) for s in args.sizes.split(",") if s]:
        corpus = write_corpus(os.path.join(args.work, f"corpus_{n}.tsv"), n)
        out = os.path.join(args.work, f"index_{n}")
        seconds, rss, tail = measured([sys.executable, "-m", "dualjax.index",
                                       f"--encoder={bundle}", f"--corpus={corpus}",
                                       f"--out={out}", f"--kind={args.kind}", "--overwrite"])
        rows.append({"documents": n, "how": "dualjax.index", "seconds": round(seconds, 1),
                     "docs_per_s": round(n / seconds), "peak_rss_gb": round(rss, 3),
                     "vectors_gb": round(n * 16 * 4 / 1e9, 3)})
        print(json.dumps(rows[-1]), flush=True)
    if args.simulate:
        n, out = args.simulate, os.path.join(args.work, f"index_sim_{args.simulate}")
        code = SIMULATE.format(repo=REPO, scripts=os.path.join(REPO, "scripts", "bench"),
                               bundle=bundle, n=n, out=out, kind=args.kind)
        seconds, rss, tail = measured([sys.executable, "-c", code])
        rows.append({"documents": n, "how": "simulated (no corpus file)",
                     "seconds": round(seconds, 1), "docs_per_s": round(n / seconds),
                     "peak_rss_gb": round(rss, 3), "vectors_gb": round(n * 16 * 4 / 1e9, 3)})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, --kind={args.kind}")
    print("| documents | how | seconds | docs/s | peak RSS (GB) | vectors (GB) |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['documents']:,} | {r['how']} | {r['seconds']} | {r['docs_per_s']:,} | "
              f"{r['peak_rss_gb']} | {r['vectors_gb']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
