"""grain input pipeline: shuffled, tokenized, batched training pairs.

Each process reads its own slice of the source and yields its share of every global
batch as numpy arrays; `sharding.put_global_batch` assembles the global batch on the
mesh. The iterator's position is part of every checkpoint (`get_state`/`set_state`),
so a resumed run sees exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import grain
import jax
import numpy as np

from dualjax.text import normalize
from dualjax.tokenizers import Tokenizer


def read_records(source, indices: Sequence[int]) -> list:
    """Records at `indices`, in one bulk read where the source supports it."""
    if hasattr(source, "__getitems__"):
        return list(source.__getitems__(list(indices)))
    return [source[i] for i in indices]


def text_ids(texts: Sequence[str]) -> np.ndarray:
    """int32 [n]: the same id for texts that normalise alike (CRC-32 of the normalised
    text, 31 bits), so a document twice in one batch is recognised as one."""
    return np.asarray([zlib.crc32(normalize(t).encode()) & 0x7FFFFFFF for t in texts], np.int32)


class ReadPairs(grain.transforms.Map):
    """A batch of record indices -> {q_ids, q_mask, d_ids, d_mask} [batch, max_len] and
    doc_ids [batch] (`text_ids` of the documents, for masking accidental hits).

    Records are read with one bulk `__getitems__` per batch: array_record then fetches
    them together, many times faster than one random read per record.
    """

    def __init__(self, source, tokenizer: Tokenizer, max_len: int):
        self._source, self._tokenizer, self._max_len = source, tokenizer, max_len

    def map(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        records = read_records(self._source, indices.tolist())
        out = {}
        for side, key in (("q", "query"), ("d", "document")):
            texts = [r[key].decode("utf-8") for r in records]
            out[f"{side}_ids"], out[f"{side}_mask"] = self._tokenizer.encode(texts, self._max_len)
        out["doc_ids"] = text_ids(texts)  # the documents: the last side encoded
        return out


def train_iterator(source, tokenizer: Tokenizer, max_len: int, global_batch_size: int,
                   seed: int, worker_count: int = 0) -> grain.DatasetIterator:
    """An endless iterator of this process's share of each global training batch.

    Every epoch is reshuffled (seeded); the last incomplete batch of an epoch does not
    exist because the data repeats before batching.
    """
    n_proc = jax.process_count()
    if global_batch_size % n_proc:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"{n_proc} processes")
    ds = grain.MapDataset.range(len(source))[jax.process_index()::n_proc]
    ds = ds.shuffle(seed=seed).repeat().batch(global_batch_size // n_proc)
    ds = ds.map(ReadPairs(source, tokenizer, max_len)).to_iter_dataset()
    if worker_count > 0:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return iter(ds)
