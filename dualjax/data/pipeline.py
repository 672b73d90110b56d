"""grain input pipeline: shuffled, tokenized, batched training pairs.

The pairs are tokenized once, when the iterator is made (`ReadPairs`), so a batch is a
gather of rows of token-id arrays. Each process yields its share of every global batch
as numpy arrays; `sharding.put_global_batch` assembles the global batch on the
mesh. The iterator's position is part of every checkpoint (`get_state`/`set_state`),
so a resumed run sees exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Sequence

import grain
import jax
import numpy as np
from absl import logging

from dualjax.data import shuffle, token_cache
from dualjax.runtime.pipeline import Background, Later
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import normalize


def read_records(source, indices: Sequence[int]) -> list:
    """Records at `indices`, in one bulk read where the source supports it."""
    if hasattr(source, "__getitems__"):
        return list(source.__getitems__(list(indices)))
    return [source[i] for i in indices]


def text_ids(texts: Sequence[str]) -> np.ndarray:
    """int32 [n]: the same id for texts that normalise alike (CRC-32 of the normalised
    text, 31 bits), so a document twice in one batch is recognised as one."""
    return np.asarray([zlib.crc32(normalize(t).encode()) & 0x7FFFFFFF for t in texts], np.int32)


def record_clusters(records: Sequence[dict], key: str) -> dict[str, np.ndarray]:
    """{key: int32 [n]} the clusters of pairs records that carry them (stored pairs);
    {} for records without (generated pairs)."""
    if not records or "cluster" not in records[0]:
        return {}
    return {key: np.asarray([r["cluster"] for r in records], np.int32)}


def record_fields(record: dict, key: str) -> dict | None:
    """The categorical fields stored (as JSON) under `key` of a pairs record, or None."""
    raw = record.get(key)
    return json.loads(raw.decode("utf-8")) if raw else None


def encode_records(records: Sequence[dict], key: str, side: Side, prefix: str
                   ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Side `key` ("query" / "document") of pairs records, encoded as `side` reads it:
    ({prefix_ids, prefix_mask[, prefix_cats]}, the texts' `text_ids`). Each distinct
    text is decoded, tokenized and normalised once (SQuAD's 42 k pairs hold 2 k
    paragraphs); the categorical fields are each record's own."""
    first: dict[bytes, int] = {}
    rows = np.fromiter((first.setdefault(r[key], len(first)) for r in records), np.int64,
                       len(records))
    texts = [raw.decode("utf-8") for raw in first]
    out = {k: v[rows] for k, v in side.encode(texts).items()}
    if side.features:
        out["cats"] = side.features.encode([record_fields(r, f"{key}_fields")
                                            for r in records])
    return {f"{prefix}_{k}": v for k, v in out.items()}, text_ids(texts)[rows]


def encode_pairs(records: Sequence[dict], inputs: Inputs) -> dict[str, np.ndarray]:
    """Pairs records {"query", "document": bytes, ...} -> {q_ids, q_mask} [batch, query
    max_len], {d_ids, d_mask} [batch, document max_len], q_cats / d_cats [batch, fields]
    for a side with categorical fields, doc_ids, query_ids [batch] (`text_ids` of the
    documents and of the queries) and, when the records have them, cluster_ids [batch],
    for masking accidental hits."""
    out, query_ids = encode_records(records, "query", inputs.query, "q")
    documents, doc_ids = encode_records(records, "document", inputs.document, "d")
    out.update(documents, doc_ids=doc_ids, query_ids=query_ids)
    out.update(record_clusters(records, "cluster_ids"))
    return out


def only(source, fields: Sequence[str]):
    """`source` with only `fields` of its records parsed where it can (a table's
    `records.Records.only`: each feature read costs about what the parse does); as it
    is otherwise (records in memory, generated pairs)."""
    return source.only(fields) if hasattr(source, "only") else source


def all_records(source, fields: Sequence[str] | None = None, chunk: int = 4096
                ) -> Iterable[dict]:
    """Every record of a data source (with `fields` alone, where given), read in bulk
    chunks."""
    source = source if fields is None else only(source, fields)
    for start in range(0, len(source), chunk):
        yield from read_records(source, range(start, min(start + chunk, len(source))))


def pair_fields(source) -> Iterable[tuple[dict | None, dict | None]]:
    """(query fields, document fields) of every training pair of a data source."""
    for r in all_records(source, ("query_fields", "document_fields")):
        yield record_fields(r, "query_fields"), record_fields(r, "document_fields")


