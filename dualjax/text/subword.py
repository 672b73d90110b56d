"""SentencePiece subword tokens for the Transformer tower (Chang et al. 2020): a unigram or
BPE model trained on the training texts with the `sentencepiece` package, deterministic
for the same texts, saved beside the tokenizer JSON and reloaded by path. Same interface
as `text.WordTokenizer` (see `tokenizers.Tokenizer`); imported by `tokenizers`, which
registers it as model.tokenizer = "sentencepiece".
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import random
from collections.abc import Iterable
from typing import Any, ClassVar

from dualjax.text.words import FORMAT_VERSION as _FORMAT_VERSION
from dualjax.text.words import (
    WordTokenizer,
    check_normalizer,
    normalize,
    read_tokenizer_json,
    saved_normalizer,
)
from dualjax.text.words import check_header as _check_header
from dualjax.text.words import write_json as _write_json

_SP_REQUIRED_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"  # always pieces
_SP_MAX_SENTENCE_BYTES = 4192  # sentencepiece's max_sentence_length, in UTF-8 bytes
_SP_SEED = 0


@dataclasses.dataclass(frozen=True)
class SentencePieceTokenizer:
    """A trained SentencePiece model over normalised text, ids shifted by one.

    Id layout: 0 padding; SentencePiece id i -> i + 1. Models from
    `build_sentencepiece` have no pad/bos/eos pieces and <unk> at sp id 0 (our id 1);
    every a-z0-9 character and every character of the training texts is a piece, so
    only a character never seen in training gives <unk>. `vocab_size` = pieces + 1.
    There are no hashed buckets.
    """

    TYPE: ClassVar[str] = "sentencepiece"
    model_proto: bytes = dataclasses.field(repr=False)
    normalizer: str = "unicode"  # `text.normalize`'s form

    def __post_init__(self) -> None:
        check_normalizer(self.normalizer)

    @functools.cached_property
    def _processor(self):
        import sentencepiece  # pylint: disable=import-outside-toplevel
        return sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)

    def __getstate__(self) -> dict[str, Any]:  # pickle the bytes, not the C++ processor
        return {"model_proto": self.model_proto, "normalizer": self.normalizer}

    @property
    def vocab_size(self) -> int:
        """Total number of ids / embedding rows: 1 + number of pieces."""
        return 1 + self._processor.get_piece_size()

    def pieces(self, text: str) -> list[str]:
        """The pieces of `normalize(text)` (for inspection)."""
        return self._processor.encode(normalize(text, self.normalizer), out_type=str)

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids (each in [1, vocab_size)) of the pieces of `normalize(text)`."""
        return [i + 1 for i in self._processor.encode(normalize(text, self.normalizer))]

    encode = WordTokenizer.encode  # same contract; only calls self.token_ids

    def save(self, path: str | os.PathLike) -> None:
        """Write the model next to `path` as <stem>.sentencepiece.model and a JSON
        {"type", "model_file" (that name, relative to the JSON's folder),
        "model_sha256", "normalizer", "version"} at `path`."""
        path = os.fspath(path)
        model_file = os.path.splitext(os.path.basename(path))[0] + ".sentencepiece.model"
        with open(os.path.join(os.path.dirname(path), model_file), "wb") as f:
            f.write(self.model_proto)
        _write_json(path, {"type": self.TYPE, "model_file": model_file,
                           "model_sha256": hashlib.sha256(self.model_proto).hexdigest(),
                           "normalizer": self.normalizer, "version": _FORMAT_VERSION})

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
            normalizer = saved_normalizer(payload)
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
        tok = cls(model_proto=proto, normalizer=normalizer)
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
    Texts in any script train: `character_coverage=1.0` makes each of their characters
    a piece.
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
            if len(s.encode()) > _SP_MAX_SENTENCE_BYTES:
                cut = s.encode()[:_SP_MAX_SENTENCE_BYTES + 1].decode(errors="ignore")
                s = cut.rsplit(" ", 1)[0] if " " in cut else cut[:-1]
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
