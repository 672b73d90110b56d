"""Distillation targets from a teacher (data.tasks "distill"): pseudo-queries of a
collection, each with a positive and k negatives the teacher mined, and the teacher's
scores of them, which the student then learns (`losses.distillation`).

The queries are those of `weak_labels.pseudo_queries`: a sentence of each passage, or
`distill.queries_per_passage` distinct sentences of it (GPL asks 3 per passage). The
teacher is any pretrained start dualjax reads (`model.pretrained`'s names and folders:
all-mpnet-base-v2, all-MiniLM-L6-v2, a static table), on its own or fused with BM25
(`distill.teacher_weight`, score interpolation as `hybrid.fuse_scores`: each top list
min-max scaled per query). For each query (its own passage, the one it was cut from, is
never a candidate):
- its candidates are the teacher's top `distill.depth` among the other passages, with
  their fused scores in [0, 1];
- the positive is the first; a candidate scored within `distill.margin` of it is dropped
  as a likely false negative (relevant too, but unjudged: RocketQA's denoising, GPL's
  margin filtering);
- k = `distill.negatives` of the rest are drawn at random (seeded), kept in the teacher's
  order; a query with fewer left is skipped (counted in the log).

Only the teacher's scores are kept, so its vocabulary, its width and its tokenizer need
not match the student's. The records are made once, by the main process, and kept in
WORKDIR/teacher_scores.jsonl (passage indices, not texts), so a resumed run trains on the
same targets and never loads the teacher again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from dualjax import models, pretrained
from dualjax.config.run import TeacherSpec
from dualjax.data.documents import Collection
from dualjax.data.pretraining import QueryWords
from dualjax.errors import DataError, PretrainedError
from dualjax.models.spec import ModelSpec, TransformerSpec
from dualjax.retrieval import encoding
from dualjax.runtime.files import read_records, write_records
from dualjax.text import sides
from dualjax.train import warm_start, weak_labels

FILE = "teacher_scores.jsonl"
Encode = Callable[[list[str]], np.ndarray]  # texts -> unit vectors [n, dim]


__all__ = ["TeacherSpec", "encoders", "load_or_make", "mine", "path"]


def mine(queries: list[str], documents: list[str], encode_queries: Encode,
         encode_documents: Encode, spec: TeacherSpec, seed: int, bm25: dict | None = None,
         own: np.ndarray | None = None) -> list[dict]:
    """The records {"query", "documents": [positive, k negatives] (indices into
    `documents`), "scores": [their fused scores]} of the queries that have k candidates
    left after the margin filter; queries[i] was cut from documents[own[i]] (by default
    documents[i]), which is never a candidate. DataError when the collection is too small
    to mine 1 + k candidates from."""
    k = spec.negatives
    depth = min(spec.depth, len(documents) - 1)
    if depth < k + 1:
        raise DataError(f"distill: {len(documents)} documents are too few to mine a positive "
                        f"and distill.negatives={k} negatives per query besides the query's "
                        f"own document (distill.depth={spec.depth}); lower "
                        "distill.negatives or use a larger collection")
    ids, scores = weak_labels.hybrid_ranking(queries, documents, encode_queries,
                                             encode_documents, spec.weight, depth, bm25, own)
    rng = np.random.default_rng([seed, 11])
    records, skipped = [], 0
    for q, row, fused in zip(queries, ids, scores, strict=True):
        keep = row >= 0
        row, fused = row[keep], fused[keep]
        if not len(row):
            skipped += 1
            continue
        pool = np.flatnonzero(fused[1:] <= fused[0] - spec.margin) + 1
        if len(pool) < k:
            skipped += 1
            continue
        picked = np.sort(rng.choice(pool, k, replace=False))
        chosen = np.concatenate([[0], picked])
        records.append({"query": q, "documents": [int(j) for j in row[chosen]],
                        "scores": [round(float(s), 6) for s in fused[chosen]]})
    if skipped:
        logging.info("distill: %d of %d queries have fewer than %d candidates scored %.2f "
                     "below their positive: skipped", skipped, len(queries), k, spec.margin)
    if not records:
        raise DataError(f"distill: no query of the {len(queries)} has {k} candidates scored "
                        f"distill.margin={spec.margin} below its positive; lower "
                        "distill.margin or distill.negatives")
    return records


def path(workdir: str, name: str = "") -> str:
    """WORKDIR/teacher_scores.jsonl, or task `name`'s teacher_scores_<name>.jsonl."""
    return os.path.join(workdir, FILE if not name else FILE.replace(".jsonl", f"_{name}.jsonl"))


