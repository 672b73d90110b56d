"""The order in which training pairs are read: every epoch a new seeded permutation.

The records at positions [start, start + count) of the endless stream are those of
grain's `MapDataset.range(n).shuffle(seed).repeat()`, which dualjax used to read one at a
time in Python, slower than the bag-of-words step leaves to the input thread
(BENCHMARKS.md, "Figures behind design choices"): epoch e visits record
`index_shuffle(i, n - 1, seed + e)` at its i-th position, where `index_shuffle` is
grain's cycle-walking Simon cipher (four rounds, keys from `std::seed_seq{seed}`), here
computed for a whole batch at once with numpy. The
batches, and so the data position a checkpoint stores, are the ones grain's would be
(tests/data/test_data_pipeline.py checks against `grain.experimental.index_shuffle`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

_U32 = 0xFFFFFFFF


def stream(start: int, count: int, n: int, seed: int) -> np.ndarray:
    """int64 [count]: the record indices at positions start, ..., start + count - 1 of the
    stream that visits n records in a new order every epoch (but see `index_shuffle` for
    n = 4^k + 1, k >= 8: one record is read twice an epoch and one never, as with grain)."""
    position = np.arange(start, start + count, dtype=np.int64)
    epoch, within = np.divmod(position, n)
    out = np.empty(count, np.int64)
    for e in np.unique(epoch):
        at = epoch == e
        out[at] = index_shuffle(within[at], n - 1, (seed + int(e)) & _U32)
    return out


def index_shuffle(index: np.ndarray, max_index: int, seed: int, rounds: int = 4) -> np.ndarray:
    """int64: where each of `index` (in [0, max_index]) goes in a seeded permutation of
    [0, max_index]: grain's `index_shuffle`, element for element. It encrypts the index
    with a block cipher on ceil(log2(max_index)) bits rounded up to even, at least 16, and
    again while the result is past max_index (cycle walking). Like grain's, it is not a
    permutation where max_index is 4^k, k >= 8 (n = 65,537, 262,145, ...): those bits
    cannot hold max_index itself, which is truncated and lands where 0 does."""
    index = np.asarray(index, np.int64)
    if max_index == 0:
        return np.zeros(index.shape, np.int64)
    bits = math.ceil(math.log2(max_index))
    bits = max(bits + bits % 2, 16)
    if max_index < 2 ** 15:  # a 16-bit block: walks of 65,536 / (max_index + 1) steps
        return _small_permutation(max_index, seed, rounds)[index]
    keys = _seed_seq(seed, rounds)
    out = index.astype(np.uint64)
    todo = np.ones(index.shape, bool)  # a block of at most 4 x max_index: short walks
    while todo.any():
        out[todo] = _encrypt(out[todo], bits // 2, keys)
        todo = out > np.uint64(max_index)
    return out.astype(np.int64)


@functools.lru_cache(maxsize=4)
def _small_permutation(max_index: int, seed: int, rounds: int) -> np.ndarray:
    """The whole cycle-walked permutation of [0, max_index] on the 16-bit block: where each
    start's chain through the cipher first comes back into range, by pointer jumping
    (each pass skips twice as many out-of-range values), ~17 passes over 65,536."""
    after = _encrypt(np.arange(2 ** 16, dtype=np.uint64), 8, _seed_seq(seed, rounds))
    after = after.astype(np.int64)
    while True:
        out = after > max_index
        if not out[:max_index + 1].any():
            return after[:max_index + 1]
        after[out] = after[after[out]]


def _encrypt(x: np.ndarray, w: int, keys: list[int]) -> np.ndarray:
    """grain's Simon cipher on blocks of 2w bits, with round keys `keys` (`_seed_seq`)."""
    mask = np.uint64((1 << w) - 1)
    masked = [np.uint64(k) & mask for k in keys]

    def rotl(v, r):
        return ((v << np.uint64(r)) | (v >> np.uint64(w - r))) & mask

    def f(v):
        return (rotl(v, 1) & rotl(v, 8)) ^ rotl(v, 2)

    left, right = (x >> np.uint64(w)) & mask, x & mask
    for i in range(0, len(keys), 2):
        left = left ^ f(right) ^ masked[i]
        right = right ^ f(left) ^ masked[i + 1]
    return (left << np.uint64(w)) | right


def _seed_seq(seed: int, n: int) -> list[int]:
    """`std::seed_seq{seed}.generate` of n 32-bit words (C++ [rand.util.seedseq])."""
    b = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q, m = p + t, max(2, n)  # m = max(len(seeds) + 1, n), one seed

    def mix(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = 1664525 * mix(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n]) & _U32
        r2 = r1 + (1 if k == 0 else k % n + seed if k == 1 else k % n) & _U32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & _U32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & _U32
        b[k % n] = r2
    for k in range(m, m + n):
        r3 = 1566083941 * mix((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & _U32) & _U32
        r4 = (r3 - k % n) & _U32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return b
