"""Building a corpus index (`python -m dualjax.index` is its command): a corpus encoded
by an exported encoder and saved with its searcher, streamed a block at a time, by one
process or several (each its own shard; process 0 writes the manifest last, after
checking every shard). `serve/corpus_index.py` describes the folder it writes.
"""
from __future__ import annotations

import array
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from absl import logging

from dualjax.data.corpus_file import Document, Line, corpus_path, documents, identity
from dualjax.errors import DataError, PeerStopped
from dualjax.retrieval import quantized, searchers
from dualjax.runtime import peers, processes
from dualjax.runtime.files import check_output, staged_output
from dualjax.runtime.pipeline import prefetched
from dualjax.runtime.progress import Progress
from dualjax.serve.bundle import Encoder
from dualjax.serve.corpus_index import (
    META,
    NOT_INSIDE,
    CorpusIndex,
    ShardWriter,
    build_searcher,
    differing,
    shard_name,
    write_manifest,
    write_shard_meta,
)
from dualjax.text import tokenizers

BLOCK_BATCHES = 16  # a block (texts held, sorted longest first, then written) = 16 batches


@dataclasses.dataclass(frozen=True)
class Settings:
    """What shapes an index's shards: the same in every process of a build (agreed
    before any work), recorded in every shard.json and in index.json."""
    kind: str = "scann"  # "scann", "hnsw" (faiss) or "exact"
    k: int = 100         # the results a search returns at most
    quantize: str = ""   # "int8" or "binary": the corpus vectors kept as codes alone
    rescore: int = 0     # a quantized index's candidates rescored with the float query

    def check(self, batch_size: int = 1) -> None:
        """`check_build`: ValueError (ImportError) before anything is read or encoded."""
        check_build(self.kind, batch_size, self.quantize, self.rescore)


@dataclasses.dataclass(frozen=True)
class Source:
    """The documents of a build: this process' share (`mine`) and all of them
    (`everything`, read again only to name a duplicate id), the name errors give them,
    the file's identity (`corpus_file.identity`; None for texts given in memory) and the
    inputs an --out must not cover."""
    mine: Callable[[], Iterator[Document]]
    everything: Callable[[], Iterator[Document]]
    name: str
    identity: dict | None = None
    inputs: tuple[str, ...] = ()


def build(encoder: Encoder, ids: Sequence[str], texts: Sequence[str], out: str,
          kind: str = "scann", k: int = 100, batch_size: int = 256,
          inputs: tuple[str, ...] = (), overwrite: bool = False, quantize: str = "",
          rescore: int = 0) -> CorpusIndex:
    """Encodes a corpus given in memory with the encoder's document side, builds its
    index and writes it to `out` (one shard: one process). Written beside `out`, then
    renamed: a failure leaves `out` as it was and nothing else behind.

    Args:
      encoder: the bundle whose document tower encodes the corpus.
      ids, texts: the corpus, one id per text (texts that give no token are skipped).
      out: new, empty or (with `overwrite`) an index holding only its own files; never one
        of `inputs` (the bundle, the corpus file), a folder holding one, or a folder
        inside a bundle, an index or a workdir.
      kind: "scann", "hnsw" (faiss) or "exact".
      k: the results a search returns at most.
      batch_size: texts per encoding call.
      quantize: "int8" or "binary": keep the corpus vectors quantized alone
        (`retrieval.quantized`; kind "exact"), the top `rescore` (0: 4 x k) candidates
        of each search rescored with the float query; "": float vectors.

    Returns:
      The index, loaded from `out` (its files checked).
    """
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")

    def everything() -> Iterator[Document]:
        return ((Line("", 0, n, [0]), str(i), t)
                for n, (i, t) in enumerate(zip(ids, texts, strict=True), 1))
    _build(encoder, Source(everything, everything, "the corpus", None, tuple(inputs)), out,
           Settings(kind, k, quantize, rescore), batch_size, overwrite)
    return CorpusIndex(out, encoder.id)


