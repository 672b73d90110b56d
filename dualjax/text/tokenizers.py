"""Tokenizers beyond words: character trigrams, words + trigrams, word bigrams and
SentencePiece (`subword.py`), all with `text.WordTokenizer`'s interface, plus a registry
to build any kind from training texts and to load any kind from its saved JSON.

Interface shared by every kind (see `Tokenizer`): `vocab_size` (embedding rows),
`token_ids(text)` (unpadded ids, each in [1, vocab_size)), `encode(texts, max_len)`
(int32 ids and bool mask [n, max_len], right-padded with 0 and truncated), `save(path)`
(JSON with a "type" field). Everything works on `text.normalize`d text (lowercase
words of letters, digits and marks of any script, separated by single spaces; each
tokenizer records its form), so "Silver-Fork!" and "silver fork" are one input. Pure
Python + numpy (sentencepiece is imported only by the sentencepiece kind), and every
tokenizer pickles, so it can run inside data-loading workers.

Vocabulary kinds (char_trigram, word+char_trigram, bigram) subclass `WordTokenizer`
and change only how a text splits into tokens: the id layout (0 pad, 1..N vocab,
N+1..N+M crc32-hashed OOV buckets), `vocab_size` and `encode` are WordTokenizer's.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol, cast

import numpy as np

from dualjax.text.subword import SentencePieceTokenizer, build_sentencepiece
from dualjax.text.words import (
    WordTokenizer,
    build_word_tokenizer,
    normalize,
    read_tokenizer_json,
    saved_normalizer,
)
from dualjax.text.words import str_list as _str_list

_ASCII_ALNUM = re.compile("[A-Za-z0-9]")
_WORD_KEY, _TRIGRAM_KEY = "w:", "t:"  # ":" never occurs in normalised text


class Tokenizer(Protocol):
    """What the input pipeline, model and evaluation need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def token_ids(self, text: str) -> list[int]: ...

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]: ...

    def save(self, path: str | os.PathLike) -> None: ...


class _ContentTokenizer(Protocol):
    """What `gives_tokens` reads of a tokenizer with `content_ids` (hf.HFTokenizer)."""

    drop_unknown: bool

    def content_ids(self, text: str) -> list[int]: ...


# ----------------------------------------------------------------------------- tokens
def _trigrams(normalised: str) -> list[str]:
    if len(normalised) < 3:
        return [normalised] if normalised else []
    return [normalised[i:i + 3] for i in range(len(normalised) - 2)]


def char_trigrams(text: str, form: str = "unicode") -> list[str]:
    """Character trigrams of `normalize(text)`, sliding one character at a time over the
    whole string, the single spaces between words included (Moscicki 2022, Table 4.7).

    "silver fork" -> sil ilv lve ver "er " "r f" " fo" for ork: 11 characters give 9
    trigrams. Moscicki's listing shows 8 (it has no "er "), but no sliding-window rule
    keeps "r f" and " fo" yet drops "er ", so we take the listing to have lost one.
    No boundary markers are added. A normalised text of 1-2 characters is its own single
    token ("ab" -> ["ab"]); an empty one has no tokens.
    """
    return _trigrams(normalize(text, form))


def _bigram_tokens(ws: list[str]) -> list[str]:
    return ws + [f"{a} {b}" for a, b in itertools.pairwise(ws)]


def word_bigrams(text: str, form: str = "unicode") -> list[str]:
    """The normalised words of `text` followed by its adjacent word pairs "w1 w2".

    "new york city" -> new york city "new york" "york city". A bigram contains a space
    and a word never does, so the two cannot be confused in one vocabulary.
    """
    return _bigram_tokens(normalize(text, form).split())


