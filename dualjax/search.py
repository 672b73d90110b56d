"""Answer queries with a trained model: an exported encoder and its corpus index, or a
training workdir.

    python -m dualjax.search --encoder=DIR --index=IDX --query="how do i fix my car" [--k=10]
    python -m dualjax.search --workdir=DIR --queries_file=queries.txt   # one query per line
    ... --hybrid=bm25   # fused with BM25 over the same candidates (reciprocal rank fusion,
                        # or score interpolation with --hybrid_weight=W)

With --encoder and --index (`python -m dualjax.index` builds one), nothing of the training
run is read: the bundle's encoder embeds the queries and the saved index, built with that
very encoder (its id is checked), answers them. With --workdir, the candidates are the
corpus of an evaluation split (`--split`, default test) of the dataset the run was trained
on, and the ScaNN index saved by the run's final evaluation is loaded when its
fingerprint (corpus embeddings, checkpoint step, index settings) still matches, and
rebuilt and saved again otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Sequence

import numpy as np
from absl import app, flags, logging

from dualjax import baselines, evaluate, ann, hybrid, sharding, tokenizers, train
from dualjax import tasks as tasks_lib
from dualjax.index import CorpusIndex
from dualjax.encoder import Encoder
from dualjax.metrics_log import setup_logging
from dualjax.trained import load_trained

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained dualjax workdir.")
_ENCODER = flags.DEFINE_string("encoder", None, "An exported encoder (python -m dualjax.export).")
_INDEX = flags.DEFINE_string("index", None, "Its corpus index (python -m dualjax.index).")
_QUERY = flags.DEFINE_multi_string("query", [], "A query (repeatable).")
_QUERIES_FILE = flags.DEFINE_string("queries_file", None, "A file with one query per line.")
_K = flags.DEFINE_integer("k", 10, "Results per query.")
_SPLIT = flags.DEFINE_string("split", "test", "--workdir: the evaluation split whose corpus "
                             "is searched.")
_TASK = flags.DEFINE_string("task", "", "--workdir, multi-task runs: the task whose corpus is "
                            "searched (default: the first).")
_HYBRID = flags.DEFINE_enum("hybrid", "", ["", "bm25", "tfidf"],
                            "Fuse the model's ranking with this lexical system's.")
_HYBRID_WEIGHT = flags.DEFINE_float("hybrid_weight", None, "With --hybrid: interpolate "
                                    "normalised scores with this dense weight in [0, 1] "
                                    "instead of reciprocal rank fusion.")

Results = list[list[tuple[float, str]]]


def fused(dense: tuple[np.ndarray, np.ndarray], corpus: Sequence[str], queries: Sequence[str],
          k: int, lexical: str, weight: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) [nq, k]: the dense (scores, ids) fused with `lexical`'s top k over
    `corpus`, by reciprocal rank fusion (scores: the RRF sums) or, with a `weight`, by
    score interpolation (scores: the interpolated values)."""
    (d_scores, d_ids), (l_scores, l_ids) = dense, baselines.rank_texts(lexical, corpus,
                                                                       queries, k)
    if weight is None:
        ids, scores = hybrid.fuse_rrf([d_ids, l_ids], k, with_scores=True)
    else:
        ids, scores = hybrid.fuse_scores((d_ids, d_scores), (l_ids, l_scores), weight, k,
                                         with_scores=True)
    return scores, ids


@dataclasses.dataclass
class Searcher:
    """A corpus, an index over its embeddings and the query encoder that matches them."""
    corpus: list[str]
    index: Any                                      # ann.ExactIndex / ScannIndex / CorpusIndex
    encode_queries: Callable[[Sequence[str]], np.ndarray]  # texts -> unit vectors [n, dim]
    tokenizer: tokenizers.Tokenizer                 # the query side's
    k: int = 10
    info: dict = dataclasses.field(default_factory=dict)

    def search(self, queries: Sequence[str], hybrid: str = "",
               weight: float | None = None) -> Results:
        """Per query, the top k (score, candidate text), best first; with `hybrid` (a
        lexical system), fused with its ranking (`fused`). Typed queries carry no
        categorical fields: a query side with fields reads them as missing."""
        k = min(self.k, len(self.corpus))
        scores, ids = self.index.search(self.encode_queries(queries), k)
        if hybrid:
            scores, ids = fused((scores, ids), self.corpus, queries, k, hybrid, weight)
        return [[(float(s), self.corpus[i]) for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, ids)]

    def unknown(self, query: str) -> bool:
        """Whether no token of the query is in the model's vocabulary."""
        return tokenizers.known_tokens(self.tokenizer, query) == 0