def build_file(encoder: Encoder, corpus: str, out: str, kind: str = "scann", k: int = 100,
               batch_size: int = 256, overwrite: bool = False, quantize: str = "",
               rescore: int = 0, devices: Sequence = ()) -> dict:
    """`build` over a corpus file (`corpus_file.corpus_path`), streamed: in a run of
    several processes (jax.distributed), each reads and encodes its own share on
    `devices` (its local ones) and writes its shard; process 0 writes the manifest.
    The processes first compare what shapes a shard (the corpus file's identity, the
    encoder, its width, the searcher and its settings): a difference stops every process
    in one line naming the flag and both values, before anything is written.

    Returns:
      The manifest (index.json's content), in every process.
    """
    import jax
    path = corpus_path(corpus)
    share, shares = jax.process_index(), jax.process_count()
    source = Source(lambda: documents(path, share, shares), lambda: documents(path), path,
                    {"path": path, **identity(path)}, (corpus,))
    return _build(encoder, source, out, Settings(kind, k, quantize, rescore), batch_size,
                  overwrite, devices, share, shares)


def _build(encoder: Encoder, source: Source, out: str, settings: Settings, batch_size: int,
           overwrite: bool, devices: Sequence = (), share: int = 0, shares: int = 1) -> dict:
    """The build of one process: its shard, then (process 0) the manifest. Every failure
    is said in each process in one line; `out` is replaced only when every shard is
    written and checked."""
    settings.check(batch_size)
    record = _record(encoder, source, settings)
    _agree_on_settings(record, shares)
    main, told = share == 0, False
    try:
        with contextlib.ExitStack() as stack:
            tmp, refused = None, None
            if main:  # --out checked and staged: the others learn it by the broadcast
                try:
                    stage = stack.enter_context(staged_output(out))
                    check_output(out, META, "corpus index",
                                 inputs=(encoder.directory, *source.inputs),
                                 overwrite=overwrite, not_inside=NOT_INSIDE)
                    tmp = stage()
                except Exception as e:  # OutputError, a disk's OSError, ...
                    refused = e
            tmp, run = _agree_on_stage(out, tmp, shares)
            told = tmp is None
            if refused is not None:
                raise refused
            if tmp is None:
                raise DataError(f"process 0 refused --out={out} (its log says why); "
                                "nothing was written")
            failed = None
            try:
                _write_shard(encoder, source.mine(), tmp, share, shares, run, settings,
                             batch_size, record, devices)
            except (DataError, ValueError, OSError) as e:
                failed = _shard_failed(e, tmp, share)
            if processes.any_process(failed is not None):
                told = True  # every process knows
                if failed is not None:
                    raise failed
                raise DataError(_other_failure(tmp, shares))
            if not main:
                manifest = None
            else:
                manifest = _finish(tmp, source, encoder.id, run, settings, record, shares)
    except BaseException:
        if main and shares > 1 and not told:
            processes.agree(False)  # the others wait for the manifest: they stop too
        raise
    if shares > 1:  # the others return once process 0 has put the index at `out`
        if not processes.agree(main):
            raise DataError("process 0 could not finish the index (its log says why); "
                            "nothing was written")
        if not main:
            with open(os.path.join(out, META)) as f:
                manifest = json.load(f)
    assert manifest is not None
    return manifest


# What the processes of a build compare, with the flag each comes from.
_FLAGS = {"corpus": "--corpus", "encoder": "--encoder", "dim": "--dim", "kind": "--kind",
          "k": "the results kept (k)", "quantize": "--quantize", "rescore": "--rescore"}


def _record(encoder: Encoder, source: Source, settings: Settings) -> dict:
    """What shapes this process' shard, as shard.json and index.json record it."""
    return {"corpus": source.identity, "encoder": {"path": encoder.directory,
                                                   "id": encoder.meta["id"]},
            "dim": encoder.dim, **dataclasses.asdict(settings)}


def _agree_on_settings(record: dict, shares: int) -> None:
    """DataError in every process (the same line) when the processes of a build were
    not given the same corpus, encoder, width or searcher; before anything is written."""
    if shares == 1:
        return
    records = processes.gather(record)
    for other, theirs in enumerate(records):
        key = differing(records[0], theirs)
        if key is not None:
            raise DataError(f"the processes were given different {_FLAGS.get(key, key)}: "
                            f"process 0 {_shown(key, records[0].get(key))}, process {other} "
                            f"{_shown(key, theirs.get(key))}; give every process the same "
                            "flags (nothing was written)")


def _shown(key: str, value) -> str:
    if key == "corpus" and value:
        return f"{value['path']} ({value['size']:,} bytes, digest {value['digest'][:8]})"
    if key == "encoder":
        return f"{value['path']} (encoder {value['id']})"
    if key == "quantize":
        return repr(value or "none")
    return repr(value)


