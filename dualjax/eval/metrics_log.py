"""WORKDIR/metrics.jsonl (one JSON object per line with "step" and "split"), the same
rows as TensorBoard scalars under WORKDIR/tensorboard/, and the console log."""

from __future__ import annotations

import json
import logging as std_logging
import os
import re
from typing import Any

import tensorflow_datasets as tfds
from absl import logging

from dualjax.runtime.files import DISK_STATUS, atomic_write

KEY_FIELDS = ("step", "split", "system", "index", "task", "typo_p")  # what makes a row one


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY_FIELDS)


def scalar_tag(row: dict, metric: str) -> tuple[str, int]:
    """(TensorBoard tag, step) of one metric of a row: "train/loss", "test/dual_encoder/
    exact/map_100" (a task's rows under "TASK/"; characters other than letters, digits,
    "_", "-", "." and "/" become "_", as tensorboardX writes them); the typo sweep's
    rows are "test/typo_robustness/SYSTEM/..." with the typo probability in % as the
    step."""
    parts = [row["task"]] if row.get("task") else []
    parts.append(row["split"])
    if "typo_p" in row:
        parts.append("typo_robustness")
    parts += [row[k] for k in ("system", "index") if row.get(k)]
    step = round(100 * row["typo_p"]) if "typo_p" in row else row["step"]
    return re.sub(r"[^-/\w.]", "_", "/".join(parts + [metric])), step


class MetricsLog:
    """Appends rows; a row whose (step, split, system, index, task, typo_p) is already
    in the file replaces the old one, so an interrupted or repeated evaluation never
    leaves a row twice. metrics.jsonl is the record; with `tensorboard`, every numeric
    value of a row is also a scalar in WORKDIR/tensorboard/ (`scalar_tag`), written with
    tensorboardX (no TensorFlow), once `start_events` has opened the writer."""

    def __init__(self, workdir: str, tensorboard: bool = False, writer: bool = True):
        """writer=False (a multi-host run's processes other than 0): reads only."""
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.writer = writer
        if writer:
            self._cut_torn_row()
        self.events_dir = (os.path.join(workdir, "tensorboard") if tensorboard and writer
                           else None)
        self._keys = {row_key(r) for r in self.read()}
        self._events = None

    def start_events(self, first_step: int, config_text: str = "") -> None:
        """Opens the event writer for a run that logs from `first_step` on: events an
        earlier run wrote at that step or later are purged when TensorBoard reads them (a
        resumed run logs those steps again). `config_text` is shown under "config"."""
        if self.events_dir is None or self._events is not None:
            return
        from tensorboardX import SummaryWriter  # only runs that write events import it
        # tensorboardX names a file events.out.tfevents.<second>.<host> and opens it with
        # "wb": a run resumed within the second of the last start would overwrite it. A
        # sequence number keeps every run's file, in the order TensorBoard reads them (by
        # name), so the resumed run's purge applies to the runs before it.
        os.makedirs(self.events_dir, exist_ok=True)
        number = sum(".out.tfevents." in name for name in os.listdir(self.events_dir))
        events = SummaryWriter(self.events_dir, purge_step=first_step or None,
                               flush_secs=30, filename_suffix=f".{number:05d}")
        self._events = events
        if config_text:
            events.add_text("config", f"<pre>{config_text}</pre>", first_step)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, step: int, split: str, values: dict[str, Any], **fields: Any) -> None:
        if not self.writer:
            return
        row = {"step": int(step), "split": split, **fields,
               **{k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in values.items()}}
        key = row_key(row)
        if key in self._keys:  # written before (a rerun, or an evaluation cut short)
            self._rewrite([r for r in self.read() if row_key(r) != key])
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self._keys.add(key)
        if self._events is not None:
            for metric, value in row.items():
                if metric not in KEY_FIELDS and isinstance(value, (int, float)):
                    tag, at = scalar_tag(row, metric)
                    self._events.add_scalar(tag, float(value), at)

    def truncate_after(self, step: int) -> None:
        """Drops rows logged after `step` (by a run killed after its last checkpoint, or
        before its first), so a resumed run does not log those steps twice."""
        if self.writer and os.path.exists(self.path):
            self._rewrite([r for r in self.read() if r["step"] <= step])

    def _rewrite(self, rows: list[dict]) -> None:
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self._keys = {row_key(r) for r in rows}

    def read(self) -> list[dict]:
        """Every row, in order. ValueError naming the file and line for a row that is not
        JSON (a torn last row is cut back when a writer opens the file)."""
        if not os.path.exists(self.path):
            return []
        rows = []
        with open(self.path) as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{self.path}:{number}: not a JSON row ({e.msg}); "
                                     "remove or mend that line") from None
        return rows

    def _cut_torn_row(self) -> None:
        """A run killed while it appended a row leaves that row torn: no newline at its
        end, not JSON. It is cut back to the last complete row, with a warning."""
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            data = f.read()
        if not data or data.endswith(b"\n"):
            return
        head, _, last = data.rpartition(b"\n")
        try:
            json.loads(last)
            return  # complete, only its newline missing: read() takes it
        except ValueError:
            pass
        logging.warning("%s: its last row was torn (%d bytes, a run stopped while writing "
                        "it); cut back to the last complete row", self.path, len(last))
        atomic_write(self.path, (head + b"\n" if head else b"").decode("utf-8"))


class _OwnInfoOnly(std_logging.Filter):
    """INFO lines from dualjax only; libraries (Orbax, TFDS) speak at WARNING and up."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Using custom data configuration" in message:
            return False  # TFDS says this for every builder config dualjax makes
        failure = message + (str(record.exc_info[1]) if record.exc_info else "")
        if (("orbax" in record.pathname or "asyncio" in record.pathname)
                and any(s in failure for s in DISK_STATUS)):
            return False  # a failed save (and its orphaned writes), said once by SaveError
        if (record.levelno >= std_logging.ERROR and "orbax" in record.pathname
                and "Save Finalize thread" in message):
            return False  # ... and Orbax's own summary of that failure
        return record.levelno >= std_logging.WARNING or "dualjax" in record.pathname


def setup_logging() -> None:
    """INFO from dualjax, WARNING and up from libraries, no TFDS progress bars."""
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(_OwnInfoOnly())
    tfds.disable_progress_bar()
