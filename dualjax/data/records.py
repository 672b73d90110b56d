"""A table's records read back from TFDS's array_record files, fast (`Records`)."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core.example_parser import tf_example_pb2

from dualjax.data import table_files

_EXAMPLE = tf_example_pb2.Example  # what TFDS writes each record as


class Records:
    """A table's split as a random-access source of records, as TFDS's data source gives
    them, parsed without TFDS's per-feature Python: the raw tf.Example bytes that
    array_record reads (TFDS's own reader, its order and shards) decoded with protobuf's
    C parser, each feature as the table's `features` declare it (`table_files.kinds`:
    text: bytes; int64: int; lists: a list of bytes / an int64 array), several times
    faster than TFDS's own decoding (BENCHMARKS.md, issue 46)."""

    def __init__(self, builder: tfds.core.DatasetBuilder, split: str, features: dict):
        self._tfds = builder.as_data_source(split=split)
        self._raw = getattr(self._tfds, "data_source", None)  # (None: TFDS decodes)
        self._kinds = tuple(table_files.kinds(features).items())  # (told apart once)
        self._folder, self._split = os.fspath(builder.data_dir), split

    def identity(self) -> str:
        """What names these records' bytes: the table's folder, the split and each of
        its files' size and modification time (a table written again is another)."""
        files = sorted(os.listdir(self._folder))
        stats = [(n, (st := os.stat(os.path.join(self._folder, n))).st_size, st.st_mtime_ns)
                 for n in files]
        return json.dumps([self._folder, self._split, stats])

    def only(self, names) -> Records:
        """The same records with only the features `names` parsed (those the table has):
        each feature read costs a map lookup per record, about as much as the parse."""
        view = copy.copy(self)
        view._kinds = tuple((n, k) for n, k in self._kinds if n in set(names))
        return view

    def __len__(self) -> int:
        return len(self._tfds)

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> list[dict]:
        if self._raw is None:
            return list(self._tfds.__getitems__(list(indices)))
        return [self._parse(raw) for raw in self._raw.__getitems__(list(indices))]

    def _parse(self, raw: bytes) -> dict:
        feature = _EXAMPLE.FromString(raw).features.feature
        out: dict = {}
        for name, kind in self._kinds:
            if kind == "text":  # (b"" is written as no value)
                values = feature[name].bytes_list.value
                out[name] = values[0] if values else b""
            elif kind == "int64":
                out[name] = int(feature[name].int64_list.value[0])
            elif kind == "text list":
                out[name] = list(feature[name].bytes_list.value)
            else:
                out[name] = np.asarray(feature[name].int64_list.value, np.int64)
        return out
