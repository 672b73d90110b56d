"""A corpus index on disk: the shards that one or several processes wrote, and the
manifest that makes them one index (`python -m dualjax.index` builds it).

    OUT/index.json                  the manifest, written last: the encoder's id, the
                                    searcher's kind and settings, the shards, and the
                                    sha256 of every file below OUT
    OUT/shard-00000-of-00002/       one per process of the build, in corpus order
        corpus.jsonl                {"id", "text"} per line, in index order
        offsets.npy                 int64 [n + 1]: where each line starts (texts and ids
                                    are read from disk by position when answering)
        embeddings.npy              float32 [n, dim] (quantized.npz: the codes alone)
        scann/ or hnsw/             the shard's searcher (none for exact)
        shard.json                  the build's run id, the encoder's id, the count and
                                    what shaped it (corpus file, encoder, width,
                                    searcher, quantization), equal to index.json's

Memory when built or loaded is the vectors and a few bounded buffers: texts and ids stay
on disk. A shard missing, left by another build or written with another encoder is
refused naming it, before anything is answered.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence

import numpy as np

from dualjax.retrieval import ann, quantized
from dualjax.retrieval.sharded import ShardedSearcher
from dualjax.runtime.files import atomic_write, file_digests, files_under, verify_digests

META = "index.json"
SHARD_META = "shard.json"
FORMAT = 3  # 3: shards (2: one folder, index.json records its files' digests)
# An index never lies inside a bundle or another index (whose --overwrite would delete
# it) or inside a run's workdir.
NOT_INSIDE = ("bundle", "corpus index", "sentence-transformers folder", "workdir")
_SHARD = re.compile(r"shard-(\d{5})-of-(\d{5})$")


def shard_name(shard: int, shards: int) -> str:
    """The folder of shard `shard` of `shards`: "shard-00001-of-00002"."""
    return f"shard-{shard:05d}-of-{shards:05d}"


def eval_config() -> dict:
    """The searchers' settings (`ann.make_index`'s eval_cfg)."""
    return {"query_chunk": 256, "corpus_chunk": 4096, "scann": ann.default_scann_config(),
            "hnsw": ann.default_hnsw_config()}


class ShardWriter:
    """Writes one shard as its documents come, a block at a time: their lines and
    vectors go to disk at once, so memory holds one block, never the shard."""

    def __init__(self, folder: str, dim: int):
        os.makedirs(folder)
        self.folder, self.dim, self.n = folder, dim, 0
        self._lines = open(os.path.join(folder, "corpus.jsonl"), "wb")
        self._vectors = open(os.path.join(folder, "embeddings.f32"), "wb")
        self._offsets = [np.zeros(1, np.int64)]

    def add(self, ids: Sequence[str], texts: Sequence[str], vectors: np.ndarray) -> None:
        """Appends documents (ids, texts) and their vectors [len(ids), dim], in index order."""
        # json.dumps({"id": i, "text": t}, ensure_ascii=False) to the byte, with json's C
        # string encoder called directly: a third of the time of a line
        quoted = json.encoder.encode_basestring
        lines = [f'{{"id": {quoted(i)}, "text": {quoted(t)}}}\n'.encode()
                 for i, t in zip(ids, texts, strict=True)]
        self._lines.writelines(lines)
        ends = np.cumsum([len(line) for line in lines], dtype=np.int64)
        self._offsets.append(self._offsets[-1][-1] + ends)
        self._vectors.write(np.ascontiguousarray(vectors, "<f4").tobytes())
        self.n += len(lines)

    def close(self) -> int:
        """Writes offsets.npy and embeddings.npy (the vectors written so far, behind the
        header that their count now gives); returns the count."""
        self._lines.close()
        self._vectors.close()
        np.save(os.path.join(self.folder, "offsets.npy"), np.concatenate(self._offsets))
        raw = os.path.join(self.folder, "embeddings.f32")
        with open(os.path.join(self.folder, "embeddings.npy"), "wb") as out, \
                open(raw, "rb") as data:
            np.lib.format.write_array_header_1_0(out, {
                "descr": "<f4", "fortran_order": False, "shape": (self.n, self.dim)})
            shutil.copyfileobj(data, out, 1 << 24)
        os.remove(raw)
        return self.n

    def abort(self) -> None:
        self._lines.close()
        self._vectors.close()


def build_searcher(folder: str, kind: str, k: int, encoder_id: str, quantize: str = "",
                   rescore: int = 0) -> dict:
    """Builds the searcher of a closed shard over its embeddings.npy (quantized: replaces
    it by the codes) and returns its settings."""
    path = os.path.join(folder, "embeddings.npy")
    embeddings = np.load(path, mmap_mode="r")
    if not len(embeddings):
        return {}
    if quantize:  # the codes alone: the float vectors are what it saves
        quantized.QuantizedIndex.build(np.asarray(embeddings), quantize, rescore).save(folder)
        del embeddings
        os.remove(path)
        return {"quantize": quantize, "rescore": rescore}
    return ann.make_index(kind, embeddings, eval_config(), min(k, len(embeddings)),
                          directory=_searcher_dir(folder, kind), extra=encoder_id)[1]["settings"]


def _searcher_dir(folder: str, kind: str) -> str | None:
    return None if kind == "exact" else os.path.join(folder, kind)


def write_shard_meta(folder: str, meta: dict) -> None:
    """shard.json: `meta` and the digests of the shard's other files."""
    files = file_digests(folder, [n for n in files_under(folder) if n != SHARD_META])
    atomic_write(os.path.join(folder, SHARD_META), json.dumps({**meta, "files": files},
                                                              indent=1) + "\n")


