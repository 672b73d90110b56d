"""Text normalisation, a word tokenizer with hashed OOV buckets, and vocab save/load.

Pure Python + numpy (no jax), so it can run inside data-loading workers.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from dualjax.runtime.files import atomic_write

PAD_ID = 0
_NON_ALNUM = re.compile(r"[^a-z0-9]+")
# bytes.translate to a-z0-9 and spaces: `normalize`'s ASCII path, faster than
# _NON_ALNUM.sub on long texts (BENCHMARKS.md, issue 46)
_ASCII_WORDS = bytes(c if chr(c).isascii() and chr(c) in "abcdefghijklmnopqrstuvwxyz0123456789"
                     else 32 for c in range(256))
_ASCII_WORD_CHAR = re.compile(r"[A-Za-z0-9]")
# Combining marks folded away with the accents (Unicode category Mn in these blocks:
# Latin/Greek/Cyrillic accents, Hebrew points, Arabic harakat: marks a word is also
# written without). Other scripts' marks (Devanagari's vowel signs...) stay in the word.
_FOLDED = "\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f" \
          "\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
_COMBINING = re.compile(f"[{_FOLDED}]")
# CJK ideographs and kana: each is a word alone (no spaces between words in those
# scripts), as BERT's BasicTokenizer and Lucene's StandardTokenizer cut them.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
_CJK_CHAR = re.compile(f"[{CJK}]")
FORMAT_VERSION = 1  # of every saved tokenizer JSON
# The forms of `normalize`: "unicode" (letters, digits and marks of every script) and
# "ascii" (a-z0-9 only: every tokenizer saved before "normalizer" was recorded).
NORMALIZERS = ("unicode", "ascii")


class _Separators(dict):
    """A `str.translate` table: every character that is not a word character -> a space.
    Word characters are Unicode letters and digits (categories L, N; "_" is not one)
    and the marks (M) that are not folded away (Devanagari's vowel signs are part of its
    words); `keep` are kept as they are too. Filled as characters are first met."""

    def __init__(self, keep: str = ""):
        super().__init__()
        self.keep = keep

    def __missing__(self, code: int) -> int:
        c = chr(code)
        word = c != "_" and (c.isalnum() or c in self.keep or (
            unicodedata.category(c)[0] == "M" and not _COMBINING.match(c)))
        self[code] = code if word else 32
        return self[code]


@functools.cache
def separators(keep: str = "") -> _Separators:
    """The `_Separators` table that also keeps the characters of `keep`."""
    return _Separators(keep)


# Data preparation normalises one text in several places (the pairs file, its clusters,
# the splits, the batches' text ids), and a collection repeats its documents (SQuAD: each
# paragraph with each of its questions), so most calls repeat one (the count and its cost:
# BENCHMARKS.md, "Figures behind design choices"). Each result is kept for the next time
# the same string comes: a bounded cache of strings the caller holds anyway.
@functools.lru_cache(maxsize=1 << 17)
def normalize(text: str, form: str = "unicode") -> str:
    """Canonical form of `text` used before splitting into words.

    form="unicode": casefold (lowercase, also "ß" -> "ss"); Unicode NFKD, accents and
    the other optional marks dropped (`_FOLDED`), then NFC; each CJK ideograph or kana
    spaced as a word of its own; every run of characters that are not letters, digits
    or marks of any script (punctuation, whitespace, symbols, emoji) becomes one space;
    stripped. "What's up?" -> "what s up", "Café Über" -> "cafe uber", "Москва, 2024"
    -> "москва 2024", "北京大学" -> "北 京 大 学", "हिन्दी!" -> "हिन्दी", "🙂?!" -> "".
    form="ascii": the same on a-z0-9, every other character a space ("Москва" -> "");
    the form of tokenizers saved before the form was recorded.
    """
    folded = text.casefold()
    if folded.isascii():  # the fast path, the same in both forms
        return " ".join(folded.encode("ascii").translate(_ASCII_WORDS).decode("ascii").split())
    folded = _COMBINING.sub("", unicodedata.normalize("NFKD", folded)).lower()
    if form == "ascii":
        return _NON_ALNUM.sub(" ", folded).strip()
    check_normalizer(form)
    folded = _CJK_CHAR.sub(r" \g<0> ", unicodedata.normalize("NFC", folded))
    return " ".join(folded.translate(separators()).split())


_MARKER = re.compile(r"\[[^\]]*\]")  # Wikipedia's "[citation needed]", "[note 1]", "[3]"


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of `text` as [start, end) character spans, whitespace excluded.

    Split by `sentencex` (Wikimedia's rule-based segmenter, maintained on PyPI); chosen
    over pysbd, blingfire, syntok, sentence-splitter, spaCy's sentencizer and punkt
    because on SQuAD v1.1 dev it cuts the fewest answers in two, keeps chemical formulas
    ("O\n2") whole and is fast on whole collections (the figures: BENCHMARKS.md,
    "Figures behind design choices"). A piece without letters, or only bracketed markers ("[citation
    needed]"), is joined to the sentence before it.
    """
    import sentencex  # here: only sentence-level readers need it
    spans: list[tuple[int, int]]
    spans, pos = [], 0
    for segment in sentencex.segment("en", text):
        start = pos + len(segment) - len(segment.lstrip())
        end = pos + len(segment.rstrip())
        pos += len(segment)
        if end <= start:
            continue
        piece = _MARKER.sub("", text[start:end])
        if spans and not any(ch.isalpha() for ch in piece):
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def has_word(text: str) -> bool:
    """Whether `normalize(text)` keeps anything (a letter, digit or mark of any script);
    an ASCII text is only searched for one, not normalised."""
    if text.isascii():
        return _ASCII_WORD_CHAR.search(text) is not None
    return bool(normalize(text))