def _checked(file: str, records: list, passages: int) -> list[dict]:
    """The records of a whole teacher_scores file; DataError naming file:line for one
    that is not a record of this collection."""
    for n, r in enumerate(records, 1):
        try:
            ok = (isinstance(r["query"], str) and len(r["documents"]) == len(r["scores"])
                  and all(0 <= int(j) < passages for j in r["documents"]))
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise DataError(f"{file}:{n}: not a teacher record of this collection (delete "
                            "the file to score the candidates again)")
    return records


def load_or_make(workdir: str, collection: Collection, seed: int, words: QueryWords,
                 spec: TeacherSpec, encoders: Callable[[], tuple[Encode, Encode]],
                 main: bool = True, name: str = "", bm25: dict | None = None) -> list[dict]:
    """WORKDIR/teacher_scores.jsonl (task `name`'s: teacher_scores_<name>.jsonl) if it
    is there whole (`files.read_records`), else the records mined (`mine`) with the
    teacher's (query, document) `encoders()` (called only then) and, by the main
    process, written there (again, said in the log, for a file cut short)."""
    file = path(workdir, name)
    if os.path.exists(file):
        records, why = read_records(file)
        if records is not None:
            return _checked(file, records, len(collection.passages))
        logging.warning("%s: %s: the teacher scores the candidates again", file, why)
    documents = weak_labels.passage_documents(collection)
    queries, own = weak_labels.pseudo_queries(collection, seed, words,
                                              spec.queries_per_passage)
    encode_queries, encode_documents = encoders()
    records = mine(queries, documents, encode_queries, encode_documents, spec, seed, bm25,
                   own)
    logging.info("distill: %d queries from %d passages, each with a positive and %d "
                 "negatives scored by %s (fused with BM25 at dense weight %.2f); %s",
                 len(records), len(documents), spec.negatives, spec.teacher, spec.weight, file)
    if main:
        write_records(file, records)
    return records


def encoders(student: ModelSpec, spec: TeacherSpec, batch_size: int, mesh: jax.sharding.Mesh
             ) -> tuple[Encode, Encode]:
    """The teacher's (encode queries, encode documents): its start as is, in one tower
    for both sides (the `student`'s model otherwise), at its own max length (or
    distill.max_len) and with its own prompts, encoded in batches of `batch_size`
    (eval.batch_size). PretrainedError for a teacher that is not there (with the fetch to
    run), or whose tokenizer has pieces its table has no row for."""
    start = pretrained.resolve(spec.teacher)
    tokenizer = start.tokenizer()
    rows = start.architecture.vocab_size if start.architecture else None
    if rows is not None and tokenizer.vocab_size > rows:
        raise PretrainedError(f"distill.teacher={spec.teacher!r}: its tokenizer.json has "
                              f"{tokenizer.vocab_size} pieces but its embedding table "
                              f"{rows} rows ({start.folder})")
    whole = bool(start.tower)  # a tower's weights, not a static table
    max_len = spec.max_len or start.max_seq_length or spec.default_max_len
    tower = start.tower or "bow"
    model_spec = dataclasses.replace(
        student, query_tower=tower, doc_tower=tower, shared_towers=True, cnn_windows=(),
        cnn_filters=ModelSpec.cnn_filters, transformer=TransformerSpec(), tower_options=(),
        embed_dim=student.embed_dim if whole else start.dim,
        output_dim=student.output_dim if whole else start.dim)
    model = models.make_model(model_spec, tokenizer.vocab_size, architecture=start.architecture)
    # The start's weights (and a random initialisation of only what it lacks), placed
    # once, not with every batch.
    params = warm_start.start_towers(model, 0, 8, mesh, start=start)
    fns = models.make_encoders(model)
    own = start.prompts or {}
    prompts = (own.get("query", ""), own.get("document", ""))

    for side, prompt in zip(("query", "document"), prompts, strict=True):
        try:
            sides.check_prompt(tokenizer, prompt, max_len, f"the {side} prompt of "
                               f"distill.teacher={spec.teacher!r}")
        except ValueError as e:
            raise PretrainedError(f"{e} (distill.max_len)") from None

    def encode(side: int, texts: list[str]) -> np.ndarray:
        inputs = sides.Side(tokenizer, max_len, prompt=prompts[side])
        return encoding.encode_texts(lambda x: fns[side](params, x), texts, inputs,
                                     batch_size, mesh, desc="teacher")

    return (lambda texts: encode(0, texts)), (lambda texts: encode(1, texts))
