"""dualjax.runtime.progress: off a terminal, a long stage logs its count and rate."""
import logging

from dualjax.runtime.progress import Progress


def test_progress_logs_count_and_rate_off_a_terminal(caplog):
    caplog.set_level(logging.INFO)
    with Progress(10, "pseudo-labels", "text", every=0.0) as bar:  # tests: not a terminal
        assert bar.bar.disable
        bar.update(4)
        bar.update(6)
    lines = [r.getMessage() for r in caplog.records if "pseudo-labels" in r.getMessage()]
    assert lines[0].startswith("pseudo-labels: 4/10 texts, ") and lines[0].endswith("/s")
    assert lines[-1].startswith("pseudo-labels: 10/10 texts, ")
    caplog.clear()
    with Progress(10, "quiet", every=3600.0) as bar:  # within the interval: no line
        bar.update(10)
    assert not [r for r in caplog.records if "quiet" in r.getMessage()]


def test_a_bar_starts_no_thread_a_signal_could_land_in():
    """tqdm's monitor thread, started by the first bar: a SIGTERM that landed while it
    started became "release unlocked lock", swallowed with a TqdmMonitorWarning (seen
    in the SIGTERM test of a two-process index). A fresh process, so that no other
    bar of the session started one first."""
    import subprocess
    import sys
    code = ("import threading; from dualjax.runtime.progress import Progress; "
            "before = set(threading.enumerate()); p = Progress(None, 'x'); p.update(1); "
            "print(sorted(t.name for t in set(threading.enumerate()) - before)); p.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
