"""SIGTERM and SIGINT during a run: deferred to the end of a training step, or one line."""

from __future__ import annotations

import signal
import threading

from absl import logging

from dualjax.errors import PeerStopped, Preempted
from dualjax.runtime import peers


class Signals:
    """SIGTERM and SIGINT (Ctrl-C) for the whole run. While `deferring` (the training
    loop), the first one is only recorded (`received`): the loop saves at the end of the
    step and stops; a second one stops at once (KeyboardInterrupt). Elsewhere (data
    preparation, compilation, evaluation) one stops the run at once with `Preempted`,
    saying what `stage` was interrupted. Handlers can only be set from the main thread;
    from another thread the run simply has none."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.deferring = False
        self.stage = "before training; nothing was saved"
        self._previous: dict = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle)
                              for sig in (signal.SIGTERM, signal.SIGINT)}
        if (watcher := peers.active()) is not None:  # the others learn of a signal not deferred
            watcher.deferring = lambda: self.deferring
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame) -> None:
        if peers.stopping():  # another process is gone: nothing more can be saved
            raise PeerStopped(peers.stopping())
        name = signal.Signals(signum).name
        if not self.deferring:
            if (watcher := peers.active()) is not None:  # the others stop with this process
                watcher.announce(name)
            error = Preempted(f"{name}: stopped {self.stage}; run the same command again "
                              "to resume")
            error.signum = signum  # (raised again if a finalizer swallows it: cli.py)
            raise error
        if self.received:  # asked twice: stop now, without saving
            raise KeyboardInterrupt
        self.received = name
        logging.warning("%s: saving a checkpoint after this step (send it again to stop at "
                        "once)", name)
