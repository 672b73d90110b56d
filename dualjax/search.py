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

import os
import sys
from collections.abc import Sequence

from absl import flags, logging

from dualjax import cli
from dualjax.errors import WorkdirError
from dualjax.eval.metrics_log import setup_logging
from dualjax.serve.searching import Results, Searcher, from_bundle, fused  # noqa: F401
from dualjax.text import tokenizers

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained dualjax workdir.")
_ENCODER = flags.DEFINE_string("encoder", None, "An exported encoder (python -m dualjax.export).")
_INDEX = flags.DEFINE_string("index", None, "Its corpus index (python -m dualjax.index).")
_QUERY = flags.DEFINE_multi_string("query", [], "A query (repeatable).")
_QUERIES_FILE = flags.DEFINE_string("queries_file", None, "A file with one query per line.")
_K = flags.DEFINE_integer("k", 10, "Results per query (at least 1).")
_MAX_CHARS = flags.DEFINE_integer("max_chars", 300, "Print at most this many characters of "
                                  "each hit's text (0: all of it).")
_SPLIT = flags.DEFINE_string("split", "test", "--workdir: the evaluation split whose corpus "
                             "is searched.")
_TASK = flags.DEFINE_string("task", "", "--workdir, multi-task runs: the task whose corpus is "
                            "searched (default: the first).")
_HYBRID = flags.DEFINE_enum("hybrid", "", ["", "bm25", "tfidf"],
                            "Fuse the model's ranking with this lexical system's.")
_HYBRID_WEIGHT = flags.DEFINE_float("hybrid_weight", None, "With --hybrid: interpolate "
                                    "normalised scores with this dense weight in [0, 1] "
                                    "instead of reciprocal rank fusion.")


def from_workdir(workdir: str, split: str = "test", k: int = 10, task: str = "") -> Searcher:
    """A search service from a training workdir: its latest checkpoint over the corpus
    of an evaluation split of its dataset, with the index its final evaluation saved
    (rebuilt if stale).

    Args:
      workdir: a training run's workdir (`config.run.saved` reads its config.json).
      split: the evaluation split whose corpus is searched.
      k: answers per query.
      task: a multi-task run's task (default: the first).

    Returns:
      The `Searcher`; ValueError naming a task the run does not have.
    """
    # The training stack is imported only here: serving a bundle needs none of it.
    from dualjax import models
    from dualjax.eval import scoring
    from dualjax.retrieval import ann, encoding
    from dualjax.runtime import sharding
    from dualjax.train import tasks as tasks_lib
    from dualjax.train.trained import load_trained
    run, inputs, model, params, step = load_trained(workdir)
    spec = run.eval
    mesh = sharding.make_mesh()
    encode_queries, encode_documents = models.make_encoders(model)
    tasks = {t.name: t for t in tasks_lib.make_tasks(run.tasks, run.schedule.seed)}
    name = task or next(iter(tasks))
    if name not in tasks:
        if list(tasks) == [""]:
            raise ValueError(f"--task={task!r}: this run has a single task, which has no "
                             "name; leave --task out")
        raise ValueError(f"--task={task!r} is not one of this run's tasks: {', '.join(tasks)}")
    data = tasks[name].eval_task(split)
    dense = scoring.DenseCorpus.of(data, inputs.document.tokenizer, k)  # as evaluated
    texts, keys = list(dense.texts), data.corpus_keys
    if keys is not None and dense.rows is not None:
        keys = [keys[i] for i in dense.rows]
    corpus_emb = encoding.encode_texts(
        lambda x: encode_documents(params, x), texts, inputs.document,
        spec.batch_size, mesh, desc="encode corpus", fields=dense.fields)
    searcher, info = ann.make_index(
        spec.index, corpus_emb, spec.index_settings, min(k, len(texts)),
        directory=os.path.join(workdir, "index", *([name] if name else []), split),
        extra=f"step {step}")
    logging.info("%s index over %d candidates (%s)", spec.index, len(texts),
                 "built" if info["built"] else "loaded")
    encode = lambda texts: encoding.encode_texts(
        lambda x: encode_queries(params, x), texts, inputs.query, max(len(texts), 1), mesh,
        desc="encode queries")
    return Searcher(texts, searcher, encode, inputs.query.tokenizer, k, info,
                    keys)  # a BEIR corpus' own ids (None: positions)


