"""glibc's malloc set to keep large freed buffers for reuse, for the runs it speeds up.

XLA on CPU allocates every step's big buffers afresh (a 50,000 x 256 table's gradient,
Adam's new moments) and frees the old ones. glibc serves blocks that large with mmap and
returns them with munmap, so each step faults every page of them in again and the kernel
zeroes it: 38,000 page faults a step for two 50,000 x 256 tables, a quarter of the step
(BENCHMARKS.md, "dualjax vs PyTorch"). Served from one heap that is never trimmed, they
are reused instead; but the process then keeps its peak memory until it exits, and the
one heap fragments: a MiniLM step at 64 x 256 tokens held twice the memory with no gain
in speed (BENCHMARKS.md, "Adapting MiniLM"). So it is set only for the towers where it
was measured to pay (`PAYS_FOR`), by the training run, before its state is allocated
(docs/training.md, "Memory on Linux").
"""

from __future__ import annotations

import ctypes
import os

# Towers whose steps it speeds up: the bag-of-words tables 1.5x, the small Transformer
# 1.3x (BENCHMARKS.md, "dualjax vs PyTorch"). Not the BERT-family towers.
PAYS_FOR = ("bow", "bow_mlp", "transformer")


def keep_freed_memory() -> bool:
    """Sets glibc's malloc to reuse large freed buffers; True if it did. A no-op where
    libc is not glibc, and with `DUALJAX_MALLOC=default` in the environment."""
    if os.environ.get("DUALJAX_MALLOC", "") == "default":
        return False
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # <malloc.h>
    mallopt(m_arena_max, 1)  # one heap: a thread's arena unmaps its heaps once they empty
    mallopt(m_mmap_max, 0)  # no block is its own mapping
    mallopt(m_trim_threshold, -1)  # the heap's free top is kept, however large
    return True


def for_tower(tower: str) -> bool:
    """`keep_freed_memory()` if `tower` (model.tower) is one it pays for; True if set."""
    return tower in PAYS_FOR and keep_freed_memory()
