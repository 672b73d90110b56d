"""The train rows: each step's metrics kept on the device until a row is written
(checked finite, with the throughput since the last row), how far the host may queue
steps ahead of the device, and the progress bar."""
from __future__ import annotations

import time
from typing import Any

import jax
import optax
from absl import logging
from tqdm.auto import tqdm

from dualjax.eval.metrics_log import MetricsLog
from dualjax.train import step as step_lib

AHEAD_SECONDS = 2.0  # the device work the host may queue ahead of it (`TrainRows.add`)


def steps_ahead(seconds_per_step: float) -> int:
    """How many steps the host may queue: those that take AHEAD_SECONDS, at least 1."""
    return max(1, int(AHEAD_SECONDS / max(seconds_per_step, 1e-9)))


class TrainRows:
    """The steps' metrics, kept on the device until a train row is written (checked
    finite, with the throughput since the last row), and the progress bar.

    Args:
        num_steps: the run's last step (the bar's total).
        start: the step training starts after (a resumed run's checkpoint).
        global_batch_size: pairs per step, for the rows' pairs_per_second.
        log: where the rows go (metrics.jsonl, TensorBoard).
    """

    def __init__(self, num_steps: int, start: int, global_batch_size: int, log: MetricsLog):
        self.num_steps, self.global_batch_size, self.log = num_steps, global_batch_size, log
        self.pending: list[tuple[int, dict]] = []
        self.since = (start, time.perf_counter())  # steps and time since the last row
        self.ahead = 1  # steps the host may queue; measured again at each train row
        self.bar = tqdm(total=num_steps, initial=start, desc="train", unit="step",
                        disable=None, dynamic_ncols=True)

    def add(self, step: int, metrics: dict) -> None:
        """Keeps the step's metrics. Dispatch is asynchronous: steps the host queues ahead
        keep a fast device busy (short steps run slower one at a time), but a signal's
        checkpoint waits for all of them, and a preemption notice is short against many
        queued slow steps (the figures: BENCHMARKS.md, "Figures behind design choices").
        So the host waits
        once `ahead` steps are queued: those that take AHEAD_SECONDS at the step time
        measured at the last train row, 1 before the first (compilation)."""
        if len(self.pending) >= self.ahead:
            jax.block_until_ready(self.pending[-self.ahead][1])
        self.pending.append((step, metrics))
        self.bar.update(1)

    def write(self, fields: dict[str, str], params: Any, last_saved: int | None) -> None:
        """The train row of the newest step, with `fields` (its task's); `params`: the
        state's (a norm the step did not measure is measured on them); `last_saved`: the
        step of the last checkpoint (named if a value is not finite)."""
        pending, self.pending = jax.device_get(self.pending), []
        step, values = pending[-1]
        if values["param_norm"] == step_lib.NOT_MEASURED:  # a signal came mid-step: it saves
            values["param_norm"] = float(jax.jit(optax.tree.norm)(params))
            del values["grad_norm"]
        step_lib.check_finite(pending, last_saved)
        now = time.perf_counter()  # includes compilation in the first interval
        values["pairs_per_second"] = ((step - self.since[0]) * self.global_batch_size
                                      / max(now - self.since[1], 1e-9))
        self.ahead = steps_ahead((now - self.since[1]) / max(step - self.since[0], 1))
        self.since = (step, now)
        stats = jax.local_devices()[0].memory_stats()  # (None on CPU)
        if stats and "peak_bytes_in_use" in stats:  # the device's high-water mark so far
            values["device_peak_gib"] = stats["peak_bytes_in_use"] / 2 ** 30
        self.log.write(step, "train", values, **fields)
        self.bar.set_postfix(loss=f"{values['loss']:.4f}")
        if self.bar.disable:  # not a terminal (CI, nohup, a pipe): progress as lines
            logging.info("step %d/%d: loss %.4f, %.0f pairs/s", step, self.num_steps,
                         values["loss"], values["pairs_per_second"])

    def close(self) -> None:
        self.bar.close()