def read_queries(given: Sequence[str], path: str | None) -> list[str]:
    """The --query values, then the non-blank lines of --queries_file; ValueError naming
    the query or file that cannot be answered (an empty query, a file that is missing,
    not UTF-8 text or without a query)."""
    for n, query in enumerate(given, 1):
        if not query.strip():
            raise ValueError(f"--query #{n} is empty: give the text to search for")
    queries = list(given)
    if path:
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise ValueError(f"--queries_file={path}: {e.strerror}") from None
        for lineno, line in enumerate(lines, 1):
            try:
                text = line.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text") from None
            queries += [text] if text else []  # blank lines (any Unicode space) skipped
        if len(queries) == len(given):
            raise ValueError(f"--queries_file={path} holds no query (one per line; blank "
                             "lines are skipped)")
    if not queries:
        raise ValueError("give --query (repeatable) or --queries_file")
    return queries


def _check_flags() -> None:
    """ValueError naming the flag whose value cannot work."""
    bundle = _ENCODER.value or _INDEX.value
    if bool(_WORKDIR.value) == bool(bundle) or (bundle and not (_ENCODER.value and _INDEX.value)):
        raise ValueError("give --encoder and --index (an exported model), or --workdir")
    if _WORKDIR.value and not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
        raise ValueError(f"--workdir={_WORKDIR.value}: not a dualjax workdir (no config.json)")
    if _K.value < 1:
        raise ValueError(f"--k={_K.value}: give the number of results per query, at least 1")
    if _MAX_CHARS.value < 0:
        raise ValueError(f"--max_chars={_MAX_CHARS.value}: give 0 (all) or more")
    weight = _HYBRID_WEIGHT.value
    if weight is not None and not _HYBRID.value:
        raise ValueError(f"--hybrid_weight={weight:g} weighs the dense scores in a hybrid "
                         "search: give --hybrid too (e.g. --hybrid=bm25)")
    if weight is not None and not 0 <= weight <= 1:
        raise ValueError(f"--hybrid_weight={weight:g}: give a weight in [0, 1] (the dense "
                         "scores' share)")


def snippet(text: str, max_chars: int) -> str:
    """`text` on one line, cut to `max_chars` (0: whole) with the length it had."""
    text = " ".join(text.split())
    if not max_chars or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [{len(text):,} characters]"


def main(argv: list[str]) -> None:
    del argv
    setup_logging()
    try:
        _check_flags()
        queries = read_queries(_QUERY.value, _QUERIES_FILE.value)
        encoder, index, workdir = _ENCODER.value, _INDEX.value, _WORKDIR.value
        if encoder and index:  # (_check_flags: these two, or a workdir)
            searcher = from_bundle(encoder, index, _K.value)
        else:
            assert workdir
            searcher = from_workdir(workdir, _SPLIT.value, _K.value, _TASK.value)
        answers = searcher.ranked(queries, _HYBRID.value, _HYBRID_WEIGHT.value)
    except (FileNotFoundError, ImportError, ValueError, WorkdirError) as e:
        sys.exit(f"dualjax.search: {e}")
    for query, results in zip(queries, answers, strict=True):
        print(f"\n> {query}")
        if not tokenizers.gives_tokens(searcher.tokenizer, query):
            print("  (no letter or digit the model reads: nothing to search for)")
        elif searcher.unknown(query):
            print("  (no token of this query is in the model's vocabulary: its vector "
                  "means little" + ("; the lexical ranking still counts)" if _HYBRID.value
                                    else ")"))
        for rank, (score, i) in enumerate(results, 1):
            print(f"{rank:3d}. {score:+.4f}  [{searcher.doc_id(i)}]  "
                  f"{snippet(searcher.corpus[i], _MAX_CHARS.value)}")


def run() -> None:
    """The `dualjax-search` console script: the same as `python -m dualjax.search`."""
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
