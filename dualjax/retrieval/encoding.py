"""Texts -> unit vectors with a jitted tower, in batches sharded over the mesh: what
evaluation, pseudo-labelling and `search --workdir` encode a corpus and its queries with."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from dualjax.runtime import sharding
from dualjax.runtime.pipeline import overlapped
from dualjax.runtime.progress import Progress
from dualjax.text.features import Fields
from dualjax.text.sides import Side, longest_first

# {"ids", "mask" [b, len], "cats" [b, fields] (a side with categorical fields)} -> [b, dim]
EncodeFn = Callable[[dict[str, jax.Array]], jax.Array]


def padded_rows(n: int, batch_size: int, multiple: int) -> int:
    """The rows a batch of `n` texts runs as: the least that holds them of `multiple`
    (the devices) times a power of two and the multiples of an eighth of `batch_size`
    (itself a multiple of `multiple`). At most 8 + log2 shapes per length, and a short
    last batch pads to at most twice its texts and an eighth of a batch more."""
    eighth = -(-batch_size // 8 // multiple) * multiple
    power = multiple
    while power < n:
        power *= 2
    return min(power, -(-n // eighth) * eighth, batch_size)


def encode_texts(encode_fn: EncodeFn, texts: Sequence[str], side: Side, batch_size: int,
                 mesh: jax.sharding.Mesh, desc: str = "encode",
                 fields: Sequence[Fields] | None = None) -> np.ndarray:
    """Embeddings [len(texts), dim] from jitted batches of `batch_size` texts, encoded as
    `side` says (its tokenizer, max length and categorical `fields`, one per text).

    Texts are batched longest first (by characters, as sentence-transformers does) and
    each batch is cut to `length_bucket` of its longest text, so short texts are not
    run at the full max length (padding never changes a text's vector). A short last
    batch is padded to `padded_rows`, not to the whole batch (118 texts of a small split
    run as 128, not 512), so the shapes stay few and shared by every corpus; each batch
    is sharded over the mesh's `data` axis. The host tokenizes the next batch while the
    device encodes this one (`runtime.pipeline.overlapped`). In a
    multi-host run every process calls this with the same texts: each tokenizes every
    batch, places its share, and gets all the embeddings back.
    """
    n_dev, n_proc, me = sharding.data_size(mesh), jax.process_count(), jax.process_index()
    batch_size = -(-batch_size // n_dev) * n_dev
    order = longest_first(texts)
    out: list[np.ndarray] = []  # [len(texts), dim], once the first vectors say the width

    def prepare(rows: np.ndarray) -> dict[str, np.ndarray]:
        padded = padded_rows(len(rows), batch_size, n_dev)
        x = side.encode_batch([texts[i] for i in rows],
                              None if fields is None else [fields[i] for i in rows], padded)
        share = padded // n_proc  # this process's rows of the batch
        return {k: v[me * share:(me + 1) * share] for k, v in x.items()}

    def take(rows: np.ndarray, vectors: jax.Array | np.ndarray) -> None:
        if n_proc > 1:  # the other processes' rows too
            from jax.experimental import multihost_utils
            vectors = multihost_utils.process_allgather(vectors, tiled=True)
        vectors = np.asarray(vectors)
        if not out:
            out.append(np.zeros((len(texts), vectors.shape[1]), vectors.dtype))
        out[0][rows] = vectors[:len(rows)]
        bar.update(len(rows))

    bar = Progress(len(texts), desc, "text", leave=False)
    overlapped((order[start:start + batch_size] for start in range(0, len(texts), batch_size)),
               prepare, lambda rows, x: encode_fn(sharding.put_global_batch(x, mesh)), take)
    bar.close()
    return out[0] if out else np.zeros((len(texts), 0), np.float32)
