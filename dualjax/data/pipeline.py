"""grain input pipeline: shuffled, tokenized, batched training pairs.

Each process reads its own slice of the source and yields its share of every global
batch as numpy arrays; `sharding.put_global_batch` assembles the global batch on the
mesh. The iterator's position is part of every checkpoint (`get_state`/`set_state`),
so a resumed run sees exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

import json
import zlib
from typing import Sequence

import grain
import jax
import numpy as np

from dualjax.features import Inputs, Side
from dualjax.text import normalize


def read_records(source, indices: Sequence[int]) -> list:
    """Records at `indices`, in one bulk read where the source supports it."""
    if hasattr(source, "__getitems__"):
        return list(source.__getitems__(list(indices)))
    return [source[i] for i in indices]


def text_ids(texts: Sequence[str]) -> np.ndarray:
    """int32 [n]: the same id for texts that normalise alike (CRC-32 of the normalised
    text, 31 bits), so a document twice in one batch is recognised as one."""
    return np.asarray([zlib.crc32(normalize(t).encode()) & 0x7FFFFFFF for t in texts], np.int32)


def record_fields(record: dict, key: str) -> dict | None:
    """The categorical fields stored (as JSON) under `key` of a pairs record, or None."""
    raw = record.get(key)
    return json.loads(raw.decode("utf-8")) if raw else None


def encode_records(records: Sequence[dict], key: str, side: Side, prefix: str
                   ) -> tuple[dict[str, np.ndarray], list[str]]:
    """Side `key` ("query" / "document") of pairs records, encoded as `side` reads it:
    ({prefix_ids, prefix_mask[, prefix_cats]}, the texts)."""
    texts = [r[key].decode("utf-8") for r in records]
    fields = [record_fields(r, f"{key}_fields") for r in records] if side.features else None
    return {f"{prefix}_{k}": v for k, v in side.encode(texts, fields).items()}, texts


class ReadPairs(grain.transforms.Map):
    """A batch of record indices -> {q_ids, q_mask} [batch, query max_len], {d_ids,
    d_mask} [batch, document max_len], q_cats / d_cats [batch, fields] for a side with
    categorical fields, doc_ids [batch] (`text_ids` of the documents, for masking
    accidental hits), and with `num_hard_negatives` k each record's mined negatives:
    n_ids, n_mask [batch, k, document max_len] and n_doc_ids [batch, k].

    Records are read with one bulk `__getitems__` per batch: array_record then fetches
    them together, many times faster than one random read per record.
    """

    def __init__(self, source, inputs: Inputs, num_hard_negatives: int = 0):
        self._source, self._inputs, self._k = source, inputs, num_hard_negatives

    def map(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        records = read_records(self._source, indices.tolist())
        out, _ = encode_records(records, "query", self._inputs.query, "q")
        documents, texts = encode_records(records, "document", self._inputs.document, "d")
        out.update(documents, doc_ids=text_ids(texts))
        if self._k:
            negatives = [[t.decode("utf-8") for t in r.get("hard_negatives", ())[:self._k]]
                         for r in records]
            if any(len(n) < self._k for n in negatives):
                raise ValueError(f"{self._k} hard negatives per pair asked for, but the data "
                                 "has fewer: prepare it with data.hard_negatives set")
            flat = [t for n in negatives for t in n]
            enc = self._inputs.document.encode(flat)
            b = len(records)
            out["n_ids"] = enc["ids"].reshape(b, self._k, -1)
            out["n_mask"] = enc["mask"].reshape(b, self._k, -1)
            out["n_doc_ids"] = text_ids(flat).reshape(b, self._k)
        return out


class MixedNegatives(grain.transforms.RandomMap):
    """Adds to a batch `count` documents drawn uniformly (with replacement) from every
    training pair's document (Yang et al. 2020's mixed negative sampling): m_ids, m_mask
    [count, document max_len], m_cats, and m_doc_ids [count] (`text_ids`).

    grain seeds the rng from the pipeline seed and the batch's index, so the draws are
    the same after a resume.
    """

    def __init__(self, source, side: Side, count: int):
        self._source, self._side, self._count = source, side, count

    def random_map(self, batch: dict, rng: np.random.Generator) -> dict:
        picks = rng.integers(0, len(self._source), self._count)
        records = read_records(self._source, picks.tolist())
        mixed, texts = encode_records(records, "document", self._side, "m")
        return {**batch, **mixed, "m_doc_ids": text_ids(texts)}


def train_iterator(source, inputs: Inputs, global_batch_size: int, seed: int,
                   worker_count: int = 0, num_mixed_negatives: int = 0,
                   num_hard_negatives: int = 0) -> grain.DatasetIterator:
    """An endless iterator of this process's share of each global training batch.

    Every epoch is reshuffled (seeded); the last incomplete batch of an epoch does not
    exist because the data repeats before batching. With `num_mixed_negatives` U, each
    process adds its share U / processes of uniformly drawn documents (`MixedNegatives`);
    with `num_hard_negatives` k, each pair's k mined negatives (`ReadPairs`).
    """
    n_proc = jax.process_count()
    for what, value in (("global_batch_size", global_batch_size),
                        ("num_mixed_negatives", num_mixed_negatives)):
        if value % n_proc:
            raise ValueError(f"{what}={value} is not divisible by {n_proc} processes")
    ds = grain.MapDataset.range(len(source))[jax.process_index()::n_proc]
    ds = ds.shuffle(seed=seed).repeat().batch(global_batch_size // n_proc)
    ds = ds.map(ReadPairs(source, inputs, num_hard_negatives))
    if num_mixed_negatives:
        ds = ds.random_map(MixedNegatives(source, inputs.document, num_mixed_negatives // n_proc),
                           seed=seed + 1)
    ds = ds.to_iter_dataset()
    if worker_count > 0:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return iter(ds)
