"""Synthetic typos for robustness training and evaluation (Moscicki 2022, section 4.4,
Algorithm 2).

Typos are added to the *normalised* text (`text.normalize`: lowercase a-z0-9 words
separated by single spaces), which is all the tokenizers ever see; so the output of
`add_typos` is normalised too ("Hello, World!" at p = 0 -> "hello world"). Word count
and order are preserved; only characters inside words change.
"""
from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np

from dualjax.text.words import normalize

Rng = random.Random | np.random.Generator

# Physical QWERTY rows. Each row sits about half a key to the right of the row above,
# so key (row r, column c) touches columns c-1 and c+1 of its own row, columns c and
# c+1 of the row above and columns c-1 and c of the row below (when those are a-z0-9
# keys: punctuation keys such as ';' or ',' are left out).
KEYBOARD_ROWS = ("1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm")

# Probabilities of each kind of typo, given that a word gets one.
SLIP_P, REMOVAL_P, TRANSPOSITION_P = 0.5, 0.25, 0.25


def _neighbours() -> dict[str, str]:
    where = {ch: (r, c) for r, row in enumerate(KEYBOARD_ROWS) for c, ch in enumerate(row)}
    def key(r: int, c: int) -> str:
        ok = 0 <= r < len(KEYBOARD_ROWS) and 0 <= c < len(KEYBOARD_ROWS[r])
        return KEYBOARD_ROWS[r][c] if ok else ""
    return {ch: "".join(key(rr, cc) for rr, cc in ((r - 1, c), (r - 1, c + 1), (r, c - 1),
                                                   (r, c + 1), (r + 1, c - 1), (r + 1, c)))
            for ch, (r, c) in where.items()}


# Each a-z0-9 key -> its neighbouring a-z0-9 keys: above (left, right), same row
# (left, right), below (left, right); e.g. 'a' -> "qwsz", 's' -> "weadzx",
# 'q' -> "12wa", 'p' -> "0ol", 'm' -> "jkn". Symmetric: x is y's neighbour iff y is x's.
QWERTY_NEIGHBOURS: dict[str, str] = _neighbours()


def _uniform(rng: Rng) -> float:
    return float(rng.random())


def _below(rng: Rng, n: int) -> int:
    """A uniform integer in [0, n)."""
    return rng.randrange(n) if isinstance(rng, random.Random) else int(rng.integers(n))


def typo_word(word: str, rng: Rng) -> str:
    """`word` (normalised, length >= 2) with exactly one typo:
      - finger slip (p 0.5): one random character -> a random QWERTY neighbour;
      - removal (p 0.25): one random character deleted;
      - transposition (p 0.25): two random adjacent characters swapped (which leaves
        the word unchanged when they are equal, e.g. the "oo" of "book").
    """
    if len(word) < 2:
        raise ValueError(f"typo_word needs a word of length >= 2, got {word!r}")
    u = _uniform(rng)
    if u < SLIP_P:
        i = _below(rng, len(word))
        options = QWERTY_NEIGHBOURS[word[i]]
        return word[:i] + options[_below(rng, len(options))] + word[i + 1:]
    if u < SLIP_P + REMOVAL_P:
        i = _below(rng, len(word))
        return word[:i] + word[i + 1:]
    i = _below(rng, len(word) - 1)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def add_typos(text: str, p: float, rng: Rng) -> str:
    """`normalize(text)` where each word of length >= 2 independently gets one typo
    (`typo_word`) with probability `p`; shorter words are untouched. Accepts a
    `random.Random` or a `np.random.Generator`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"typo probability must be in [0, 1], got {p}")
    out = []
    for w in normalize(text).split():
        if len(w) >= 2 and _uniform(rng) < p:
            w = typo_word(w, rng)
        out.append(w)
    return " ".join(out)


def typo_texts(texts: Iterable[str], p: float, seed: int) -> list[str]:
    """`add_typos` of every text with one `random.Random(seed)` drawn in order: the same
    texts, p and seed always give the same output."""
    rng = random.Random(seed)
    return [add_typos(t, p, rng) for t in texts]
