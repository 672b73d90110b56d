"""jax's coordination service for a multi-process command, in a process of its own beside
process 0, so that process 0's death does not take it down (`runtime/peers.py` says why).

    python -m dualjax.runtime.coordinator BIND_ADDRESS NUM_PROCESSES PARENT_PID LINGER

Prints "ready" once it serves (or "error: ..." and exits 1), then serves until its
parent (process 0) has ended and LINGER more seconds have passed: long enough for the
other processes to learn from their watchers that process 0 is gone. It ignores SIGINT
and SIGTERM, which the processes of the command handle (a Ctrl-C in a terminal reaches
the whole process group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

HEARTBEAT_S = 100  # jax's own: the watchers notice a dead process long before
SHUTDOWN_S = 300


def start(bind_address: str, num_processes: int, linger: float) -> subprocess.Popen:
    """Starts the service beside this process (process 0) and waits until it serves.

    Raises:
      OSError: it could not serve at `bind_address` (what it said).
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "dualjax.runtime.coordinator", bind_address,
         str(num_processes), str(os.getpid()), str(linger)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, text=True)
    assert child.stdout is not None  # stdout=PIPE
    said = child.stdout.readline().strip()
    child.stdout.close()
    if said != "ready":
        child.wait()
        raise OSError(said.removeprefix("error: ") or f"it ended with status {child.returncode}")
    return child


class Elsewhere:
    """What jax keeps as process 0's service when the service runs in its own process:
    jax only shuts it down at exit, and the service process ends by itself."""

    def shutdown(self) -> None:
        pass


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    address, count, parent, linger = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                      float(sys.argv[4]))
    from jax._src.lib import _jax
    try:
        service = _jax.get_distributed_runtime_service(
            address, count, heartbeat_timeout=HEARTBEAT_S, shutdown_timeout=SHUTDOWN_S)
    except Exception as e:  # (a port taken in between is a crash, not this: see cli.py)
        print(f"error: {e}", flush=True)
        sys.exit(1)
    print("ready", flush=True)
    while os.getppid() == parent:
        time.sleep(0.5)
    time.sleep(linger)
    del service
    os._exit(0)


if __name__ == "__main__":
    main()
