"""The processes of one multi-process command end together, each in one line.

jax.distributed joins the processes of a run (a pod slice, several GPU hosts), and a
collective then waits for every one of them. When one process stops (a SIGTERM, a
Ctrl-C, a kill -9, its host gone), the others would wait inside a collective until
jax's heartbeat (100 s) aborts them with a C++ stack; and the process that hosts jax's
coordination service takes it down when it dies, which aborts every other process at
once, also with a C++ stack. So a multi-process command runs:

- the coordination service in a small process of its own beside process 0
  (`runtime/coordinator.py`), which outlives process 0 by a grace period: the others
  then learn of process 0's death from the beats below, in one line;
- a watcher thread in every process (`Peers`), which every BEAT seconds writes this
  process' beat to the service's key-value store and reads the others'. A process whose
  beat has not moved for `timeout` seconds is dead: the others stop (exit 1). A
  SIGTERM or SIGINT that the command does not defer (training defers the first one to
  save a checkpoint, `runtime/signals.py`) is written there as this process' stop; the
  others read it and stop too (exit 143 or 130).

A process that learns that another one stopped raises `PeerStopped` in its main thread,
so that the command's own cleanup runs (a staging folder removed). A main thread blocked
in a collective, waiting for a process that is gone, cannot raise: after GRACE seconds
the watcher runs the cleanups registered with `on_stop` itself. Either way the process
prints one line, `COMMAND: REASON; this process stops too; KEPT`, and ends at once
(os._exit: jax's exit would wait at its shutdown barrier for processes that are gone).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from absl import logging

from dualjax.errors import PeerStopped

BEAT = 0.5  # seconds between beats (3 small RPCs to the service each)
GRACE = 3.0  # seconds the main thread has to end by itself before the watcher ends it
UNREACHABLE = 3.0  # seconds the coordination service may not answer before it is "gone"
PREFIX = "dualjax/"
EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130}

_active: Peers | None = None  # the process' watcher: signals and the exit path consult it


def active() -> Peers | None:
    """This process' watcher, when it is one of several processes of a command."""
    return _active


def stopping() -> str | None:
    """Why this process stops because of another one (None: it does not)."""
    return _active.reason if _active is not None else None


def leaving() -> str | None:
    """Why this process stops: another one's stop, or its own signal, which the others
    know of (None: it does not). A process leaving enters no collective: the others may
    be gone or going."""
    if _active is None:
        return None
    return _active.reason or (f"stopped by {_active.signal}" if _active.signal else None)


