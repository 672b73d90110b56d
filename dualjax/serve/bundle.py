"""A trained model outside its workdir: the serving bundle `dualjax.export` writes, loaded.

    encoder = dualjax.Encoder.load("runs/default/export")
    q = encoder.encode_queries(["how do i fix my bike"])      # [1, dim] unit vectors
    d = encoder.encode_documents(["..."])                    # [n, dim]
    scores = q @ d.T

A bundle holds the tokenizer (vocab.json), the categorical field vocabularies
(features.json, when the model reads fields), the model's parameters (params.msgpack, no
optimizer state), and each side's encoder as a serialised `jax.export` function
(query.jax_export, document.jax_export): (params, ids [b, l], mask[, cats]) -> unit
vectors [b, dim], with the pooling and the normalisation inside the graph, the batch size
b and the length l <= max_len symbolic (a bundle of an older dualjax: l = max_len).
Loading it needs jax, numpy and flax's msgpack, not the model's code or config, and
never the training workdir.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import serialization

from dualjax.runtime.files import verify_digests
from dualjax.runtime.pipeline import AHEAD, Timings, overlapped
from dualjax.text import features, sides, tokenizers

FORMAT = 2  # encoder.json "format": bumped when a bundle's layout changes (2: "files")
SIDES = ("query", "document")


def bundle_id(files: dict[str, str]) -> str:
    """A bundle's id: a digest of its files' names and sha256 digests (what an index
    built with it records)."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]


def _read_meta(path: str) -> dict:
    """encoder.json, checked for what loading reads; ValueError naming the file."""
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable encoder.json ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{path}: bundle format {got}, this dualjax reads {FORMAT}; "
                         "export it again")
    lengths = meta.get("max_len")
    for key, ok in (("files", isinstance(meta.get("files"), dict)),
                    ("dim", isinstance(meta.get("dim"), int)),
                    ("max_len", isinstance(lengths, dict) and all(
                        isinstance(lengths.get(side), int) for side in SIDES))):
        if not ok:
            raise ValueError(f"{path}: no valid {key!r}; export the bundle again")
    if bundle_id(meta["files"]) != meta.get("id"):
        raise ValueError(f"{path}: its file list does not give its id; export it again")
    return meta


def _readable(path: str, read, data):
    """read(data), or ValueError naming the file that this jax / flax cannot read."""
    try:
        return read(data)
    except Exception as e:  # struct.error, msgpack's, jax's own: all mean "not readable"
        raise ValueError(f"{path}: unreadable by jax {jax.__version__} ({type(e).__name__}: "
                         f"{e}); export the bundle again with this version") from None


