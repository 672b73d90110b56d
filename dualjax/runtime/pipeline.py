"""Host and device at work at once: while the device runs batch n, the host prepares
batch n+1 (reads, tokenizes, pads) and reads back and stores the vectors of batch n-1.

jax dispatches a computation and returns at once; only reading its result waits. A loop
that prepares a batch, runs it and reads it back before preparing the next makes host
and device take turns, each idle half the time. `overlapped` runs `prepare` in
`HOST_WORKERS` worker threads up to `ahead` jobs in advance (the tokenizers library and
numpy release the GIL while they work), dispatches each job's device work in order, and
reads a job's result back only once `lag` later jobs are dispatched (one per device when
several take turns).

Two workers, not one: a batch's preparation is the tokenizer's call, which fills every
core in its own threads, then Python's part (lowercasing before it, reading the ids and
padding after), which holds one core. With one worker the other cores idle during
Python's part; with two, one worker's Python part runs beside the other's tokenizer
call. Preparing several jobs ahead also keeps the host at work while the device's
program for a new length bucket compiles (BENCHMARKS.md, "Corpus encoding, static
tower").

Every corpus encoding goes through it: evaluation, `dualjax.index`, the bundle's
`Encoder`, the teacher's pass and the pseudo-labels.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import jax

HOST_WORKERS = 2  # threads preparing jobs (see above)
AHEAD = 4  # jobs prepared in advance

T = TypeVar("T")
J = TypeVar("J")  # a job: what to encode (row indices, a device)
P = TypeVar("P")  # a job prepared by the host (token ids, masks)


@dataclasses.dataclass
class Timings:
    """Where an `overlapped` run's time went, in seconds: the host preparing jobs (in its
    worker thread), dispatching them, and storing results (in the caller's thread); the
    caller waiting for a preparation (the host is the bottleneck) or for a device result
    (the device is)."""
    prepare: float = 0.0
    dispatch: float = 0.0
    store: float = 0.0
    wait_host: float = 0.0
    wait_device: float = 0.0
    jobs: int = 0

    def add(self, other: Timings) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return {f.name: round(getattr(self, f.name), 3) for f in dataclasses.fields(self)}


def overlapped(jobs: Iterable[J], prepare: Callable[[J], P], run: Callable[[J, P], Any],
               take: Callable[[J, Any], None], ahead: int = AHEAD, lag: int = 1,
               timings: Timings | None = None, workers: int = HOST_WORKERS) -> None:
    """prepare(job) on the host, run(job, prepared) on the device (dispatched, not
    waited for), take(job, result) once `lag` more jobs are dispatched, for every job,
    in order; everything taken before it returns.

    Args:
      jobs: the jobs, in the order they are run and taken.
      prepare: host work of one job, run in a worker thread, at most `ahead` jobs early;
        called from `workers` threads at once, so it must not share mutable state.
      run: dispatches a prepared job (returns without waiting for the device).
      take: reads a job's result back (waits for it) and stores it.
      ahead: jobs prepared in advance (>= 1).
      lag: jobs dispatched before a result is read back (>= 1; the number of devices
        taking turns, so that each has one in flight).
      timings: where the time went is added to it (the bench's split of host, device
        and waiting); `prepare` is the sum of the workers' seconds.
      workers: threads preparing jobs (>= 1).
    """
    jobs = iter(jobs)
    t = timings if timings is not None else Timings()
    clock = time.perf_counter

    lock = threading.Lock()

    def timed_prepare(job: J) -> P:
        start = clock()
        try:
            return prepare(job)
        finally:
            with lock:
                t.prepare += clock() - start

    def finish(job: J, result: Any) -> None:
        start = clock()
        jax.block_until_ready(result)
        middle = clock()
        take(job, result)
        t.wait_device += middle - start
        t.store += clock() - middle
        t.jobs += 1

    ready: collections.deque = collections.deque()  # (job, future of its preparation)
    running: collections.deque = collections.deque()  # (job, its dispatched result)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, ahead)),
                                               thread_name_prefix="prepare") as pool:
        def fill() -> None:
            while len(ready) < ahead:
                try:
                    job = next(jobs)
                except StopIteration:
                    return
                ready.append((job, pool.submit(timed_prepare, job)))
        try:
            fill()
            while ready:
                job, prepared = ready.popleft()
                fill()  # the next job's preparation starts before this one runs
                start = clock()
                args = prepared.result()
                middle = clock()
                running.append((job, run(job, args)))
                t.wait_host += middle - start
                t.dispatch += clock() - middle
                while len(running) > lag:
                    finish(*running.popleft())
            while running:
                finish(*running.popleft())
        finally:
            for _, prepared in ready:
                prepared.cancel()


def prefetched(items: Iterable[J], depth: int = 1) -> Iterator[J]:
    """`items`, produced in a worker thread up to `depth` ahead of their consumer (a
    file read and parsed while the previous block is encoded). An error of the producer
    is raised where its item would have come."""
    queue_: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        queue_.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            queue_.put((_END, None))
        except BaseException as e:  # said where the consumer reads it
            queue_.put((_END, e))

    worker = threading.Thread(target=produce, name="prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = queue_.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()


_END = object()


class Background(Generic[T]):
    """`fn()` run in a thread from now on: `result()` waits for it and returns its value,
    or raises its error there, in the caller's thread; `done()` says whether it would
    wait. The thread is a daemon: a run that fails before asking for the result does not
    wait for it to end. (A run tokenizes its training pairs this way while its model is
    built and compiled, and while its first steps train: `data.pipeline.ReadPairs`.)"""

    def __init__(self, fn: Callable[[], T], name: str):
        self._done = threading.Event()
        self._value: list[T] = []
        self._error: list[BaseException] = []

        def work() -> None:
            try:
                self._value.append(fn())
            except BaseException as e:  # raised by result(), where it is asked for
                self._error.append(e)
            finally:
                self._done.set()

        threading.Thread(target=work, name=name, daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> T:
        self._done.wait()
        if self._error:
            raise self._error[0]
        return self._value[0]

    def then(self, fn: Callable[[T], Any]) -> Later:
        """`fn` of the result, as the result of a `Later` (in no thread of its own)."""
        return Later(self, fn)


class Later:
    """`fn(background.result())`, asked for like the Background itself (`done`,
    `result`): one task's part of what a Background makes for several."""

    def __init__(self, background: Background, fn: Callable[[Any], Any]):
        self._background, self._fn = background, fn

    def done(self) -> bool:
        return self._background.done()

    def result(self) -> Any:
        return self._fn(self._background.result())