def from_bundle(encoder_dir: str, index_dir: str, k: int = 10) -> Searcher:
    """An exported encoder and a corpus index built with it: no training state is read
    and the corpus is not encoded again."""
    encoder = Encoder.load(encoder_dir)
    corpus_index = CorpusIndex(index_dir, encoder.id)
    return Searcher(corpus_index.texts, corpus_index, encoder.encode_queries,
                    encoder.sides["query"].tokenizer, k, {"built": False, **corpus_index.meta})


def from_workdir(workdir: str, split: str = "test", k: int = 10, task: str = "") -> Searcher:
    """A training workdir's latest checkpoint over the corpus of an evaluation split of its
    dataset, with the index its final evaluation saved (rebuilt if stale)."""
    config, inputs, model, params, step = load_trained(workdir)
    mesh = sharding.make_mesh()
    encode_queries, encode_documents = train.make_encoders(model)
    tasks = {t.name: t for t in tasks_lib.make_tasks(config, workdir)}
    name = task or next(iter(tasks))
    if name not in tasks:
        raise ValueError(f"--task={task!r} is not one of this run's tasks: {', '.join(tasks)}")
    data = tasks[name].eval_task(split)
    corpus_emb = evaluate.encode_texts(
        lambda x: encode_documents(params, x), data.corpus, inputs.document,
        config.eval.batch_size, mesh, desc="encode corpus", fields=data.corpus_fields)
    searcher, info = ann.make_index(
        config.eval.index, corpus_emb, config.eval, min(k, len(data.corpus)),
        directory=os.path.join(workdir, "index", *([name] if name else []), split),
        extra=f"step {step}")
    logging.info("%s index over %d candidates (%s)", config.eval.index, len(data.corpus),
                 "built" if info["built"] else "loaded")
    encode = lambda texts: evaluate.encode_texts(
        lambda x: encode_queries(params, x), texts, inputs.query, max(len(texts), 1), mesh,
        desc="encode queries")
    return Searcher(data.corpus, searcher, encode, inputs.query.tokenizer, k, info)


def main(argv: list[str]) -> None:
    del argv
    setup_logging()
    queries = list(_QUERY.value)
    if _QUERIES_FILE.value:
        with open(_QUERIES_FILE.value, encoding="utf-8") as f:
            queries += [line.strip() for line in f if line.strip()]
    if not queries:
        sys.exit("dualjax.search: give --query (repeatable) or --queries_file")
    bundle = _ENCODER.value or _INDEX.value
    if bool(_WORKDIR.value) == bool(bundle) or (bundle and not (_ENCODER.value and _INDEX.value)):
        sys.exit("dualjax.search: give --encoder and --index (an exported model), or --workdir")
    if _WORKDIR.value and not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
        sys.exit(f"dualjax.search: --workdir={_WORKDIR.value}: not a dualjax workdir (no "
                 "config.json)")
    weight = _HYBRID_WEIGHT.value
    if weight is not None and not (_HYBRID.value and 0 <= weight <= 1):
        sys.exit("dualjax.search: --hybrid_weight is a weight in [0, 1] for --hybrid")
    try:
        searcher = (from_bundle(_ENCODER.value, _INDEX.value, _K.value) if bundle else
                    from_workdir(_WORKDIR.value, _SPLIT.value, _K.value, _TASK.value))
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"dualjax.search: {e}")
    for query, results in zip(queries, searcher.search(queries, _HYBRID.value, weight)):
        print(f"\n> {query}")
        if searcher.unknown(query):
            print("  (no token of this query is in the model's vocabulary: its vector "
                  "means little" + ("; the lexical ranking still counts)" if _HYBRID.value
                                    else ")"))
        for rank, (score, text) in enumerate(results, 1):
            print(f"{rank:3d}. {score:+.4f}  {text}")


def run() -> None:
    """The `dualjax-search` console script: the same as `python -m dualjax.search`."""
    app.run(main)


if __name__ == "__main__":
    run()