class Encoder:
    """Encodes texts into the model's unit vectors, query side or document side."""

    min_bucket = sides.MIN_BUCKET  # the shortest length a batch is cut to

    def __init__(self, directory: str, dim: int | None = None):
        self.directory = directory
        path = os.path.join(directory, "encoder.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{directory}: no encoder.json; make a bundle with "
                                    "python -m dualjax.export --workdir=WORKDIR --out=DIR")
        self.meta = _read_meta(path)
        verify_digests(directory, self.meta["files"], "bundle")  # every file as exported
        tokenizer = tokenizers.load_tokenizer(os.path.join(directory, "vocab.json"))
        fields = (features.load(os.path.join(directory, "features.json"))
                  if os.path.exists(os.path.join(directory, "features.json"))
                  else (features.SideFeatures(), features.SideFeatures()))
        prompts = self.meta.get("prompts", {})  # a bundle from before prompts: none
        self.sides = {side: sides.Side(tokenizer, self.meta["max_len"][side], f,
                                       prompts.get(side, ""))
                      for side, f in zip(SIDES, fields, strict=True)}
        # The digests match, so a file that cannot be read was written by another version.
        path = os.path.join(directory, "params.msgpack")
        with open(path, "rb") as f:
            self.params = jax.device_put(_readable(path, serialization.msgpack_restore,
                                                   f.read()))
        self._dim = self._checked_dim(dim)
        # device -> the params there (`_params_on`; shared by at_dim)
        self._device_params: dict[jax.Device | None, Any] = {}
        self.timings = Timings()  # where the encoding time went, over every call so far
        self._fns = {}
        for side in SIDES:
            path = os.path.join(directory, f"{side}.jax_export")
            with open(path, "rb") as f:
                self._fns[side] = jax.jit(_readable(path, jax.export.deserialize,
                                                    bytearray(f.read())).call)

    @classmethod
    def load(cls, directory: str, dim: int | None = None) -> Encoder:
        """The bundle `python -m dualjax.export` wrote to `directory`, its files checked
        against encoder.json's digests (ValueError naming a file missing or changed).

        Args:
          directory: the bundle's folder.
          dim: read its vectors at their first `dim` coordinates, renormalised (a model
            trained with loss.matryoshka_dims keeps them usable); None: all of them.
        """
        return cls(directory, dim)

    def _checked_dim(self, dim: int | None) -> int | None:
        """Matryoshka: the vectors cut to their first `dim` coordinates, renormalised
        (None: all of them)."""
        full = int(self.meta["dim"])
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer))):
            raise TypeError(f"dim={dim!r}: give the number of dimensions as an int (1 to "
                            f"{full}), or None for all")
        if dim is not None and not 1 <= dim <= full:
            raise ValueError(f"dim={dim}: this bundle's vectors have {full} dimensions; "
                             f"give 1 to {full}")
        return None if dim in (None, full) else int(dim)

    def at_dim(self, dim: int | None) -> Encoder:
        """This encoder with its vectors read at `dim` (as `load`'s), sharing its files
        and compiled functions."""
        out = copy.copy(self)
        out._dim = self._checked_dim(dim)
        return out

    @property
    def dim(self) -> int:
        """The width of the vectors it returns (`dim` when given)."""
        return self._dim or int(self.meta["dim"])

    @property
    def id(self) -> str:
        """A digest of the bundle's files (checked when loaded), with "@dim" when its
        vectors are cut: an index built with this encoder records it."""
        return self.meta["id"] + (f"@{self._dim}" if self._dim else "")

    def known_query_tokens(self, text: str) -> int:
        """How many of the query's tokens are in the model's vocabulary (0: the query's
        vector is made of OOV buckets alone, if any, and means little)."""
        return tokenizers.known_tokens(self.sides["query"].tokenizer, text)

    def encode_queries(self, texts: Sequence[str], fields: Sequence[dict] | None = None,
                       batch_size: int = 256) -> np.ndarray:
        """The query tower's vectors.

        Args:
          texts: the queries (str each; a single str is refused).
          fields: their categorical fields, one dict per text, when the model reads any.
          batch_size: texts per call of the exported function.

        Returns:
          Unit vectors float32 [len(texts), dim], in the order of `texts`.
        """
        return self._encode("query", texts, fields, batch_size)

    def encode_documents(self, texts: Sequence[str], fields: Sequence[dict] | None = None,
                         batch_size: int = 256, devices: Sequence[jax.Device] = (),
                         progress: Callable[[int], None] | None = None) -> np.ndarray:
        """The document tower's vectors.

        Args:
          texts: the documents (str each; a single str is refused).
          fields: their categorical fields, one dict per text, when the model reads any.
          batch_size: texts per call of the exported function.
          devices: a process' local devices: the batches go to them in turn, each device
            encoding its own while the next is dispatched (none given: the default one).
          progress: called with n as each batch of n texts is stored.

        Returns:
          Unit vectors float32 [len(texts), dim], in the order of `texts`.
        """
        return self._encode("document", texts, fields, batch_size, devices, progress)

    def _params_on(self, device: jax.Device | None):
        """The parameters on `device` (one copy per device, made once)."""
        if device is None:
            return self.params
        if device not in self._device_params:
            self._device_params[device] = jax.device_put(self.params, device)
        return self._device_params[device]

    def _encode(self, side: str, texts: Sequence[str], fields, batch_size: int,
                devices: Sequence[jax.Device] = (),
                progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Batches longest text first (by characters, as sentence-transformers does), each
        cut to the length bucket of its longest text when the bundle's length is symbolic
        (padding never changes a vector); full batches, so each bucket compiles once.
        The host tokenizes the next batches while the devices encode (one batch in flight
        on each device: `runtime.pipeline.overlapped`)."""
        method = {"query": "encode_queries", "document": "encode_documents"}[side]
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"{method} takes a sequence of texts, not one string: pass [text]")
        try:
            texts = list(texts)
        except TypeError:
            raise TypeError(f"{method} takes a sequence of texts (str), not "
                            f"{type(texts).__name__}") from None
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise TypeError(f"{method}: text {bad} is {type(texts[bad]).__name__} "
                            f"{texts[bad]!r:.40}, not str")
        out = np.zeros((len(texts), self.dim), np.float32)
        order = sides.longest_first(texts)
        s = self.sides[side]
        # an older bundle's functions take max_len alone
        min_bucket = self.min_bucket if self.meta.get("length") == "symbolic" else s.max_len
        devices = list(devices) or [None]
        rows_of = lambda n: order[n * batch_size:(n + 1) * batch_size]

        def prepare(n: int) -> list[np.ndarray]:
            rows = rows_of(n)
            x = s.encode_batch([texts[i] for i in rows],
                               None if fields is None else [fields[i] for i in rows],
                               batch_size if len(texts) > batch_size else 0, min_bucket)
            return [x["ids"], x["mask"]] + ([x["cats"]] if "cats" in x else [])

        def run(n: int, args: list[np.ndarray]):
            device = devices[n % len(devices)]
            if device is not None:
                args = jax.device_put(args, device)
            return self._fns[side](self._params_on(device), *args)

        def take(n: int, y) -> None:
            rows = rows_of(n)
            y = np.asarray(y)[:len(rows), :self.dim]
            if self._dim:
                y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-6)
            out[rows] = y
            if progress is not None:
                progress(len(rows))

        overlapped(range(-(-len(texts) // batch_size)), prepare, run, take,
                   ahead=len(devices) + AHEAD, lag=len(devices), timings=self.timings)
        return out