def words(text: str, form: str = "unicode") -> list[str]:
    """The normalised words of `text` (`normalize(text, form).split()`); may be empty."""
    return normalize(text, form).split()


def _stable_hash(word: str) -> int:
    """Process-independent hash of a word: CRC-32 of its UTF-8 bytes (unsalted)."""
    return zlib.crc32(word.encode("utf-8"))


def read_tokenizer_json(path: str | os.PathLike) -> dict:
    """The JSON object of a saved tokenizer; errors name the path."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"tokenizer file not found: {os.fspath(path)}") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read tokenizer file {os.fspath(path)}: {e}") from e
    if not isinstance(payload, dict):
        raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: not a JSON object")
    return payload


def check_header(payload: dict[str, Any], kind: str) -> None:
    """ValueError unless a saved tokenizer's JSON is of `kind` and this format version."""
    if payload.get("type") != kind or payload.get("version") != FORMAT_VERSION:
        raise ValueError(f"expected type/version {kind!r}/{FORMAT_VERSION}, got "
                         f"{payload.get('type')!r}/{payload.get('version')!r}")


def check_normalizer(form: str) -> None:
    if form not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {form!r}; known: {', '.join(NORMALIZERS)}")


def saved_normalizer(payload: dict[str, Any]) -> str:
    """A saved tokenizer's `normalize` form: "ascii" for files from before it was
    recorded, so their texts still split as they were trained."""
    form = payload.get("normalizer", "ascii")
    check_normalizer(form)
    return form