def write_manifest(directory: str, meta: dict, shards: int) -> dict:
    """index.json over the `shards` shard folders in `directory`, written last: `meta`
    (encoder_id, kind, k, run, ...) with each shard's count and the digest of every file.
    ValueError naming a shard that is missing or another build's."""
    settings: dict
    files, counts, settings = {}, [], {}
    for s in range(shards):
        name = shard_name(s, shards)
        shard = _read_shard_meta(directory, name, meta, shards)
        files.update({f"{name}/{n}": d for n, d in shard["files"].items()})
        files.update({f"{name}/{k}": d for k, d in
                      file_digests(os.path.join(directory, name), [SHARD_META]).items()})
        counts.append(shard["n"])
        settings = settings or shard.get("settings", {})
    n = sum(counts)
    manifest = {"format": FORMAT, **meta, "n": n, "k": min(meta["k"], n), "settings": settings,
                "shards": counts, "files": files}
    atomic_write(os.path.join(directory, META), json.dumps(manifest, indent=1) + "\n")
    return manifest


def _read_shard_meta(directory: str, name: str, meta: dict, shards: int) -> dict:
    """The shard's shard.json, checked against the index it belongs to (`meta`: its
    manifest, or what the manifest will hold): the same build, encoder and width, and the
    same corpus file and searcher settings (its knobs that follow from a shard's size
    may differ)."""
    run, encoder_id = meta["run"], meta["encoder_id"]
    path = os.path.join(directory, name, SHARD_META)
    if not os.path.isdir(os.path.join(directory, name)):
        raise ValueError(f"{os.path.join(directory, name)}: missing; the index has {shards} "
                         f"shard(s), one per process that built it: build it again")
    try:
        with open(path) as f:
            shard = json.load(f)
        n, files = shard["n"], shard["files"]
        if not isinstance(n, int) or not isinstance(files, dict):
            raise ValueError("its 'n' or 'files' is not valid")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable shard record ({e}); build the index "
                         "again") from None
    if shard.get("run") != run:
        raise ValueError(f"{os.path.join(directory, name)} was written by another build (run "
                         f"{shard.get('run')}, this index's is {run}): build the index again")
    if shard.get("encoder_id") != encoder_id:
        raise ValueError(f"{os.path.join(directory, name)} was encoded with encoder "
                         f"{shard.get('encoder_id')}, the index with {encoder_id}: build the "
                         "index again")
    differ = differing(shard.get("build"), meta.get("build"))
    if differ is None and shard.get("dim", meta.get("dim")) != meta.get("dim"):
        differ = "dim"
    if differ is not None:
        raise ValueError(f"{os.path.join(directory, name)} was built with another {differ} "
                         "than the index: build the index again")
    return shard


def differing(a: dict | None, b: dict | None) -> str | None:
    """The first setting two build records (`dualjax.index` writes them) disagree on; a
    file's identity counts, not the path it was read at (a shared corpus or bundle may be
    mounted elsewhere on each host); None when they agree or either is missing (an
    index from before they were recorded)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    plain = lambda v: {k: x for k, x in v.items() if k != "path"} if isinstance(v, dict) else v
    return next((key for key in sorted(set(a) | set(b))
                 if plain(a.get(key)) != plain(b.get(key))), None)


def recorded_dim(directory: str) -> int | None:
    """The width of the vectors an index was built over (index.json's "dim"; None when it
    cannot be read: `CorpusIndex` then says why)."""
    try:
        with open(os.path.join(directory, META), encoding="utf-8") as f:
            dim = json.load(f).get("dim")
    except (OSError, ValueError, AttributeError):
        return None
    return dim if isinstance(dim, int) else None


class _Lines:
    """A shard's corpus.jsonl, each line read from disk by its position."""

    def __init__(self, folder: str, n: int):
        # Mapped, not read: an answer touches the pages of its hits' offsets alone.
        self.offsets = np.load(os.path.join(folder, "offsets.npy"), mmap_mode="r")
        path = os.path.join(folder, "corpus.jsonl")
        if len(self.offsets) != n + 1 or self.offsets[-1] != os.path.getsize(path):
            raise ValueError(f"{folder}: offsets.npy does not fit its corpus.jsonl and "
                             f"{n} documents: build the index again")
        self.data = np.memmap(path, np.uint8, mode="r") if n else np.zeros(0, np.uint8)

    def __getitem__(self, row: int) -> dict:
        start, end = self.offsets[row], self.offsets[row + 1]
        return json.loads(self.data[start:end].tobytes())


