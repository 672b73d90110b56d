"""dualjax sets glibc's malloc so that large freed buffers are reused, not handed back to
the kernel and faulted in again, for the towers where that pays (dualjax/runtime/malloc.py)."""

import os
import subprocess
import sys

import pytest

# Allocates a 64 MiB buffer with malloc, writes every page and frees it, 6 times after a
# first one; prints the page faults of those 6.
PROGRAM = """
import ctypes
import resource
import sys
from dualjax.runtime import malloc
malloc.for_tower(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def buffer():
    p = libc.malloc(64 << 20)
    ctypes.memset(p, 1, 64 << 20)
    libc.free(p)
buffer()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    buffer()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(malloc: str, tower: str = "bow") -> int:
    env = {**os.environ, "DUALJAX_MALLOC": malloc}
    out = subprocess.run([sys.executable, "-c", PROGRAM, tower], env=env, capture_output=True,
                         text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="glibc only")
def test_freed_buffers_are_reused_for_table_towers_unless_malloc_is_left_as_is():
    pages = 6 * (64 << 20) // 4096  # every page of the six buffers
    assert faults("default") > pages // 2  # each buffer mapped afresh and faulted in
    assert faults("") < pages // 20  # the first buffer's memory, reused
    # The BERT-family towers keep malloc as it is: a heap that is never trimmed doubled
    # their peak memory, with no gain in speed.
    assert faults("", "bert") > pages // 2