def _agree_on_stage(out: str, tmp: str | None, shares: int) -> tuple[str | None, str]:
    """(the staging folder, the build's run id), process 0's, in every process; the
    folder is None in all of them when process 0 has none (it refused --out)."""
    pid, number, ok = os.getpid(), secrets.randbits(31), int(tmp is not None)
    if shares > 1:
        from jax.experimental import multihost_utils
        pid, number, ok = (int(v) for v in multihost_utils.broadcast_one_to_all(
            np.array([pid, number, ok], np.int32)))
    staged = (tmp or f"{out.rstrip(os.sep)}.tmp{pid}") if ok else None
    return staged, f"{pid}-{number:08x}"


def _shard_failed(error: Exception, tmp: str, share: int) -> Exception:
    """This process' shard could not be written: its error, left for the others in
    error-N.txt. When the staging folder is gone, process 0 removed it as it stopped (a
    signal): this process stops for that reason, not for the file its write lost
    (PeerStopped, as soon as its watcher reads the other's stop)."""
    if not os.path.isdir(tmp):
        watcher = peers.active()
        reason = watcher.await_stop() if watcher is not None else None
        if reason is not None:
            raise PeerStopped(reason) from error
    try:
        with open(os.path.join(tmp, f"error-{share}.txt"), "w") as f:
            f.write(str(error))
    except OSError:  # (the others then say "another process failed")
        pass
    return error


def _other_failure(tmp: str, shares: int) -> str:
    """What the process that failed wrote (its error-N.txt in the staging folder)."""
    for s in range(shares):
        path = os.path.join(tmp, f"error-{s}.txt")
        if os.path.isfile(path):
            with open(path) as f:
                return f"process {s}: {f.read().strip()}"
    return "another process failed (its log says why); nothing was written"


def _id_hash(doc_id: str) -> int:
    """A 64-bit digest of an id: duplicates are found over every shard from these alone."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")


def _write_shard(encoder: Encoder, docs: Iterator[Document], tmp: str, share: int,
                 shares: int, run: str, settings: Settings, batch_size: int, record: dict,
                 devices: Sequence) -> None:
    """Streams this process' documents into its shard folder: a block at a time, its
    texts that give a token encoded longest first and written with their vectors; then
    the shard's searcher, its shard.json, and (beside it) its ids' digests."""
    start = time.perf_counter()
    folder = os.path.join(tmp, shard_name(share, shares))
    writer = ShardWriter(folder, encoder.dim)
    tokenizer = encoder.sides["document"].tokenizer
    hashes, skipped, block_size = array.array("Q"), [], BLOCK_BATCHES * batch_size

    def blocks() -> Iterator[tuple[list[str], list[str]]]:
        """(ids, texts) of each block of documents, with their ids' digests kept."""
        ids: list[str] = []
        texts: list[str] = []
        for _, doc_id, text in docs:
            hashes.append(_id_hash(doc_id))
            ids.append(doc_id)
            texts.append(text)
            if len(texts) == block_size:
                yield ids, texts
                ids, texts = [], []
        yield ids, texts

    # The next block is read and parsed, and the last one written, while this one is
    # encoded (`runtime.pipeline`): none of the three waits for the others.
    written = None
    try:
        with Progress(None, f"encode corpus{f' (shard {share})' if shares > 1 else ''}",
                      "text") as bar, concurrent.futures.ThreadPoolExecutor(1) as write:
            for block_ids, block_texts in prefetched(blocks()):
                ids, texts, dropped = with_tokens(block_ids, block_texts, tokenizer)
                skipped.extend(dropped)
                vectors = encoder.encode_documents(texts, batch_size=batch_size,
                                                   devices=devices, progress=bar.update)
                if written is not None:
                    written.result()
                written = write.submit(writer.add, ids, texts, vectors)
            if written is not None:
                written.result()
    except BaseException:
        writer.abort()
        raise
    n = writer.close()
    encoded = time.perf_counter() - start
    if skipped:
        logging.warning("skipped %d documents that give the encoder no token (empty, or no "
                        "letter or digit; ids %s%s)", len(skipped), ", ".join(skipped[:5]),
                        ", ..." if len(skipped) > 5 else "")
    searcher = build_searcher(folder, settings.kind, settings.k, encoder.id,
                              settings.quantize, settings.rescore)
    write_shard_meta(folder, {
        "run": run, "shard": share, "shards": shares, "encoder_id": encoder.id, "n": n,
        "dim": encoder.dim, "read": len(hashes), "settings": searcher, "build": record,
        "encode_seconds": round(encoded, 3), "encode_profile": encoder.timings.as_dict(),
        "build_seconds": round(time.perf_counter() - start - encoded, 3)})
    np.save(os.path.join(tmp, f"ids-{share}.npy"), np.frombuffer(hashes, np.uint64))


