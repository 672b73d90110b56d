"""dualjax: two-tower retrieval models in JAX/Flax."""

import ctypes
import os


def _keep_freed_memory() -> None:
    """Keeps glibc's malloc from handing large freed buffers back to the kernel.

    XLA on CPU allocates every step's big buffers afresh (a 50,000 x 256 table's gradient,
    Adam's new moments) and frees the old ones. glibc serves blocks that large with mmap
    and returns them with munmap, so each step faults every page of them in again and the
    kernel zeroes it: 38,000 page faults a step for two 50,000 x 256 tables, a quarter of
    the step (BENCHMARKS.md, "dualjax vs PyTorch"). Served from one heap that is never
    trimmed, they are reused instead; the process keeps its peak memory until it exits
    (docs/training.md, "Memory on Linux"). `DUALJAX_MALLOC=default` leaves malloc as it
    is. Runs on import, before jax allocates; a no-op where libc is not glibc.
    """
    if os.environ.get("DUALJAX_MALLOC", "") == "default":
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # <malloc.h>
    mallopt(m_arena_max, 1)  # one heap: a thread's arena unmaps its heaps once they empty
    mallopt(m_mmap_max, 0)  # no block is its own mapping
    mallopt(m_trim_threshold, -1)  # the heap's free top is kept, however large


_keep_freed_memory()


def __getattr__(name: str):
    if name == "Encoder":  # a trained model's serving bundle (dualjax.export); jax on demand
        from dualjax.encoder import Encoder
        return Encoder
    raise AttributeError(f"module 'dualjax' has no attribute {name!r}")