# ----------------------------------------------------------------------------- vocab kinds
@dataclasses.dataclass(frozen=True)
class _TokenVocabTokenizer(WordTokenizer):
    """A WordTokenizer whose tokens come from `tokens(text)` instead of the words.

    `vocab` holds the lookup keys that `tokens` produces, id i for vocab[i - 1]; an
    unknown key k gets the bucket N + 1 + crc32(k) % M, exactly as a WordTokenizer word.
    """

    def tokens(self, text: str) -> list[str]:
        """The lookup keys of `text`, in the order their ids are produced."""
        raise NotImplementedError

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids (each in [1, vocab_size)) of `tokens(text)`."""
        table, oov = self._word_to_id, self._oov_id
        return [table.get(t) or oov(t) for t in self.tokens(text)]


@dataclasses.dataclass(frozen=True)
class CharTrigramTokenizer(_TokenVocabTokenizer):
    """Character trigrams (`char_trigrams`) with WordTokenizer's id layout: `vocab` is
    the kept trigrams, unknown trigrams hash into `num_oov_buckets` buckets.

    A text of n >= 3 normalised characters has n - 2 tokens, so `max_len` must be
    several times a word tokenizer's to cover the same text.
    """

    TYPE: ClassVar[str] = "char_trigram"

    def tokens(self, text: str) -> list[str]:
        return char_trigrams(text, self.normalizer)


@dataclasses.dataclass(frozen=True)
class BigramTokenizer(_TokenVocabTokenizer):
    """Word unigrams then word bigrams (`word_bigrams`; Nigam et al.), one vocabulary.

    `vocab` holds unigrams and bigrams ranked together by training count under one
    budget (so frequent bigrams compete with rare words for a slot); unknown unigrams and
    bigrams share the hashed buckets. Unigrams come first, so truncation to `max_len`
    drops bigrams before words.
    """

    TYPE: ClassVar[str] = "bigram"

    def tokens(self, text: str) -> list[str]:
        return word_bigrams(text, self.normalizer)


@dataclasses.dataclass(frozen=True)
class WordTrigramTokenizer(_TokenVocabTokenizer):
    """Words and character trigrams in one id space with separate vocabulary budgets
    (Moscicki 2022: e.g. 110k words + 40k trigrams + 50k shared buckets).

    Id layout (W words, T trigrams, M buckets):
      0                    padding
      1 .. W               words (`word_vocab` order)
      W+1 .. W+T           trigrams (`trigram_vocab` order)
      W+T+1 .. W+T+M       buckets shared by unknown words and unknown trigrams
    Lookup keys carry a prefix, "w:" + word or "t:" + trigram (that is what `vocab`
    holds), so the word "for" and the trigram "for" are different tokens and hash to
    independent buckets. Token order within a text: all words, then all trigrams of
    the whole normalised string, so truncation drops trigrams first.
    """

    TYPE: ClassVar[str] = "word+char_trigram"
    num_words: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        heads = [k[:2] for k in self.vocab]
        if heads != [_WORD_KEY] * self.num_words + [_TRIGRAM_KEY] * (len(heads) - self.num_words):
            raise ValueError(f"vocab must be {self.num_words} '{_WORD_KEY}' keys followed by "
                             f"'{_TRIGRAM_KEY}' keys")

    @classmethod
    def from_vocabs(cls, word_vocab: Sequence[str], trigram_vocab: Sequence[str],
                    num_oov_buckets: int, normalizer: str = "unicode") -> WordTrigramTokenizer:
        """The tokenizer for unprefixed word and trigram lists."""
        keys = [_WORD_KEY + w for w in word_vocab] + [_TRIGRAM_KEY + t for t in trigram_vocab]
        return cls(vocab=tuple(keys), num_oov_buckets=num_oov_buckets,
                   normalizer=normalizer, num_words=len(word_vocab))

    @property
    def word_vocab(self) -> tuple[str, ...]:
        """The kept words (ids 1..W)."""
        return tuple(k[2:] for k in self.vocab[:self.num_words])

    @property
    def trigram_vocab(self) -> tuple[str, ...]:
        """The kept trigrams (ids W+1..W+T)."""
        return tuple(k[2:] for k in self.vocab[self.num_words:])

    def tokens(self, text: str) -> list[str]:
        s = normalize(text, self.normalizer)
        return ([_WORD_KEY + w for w in s.split()]
                + [_TRIGRAM_KEY + t for t in _trigrams(s)])

    def _payload(self) -> dict[str, Any]:
        return {"word_vocab": list(self.word_vocab), "trigram_vocab": list(self.trigram_vocab)}

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], num_oov_buckets: int) -> WordTrigramTokenizer:
        return cls.from_vocabs(_str_list(payload["word_vocab"], "word_vocab"),
                               _str_list(payload["trigram_vocab"], "trigram_vocab"),
                               num_oov_buckets, saved_normalizer(payload))


# ----------------------------------------------------------------------------- registries
def _most_frequent(counts: collections.Counter, k: int, min_count: int) -> tuple[str, ...]:
    """The k most frequent keys with count >= min_count, by count then alphabetically
    (the order of `text.build_word_tokenizer`)."""
    if k < 0:
        raise ValueError(f"vocabulary budget must be >= 0, got {k}")
    ranked = sorted((kv for kv in counts.items() if kv[1] >= min_count),
                    key=lambda kv: (-kv[1], kv[0]))
    return tuple(key for key, _ in ranked[:k])


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Everything `build_tokenizer` passes on; each kind reads what it needs."""

    vocab_size: int
    num_oov_buckets: int
    trigram_vocab_size: int = 40_000
    min_count: int = 1
    model_type: str = "unigram"
    input_sentence_size: int = 1_000_000
    num_threads: int = 1


