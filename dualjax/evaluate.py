"""Evaluation: encode the queries and the corpus, search, score the ranking.

An evaluation receives encode functions (text ids -> unit vectors) and a retrieval
task; it does not reach into the trainer. Results are flat dicts of metrics as in
metrics.py.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from dualjax import index, metrics, sharding
from dualjax.data.clusters import RetrievalTask
from dualjax.text import WordTokenizer

EncodeFn = Callable[[jax.Array, jax.Array], jax.Array]  # ids, mask [b, len] -> [b, dim]


def encode_texts(encode_fn: EncodeFn, texts: Sequence[str], tokenizer: WordTokenizer,
                 max_len: int, batch_size: int, mesh: jax.sharding.Mesh,
                 desc: str = "encode") -> np.ndarray:
    """Embeddings [len(texts), dim] from jitted batches of `batch_size` texts.

    The last batch is padded to the full size so the function compiles once; each
    batch is sharded over the mesh's `data` axis.
    """
    n_dev = mesh.devices.size
    batch_size = -(-batch_size // n_dev) * n_dev
    out = []
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, leave=False,
                      unit="batch", disable=None):
        chunk = list(texts[start:start + batch_size])
        ids, mask = tokenizer.encode(chunk + [""] * (batch_size - len(chunk)), max_len)
        placed = sharding.put_global_batch({"ids": ids, "mask": mask}, mesh)
        out.append(np.asarray(encode_fn(placed["ids"], placed["mask"]))[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def evaluate_task(encode_queries: EncodeFn, encode_documents: EncodeFn, task: RetrievalTask,
                  tokenizer: WordTokenizer, max_len: int, eval_cfg: ml_collections.ConfigDict,
                  mesh: jax.sharding.Mesh) -> dict[str, float]:
    """Retrieval metrics of the towers on `task` (a query never retrieves itself)."""
    enc = dict(tokenizer=tokenizer, max_len=max_len, batch_size=eval_cfg.batch_size, mesh=mesh)
    corpus = encode_texts(encode_documents, task.corpus, desc="encode corpus", **enc)
    queries = encode_texts(encode_queries, task.queries, desc="encode queries", **enc)
    search = index.INDEXES[eval_cfg.index]
    _, ranked = search(queries, corpus, min(eval_cfg.top_k, len(task.corpus)),
                       exclude=task.query_corpus_index, query_chunk=eval_cfg.query_chunk,
                       corpus_chunk=eval_cfg.corpus_chunk)
    return metrics.retrieval_metrics(ranked, task.relevant)


def format_table(rows: Sequence[dict], keys: Sequence[str]) -> str:
    """A plain-text table: one row per dict, the `system` column first."""
    header = ["system", *keys]
    lines = [header] + [[str(r.get("system", ""))] + [f"{r[k]:.4f}" if isinstance(r.get(k), float)
                                                        else str(r.get(k, "")) for k in keys]
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    fmt = lambda line: "  ".join(c.rjust(w) if i else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([fmt(lines[0]), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines[1:]])


def log_metrics(prefix: str, values: dict) -> None:
    logging.info("%s: %s", prefix, ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in values.items()))
