"""Categorical features (Mościcki 2022 §4.2) and what one side of the model reads.

A record (a query or a document) may carry categorical fields besides its text, e.g. a
product's category. `model.query_features` / `model.doc_features` name them, each with
an embedding size ("category:32,brand"; `model.feature_dim` when none is given). Per
field, the `model.feature_vocab_size` most frequent training values get their own ids;
any other value lands in one of `model.feature_buckets` buckets chosen by CRC-32 of the
value (stable across processes, unlike Python's salted `hash`). Id 0 is reserved for a
missing value (field absent, null or ""); missing values are counted, not fatal.

`Side` bundles what one tower reads: the tokenizer, the side's max length and its
categorical fields. `Inputs` is the pair (query side, document side); training batches,
evaluation and search all encode texts through it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
import zlib
from typing import Iterable, Mapping, Sequence

import numpy as np
from absl import logging

from dualjax.text.tokenizers import Tokenizer
from dualjax.text.words import write_json

MISSING_ID = 0
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Fields = Mapping[str, object] | None  # one record's categorical fields (None: none given)


def parse_spec(spec: str, default_dim: int, key: str = "model.doc_features"
               ) -> tuple[tuple[str, int], ...]:
    """"category:32,brand" -> (("category", 32), ("brand", default_dim)); ValueError naming
    `key` for a bad name, a bad or non-positive size, or a field named twice."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, dim = part.partition(":")
        name = name.strip()
        try:
            size = int(dim) if dim.strip() else default_dim
        except ValueError:
            size = 0
        if not _NAME.match(name) or size <= 0:
            raise ValueError(f"{key}={spec!r}: {part!r} is not NAME or NAME:SIZE with a "
                             "positive SIZE (e.g. 'category:32,brand')")
        out.append((name, size))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{key}={spec!r} names a field twice")
    return tuple(out)


def value_key(value: object) -> str | None:
    """A field value as the string its id is looked up by; None when missing."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclasses.dataclass(frozen=True)
class Field:
    """One categorical field: ids 1..len(vocab) for its vocabulary, then hashed buckets."""

    name: str
    dim: int
    vocab: tuple[str, ...]
    num_buckets: int

    @property
    def size(self) -> int:
        """Rows of its embedding table: missing + vocabulary + buckets."""
        return 1 + len(self.vocab) + self.num_buckets

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {v: i for i, v in enumerate(self.vocab, 1)}

    def ids(self, values: Sequence[object]) -> np.ndarray:
        index = self._index
        out = np.empty(len(values), np.int32)
        for j, value in enumerate(values):
            key = value_key(value)
            if key is None:
                out[j] = MISSING_ID
            elif key in index:
                out[j] = index[key]
            elif self.num_buckets:
                out[j] = 1 + len(self.vocab) + zlib.crc32(key.encode()) % self.num_buckets
            else:
                out[j] = MISSING_ID
        return out


@dataclasses.dataclass(frozen=True)
class SideFeatures:
    """The categorical fields one side reads, in the order of its embedding tables."""

    fields: tuple[Field, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.fields)

    def sizes(self) -> tuple[tuple[int, int], ...]:
        """((table rows, embedding size), ...) per field: what the model needs."""
        return tuple((f.size, f.dim) for f in self.fields)

    def encode(self, records: Sequence[Fields]) -> np.ndarray:
        """int32 [len(records), num_fields]; MISSING_ID where a field is absent."""
        out = np.zeros((len(records), len(self.fields)), np.int32)
        for j, f in enumerate(self.fields):
            out[:, j] = f.ids([(r or {}).get(f.name) for r in records])
        return out

    def missing_counts(self, ids: np.ndarray) -> dict[str, int]:
        """How many rows of `encode`'s output lack each field."""
        return {f.name: int((ids[:, j] == MISSING_ID).sum()) for j, f in enumerate(self.fields)}

    def to_json(self) -> list:
        return [{"name": f.name, "dim": f.dim, "vocab": list(f.vocab),
                 "num_buckets": f.num_buckets} for f in self.fields]

    @classmethod
    def from_json(cls, data: list) -> "SideFeatures":
        return cls(tuple(Field(d["name"], int(d["dim"]), tuple(d["vocab"]), int(d["num_buckets"]))
                         for d in data))


def build_side(spec: Sequence[tuple[str, int]], records: Iterable[Fields], vocab_size: int,
               num_buckets: int) -> SideFeatures:
    """Per field of `spec`, its `vocab_size` most frequent values in `records` (ties: the
    value first seen wins) as the vocabulary, plus `num_buckets` hashed buckets."""
    counts = {name: collections.Counter() for name, _ in spec}
    for r in records:
        for name, _ in spec:
            key = value_key((r or {}).get(name))
            if key is not None:
                counts[name][key] += 1
    return SideFeatures(tuple(
        Field(name, dim, tuple(v for v, _ in counts[name].most_common(vocab_size)), num_buckets)
        for name, dim in spec))


# Texts over this many times max_len words cost time and memory for tokens never read.
LONG_TEXT_FACTOR = 100
_warned_long = [False]  # once per process