def _build_word(texts: Iterable[str], o: BuildOptions) -> WordTokenizer:
    return build_word_tokenizer(texts, o.vocab_size, o.num_oov_buckets, o.min_count)


def _build_trigram(texts: Iterable[str], o: BuildOptions) -> CharTrigramTokenizer:
    counts = collections.Counter(g for t in texts for g in char_trigrams(t))
    return CharTrigramTokenizer(vocab=_most_frequent(counts, o.trigram_vocab_size, o.min_count),
                                num_oov_buckets=o.num_oov_buckets)


def _build_word_trigram(texts: Iterable[str], o: BuildOptions) -> WordTrigramTokenizer:
    word_counts: collections.Counter[str]
    trigram_counts: collections.Counter[str]
    word_counts, trigram_counts = collections.Counter(), collections.Counter()
    for t in texts:
        s = normalize(t)
        word_counts.update(s.split())
        trigram_counts.update(_trigrams(s))
    return WordTrigramTokenizer.from_vocabs(
        _most_frequent(word_counts, o.vocab_size, o.min_count),
        _most_frequent(trigram_counts, o.trigram_vocab_size, o.min_count), o.num_oov_buckets)


def _build_bigram(texts: Iterable[str], o: BuildOptions) -> BigramTokenizer:
    counts = collections.Counter(g for t in texts for g in word_bigrams(t))
    return BigramTokenizer(vocab=_most_frequent(counts, o.vocab_size, o.min_count),
                           num_oov_buckets=o.num_oov_buckets)


def _build_sentencepiece(texts: Iterable[str], o: BuildOptions) -> SentencePieceTokenizer:
    return build_sentencepiece(texts, o.vocab_size, o.model_type, o.input_sentence_size,
                               o.num_threads)


_BUILDERS: dict[str, Callable[[Iterable[str], BuildOptions], Tokenizer]] = {
    "word": _build_word,
    "char_trigram": _build_trigram,
    "word+char_trigram": _build_word_trigram,
    "bigram": _build_bigram,
    "sentencepiece": _build_sentencepiece,
}
_LOADERS: dict[str, Callable[[str | os.PathLike], Tokenizer]] = {
    "word": WordTokenizer.load,
    CharTrigramTokenizer.TYPE: CharTrigramTokenizer.load,
    WordTrigramTokenizer.TYPE: WordTrigramTokenizer.load,
    BigramTokenizer.TYPE: BigramTokenizer.load,
    SentencePieceTokenizer.TYPE: SentencePieceTokenizer.load,
}