def pair_texts(source) -> Iterable[str]:
    """Both sides of every training pair of a data source."""
    for r in all_records(source, ("query", "document")):
        yield r["query"].decode("utf-8")
        yield r["document"].decode("utf-8")


Table = dict[str, np.ndarray]  # every pair's arrays, by name (`pretokenized_pairs`)
Pending = Background | Later  # one in the making, in a thread


PRETOKENIZE_MAX_BYTES = 2 * 2 ** 30  # a source whose token ids fit in this is encoded once
CHUNK = 1 << 15  # records encoded at a time when the source is pretokenized


def fits_pretokenized(source, inputs: Inputs, num_hard_negatives: int = 0) -> bool:
    """Whether the token ids of every record of `source` take at most
    `PRETOKENIZE_MAX_BYTES` (`pretokenized_pairs` encodes them once then)."""
    row_bytes = 5 * (inputs.query.max_len + (1 + num_hard_negatives) * inputs.document.max_len)
    return len(source) * row_bytes <= PRETOKENIZE_MAX_BYTES


def pretokenized_pairs(source, inputs: Inputs, num_hard_negatives: int = 0,
                       keep_in: str = "", inputs_id: str = "", write: bool = True
                       ) -> dict[str, np.ndarray] | None:
    """Every record of `source` encoded once, in bulk chunks of `CHUNK` (a document
    repeated over a chunk is tokenized once, `Side.encode`): the arrays `ReadPairs`
    gathers its batches from; None when they would take more than
    `PRETOKENIZE_MAX_BYTES` (then each batch is encoded when it is read). It touches
    nothing of jax: a run computes it in a thread while its model is built.

    keep_in: a folder where the arrays are kept for the next run that asks the same
    (`token_cache`: read back from there when they are; written there when `write`);
    inputs_id names the tokenizer and the categorical fields' vocabularies."""
    if not fits_pretokenized(source, inputs, num_hard_negatives):
        return None
    kept = token_cache.folder(keep_in, source, inputs, num_hard_negatives, inputs_id)
    if kept and (arrays := token_cache.read(kept)) is not None:
        return arrays
    reader = ReadPairs(source, inputs, num_hard_negatives, pretokenize=False)
    parts = [reader.map(np.arange(start, min(start + CHUNK, len(source))))
             for start in range(0, len(source), CHUNK)]
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if kept and write:
        token_cache.write(kept, arrays)
    return arrays


