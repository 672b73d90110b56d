"""Tokenizers beyond words: character trigrams, words + trigrams, word bigrams and
SentencePiece, all with `text.WordTokenizer`'s interface, plus a registry to build any
kind from training texts and to load any kind from its saved JSON.

Interface shared by every kind (see `Tokenizer`): `vocab_size` (embedding rows),
`token_ids(text)` (unpadded ids, each in [1, vocab_size)), `encode(texts, max_len)`
(int32 ids and bool mask [n, max_len], right-padded with 0 and truncated), `save(path)`
(JSON with a "type" field). Everything works on `text.normalize`d text (lowercase
a-z0-9 words separated by single spaces), so "Silver-Fork!" and "silver fork" are one
input. Pure Python + numpy (sentencepiece is imported only by the sentencepiece kind),
and every tokenizer pickles, so it can run inside data-loading workers.

Vocabulary kinds (char_trigram, word+char_trigram, bigram) subclass `WordTokenizer`
and change only how a text splits into tokens: the id layout (0 pad, 1..N vocab,
N+1..N+M crc32-hashed OOV buckets), `vocab_size` and `encode` are WordTokenizer's.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import io
import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from dualjax.text import WordTokenizer, build_word_tokenizer, normalize, read_tokenizer_json

_FORMAT_VERSION = 1
_WORD_KEY, _TRIGRAM_KEY = "w:", "t:"  # ":" never occurs in normalised text
_SP_REQUIRED_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"  # every normalised char
_SP_MAX_SENTENCE_CHARS = 4192  # sentencepiece's max_sentence_length (bytes = chars here)
_SP_SEED = 0


class Tokenizer(Protocol):
    """What the input pipeline, model and evaluation need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def token_ids(self, text: str) -> list[int]: ...

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]: ...

    def save(self, path: str | os.PathLike) -> None: ...


# ----------------------------------------------------------------------------- tokens
def _trigrams(normalised: str) -> list[str]:
    if len(normalised) < 3:
        return [normalised] if normalised else []
    return [normalised[i:i + 3] for i in range(len(normalised) - 2)]


def char_trigrams(text: str) -> list[str]:
    """Character trigrams of `normalize(text)`, sliding one character at a time over the
    whole string, the single spaces between words included (Moscicki 2022, Table 4.7).

    "silver fork" -> sil ilv lve ver "er " "r f" " fo" for ork: 11 characters give 9
    trigrams. Moscicki's listing shows 8 (it has no "er "), but no sliding-window rule
    keeps "r f" and " fo" yet drops "er ", so we take the listing to have lost one.
    No boundary markers are added. A normalised text of 1-2 characters is its own single
    token ("ab" -> ["ab"]); an empty one has no tokens.
    """
    return _trigrams(normalize(text))


def _bigram_tokens(ws: list[str]) -> list[str]:
    return ws + [f"{a} {b}" for a, b in zip(ws, ws[1:])]


def word_bigrams(text: str) -> list[str]:
    """The normalised words of `text` followed by its adjacent word pairs "w1 w2".

    "new york city" -> new york city "new york" "york city". A bigram contains a space
    and a word never does, so the two cannot be confused in one vocabulary.
    """
    return _bigram_tokens(normalize(text).split())


# ----------------------------------------------------------------------------- json io
def _check_header(payload: dict[str, Any], kind: str) -> None:
    if payload.get("type") != kind or payload.get("version") != _FORMAT_VERSION:
        raise ValueError(f"expected type/version {kind!r}/{_FORMAT_VERSION}, got "
                         f"{payload.get('type')!r}/{payload.get('version')!r}")


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{key!r} is not a list of strings")
    return tuple(value)


def _write_json(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=True)