def _load_hf(path: str | os.PathLike) -> Tokenizer:
    from dualjax.text.hf import HFTokenizer  # needs the tokenizers library
    return HFTokenizer.load(path)


_LOADERS["hf"] = _load_hf
TOKENIZERS = tuple(_BUILDERS)  # the `model.tokenizer` names built from training texts
KINDS = TOKENIZERS + ("hf",)  # every `model.tokenizer` name; "hf" is read, not built


def build_tokenizer(kind: str, texts: Iterable[str], *, vocab_size: int, num_oov_buckets: int,
                    trigram_vocab_size: int = 40_000, min_count: int = 1,
                    model_type: str = "unigram", input_sentence_size: int = 1_000_000,
                    num_threads: int = 1) -> Tokenizer:
    """Build a tokenizer of `kind` (one of `TOKENIZERS`) from training texts, read once
    (an iterator is fine).

    Budgets, each the number of kept vocabulary entries (ranked by training count,
    ties alphabetical, count >= `min_count`):
      word               `vocab_size` words
      char_trigram       `trigram_vocab_size` trigrams
      word+char_trigram  `vocab_size` words + `trigram_vocab_size` trigrams
      bigram             `vocab_size` unigrams and bigrams together
      sentencepiece      `vocab_size` pieces (a target; see `build_sentencepiece`)
    `num_oov_buckets` hashed buckets follow the vocabulary (not used by sentencepiece).
    `model_type` ("unigram" or "bpe"), `input_sentence_size` and `num_threads` are
    sentencepiece options.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown tokenizer {kind!r}; known: {', '.join(TOKENIZERS)}")
    opts = BuildOptions(vocab_size=vocab_size, num_oov_buckets=num_oov_buckets,
                        trigram_vocab_size=trigram_vocab_size, min_count=min_count,
                        model_type=model_type, input_sentence_size=input_sentence_size,
                        num_threads=num_threads)
    return _BUILDERS[kind](texts, opts)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load any tokenizer written by a `save`, dispatching on its JSON "type"."""
    kind = read_tokenizer_json(path).get("type")
    if kind not in _LOADERS:
        raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: unknown type {kind!r}; "
                         f"known: {', '.join(_LOADERS)}")
    return _LOADERS[kind](path)


def gives_tokens(tokenizer: Tokenizer, text: str) -> bool:
    """Whether `text` gives the tokenizer any token of its own (special tokens aside).
    A text that gives none is encoded as the towers' bias alone: one vector shared by
    every such text, so it is skipped (an index, an evaluation corpus) or refused."""
    # An ASCII letter or digit is a token in every form of `normalize`, a piece of every
    # sentencepiece model and at worst an hf tokenizer's unknown token: most texts are
    # answered here, not tokenised twice (BENCHMARKS.md, "Figures behind design choices").
    hf = hasattr(tokenizer, "content_ids")  # hf: [CLS] and [SEP] are always there
    content = cast(_ContentTokenizer, tokenizer)  # read only where `hf`
    if _ASCII_ALNUM.search(text) and not (hf and content.drop_unknown):
        return True
    return bool(content.content_ids(text) if hf else tokenizer.token_ids(text))


def without_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """The positions of the `texts` that give the tokenizer no token (`gives_tokens`)."""
    return [i for i, t in enumerate(texts) if not gives_tokens(tokenizer, t)]


def known_tokens(tokenizer: Tokenizer, text: str) -> int:
    """How many of `text`'s tokens the tokenizer knows: in its vocabulary, not an OOV
    bucket or the unknown id (a sentencepiece model's <unk>, our id 1)."""
    if hasattr(tokenizer, "known"):  # hf: its own unknown token
        return tokenizer.known(text)
    ids = tokenizer.token_ids(text)
    vocab = getattr(tokenizer, "vocab", None)
    if vocab is None:
        return sum(i != 1 for i in ids)
    return sum(1 <= i <= len(vocab) for i in ids)