def with_tokens(ids: Sequence[str], texts: Sequence[str], tokenizer
                ) -> tuple[list[str], list[str], list[str]]:
    """(ids, texts) of the documents that give the tokenizer some token, and the ids of
    the others. One that gives none (empty, or only punctuation, symbols or emoji for a
    word tokenizer) would be the towers' bias alone, one vector shared by all such
    documents that ranks them first for every query the model knows nothing of."""
    skipped = set(tokenizers.without_tokens(tokenizer, texts))
    return ([i for n, i in enumerate(ids) if n not in skipped],
            [t for n, t in enumerate(texts) if n not in skipped],
            [ids[n] for n in sorted(skipped)])


def _finish(tmp: str, source: Source, encoder_id: str, run: str, settings: Settings,
            record: dict, shares: int) -> dict:
    """Process 0, once every shard is written: ids unique over all shards, a document to
    search, then index.json, written last."""
    hashes = np.concatenate([np.load(os.path.join(tmp, f"ids-{s}.npy")) for s in range(shares)])
    for s in range(shares):
        os.remove(os.path.join(tmp, f"ids-{s}.npy"))
    if not len(hashes):
        raise DataError(f"{source.name}: no documents")
    ordered = np.sort(hashes)
    if (ordered[1:] == ordered[:-1]).any():
        _raise_duplicate(source.everything, source.name)
    shard_metas = []
    for s in range(shares):
        with open(os.path.join(tmp, shard_name(s, shares), "shard.json")) as f:
            shard_metas.append(json.load(f))
    meta = {"encoder_id": encoder_id, "run": run, "kind": settings.kind, "k": settings.k,
            "dim": shard_metas[0]["dim"], "build": record,
            **({"quantize": settings.quantize, "rescore": settings.rescore}
               if settings.quantize else {}),
            # the slowest process' (they run at once)
            "encode_seconds": max(m["encode_seconds"] for m in shard_metas),
            "build_seconds": max(m["build_seconds"] for m in shard_metas)}
    if not sum(m["n"] for m in shard_metas):
        raise ValueError("the corpus holds no document that gives the encoder a token")
    return write_manifest(tmp, meta, shares)


def _raise_duplicate(everything: Callable[[], Iterator[Document]], source: str) -> None:
    """DataError naming the first repeated id and both its lines (read again: only when
    the digests say an id repeats)."""
    seen: dict[str, int] = {}
    for line, doc_id, _ in everything():
        if doc_id in seen:
            where = f"{source}:{int(line)}" if source != "the corpus" else \
                f"the corpus' text {int(line)}"
            raise DataError(f"{where}: duplicate id {doc_id!r} (first at "
                            f"{'line' if source != 'the corpus' else 'text'} {seen[doc_id]})")
        seen[doc_id] = int(line)


def check_build(kind: str, batch_size: int, quantize: str = "", rescore: int = 0) -> None:
    """ValueError (ImportError for a missing faiss or ScaNN) naming the setting that
    cannot work, before anything is read or encoded."""
    if kind not in searchers.SEARCHERS:
        raise ValueError(f"--kind={kind!r} is not one of: {', '.join(searchers.SEARCHERS)}")
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size}: give the texts per batch, at least 1")
    if quantize and quantize not in quantized.KINDS:
        raise ValueError(f"--quantize={quantize!r} is not one of: {', '.join(quantized.KINDS)}")
    if quantize and kind != "exact":
        raise ValueError(f"--quantize={quantize} searches the codes themselves: give "
                         f"--kind=exact (not {kind!r}, which keeps float vectors)")
    if rescore < 0 or (rescore and not quantize):
        raise ValueError(f"--rescore={rescore}: the candidates a quantized index rescores "
                         "(>= 0, with --quantize)")
    searchers.SEARCHERS[kind].require()  # ImportError: what to install
