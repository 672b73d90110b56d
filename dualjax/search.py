"""Answer queries with a trained workdir: its vocabulary, towers and saved index.

    python -m dualjax.search --workdir=DIR --query="how do i fix my car" [--query=...] [--k=10]
    python -m dualjax.search --workdir=DIR --queries_file=queries.txt   # one query per line

The candidates are the corpus of an evaluation split (`--split`, default test) of the
dataset the run was trained on. The ScaNN index saved by the run's final evaluation is
loaded when its fingerprint (corpus embeddings, checkpoint step, index settings) still
matches, and rebuilt and saved again otherwise.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from absl import app, flags, logging

from dualjax import evaluate, index, sharding, train
from dualjax import tasks as tasks_lib
from dualjax.metrics_log import setup_logging
from dualjax.trained import load_trained

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained dualjax workdir.")
_QUERY = flags.DEFINE_multi_string("query", [], "A query (repeatable).")
_QUERIES_FILE = flags.DEFINE_string("queries_file", None, "A file with one query per line.")
_K = flags.DEFINE_integer("k", 10, "Results per query.")
_SPLIT = flags.DEFINE_string("split", "test", "Evaluation split whose corpus is searched.")
_TASK = flags.DEFINE_string("task", "", "Multi-task runs: the task whose corpus is searched "
                            "(default: the first).")


class Searcher:
    """The towers of a workdir's latest checkpoint and an index over a split's corpus."""

    def __init__(self, workdir: str, split: str = "test", k: int = 10, task: str = ""):
        config, self.inputs, model, params, step = load_trained(workdir)
        self.k = k
        self.mesh = sharding.make_mesh()
        encode_queries, encode_documents = train.make_encoders(model)
        self._encode_queries = lambda x: encode_queries(params, x)
        tasks = {t.name: t for t in tasks_lib.make_tasks(config, workdir)}
        name = task or next(iter(tasks))
        if name not in tasks:
            raise ValueError(f"--task={task!r} is not one of this run's tasks: "
                             f"{', '.join(tasks)}")
        data = tasks[name].eval_task(split)
        self.corpus = data.corpus
        corpus_emb = evaluate.encode_texts(
            lambda x: encode_documents(params, x), self.corpus, self.inputs.document,
            config.eval.batch_size, self.mesh, desc="encode corpus", fields=data.corpus_fields)
        self.index, self.info = index.make_index(
            config.eval.index, corpus_emb, config.eval, min(k, len(self.corpus)),
            directory=os.path.join(workdir, "index", *([name] if name else []), split),
            extra=f"step {step}")
        logging.info("%s index over %d candidates (%s)", config.eval.index, len(self.corpus),
                     "built" if self.info["built"] else "loaded")

    def search(self, queries: Sequence[str]) -> list[list[tuple[float, str]]]:
        """Per query, the top k (score, candidate text), best first. Typed queries carry
        no categorical fields: a query side with fields reads them as missing."""
        emb = evaluate.encode_texts(self._encode_queries, queries, self.inputs.query,
                                    len(queries), self.mesh, desc="encode queries")
        scores, ids = self.index.search(emb, min(self.k, len(self.corpus)))
        return [[(float(s), self.corpus[i]) for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, ids)]


def main(argv: list[str]) -> None:
    del argv
    setup_logging()
    queries = list(_QUERY.value)
    if _QUERIES_FILE.value:
        with open(_QUERIES_FILE.value, encoding="utf-8") as f:
            queries += [line.strip() for line in f if line.strip()]
    if not queries:
        sys.exit("dualjax.search: give --query (repeatable) or --queries_file")
    if not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
        sys.exit(f"dualjax.search: --workdir={_WORKDIR.value}: not a dualjax workdir (no "
                 "config.json)")
    try:
        searcher = Searcher(_WORKDIR.value, _SPLIT.value, _K.value, _TASK.value)
    except FileNotFoundError as e:
        sys.exit(f"dualjax.search: {e}")
    for query, results in zip(queries, searcher.search(queries)):
        print(f"\n> {query}")
        for rank, (score, text) in enumerate(results, 1):
            print(f"{rank:3d}. {score:+.4f}  {text}")


def run() -> None:
    """The `dualjax-search` console script: the same as `python -m dualjax.search`."""
    flags.mark_flag_as_required("workdir")
    app.run(main)


if __name__ == "__main__":
    run()