# ----------------------------------------------------------------------------- vocab kinds
@dataclasses.dataclass(frozen=True)
class _TokenVocabTokenizer(WordTokenizer):
    """A WordTokenizer whose tokens come from `tokens(text)` instead of the words.

    `vocab` holds the lookup keys that `tokens` produces, id i for vocab[i - 1]; an
    unknown key k gets the bucket N + 1 + crc32(k) % M, exactly as a WordTokenizer word.
    """

    TYPE: ClassVar[str] = ""

    def tokens(self, text: str) -> list[str]:
        """The lookup keys of `text`, in the order their ids are produced."""
        raise NotImplementedError

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids (each in [1, vocab_size)) of `tokens(text)`."""
        table, oov = self._word_to_id, self._oov_id
        return [table.get(t) or oov(t) for t in self.tokens(text)]

    def _payload(self) -> dict[str, Any]:
        return {"vocab": list(self.vocab)}

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], num_oov_buckets: int) -> _TokenVocabTokenizer:
        return cls(vocab=_str_list(payload["vocab"], "vocab"), num_oov_buckets=num_oov_buckets)

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON: {"type", <vocab lists>, "num_oov_buckets", "version"}."""
        _write_json(path, {"type": self.TYPE, **self._payload(),
                           "num_oov_buckets": self.num_oov_buckets, "version": _FORMAT_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> _TokenVocabTokenizer:
        """Read a tokenizer written by `save`; errors name `path` if missing or corrupt."""
        payload = read_tokenizer_json(path)
        try:
            _check_header(payload, cls.TYPE)
            m = payload["num_oov_buckets"]
            if not isinstance(m, int):
                raise ValueError("num_oov_buckets is not an int")
            return cls._from_payload(payload, m)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: {e}") from e


@dataclasses.dataclass(frozen=True)
class CharTrigramTokenizer(_TokenVocabTokenizer):
    """Character trigrams (`char_trigrams`) with WordTokenizer's id layout: `vocab` is
    the kept trigrams, unknown trigrams hash into `num_oov_buckets` buckets.

    A text of n >= 3 normalised characters has n - 2 tokens, so `max_len` must be
    several times a word tokenizer's to cover the same text.
    """

    TYPE: ClassVar[str] = "char_trigram"

    def tokens(self, text: str) -> list[str]:
        return char_trigrams(text)


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
        return word_bigrams(text)


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
                    num_oov_buckets: int) -> WordTrigramTokenizer:
        """The tokenizer for unprefixed word and trigram lists."""
        keys = [_WORD_KEY + w for w in word_vocab] + [_TRIGRAM_KEY + t for t in trigram_vocab]
        return cls(vocab=tuple(keys), num_oov_buckets=num_oov_buckets, num_words=len(word_vocab))

    @property
    def word_vocab(self) -> tuple[str, ...]:
        """The kept words (ids 1..W)."""
        return tuple(k[2:] for k in self.vocab[:self.num_words])

    @property
    def trigram_vocab(self) -> tuple[str, ...]:
        """The kept trigrams (ids W+1..W+T)."""
        return tuple(k[2:] for k in self.vocab[self.num_words:])

    def tokens(self, text: str) -> list[str]:
        s = normalize(text)
        return ([_WORD_KEY + w for w in s.split()]
                + [_TRIGRAM_KEY + t for t in _trigrams(s)])

    def _payload(self) -> dict[str, Any]:
        return {"word_vocab": list(self.word_vocab), "trigram_vocab": list(self.trigram_vocab)}

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], num_oov_buckets: int) -> WordTrigramTokenizer:
        return cls.from_vocabs(_str_list(payload["word_vocab"], "word_vocab"),
                               _str_list(payload["trigram_vocab"], "trigram_vocab"),
                               num_oov_buckets)