def str_list(value: Any, key: str) -> tuple[str, ...]:
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{key!r} is not a list of strings")
    return tuple(value)


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Writes `payload` atomically (a temporary file, then a rename): a run killed while
    saving leaves the old file or the new one, never a truncated one."""
    atomic_write(path, json.dumps(payload, ensure_ascii=True))


@dataclasses.dataclass(frozen=True)
class WordTokenizer:
    """Maps normalised words to integer ids.

    Id layout (N = len(vocab), M = num_oov_buckets):
      0            padding (never produced for a real token)
      1 .. N       vocab words, in `vocab` order (most frequent first)
      N+1 .. N+M   OOV buckets: an unknown word w gets N + 1 + crc32(w) % M
      N+1          if M == 0, the single shared "unk" id for every unknown word
    so `vocab_size` (embedding rows) is 1 + N + max(M, 1).
    """

    TYPE: ClassVar[str] = "word"  # the saved JSON's "type"
    vocab: tuple[str, ...]
    num_oov_buckets: int
    normalizer: str = "unicode"  # `normalize`'s form

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab", tuple(self.vocab))
        check_normalizer(self.normalizer)
        if self.num_oov_buckets < 0:
            raise ValueError(f"num_oov_buckets must be >= 0, got {self.num_oov_buckets}")
        if len(set(self.vocab)) != len(self.vocab):
            raise ValueError("vocab contains duplicate words")

    @property
    def vocab_size(self) -> int:
        """Total number of ids / embedding rows: 1 + N + max(M, 1)."""
        return 1 + len(self.vocab) + max(self.num_oov_buckets, 1)

    @functools.cached_property
    def _word_to_id(self) -> dict[str, int]:
        return {w: i + 1 for i, w in enumerate(self.vocab)}

    def _oov_id(self, word: str) -> int:
        first = len(self.vocab) + 1
        if self.num_oov_buckets == 0:
            return first
        return first + _stable_hash(word) % self.num_oov_buckets

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids (each in [1, vocab_size)) of the normalised words of `text`."""
        table = self._word_to_id
        return [table.get(w) or self._oov_id(w) for w in words(text, self.normalizer)]

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch-encode `texts` to fixed length.

        Returns (ids, mask): ids int32 [n, max_len], truncated to the first `max_len`
        words and right-padded with 0; mask bool [n, max_len], True on real tokens.
        A text with no words gives an all-padding row (mask all False).
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        ids = np.zeros((len(texts), max_len), dtype=np.int32)
        for row, text in enumerate(texts):
            toks = self.token_ids(text)[:max_len]
            ids[row, : len(toks)] = toks
        return ids, ids != PAD_ID

    def _payload(self) -> dict[str, Any]:
        """The JSON keys of the vocabulary (subclasses with other lists override both)."""
        return {"vocab": list(self.vocab)}

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], num_oov_buckets: int) -> WordTokenizer:
        return cls(vocab=str_list(payload["vocab"], "vocab"), num_oov_buckets=num_oov_buckets,
                   normalizer=saved_normalizer(payload))

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON: {"type": TYPE, <vocab lists>, "num_oov_buckets", "normalizer",
        "version"}."""
        write_json(path, {"type": self.TYPE, **self._payload(),
                          "num_oov_buckets": self.num_oov_buckets,
                          "normalizer": self.normalizer, "version": FORMAT_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordTokenizer:
        """Read a tokenizer written by `save`; errors name `path` if missing or corrupt."""
        payload = read_tokenizer_json(path)
        try:
            check_header(payload, cls.TYPE)
            m = payload["num_oov_buckets"]
            if not isinstance(m, int):
                raise ValueError("num_oov_buckets is not an int")
            return cls._from_payload(payload, m)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: {e}") from e


def build_word_tokenizer(texts: Iterable[str], vocab_size: int, num_oov_buckets: int,
                         min_count: int = 1) -> WordTokenizer:
    """Build a tokenizer from training texts.

    Keeps the `vocab_size` most frequent normalised words with count >= `min_count`,
    ordered by count descending, ties broken alphabetically (deterministic).
    `vocab_size` here is N (vocab words), not the total id count.
    """
    if vocab_size < 0:
        raise ValueError(f"vocab_size must be >= 0, got {vocab_size}")
    counts = collections.Counter(w for t in texts for w in words(t))
    ranked = sorted((kv for kv in counts.items() if kv[1] >= min_count),
                    key=lambda kv: (-kv[1], kv[0]))
    return WordTokenizer(vocab=tuple(w for w, _ in ranked[:vocab_size]),
                         num_oov_buckets=num_oov_buckets)
