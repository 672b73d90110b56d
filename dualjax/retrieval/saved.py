"""What the searchers share: a corpus' fingerprint, their results padded to k and cut
of an excluded row, and a searcher saved beside its corpus (meta.json written last) and
loaded only when its fingerprint, size and version still match."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from absl import logging

_META = "meta.json"
Settings = Mapping[str, Any]  # a plain dict, or the config's eval.scann / eval.hnsw


def corpus_fingerprint(corpus: np.ndarray, extra: str = "") -> str:
    """sha256 hex digest of the corpus' shape, dtype and bytes, then `extra`."""
    corpus = np.ascontiguousarray(corpus)
    h = hashlib.sha256(f"{corpus.shape}|{corpus.dtype.str}|".encode())
    h.update(corpus.data.cast("B"))
    h.update(extra.encode())
    return h.hexdigest()


def pad(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[nq, <=k] -> [nq, k] with -inf / -1 on the right."""
    out_s = np.full((len(scores), k), -np.inf, np.float32)
    out_i = np.full((len(ids), k), -1, np.int32)
    width = min(k, scores.shape[1])
    out_s[:, :width], out_i[:, :width] = scores[:, :width], ids[:, :width]
    return out_s, out_i


def drop_excluded(ids: np.ndarray, scores: np.ndarray, exclude: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """ids / scores [nq, w] (best first) of a search for one more than wanted: row i's first
    exclude[i] (if any) moves last as -1 / -inf, so the first w - 1 are the results."""
    exclude = np.asarray(exclude, np.int64)[:, None]
    hit = (ids == exclude) & (exclude >= 0)
    drop = hit & (np.cumsum(hit, axis=1) == 1)  # the first match only
    order = np.argsort(drop, axis=1, kind="stable")  # the dropped one goes last
    ids, scores = np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
    drop = np.take_along_axis(drop, order, 1)
    ids[drop], scores[drop] = -1, -np.inf
    return ids, scores


def save_index(directory: str, label: str, write: Callable[[str], None], meta: dict) -> None:
    """`write(folder)` then meta.json (last, so a partial save never loads) into a fresh
    folder that replaces `directory`; refuses to replace a folder that is not a saved index."""
    occupied = os.path.isfile(directory) or os.path.isdir(directory) and os.listdir(directory)
    if occupied and not (os.path.isfile(os.path.join(directory, "scann_assets.pbtxt"))
                         or os.path.isfile(os.path.join(directory, _META))):
        raise ValueError(f"{directory} exists and is not a {label} index: not replacing it")
    tmp = f"{directory.rstrip('/')}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write(tmp)
    with open(os.path.join(tmp, _META), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


_WORDS = {"n": "corpus size", "scann": "scann version"}  # meta.json keys, as the log says them


def saved_meta(directory: str, label: str, expected: dict) -> dict | None:
    """meta.json of the index saved in `directory` if each of its `expected` values (None:
    unchecked) matches; else None, logging why."""
    path = os.path.join(directory, _META)
    if not os.path.isfile(path):
        logging.warning("%s index: nothing saved at %s; building", label, directory)
        return None
    with open(path) as f:
        meta = json.load(f)
    for what, now in expected.items():
        if now is not None and meta.get(what) != now:  # fingerprint: another model/corpus/settings
            logging.warning("%s index at %s was saved for %s %.16s, not %.16s; rebuilding",
                            label, directory, _WORDS.get(what, what), meta.get(what), now)
            return None
    return meta


def loaded(directory: str, label: str, searcher, size: int, meta: dict):
    """`searcher` if it holds meta.json's n rows; else None, logging why."""
    if size != meta["n"]:
        logging.warning("%s index at %s holds %d rows, meta.json says %d; rebuilding",
                        label, directory, size, meta["n"])
        return None
    return searcher
