"""Tests for dualjax.text.typos: the QWERTY map and the statistics of Algorithm 2."""
import collections
import itertools
import math
import random

import numpy as np
import pytest

from dualjax.text.typos import QWERTY_NEIGHBOURS, add_typos, typo_texts, typo_word
from dualjax.text.words import normalize


def classify(orig: str, new: str) -> str:
    """Which single typo turns `orig` into `new` ("same" / "other" if none)."""
    if new == orig:
        return "same"
    if len(new) == len(orig) - 1 and any(orig[:i] + orig[i + 1:] == new
                                         for i in range(len(orig))):
        return "removal"
    if len(new) == len(orig):
        diff = [i for i in range(len(orig)) if orig[i] != new[i]]
        if len(diff) == 1 and new[diff[0]] in QWERTY_NEIGHBOURS[orig[diff[0]]]:
            return "slip"
        if (len(diff) == 2 and diff[1] == diff[0] + 1
                and (new[diff[0]], new[diff[1]]) == (orig[diff[1]], orig[diff[0]])):
            return "transposition"
    return "other"


def _no_repeat_words(n: int, seed: int) -> list[str]:
    """Random a-z0-9 words of length 2..9 with no two equal adjacent characters, so that
    every typo changes the word."""
    rng, alphabet, out = random.Random(seed), "abcdefghijklmnopqrstuvwxyz0123456789", []
    while len(out) < n:
        w = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))
        if all(a != b for a, b in itertools.pairwise(w)):
            out.append(w)
    return out


def _within(observed: float, expected: float, n: int, sigmas: float = 4.0) -> bool:
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("key, neighbours", [
    ("a", "qwsz"), ("s", "weadzx"), ("q", "12wa"), ("p", "0ol"),
    ("m", "jkn"), ("g", "tyfhvb"), ("1", "2q"), ("0", "9op"), ("z", "asx"), ("l", "kop"),
])
def test_neighbours_are_physical_qwerty(key, neighbours):
    assert set(QWERTY_NEIGHBOURS[key]) == set(neighbours)


def test_neighbour_map_is_symmetric_and_covers_a_z_0_9():
    assert set(QWERTY_NEIGHBOURS) == set("abcdefghijklmnopqrstuvwxyz0123456789")
    for key, near in QWERTY_NEIGHBOURS.items():
        assert key not in near and len(near) == len(set(near)) >= 2
        assert all(key in QWERTY_NEIGHBOURS[n] for n in near)


def test_change_rate_and_typo_mix():
    words = _no_repeat_words(20_000, seed=1)
    texts = [" ".join(words[i:i + 10]) for i in range(0, len(words), 10)]
    out = typo_texts(texts, p=0.5, seed=7)
    new_words = " ".join(out).split()
    assert len(new_words) == len(words)  # word count and order preserved
    kinds = collections.Counter(classify(a, b) for a, b in zip(words, new_words, strict=True))
    assert kinds["other"] == 0  # every change is exactly one of the three typos
    changed = len(words) - kinds["same"]
    assert _within(changed / len(words), 0.5, len(words))
    for kind, share in (("slip", 0.5), ("removal", 0.25), ("transposition", 0.25)):
        assert _within(kinds[kind] / changed, share, changed), (kind, kinds)


def test_transposing_equal_letters_leaves_the_word_unchanged():
    rng = random.Random(3)
    n = 4000
    same = sum(typo_word("aa", rng) == "aa" for _ in range(n))
    assert _within(same / n, 0.25, n)  # only the transposition branch keeps "aa"


def test_numpy_generator_works_and_p_one_changes_every_long_word():
    words = _no_repeat_words(500, seed=2)
    text = " ".join(w + " x" for w in words)  # interleave one-letter words
    out = add_typos(text, 1.0, np.random.default_rng(0)).split()
    assert out[1::2] == ["x"] * len(words)  # short words untouched
    assert all(classify(a, b) in ("slip", "removal", "transposition")
               for a, b in zip(words, out[0::2], strict=False))
    assert add_typos(text, 1.0, np.random.default_rng(0)) == " ".join(out)


def test_p_zero_only_normalises():
    texts = ["Hello, World!", "  The quick  brown fox ", "", "Café 42"]
    assert typo_texts(texts, p=0.0, seed=0) == [normalize(t) for t in texts]
    assert typo_texts(texts, p=0.0, seed=0)[0] == "hello world"


def test_deterministic_by_seed():
    texts = [" ".join(_no_repeat_words(20, seed=s)) for s in range(10)]
    first = typo_texts(texts, p=0.3, seed=11)
    assert first == typo_texts(iter(texts), p=0.3, seed=11)
    assert first != typo_texts(texts, p=0.3, seed=12)
    assert first != texts


def test_invalid_arguments():
    with pytest.raises(ValueError):
        add_typos("abc", 1.5, random.Random(0))
    with pytest.raises(ValueError):
        add_typos("abc", -0.1, random.Random(0))
    with pytest.raises(ValueError):
        typo_word("a", random.Random(0))