class ReadPairs(grain.transforms.Map):
    """A batch of record indices -> `encode_pairs` of those records, and with
    `num_hard_negatives` k each record's mined negatives: n_ids, n_mask [batch, k,
    document max_len] and n_doc_ids [batch, k].

    With `pretokenize` (and a source whose encoded arrays take at most
    `PRETOKENIZE_MAX_BYTES`), every record is encoded once up front
    (`pretokenized_pairs`; or `table`, those arrays computed before) and a batch is a
    gather of rows of those arrays: no record read and no Python string work per batch.
    Otherwise records are read with one bulk `__getitems__` per batch (array_record then
    fetches them together) and encoded then. Both give the same arrays (`map_records`
    does either), so `table` may also be still in the making (a `Background`, or its
    `Later` part): until it is done, each batch is encoded from its records, and the
    first steps of a run need not wait for every pair to be tokenized.
    """

    def __init__(self, source, inputs: Inputs, num_hard_negatives: int = 0,
                 pretokenize: bool = True, table: Table | Pending | None = None):
        self._inputs, self._k = inputs, num_hard_negatives
        # A table's records parsed for what is encoded alone.
        self._source = only(source, ["query", "document", "cluster"] + [
            f"{side}_fields" for side in ("query", "document")
            if getattr(inputs, side).features] + ["hard_negatives"] * bool(num_hard_negatives))
        self._table: Table | Pending | None = table
        if table is None and pretokenize:
            self._table = pretokenized_pairs(source, inputs, num_hard_negatives)

    @property
    def pretokenized(self) -> bool:
        """Whether batches gather rows of a table (or will, once it is made)."""
        return self._table is not None

    def _ready(self) -> Table | None:
        """The table, once there is one to gather from (a pending one's error is raised
        here, in the thread reading a batch)."""
        table = self._table
        if table is None or isinstance(table, dict):
            return table
        if not table.done():
            return None
        self._table = made = table.result()
        return made

    def map(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        table = self._ready()
        if table is not None:
            return {k: v[indices] for k, v in table.items()}
        return self.map_records(read_records(self._source, indices.tolist()))

    def map_records(self, records: Sequence[dict]) -> dict[str, np.ndarray]:
        """`encode_pairs` of the records, and their hard negatives."""
        out = encode_pairs(records, self._inputs)
        if self._k:
            negatives = [[t.decode("utf-8") for t in r.get("hard_negatives", ())[:self._k]]
                         for r in records]
            if any(len(n) < self._k for n in negatives):
                raise ValueError(f"{self._k} hard negatives per pair asked for, but the data "
                                 "has fewer: prepare it with data.hard_negatives set")
            out.update(encode_negatives(negatives, self._inputs.document))
        return out


def encode_negatives(negatives: Sequence[Sequence[str]], side: Side) -> dict[str, np.ndarray]:
    """k negative documents per pair -> n_ids, n_mask [batch, k, document max_len] and
    n_doc_ids [batch, k] (`text_ids`, for accidental hits)."""
    b, k = len(negatives), len(negatives[0])
    flat = [t for n in negatives for t in n]
    enc = side.encode(flat)
    return {"n_ids": enc["ids"].reshape(b, k, -1), "n_mask": enc["mask"].reshape(b, k, -1),
            "n_doc_ids": text_ids(flat).reshape(b, k)}


def distinct_documents(source) -> np.ndarray:
    """Indices of the records whose document is the first of its `text_ids` (one per
    distinct normalised document), in record order."""
    seen, first, raw_seen = set(), [], set()
    for i, r in enumerate(all_records(source, ("document",))):
        if r["document"] in raw_seen:  # (the same bytes: the same text id, seen)
            continue
        raw_seen.add(r["document"])
        key = text_ids([r["document"].decode("utf-8")])[0]
        if key not in seen:
            seen.add(key)
            first.append(i)
    return np.asarray(first, np.int64)


class MixedNegatives(grain.transforms.RandomMap):
    """Adds to a batch `count` documents drawn uniformly (with replacement) from the
    distinct training documents (Yang et al. 2020's mixed negative sampling; a document
    of many pairs is no likelier than one of a single pair): m_ids, m_mask [count,
    document max_len], m_cats, and m_doc_ids [count] (`text_ids`).

    grain seeds the rng from the pipeline seed and the batch's index, so the draws are
    the same after a resume.
    """

    def __init__(self, source, side: Side, count: int, share: slice = slice(None)):
        self._source, self._side, self._count = source, side, count
        self._share = share  # this process's part of the draws (all processes draw alike)
        self._documents = distinct_documents(source)

    def random_map(self, batch: dict, rng: np.random.Generator) -> dict:
        picks = self._documents[rng.integers(0, len(self._documents), self._count)][self._share]
        records = read_records(self._source, picks.tolist())
        mixed, doc_ids = encode_records(records, "document", self._side, "m")
        return {**batch, **mixed, "m_doc_ids": doc_ids,
                **record_clusters(records, "m_cluster_ids")}


MAX_AUTO_WORKERS = 8


def workers(asked: int, none_because: str = "") -> int:
    """The grain worker processes for data.worker_count `asked`: itself, or for -1 one a
    core but the main process's, at most MAX_AUTO_WORKERS, unless `none_because` says
    why a worker would not help (every pair tokenized up front: a batch is a gather of
    rows, which a worker would only copy)."""
    if asked >= 0:
        return asked
    cores = len(os.sched_getaffinity(0))
    chosen = 0 if none_because else min(cores - 1, MAX_AUTO_WORKERS)
    logging.info("data.worker_count=-1: %d worker processes (%s)", chosen,
                 none_because or f"{cores} cores")
    return chosen


def _iterate(ds: grain.MapDataset, worker_count: int, prefetch_batches: int
             ) -> grain.DatasetIterator:
    """Iterates a dataset of whole batches, `prefetch_batches` of them built ahead by as
    many threads (grain's default, 16 threads and 500 elements, would build 500 *batches*
    ahead: gigabytes at a large batch, and minutes of CPU taken from a short run)."""
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=prefetch_batches,
                                              prefetch_buffer_size=prefetch_batches))
    if worker_count > 0:
        from absl import flags
        if not flags.FLAGS.is_parsed():  # (grain's workers read its flags; the commands
            flags.FLAGS.mark_as_parsed()  # parse them, a notebook or a test may not)
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return iter(ds)


