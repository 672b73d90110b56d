"""A table's split written as TFDS array_record shards, at corpus scale (`write_split`).

TFDS's own writer serializes each record through its per-feature Python, keeps every
serialized record to shuffle them, then writes them from one process (its rate:
BENCHMARKS.md, issue 46). Here a record is encoded as the same tf.Example by hand
(`encoder`: what protobuf parses back equals what TFDS writes), in the order TFDS's
writer gives (`tfds_order`: the records sorted by the MD5 of their index salted with the
split's name), straight into the shards, holding only the order in memory; a long split
is written by worker processes, a shard each. The files, their names and the split's
info are what TFDS writes and reads (`tfds.core.SplitInfo`), so `builder.as_data_source`
and grain read them as before, a table written by TFDS's own writer reads the same, and
each record keeps its place: the training order of a seed does not change with the
writer.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol, cast

import numpy as np
import tensorflow_datasets as tfds
from array_record.python import array_record_module

from dualjax.errors import WorkdirError

SHARD_BYTES = 512 << 20  # a shard is closed once it holds this many bytes of records
# One record a chunk (random access, as TFDS writes), each compressed with snappy rather
# than TFDS's default, brotli: several times faster to write and faster to read, for
# somewhat larger files (the figures: BENCHMARKS.md, issue 46).
OPTIONS = "group_size:1,snappy"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(i) for i in range(1 << 14)]


def _len(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint(n)


def _text(value) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


# A tf.Example is Example{1: Features{1: map entries {1: name, 2: Feature}}}, a Feature
# {1: BytesList{1: bytes, ...}} or {3: Int64List{1: packed varints}}. Each part below is
# the list of byte strings of one map entry (tag, length, payload), joined once a record.
def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _len(len(payload)) + payload


def _entry(key: bytes, feature: list[bytes], size: int) -> tuple[list[bytes], int]:
    """A map entry of `key` and a Feature of `size` bytes."""
    head = _len(size)
    body = len(key) + 1 + len(head) + size
    lead = _len(body)
    return [b"\x0a", lead, key, b"\x12", head, *feature], 1 + len(lead) + body


def _bytes_entry(key: bytes, values: list[bytes]) -> tuple[list[bytes], int]:
    parts: list[bytes] = []
    size = 0
    for v in values:
        n = _len(len(v))
        parts += (b"\x0a", n, v)
        size += 1 + len(n) + len(v)
    head = _len(size)
    return _entry(key, [b"\x0a", head, *parts], 1 + len(head) + size)


def _int64_entry(key: bytes, values) -> tuple[list[bytes], int]:
    packed = b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in values)
    inner = b"\x0a" + _len(len(packed)) + packed if packed else b""
    feature = b"\x1a" + _len(len(inner)) + inner
    return _entry(key, [feature], len(feature))


def kinds(features: Mapping[str, object]) -> dict[str, str]:
    """A table's features (builders._FEATURES: Text, np.int64, Sequences of either) as
    {name: "text" | "int64" | "text list" | "int64 list"}."""
    def kind(f) -> str:
        return "text" if isinstance(f, tfds.features.Text) else "int64"
    return {name: f"{kind(f.feature)} list" if isinstance(f, tfds.features.Sequence)
            else kind(f) for name, f in features.items()}


_MAKERS = {"text": lambda k, v: _bytes_entry(k, [_text(v)]),
           "text list": lambda k, v: _bytes_entry(k, [_text(x) for x in v]),
           "int64": lambda k, v: _int64_entry(k, (v,)),
           "int64 list": _int64_entry}


def encoder(table_kinds: Mapping[str, str]) -> Callable[[Mapping], bytes]:
    """record -> the tf.Example bytes TFDS writes for it, for a table of `kinds`. A
    record holds each feature as TFDS takes it: str or bytes, an int, a list of them."""
    parts = [(name, functools.partial(_MAKERS[kind], _field(b"\x0a", name.encode())))
             for name, kind in table_kinds.items()]

    def encode(record: Mapping) -> bytes:
        out, size = [b"\x0a", b""], 0
        for name, make in parts:
            entry, n = make(record[name])
            out += entry
            size += n
        out[1] = _len(size)
        return b"".join(out)
    return encode


def tfds_order(n: int, salt: str) -> np.ndarray:
    """The indices of n records in the order TFDS's writer puts them (its Shuffler sorts
    by tfds.core.hashing.Hasher(salt).hash_key(index), a 128-bit MD5)."""
    base = hashlib.md5(salt.encode("utf-8"))
    high, low = np.empty(n, np.uint64), np.empty(n, np.uint64)
    for i in range(n):
        md5 = base.copy()
        md5.update(str(i).encode())
        digest = md5.digest()
        high[i] = int.from_bytes(digest[:8], "big")
        low[i] = int.from_bytes(digest[8:], "big")
    return np.lexsort((low, high))


class Indexed(Protocol):
    """Records by index (a list, or builders' records built as they are read)."""
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Mapping: ...


def write_split(records: Indexed, features: Mapping[str, object],
                template: tfds.core.ShardedFileTemplate, shard_bytes: int = SHARD_BYTES,
                workers: int | None = None) -> tfds.core.SplitInfo:
    """Writes `records` (a sequence: read by index in TFDS's order) as the split of
    `template` (its folder is TFDS's temporary one until the table is whole); returns its
    SplitInfo. A split of PARALLEL_RECORDS or more is written by `workers` processes
    (default: one a core), a shard of TASK_RECORDS records each; a shorter one here,
    closing a shard at `shard_bytes`. The shards are named, with their count, once all
    are written."""
    n = len(records)
    if n == 0:
        raise AssertionError("No examples were yielded.")  # (what TFDS's writer says)
    order = tfds_order(n, template.split)
    table_kinds = kinds(features)
    folder = os.fspath(template.data_dir)
    if workers is None:
        workers = _default_workers(n)
    if workers > 1:
        written = _write_in_processes(records, order, table_kinds, folder, template.split,
                                      workers)
    else:
        written = _write_here(records, order, table_kinds, folder, template.split,
                              shard_bytes)
    for k, (path, _, _) in enumerate(written):
        os.replace(path, os.fspath(template.sharded_filepath(shard_index=k,
                                                             num_shards=len(written))))
    return tfds.core.SplitInfo(name=template.split, shard_lengths=[c for _, c, _ in written],
                               num_bytes=sum(b for _, _, b in written),
                               filename_template=template)


PARALLEL_RECORDS = 200_000
TASK_RECORDS = 50_000


def _default_workers(n: int) -> int:
    """One writer process a core for a split of PARALLEL_RECORDS or more, else none."""
    return len(os.sched_getaffinity(0)) if n >= PARALLEL_RECORDS else 1


def _worker_command() -> tuple[list[str], dict[str, str]]:
    """The command of a writer process and its environment (dualjax importable)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package, os.environ.get("PYTHONPATH", "")) if p)}
    return [sys.executable, "-m", "dualjax.data.table_files"], env
Written = tuple[str, int, int]  # a shard's temporary path, its records and bytes


def _shard_path(folder: str, split: str, k: int) -> str:
    return os.path.join(folder, f".{split}-shard-{k:05d}")


def _write_here(records, order, table_kinds, folder, split, shard_bytes) -> list[Written]:
    encode = encoder(table_kinds)
    written: list[Written] = []
    writer, path, count, size = None, "", 0, 0
    for i in order:
        data = encode(records[int(i)])
        if writer is None:
            path = _shard_path(folder, split, len(written))
            writer = array_record_module.ArrayRecordWriter(path, OPTIONS)
            count = size = 0
        writer.write(data)
        count, size = count + 1, size + len(data)
        if size >= shard_bytes:
            writer.close()
            written.append((path, count, size))
            writer = None
    if writer is not None:
        writer.close()
        written.append((path, count, size))
    return written


def write_shard(path: str, table_kinds: Mapping[str, str], records: Sequence[Mapping]
                ) -> Written:
    """One shard of `records`, in their order (a worker process's task)."""
    encode = encoder(table_kinds)
    writer = array_record_module.ArrayRecordWriter(path, OPTIONS)
    size = 0
    for r in records:
        data = encode(r)
        writer.write(data)
        size += len(data)
    writer.close()
    return path, len(records), size


def _write_in_processes(records, order, table_kinds, folder, split, workers) -> list[Written]:
    """A shard a task, TASK_RECORDS records each, over `workers` processes of this module
    (`python -m dualjax.data.table_files`: started bare, not forked from this process,
    which has jax's threads, nor spawned by multiprocessing, which imports the caller's
    main module again). Here the records are gathered in TFDS's order and sent, one task
    a worker at a time; there they are encoded and written."""
    starts = list(range(0, len(order), TASK_RECORDS))
    workers = min(workers, len(starts))
    command, env = _worker_command()
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
             for _ in range(workers)]
    written: list[Written] = []
    try:
        for k, start in enumerate(starts):
            proc = procs[k % workers]
            if k >= workers:  # its previous task first
                written.append(_result(proc))
            chunk = [records[int(i)] for i in order[start:start + TASK_RECORDS]]
            stdin = cast(IO[bytes], proc.stdin)
            pickle.dump((_shard_path(folder, split, k), table_kinds, chunk), stdin)
            stdin.flush()
        for k in range(len(written), len(starts)):
            written.append(_result(procs[k % workers]))
    finally:
        for proc in procs:
            cast(IO[bytes], proc.stdin).close()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return written


def _result(proc: subprocess.Popen) -> Written:
    """A worker's answer to its task; its error raised here, with its message (a full
    disk's stays recognisable: builders.prepare reads it)."""
    try:
        answer = pickle.load(cast(IO[bytes], proc.stdout))
    except EOFError:
        raise WorkdirError(
            f"a process writing the data tables (pid {proc.pid}) ended with exit code "
            f"{proc.wait()} before its shard was whole; nothing was kept (the table is "
            "written into a temporary folder, removed): run the same command again") from None
    if isinstance(answer, BaseException):
        raise answer
    return answer


def _serve() -> None:
    """A worker: tasks (path, kinds, records) from stdin until it closes, each answered
    on stdout with its `write_shard` result, or the exception that stopped it."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            task = pickle.load(stdin)
        except EOFError:
            return
        try:
            answer: object = write_shard(*task)
        except Exception as e:  # noqa: BLE001 (sent back, raised there)
            answer = e if isinstance(e, (OSError, RuntimeError)) else RuntimeError(str(e))
        pickle.dump(answer, stdout)
        stdout.flush()


if __name__ == "__main__":
    _serve()
