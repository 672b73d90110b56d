"""Host and device at work at once (`runtime/pipeline.py`): the host prepares the next
jobs while the device runs this one, results are read back in order, one device's lag
per device, and an error of either side is raised where it belongs."""

import threading
import time

import pytest

from dualjax.runtime.pipeline import Timings, overlapped, prefetched


def test_the_next_job_is_prepared_before_this_ones_result_is_read():
    """The order that makes host and device overlap: job n+1's preparation has started
    (in the worker thread) before job n's result is read back; each result is taken
    after `lag` more jobs are dispatched, in job order, every one of them."""
    log, lock = [], threading.Lock()

    def note(*event):
        with lock:
            log.append(event)

    def prepare(n):
        note("prepare", n)
        time.sleep(0.01)
        return n * 10

    timings = Timings()
    overlapped(range(6), prepare, lambda n, x: note("run", n) or x,
               lambda n, y: note("take", n, y), ahead=2, lag=1, timings=timings)
    at = {e: i for i, e in enumerate(log)}
    assert [e for e in log if e[0] == "take"] == [("take", n, n * 10) for n in range(6)]
    for n in range(5):
        assert at[("prepare", n + 1)] < at[("take", n, n * 10)]  # overlapped
        assert at[("run", n + 1)] < at[("take", n, n * 10)]      # one job in flight ahead
    assert timings.jobs == 6 and timings.prepare >= 0.05


def test_several_devices_keep_one_job_in_flight_each():
    log = []
    overlapped(range(8), lambda n: n, lambda n, x: log.append(("run", n)),
               lambda n, y: log.append(("take", n)), ahead=4, lag=3)
    for n in range(5):  # job n is read back once jobs n+1..n+3 are dispatched
        assert log.index(("run", n + 3)) < log.index(("take", n))
    assert [e for e in log if e[0] == "take"] == [("take", n) for n in range(8)]


def test_an_error_while_preparing_or_taking_is_raised_to_the_caller():
    def prepare(n):
        if n == 3:
            raise ValueError("text 3 is bad")
        return n

    taken = []
    with pytest.raises(ValueError, match="text 3 is bad"):
        overlapped(range(10), prepare, lambda n, x: x, lambda n, y: taken.append(n))
    assert taken == [0, 1]  # what was run before it was stored; nothing after

    def take(n, y):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        overlapped(range(3), lambda n: n, lambda n, x: x, take)


def test_prefetched_items_come_in_order_and_a_producer_error_where_its_item_would():
    assert list(prefetched(iter(range(100)), depth=3)) == list(range(100))

    def items():
        yield 1
        yield 2
        raise KeyError("line 3")

    got = []
    with pytest.raises(KeyError, match="line 3"):
        for x in prefetched(items()):
            got.append(x)
    assert got == [1, 2]
    stopped = prefetched(iter(range(10 ** 6)), depth=2)  # a consumer that stops early
    assert next(stopped) == 0
    stopped.close()


def test_two_workers_prepare_at_once_and_results_keep_the_job_order():
    """`workers` threads prepare jobs side by side (one's Python part beside the other's
    tokenizer call); a job whose preparation ends first is still run and taken in job
    order."""
    def preparing(both: threading.Barrier):  # passes only while two preparations overlap
        def prepare(n):
            if n < 2:
                both.wait()
                time.sleep(0.05 if n == 0 else 0)  # job 1 ready before job 0
            return n
        return prepare

    taken = []
    overlapped(range(6), preparing(threading.Barrier(2, timeout=5)), lambda n, x: x,
               lambda n, y: taken.append((n, y)), ahead=4, workers=2)
    assert taken == [(n, n) for n in range(6)]
    with pytest.raises(threading.BrokenBarrierError):  # one worker: never two at once
        overlapped(range(2), preparing(threading.Barrier(2, timeout=0.3)), lambda n, x: x,
                   lambda n, y: None, workers=1)


def test_background_work_gives_its_value_or_its_error_to_the_caller():
    from dualjax.runtime.pipeline import Background
    assert Background(lambda: 42, "answer").result() == 42

    def fails():
        raise ValueError("data.path: line 3 is bad")

    with pytest.raises(ValueError, match="line 3 is bad"):
        Background(fails, "fails").result()