def _warn_if_long(texts: Sequence[str], max_len: int) -> None:
    """Warns (once) of a text of more than LONG_TEXT_FACTOR x max_len words: only its
    first max_len tokens are read, but all of it is normalised and split each time."""
    if _warned_long[0]:
        return
    limit = LONG_TEXT_FACTOR * max_len
    for t in texts:
        if len(t) > limit and len(t.split()) > limit:  # the character test is the cheap one
            _warned_long[0] = True
            logging.warning("a text of %d words (%d characters) is over %d x max_len=%d: "
                            "only its first %d tokens are read, but all of it is tokenised "
                            "each time it is read; shorten such texts (said once): %r...",
                            len(t.split()), len(t), LONG_TEXT_FACTOR, max_len, max_len,
                            t[:60])
            return


@dataclasses.dataclass(frozen=True)
class Side:
    """What one tower reads: tokens of at most max_len, and its categorical fields."""

    tokenizer: Tokenizer
    max_len: int
    features: SideFeatures = SideFeatures()

    def encode(self, texts: Sequence[str], fields: Sequence[Fields] | None = None
               ) -> dict[str, np.ndarray]:
        """{"ids", "mask"} [n, max_len] (truncated, padded), plus "cats" [n, num_fields]
        when the side has categorical fields (all missing when `fields` is None)."""
        texts = list(texts)
        _warn_if_long(texts, self.max_len)
        ids, mask = self.tokenizer.encode(texts, self.max_len)
        out = {"ids": ids, "mask": mask}
        if self.features:
            given = fields if fields is not None else [None] * len(texts)
            out["cats"] = self.features.encode(given)
        return out

    def encode_batch(self, texts: Sequence[str], fields: Sequence[Fields] | None = None,
                     rows: int = 0, min_bucket: int | None = None) -> dict[str, np.ndarray]:
        """`encode` of a batch padded with empty texts to `rows` (one shape per length,
        so each compiles once), ids and mask cut to the `length_bucket` (half steps) of
        its longest text: padding never changes a vector."""
        pad = max(rows - len(texts), 0)
        x = self.encode(list(texts) + [""] * pad,
                        None if fields is None else list(fields) + [None] * pad)
        length = length_bucket(int(x["mask"].sum(1).max()), self.max_len,
                               min_bucket or MIN_BUCKET, half_steps=True)
        x["ids"], x["mask"] = x["ids"][:, :length], x["mask"][:, :length]
        return x


def longest_first(texts: Sequence[str]) -> np.ndarray:
    """The texts' indices, longest (in characters) first, as sentence-transformers batches
    them: the texts of a batch are of about one length, cut to one bucket."""
    return np.argsort([-len(t) for t in texts], kind="stable")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The query side and the document side."""

    query: Side
    document: Side

    def feature_sizes(self) -> dict[str, tuple[tuple[int, int], ...]]:
        return {"query": self.query.features.sizes(), "document": self.document.features.sizes()}


def save(path: str, query: SideFeatures, document: SideFeatures) -> None:
    write_json(path, {"query": query.to_json(), "document": document.to_json()})


def load(path: str) -> tuple[SideFeatures, SideFeatures]:
    with open(path) as f:
        data = json.load(f)
    return SideFeatures.from_json(data["query"]), SideFeatures.from_json(data["document"])


MIN_BUCKET = 32  # shortest padded length a batch is cut to (`length_bucket`)
# Training cuts only the fields of texts longer than this (max_len > 128: the BERT-family
# towers, whose steps take seconds): each length compiles the whole train step again,
# which a run of short texts' cheap steps never pays back. Those it cuts go to
# `length_bucket`'s half steps from 32 (32, 48, 64, 96, 128, 192, 256, ...): a sentence
# query of 40 tokens runs at 48, not at the documents' 256.
TRAIN_CUT_ABOVE = 128
TEXT_PREFIXES = ("q", "d", "m", "n")  # a batch's texts: queries, documents, mixed, hard negatives


def length_bucket(longest: int, max_len: int, min_bucket: int = MIN_BUCKET,
                  half_steps: bool = False) -> int:
    """The padded length of a batch whose longest text has `longest` tokens: the next
    power of two from `min_bucket` on, at most max_len (a few shapes, one compile each).
    half_steps: also 1.5 times each (32, 48, 64, 96, 128, 192, ...): a few more shapes,
    and on NPL's documents at batch 32 a fifth less work than powers of two alone."""
    bucket = min_bucket
    while bucket < longest:
        if half_steps and bucket % 2 == 0 and bucket * 3 // 2 >= longest:
            return min(bucket * 3 // 2, max_len)
        bucket *= 2
    return min(bucket, max_len)


def trim_padding(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` with each text field's ids and mask ("<prefix>_ids", "<prefix>_mask", last
    axis the length) longer than TRAIN_CUT_ABOVE cut to `length_bucket` (half steps) of
    its longest text: padding never changes a text's vector, and a batch of short texts
    need not run at the full max length."""
    out = dict(batch)
    for prefix in TEXT_PREFIXES:
        mask = batch.get(f"{prefix}_mask")
        if mask is None or mask.shape[-1] <= TRAIN_CUT_ABOVE:
            continue
        length = length_bucket(int(mask.sum(-1).max(initial=0)), mask.shape[-1],
                               half_steps=True)
        out[f"{prefix}_ids"] = batch[f"{prefix}_ids"][..., :length]
        out[f"{prefix}_mask"] = mask[..., :length]
    return out
