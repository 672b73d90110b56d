"""Progress of a long stage: a tqdm bar on a terminal, else a log line at least every
`every` seconds (CI, nohup, a pipe: where a bar is not shown), with the count, the
total and the rate, so a stage of minutes (pseudo-labels, teacher scores, the corpus's
vectors) is never silent."""

from __future__ import annotations

import time

from absl import logging
from tqdm.auto import tqdm

LOG_EVERY_SECONDS = 30.0
# tqdm's monitor thread (it shortens a stalled bar's refresh) is started by the first bar:
# a SIGTERM landing while it starts was turned into "release unlocked lock", swallowed
# with a TqdmMonitorWarning, and the command went on. No bar here needs it.
tqdm.monitor_interval = 0


class Progress:
    """`with Progress(total, "encode corpus", "text") as p: ... p.update(n)`."""

    def __init__(self, total: int | None, desc: str, unit: str = "item",
                 every: float = LOG_EVERY_SECONDS, leave: bool = True):
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=None, leave=leave,
                        dynamic_ncols=True)
        self.done = 0
        self.start = self.last = time.perf_counter()

    def update(self, n: int) -> None:
        """`n` more items done."""
        self.done += n
        self.bar.update(n)
        now = time.perf_counter()
        done = self.total is not None and self.done >= self.total
        if self.bar.disable and (now - self.last >= self.every or
                                 (done and now - self.start >= self.every)):
            self.last = now
            of = "" if self.total is None else f"/{self.total}"  # None: a stream
            logging.info("%s: %d%s %ss, %.1f/s", self.desc, self.done, of, self.unit,
                         self.done / max(now - self.start, 1e-9))

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