# ----------------------------------------------------------------------------- sentencepiece
@dataclasses.dataclass(frozen=True)
class SentencePieceTokenizer:
    """A trained SentencePiece model over normalised text, ids shifted by one.

    Id layout: 0 padding; SentencePiece id i -> i + 1. Models from
    `build_sentencepiece` have no pad/bos/eos pieces and <unk> at sp id 0 (our id 1);
    every a-z0-9 character is a piece, so no normalised text ever produces <unk>.
    `vocab_size` = pieces + 1. There are no hashed buckets.
    """

    TYPE: ClassVar[str] = "sentencepiece"
    model_proto: bytes = dataclasses.field(repr=False)

    @functools.cached_property
    def _processor(self):
        import sentencepiece  # pylint: disable=import-outside-toplevel
        return sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)

    def __getstate__(self) -> dict[str, Any]:  # pickle the bytes, not the C++ processor
        return {"model_proto": self.model_proto}

    @property
    def vocab_size(self) -> int:
        """Total number of ids / embedding rows: 1 + number of pieces."""
        return 1 + self._processor.get_piece_size()

    def pieces(self, text: str) -> list[str]:
        """The pieces of `normalize(text)` (for inspection)."""
        return self._processor.encode(normalize(text), out_type=str)

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids (each in [1, vocab_size)) of the pieces of `normalize(text)`."""
        return [i + 1 for i in self._processor.encode(normalize(text))]

    encode = WordTokenizer.encode  # same contract; only calls self.token_ids

    def save(self, path: str | os.PathLike) -> None:
        """Write the model next to `path` as <stem>.sentencepiece.model and a JSON
        {"type", "model_file" (that name, relative to the JSON's folder),
        "model_sha256", "version"} at `path`."""
        path = os.fspath(path)
        model_file = os.path.splitext(os.path.basename(path))[0] + ".sentencepiece.model"
        with open(os.path.join(os.path.dirname(path), model_file), "wb") as f:
            f.write(self.model_proto)
        _write_json(path, {"type": self.TYPE, "model_file": model_file,
                           "model_sha256": hashlib.sha256(self.model_proto).hexdigest(),
                           "version": _FORMAT_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
        """Read a tokenizer written by `save`, the model file resolved relative to the
        JSON's folder (not the working directory); errors name the file at fault."""
        payload = read_tokenizer_json(path)
        try:
            _check_header(payload, cls.TYPE)
            model_file, digest = payload["model_file"], payload["model_sha256"]
            if not (isinstance(model_file, str) and isinstance(digest, str)):
                raise ValueError("bad model_file or model_sha256")
        except (KeyError, ValueError) as e:
            raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: {e}") from e
        model_path = os.path.join(os.path.dirname(os.path.abspath(path)), model_file)
        try:
            with open(model_path, "rb") as f:
                proto = f.read()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"sentencepiece model not found: {model_path}") from e
        if hashlib.sha256(proto).hexdigest() != digest:
            raise ValueError(f"sentencepiece model {model_path} does not match the sha256 "
                             f"recorded in {os.fspath(path)}")
        tok = cls(model_proto=proto)
        try:
            _ = tok.vocab_size  # parse now, so a corrupt model fails here, not in a worker
        except RuntimeError as e:
            raise ValueError(f"corrupt sentencepiece model {model_path}: {e}") from e
        return tok


def _sample(items: Iterable[str], k: int, seed: int) -> list[str]:
    """All of `items` if there are at most k (k <= 0: no limit), else a seeded reservoir
    sample of k in first-seen order (deterministic for the same input)."""
    rng, kept = random.Random(seed), []
    for i, item in enumerate(items):
        if k <= 0 or i < k:
            kept.append((i, item))
        elif (j := rng.randrange(i + 1)) < k:
            kept[j] = (i, item)
    return [item for _, item in sorted(kept)]


def build_sentencepiece(texts: Iterable[str], vocab_size: int, model_type: str = "unigram",
                        input_sentence_size: int = 1_000_000,
                        num_threads: int = 1) -> SentencePieceTokenizer:
    """Train a SentencePiece model on the normalised, non-empty `texts`.

    Deterministic for the same texts and options: the sample of `input_sentence_size`
    texts (0: all) is drawn here with a fixed seed, because sentencepiece's own sampling
    differs from process to process even after `set_random_generator_seed`. The trained
    model also depends on `num_threads` (fixed, not the machine's core count). Texts are
    cut to sentencepiece's 4192-byte sentence limit at a space instead of being dropped.
    `vocab_size` is a target: `hard_vocab_limit=False` lets a small corpus give fewer
    pieces instead of failing; it must still cover <unk> and the 37 required characters
    (a-z, 0-9 and the word-boundary mark), i.e. be >= 38.
    """
    import sentencepiece  # pylint: disable=import-outside-toplevel
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"sentencepiece model_type must be 'unigram' or 'bpe', got {model_type!r}")

    def clipped() -> Iterable[str]:
        for t in texts:
            s = normalize(t)
            if len(s) > _SP_MAX_SENTENCE_CHARS:
                s = s[:_SP_MAX_SENTENCE_CHARS + 1].rsplit(" ", 1)[0][:_SP_MAX_SENTENCE_CHARS]
            if s:
                yield s

    sentences = _sample(clipped(), input_sentence_size, _SP_SEED)
    if not sentences:
        raise ValueError("cannot train sentencepiece: no text is non-empty after normalisation")
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, num_threads=num_threads, hard_vocab_limit=False,
            character_coverage=1.0, required_chars=_SP_REQUIRED_CHARS,
            normalization_rule_name="identity", input_sentence_size=0,
            pad_id=-1, unk_id=0, bos_id=-1, eos_id=-1, minloglevel=2)
    except RuntimeError as e:
        raise ValueError(f"sentencepiece training failed (vocab_size={vocab_size}): {e}") from e
    return SentencePieceTokenizer(model_proto=model.getvalue())


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
TOKENIZERS = tuple(_BUILDERS)  # the `model.tokenizer` names


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
