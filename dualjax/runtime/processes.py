"""A multi-host run is one program per host (jax.distributed): process 0 prepares data and
writes the workdir's files; the others read what it wrote; every decision that changes
which collectives run next is process 0's (`agree`), so no process waits on the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from dualjax.errors import PeerStopped, WorkdirError
from dualjax.runtime import peers

T = TypeVar("T")


def is_main() -> bool:
    """Whether this process writes the workdir's files (process 0)."""
    import jax
    return jax.process_index() == 0


def _not_stopping() -> None:
    """PeerStopped instead of a collective that a process that is gone would never join."""
    if peers.leaving():
        raise PeerStopped(peers.leaving())


def agree(flag: bool) -> bool:
    """Process 0's `flag`, in every process (a collective: all processes call it)."""
    import jax
    if jax.process_count() == 1:
        return flag
    _not_stopping()
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))


def any_process(flag: bool) -> bool:
    """Whether `flag` holds in any process (a collective: all processes call it)."""
    import jax
    if jax.process_count() == 1:
        return flag
    _not_stopping()
    from jax.experimental import multihost_utils
    return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))


def gather(value: Any) -> list[Any]:
    """`value` (small, JSON-serialisable) of every process, in process order (a
    collective: all processes call it)."""
    import jax
    if jax.process_count() == 1:
        return [value]
    _not_stopping()
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(len(data)))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:len(data)] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(rows[i, :n].tobytes()) for i, n in enumerate(sizes)]


def main_first(fn: Callable[[], T]) -> T:
    """fn() in process 0, then in the others (which then read what it wrote, a dataset
    or a vocabulary); if it fails in process 0, the others stop too, with one line."""
    import jax
    if jax.process_count() == 1:
        return fn()
    if is_main():
        try:
            out = fn()
        except BaseException:
            agree(False)
            raise
        agree(True)
        return out
    if not agree(False):
        raise WorkdirError("process 0 stopped (its log says why); this process stops too")
    return fn()