class Peers:
    """Watches the other processes of this command (the module's docstring says how).

    Args:
      client: jax's coordination-service client (its key-value store).
      me, count: this process' index and the number of processes.
      command: the command's name, which starts every line it prints.
      timeout: seconds without a beat after which a process counts as dead.
      kept: what is left after a stop, said at the end of the line.
    """

    def __init__(self, client, me: int, count: int, command: str, timeout: float,
                 kept: str = "nothing half-written was kept"):
        self.client, self.me, self.count = client, me, count
        self.command, self.timeout, self.kept = command, timeout, kept
        self.reason: str | None = None  # why another process makes this one stop
        self.code = 0
        self.signal: str | None = None  # why this process told the others it stops
        self.deferring: Callable[[], bool] = lambda: False  # (training: Signals.deferring)
        self._cleanups: dict[int, Callable[[], None]] = {}
        self._lock = threading.RLock()  # (a signal handler may announce inside exit)
        self._stopped = threading.Event()  # set with `reason`
        self._announced = threading.Event()  # this process' stop is with the service
        self._exiting = False
        self._done = threading.Event()
        self._wake_read = -1
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ set up
    def start(self) -> Peers:
        """Starts the watcher (from the main thread: it takes the signals' wakeup fd)."""
        global _active
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        # Python's C-level handler writes each signal's number here even while the main
        # thread is blocked in a collective, where the Python handler cannot run yet.
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wake_read = read
        signal.signal(signal.SIGUSR1, self._interrupt)
        self._thread = threading.Thread(target=self._watch, name="dualjax-peers", daemon=True)
        self._thread.start()
        _active = self
        atexit.register(self.close)  # registered after jax's: runs before its shutdown
        return self

    def close(self) -> None:
        """Stops the watcher at a normal end (every process reaches jax's shutdown)."""
        global _active
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * BEAT + 1)
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
        _active = None

    def on_stop(self, cleanup: Callable[[], None]) -> Callable[[], object]:
        """Registers `cleanup` (removing what this process was writing) to run when the
        process is ended from here; returns the function that unregisters it."""
        key = id(cleanup)
        self._cleanups[key] = cleanup
        return lambda: self._cleanups.pop(key, None)

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        others = [p for p in range(self.count) if p != self.me]
        beats: dict[int, tuple[str | None, float]] = {p: (None, time.monotonic())
                                                      for p in others}
        unreachable_since: float | None = None
        n = 0
        while not self._done.is_set():
            ready, _, _ = select.select([self._wake_read], [], [], BEAT)
            if ready:
                self._own_signals(os.read(self._wake_read, 256))
            if self._exiting:
                continue
            now = time.monotonic()
            try:
                n += 1
                self.client.key_value_set(f"{PREFIX}beat/{self.me}", str(n),
                                          allow_overwrite=True)
                seen = dict(self.client.key_value_dir_get(f"{PREFIX}beat/"))
                stops = self.client.key_value_dir_get(f"{PREFIX}stop/")
                unreachable_since = None
            except Exception:  # the service is gone (its host), or slow for a moment
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE:
                    self._stop(1, "the coordination service (beside process 0) stopped "
                                  f"answering for {UNREACHABLE:g} s")
                continue
            for key, why in stops:
                who = int(key.rsplit("/", 1)[-1])
                if who != self.me:
                    self._stop(EXIT_CODES.get(why, 1), f"process {who} was stopped by {why}"
                               if why in EXIT_CODES else f"process {who} stopped on {why} "
                               "(its log says which)")
            for p in others:
                value = seen.get(f"{PREFIX}beat/{p}")
                if value != beats[p][0]:
                    beats[p] = (value, now)
                elif now - beats[p][1] > self.timeout:
                    self._stop(1, f"process {p} stopped answering for {self.timeout:g} s "
                                  "(killed, or its host is down)")

    def _own_signals(self, data: bytes) -> None:
        """A SIGTERM / SIGINT this process received: the others learn of it, unless the
        command defers it (training saves first: its processes agree on a step)."""
        names = [signal.Signals(b).name for b in data if b in (signal.SIGTERM, signal.SIGINT)]
        if not names or self.reason or self.deferring() or not self.announce(names[0]):
            return
        # The main thread's handler raises where it is; if it is blocked, end it here.
        threading.Timer(GRACE, self.exit).start()

    def announce(self, why: str) -> bool:
        """Tells the others that this process stops, and why ("SIGTERM", "SIGINT", "an
        error"); once (False when it had already). Returns once the message is with the
        service: a second caller (the main thread's handler while the watcher sends the
        same signal's) waits for the first's, so the process never exits with it unsent
        (the others would then read a dead process, not a signal)."""
        with self._lock:
            first = self.signal is None
            if first:
                self.signal = why
        if not first:
            self._announced.wait(UNREACHABLE + 1)
            return False
        try:
            self._send_stop(why)
        finally:
            self._announced.set()
        return True

    def _send_stop(self, why: str) -> None:
        """Writes this process' stop to the service, trying again for UNREACHABLE seconds
        when it does not answer (loaded, for a moment): a stop not written reads as a dead
        process to the others (exit 1 after `timeout`, not this signal's status)."""
        deadline = time.monotonic() + UNREACHABLE
        while True:
            try:
                self.client.key_value_set(f"{PREFIX}stop/{self.me}", why,
                                          allow_overwrite=True)
                return
            except Exception as e:
                if time.monotonic() > deadline:  # (the others find the beats stopping)
                    logging.warning("could not tell the other processes that this one "
                                    "stops (%s): %s", why, e)
                    return
                time.sleep(0.05)

    def _stop(self, code: int, why: str) -> None:
        """Another process stopped, died, or the service is gone: this one stops too."""
        with self._lock:
            if self.reason is not None or self.signal is not None:
                return
            self.reason, self.code = f"{why}; this process stops too", code
        self._stopped.set()
        main = threading.main_thread().ident
        assert main is not None  # (the main thread has always started)
        try:  # the main thread raises PeerStopped where it is and cleans up
            signal.pthread_kill(main, signal.SIGUSR1)
        except (OSError, ValueError):
            pass
        threading.Timer(GRACE, self.exit).start()

    def _interrupt(self, signum, frame) -> None:
        if self.reason is not None and not self._exiting:
            raise PeerStopped(self.reason)

    def await_stop(self) -> str | None:
        """Waits until the watcher knows why another process is gone, at most `timeout`
        seconds and a beat: a collective that failed ("connection closed by peer") or
        blocks says a process is gone before its beats do. The reason, or None."""
        deadline = time.monotonic() + self.timeout + 2 * BEAT
        while self.reason is None and time.monotonic() < deadline:
            try:
                self._stopped.wait(BEAT)
            except PeerStopped:
                pass
        return self.reason

    # ------------------------------------------------------------------ the end
    def exit(self, code: int | None = None, line: str | None = None,
             announce: str = "") -> None:
        """Ends this process now. Its line: another process' stop when there was one;
        else `line` (whole, with the command's name); else (the watcher ending a process
        blocked when its own signal came) "stopped by SIGTERM". `code` with no `line`:
        the command has said why already. `announce`: tell the others first (a signal
        the command handled itself, an unexpected error). The cleanups run first. Never
        returns."""
        if announce and self.reason is None:
            self.announce(announce)
        with self._lock:
            first, self._exiting = not self._exiting, True
        if not first:  # another thread is ending the process
            threading.Event().wait()
        if self.reason is not None:
            line, code = f"{self.command}: {self.reason}; {self.kept}", self.code
        elif code is None:
            name = self.signal if self.signal in EXIT_CODES else "SIGTERM"
            line, code = f"{self.command}: stopped by {name}; {self.kept}", EXIT_CODES[name]
        for cleanup in list(self._cleanups.values()):
            try:
                cleanup()
            except Exception:
                pass
        if line:
            print(line, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)
