"""Encoding throughput of an exported encoder against the training-time towers.

    python scripts/bench/bench_export.py --workdir=runs/default [--repeats=3] [--batch_size=256]

Exports the workdir (`dualjax.export`, cpu) to a temporary folder, then encodes the test
split's corpus of its dataset as documents, alternating the training-time encoder
(`models.make_encoders` on the latest params, one jitted batch at a time, as the
evaluation does) and `dualjax.Encoder.load(bundle).encode_documents`, `--repeats` times
each after a warm-up, and prints texts per second (median) and their ratio. Both
tokenize in Python; the numbers include it.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import jax
import numpy as np

from dualjax import export, models
from dualjax.train import tasks as tasks_lib
from dualjax.train import trained as trained_lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=256)
    args = parser.parse_args()

    model = trained_lib.load_trained(args.workdir)
    task = tasks_lib.make_tasks(model.spec.tasks, model.spec.schedule.seed)[0]
    texts = task.eval_task(task.splits()[-1]).corpus
    side = model.inputs.document
    _, encode_d = models.make_encoders(model.model)
    params = jax.device_put(model.params, jax.devices()[0])

    def training_time() -> np.ndarray:
        out = []
        for start in range(0, len(texts), args.batch_size):
            chunk = texts[start:start + args.batch_size]
            chunk = chunk + [""] * (args.batch_size - len(chunk))
            out.append(np.asarray(encode_d(params, side.encode(chunk))))
        return np.concatenate(out)[:len(texts)]

    with tempfile.TemporaryDirectory() as tmp:
        encoder = export.export(args.workdir, os.path.join(tmp, "bundle"), platforms=("cpu",))
        exported = lambda: encoder.encode_documents(texts, batch_size=args.batch_size)
        a, b = training_time(), exported()  # warm-up (compilation) and equality
        print(f"max |difference| {np.abs(a - b).max():.2e} over {len(texts)} x {a.shape[1]}")
        times = {"training-time towers": [], "exported encoder": []}
        for _ in range(args.repeats):
            for name, fn in (("training-time towers", training_time),
                             ("exported encoder", exported)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    rates = {name: len(texts) / statistics.median(t) for name, t in times.items()}
    for name, rate in rates.items():
        print(f"{name}: {rate:,.0f} texts/s (median of {args.repeats})")
    ratio = rates["exported encoder"] / rates["training-time towers"]
    print(f"ratio exported / training-time: {ratio:.2f}"
          f" ({platform.node()}, {os.cpu_count()} CPUs, {len(jax.devices())} device(s), "
          f"model {model.config.model.name}, {len(texts)} texts, batch {args.batch_size})")


if __name__ == "__main__":
    main()