def train_iterator(source, inputs: Inputs, global_batch_size: int, seed: int,
                   worker_count: int = 0, num_mixed_negatives: int = 0,
                   num_hard_negatives: int = 0, prefetch_batches: int = 4,
                   pretokenize: bool = True, table: Table | Pending | None = None
                   ) -> grain.DatasetIterator:
    """An endless iterator of this process's share of each global training batch (its
    pairs encoded once up front with `pretokenize`, or given so encoded as `table`:
    `pretokenized_pairs`, or still being encoded; see `ReadPairs`).

    Every epoch is reshuffled (seeded, `shuffle.stream`); the last incomplete batch of an
    epoch does not exist because the data repeats before batching. Every process orders
    and batches all the pairs alike and reads its contiguous share of each global batch,
    so the global batches do not depend on the number of processes. With
    `num_mixed_negatives` U, U uniformly drawn documents join each global batch
    (`MixedNegatives`, each process reading its share of the same draws); with
    `num_hard_negatives` k, each pair's k mined negatives (`ReadPairs`).
    """
    n_proc, i = jax.process_count(), jax.process_index()
    if not 0 <= seed < 2 ** 32:
        raise ValueError(f"seed={seed}: the training data's order needs a seed in [0, 2**32)")
    for what, value in (("global_batch_size", global_batch_size),
                        ("num_mixed_negatives", num_mixed_negatives)):
        if value % n_proc:
            raise ValueError(f"{what}={value} is not divisible by {n_proc} processes")
    local, n = global_batch_size // n_proc, len(source)
    batches = grain.MapDataset.range(2 ** 62 // global_batch_size)
    ds = batches.map(lambda b: shuffle.stream(b * global_batch_size + i * local, local, n, seed))
    if table is not None and not isinstance(table, dict):
        if not fits_pretokenized(source, inputs, num_hard_negatives):
            table = None  # (it will be None: each batch encoded as it is read)
        elif worker_count > 0:  # the workers are handed the table itself
            table = table.result()
    reader = ReadPairs(source, inputs, num_hard_negatives, pretokenize, table)
    ds = ds.map(reader)
    if num_mixed_negatives:
        u = num_mixed_negatives // n_proc
        ds = ds.random_map(MixedNegatives(source, inputs.document, num_mixed_negatives,
                                          slice(i * u, (i + 1) * u)), seed=seed + 1)
    return _iterate(ds, workers(worker_count, "the pairs are tokenized up front"
                                if reader.pretokenized else ""), prefetch_batches)


class GeneratePairs(grain.transforms.Map):
    """A batch of stream positions -> `encode_pairs` of the pairs a pre-training
    `PairGenerator` makes at those positions; for "distill" pairs also their negatives
    (`encode_negatives`) and "teacher" [batch, 1 + k], the teacher's scores."""

    def __init__(self, generator, inputs: Inputs):
        self._generator, self._inputs = generator, inputs

    def map(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        pairs = [self._generator.pair(int(p)) for p in positions]
        out = encode_pairs([{"query": q.encode(), "document": d.encode()} for q, d, _ in pairs],
                           self._inputs)
        if "distill" in self._generator.tasks:  # alone (pretraining.ALONE)
            candidates = [self._generator.candidates(int(p)) for p in positions]
            out.update(encode_negatives([c[0] for c in candidates], self._inputs.document))
            out["teacher"] = np.stack([c[1] for c in candidates])
        return out


def generated_iterator(generator, inputs: Inputs, global_batch_size: int,
                       worker_count: int = 0, prefetch_batches: int = 4
                       ) -> grain.DatasetIterator:
    """An endless iterator of this process's share of each global batch of generated
    pairs: global batch b holds stream positions [b * B, (b + 1) * B), and process i of
    n its i-th contiguous share, so the pairs do not depend on the number of processes."""
    n_proc, i = jax.process_count(), jax.process_index()
    if global_batch_size % n_proc:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"{n_proc} processes")
    local = global_batch_size // n_proc
    batches = grain.MapDataset.range(2 ** 62 // global_batch_size)
    ds = batches.map(lambda b: np.arange(b * global_batch_size + i * local,
                                         b * global_batch_size + (i + 1) * local))
    return _iterate(ds.map(GeneratePairs(generator, inputs)),
                    workers(worker_count, "the generator holds the whole collection, which "
                            "each worker would copy"), prefetch_batches)
