"""Categorical features (Mościcki 2022 §4.2) and what one side of the model reads.

A record (a query or a document) may carry categorical fields besides its text, e.g. a
product's category. `model.query_features` / `model.doc_features` name them, each with
an embedding size ("category:32,brand"; `model.feature_dim` when none is given). Per
field, the `model.feature_vocab_size` most frequent training values get their own ids;
any other value lands in one of `model.feature_buckets` buckets chosen by CRC-32 of the
value (stable across processes, unlike Python's salted `hash`). Id 0 is reserved for a
missing value (field absent, null or ""); missing values are counted, not fatal.
`sides.Side` reads them beside a text's tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

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
    def from_json(cls, data: list) -> SideFeatures:
        return cls(tuple(Field(d["name"], int(d["dim"]), tuple(d["vocab"]), int(d["num_buckets"]))
                         for d in data))


def build_side(spec: Sequence[tuple[str, int]], records: Iterable[Fields], vocab_size: int,
               num_buckets: int) -> SideFeatures:
    """Per field of `spec`, its `vocab_size` most frequent values in `records` (ties: the
    value first seen wins) as the vocabulary, plus `num_buckets` hashed buckets."""
    counts: dict[str, collections.Counter[str]] = {name: collections.Counter() for name, _ in spec}
    for r in records:
        for name, _ in spec:
            key = value_key((r or {}).get(name))
            if key is not None:
                counts[name][key] += 1
    return SideFeatures(tuple(
        Field(name, dim, tuple(v for v, _ in counts[name].most_common(vocab_size)), num_buckets)
        for name, dim in spec))


def save(path: str, query: SideFeatures, document: SideFeatures) -> None:
    write_json(path, {"query": query.to_json(), "document": document.to_json()})


def load(path: str) -> tuple[SideFeatures, SideFeatures]:
    with open(path) as f:
        data = json.load(f)
    return SideFeatures.from_json(data["query"]), SideFeatures.from_json(data["document"])