class Column(Sequence[str]):
    """The corpus' texts (or ids) in index order, over every shard, read from disk on
    each access: an index of millions of documents keeps none of them in memory."""

    def __init__(self, shards: list[_Lines], sizes: Sequence[int], key: str):
        self.shards, self.key = shards, key
        self.starts = np.concatenate([[0], np.cumsum(sizes)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} of {len(self)}")
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.shards[s][i - int(self.starts[s])][self.key]

    def __iter__(self) -> Iterator[str]:
        for shard, n in zip(self.shards, np.diff(self.starts), strict=True):
            for row in range(int(n)):
                yield shard[row][self.key]


class CorpusIndex:
    """A saved corpus index: its ids, texts and searcher (ScaNN, HNSW or exact, over
    each shard, merged), every file checked against the manifest when loaded."""

    def __init__(self, directory: str, encoder_id: str | None = None):
        self.directory = directory
        self.meta = _read_manifest(directory)
        built_with, counts = self.meta["encoder_id"], self.meta["shards"]
        if encoder_id is not None and built_with != encoder_id:
            raise ValueError(f"{directory} was built with encoder {built_with}, "
                             f"not {encoder_id}: build it again with this encoder")
        names = [shard_name(s, len(counts)) for s in range(len(counts))]
        found = sorted(e for e in os.listdir(directory) if _SHARD.match(e))
        stray = sorted(set(found) - set(names))
        if stray:
            raise ValueError(f"{os.path.join(directory, stray[0])}: a shard this index does "
                             f"not list (it has {len(counts)}, one per process that built "
                             "it): build the index again")
        for name in names:
            _read_shard_meta(directory, name, self.meta, len(counts))
        # Its parts as they were written, before anything is answered or rebuilt.
        verify_digests(directory, self.meta["files"], "index")
        self.folders = [os.path.join(directory, name) for name in names]
        lines = [_Lines(folder, n) for folder, n in zip(self.folders, counts, strict=True)]
        self.ids, self.texts = Column(lines, counts, "id"), Column(lines, counts, "text")
        self._searcher = None

    @property
    def searcher(self):
        """The searcher over every shard (the shard's own when there is one), loaded on
        first use: the saved vectors, never the texts again."""
        if self._searcher is None:
            parts = [self._shard_searcher(f, n)
                     for f, n in zip(self.folders, self.meta["shards"], strict=True)]
            self._searcher = parts[0] if len(parts) == 1 else ShardedSearcher(
                parts, self.meta["shards"])
        return self._searcher

    def _shard_searcher(self, folder: str, n: int):
        if not n:
            return None
        dim, kind = self.meta["dim"], self.meta["kind"]
        if self.meta.get("quantize"):
            searcher = quantized.QuantizedIndex.load(folder)
            if len(searcher.codes) != n or searcher.dim != dim:
                raise ValueError(f"{folder}: {len(searcher.codes)} x {searcher.dim} codes, "
                                 f"but its records say {n} x {dim}")
            return searcher
        path = os.path.join(folder, "embeddings.npy")
        embeddings = np.load(path, mmap_mode="r")
        if embeddings.shape != (n, dim):
            raise ValueError(f"{folder}: embeddings of shape {embeddings.shape}, but "
                             f"{META} records {n} x {dim}")
        if kind == "exact":  # read into the device a block at a time, never mapped whole
            settings = eval_config()
            return ann.ExactIndex.from_npy(path, settings["query_chunk"],
                                           settings["corpus_chunk"])
        # The searcher saved beside them is loaded when their fingerprint matches (else
        # rebuilt from them, with a warning).
        return ann.make_index(kind, embeddings, eval_config(), min(self.meta["k"], n),
                              directory=_searcher_dir(folder, kind),
                              extra=self.meta["encoder_id"])[0]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k], ids [nq, k]) of queries [nq, dim], best first, -1 padding."""
        return self.searcher.search(queries, min(k, len(self.texts)))


def _read_manifest(directory: str) -> dict:
    """index.json, checked for what loading reads; ValueError naming the file and key."""
    path = os.path.join(directory, META)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {META}; build one with python -m "
                                "dualjax.index --encoder=DIR --corpus=FILE --out=DIR")
    try:
        with open(path) as f:
            meta = json.load(f)
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')}, this dualjax reads {FORMAT}; "
                             "build it again")
        for key in ("encoder_id", "files", "kind", "k", "n", "dim", "run", "shards"):
            meta[key]  # noqa: B018 (present)
    except KeyError as e:
        raise ValueError(f"{path}: no {e.args[0]!r}; build the index again") from None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a readable index.json ({e})") from None
    shards = meta["shards"]
    for key, ok in (("files", isinstance(meta["files"], dict)),
                    ("kind", meta["kind"] in ann.INDEXES),
                    ("shards", isinstance(shards, list) and shards and all(
                        isinstance(n, int) and n >= 0 for n in shards)),
                    *((key, isinstance(meta[key], int)) for key in ("n", "dim", "k"))):
        if not ok:
            raise ValueError(f"{path}: its {key!r} is not valid; build the index again")
    if sum(shards) != meta["n"]:
        raise ValueError(f"{path}: its shards hold {sum(shards)} documents, its 'n' says "
                         f"{meta['n']}; build the index again")
    return meta
