"""Evaluation: encode the queries and the corpus, search, score the ranking.

An evaluation receives encode functions (text ids -> unit vectors) and a retrieval
task; it does not reach into the trainer. Results are flat dicts of metrics as in
metrics.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from absl import logging

from dualjax import losses
from dualjax.retrieval import ann, hybrid, metrics
from dualjax.retrieval import baselines as baselines_lib
from dualjax.retrieval.encoding import EncodeFn, encode_texts
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime.registry import Registry
from dualjax.text import tokenizers, typos
from dualjax.text.features import Fields
from dualjax.text.sides import Inputs


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What an evaluation reads of the run (config.eval and model.name), resolved once by
    `config.specs.eval_spec`; configs/default.py's eval group says what each key does.

    index_settings: `ann.make_index`'s (query_chunk, corpus_chunk, scann, hnsw); bm25:
    `baselines.rank`'s BM25 options; system: the trained model's rows ("dual_encoder" or
    "pses"), the one searched approximately and fused with eval.hybrid.
    """
    batch_size: int = 512
    top_k: int = 100
    index: str = "exact"
    index_settings: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {"query_chunk": 256, "corpus_chunk": 4096})
    bm25: Mapping[str, Any] = dataclasses.field(default_factory=baselines_lib.bm25_defaults)
    baselines: tuple[str, ...] = ()
    hybrid: str = ""
    hybrid_rrf_k: float = 60.0
    hybrid_weight: float = 0.5
    select_by: str = ""
    typo_probs: tuple[float, ...] = ()
    typo_seed: int = 0
    system: str = "dual_encoder"
    dims: tuple[int, ...] = ()  # the trained system also searched at these prefixes
    # eval.evaluators: (registered name, its options) of each evaluator run after a task's
    # retrieval evaluation (evaluators.EVALUATORS)
    evaluators: tuple[tuple[str, Mapping[str, Any]], ...] = ()


class Ranking(NamedTuple):
    """One system's answers to a task's queries: corpus ids int [nq, k] best first (-1
    padding) and their scores [nq, k] (the system's own: cosines, BM25, fused values)."""
    ids: np.ndarray
    scores: np.ndarray


def log_missing_fields(task: RetrievalTask, inputs: Inputs) -> None:
    """Logs, per side with categorical fields, how many of a task's records lack each."""
    for name, side, texts, fields in (("queries", inputs.query, task.queries, task.query_fields),
                                      ("candidates", inputs.document, task.corpus,
                                       task.corpus_fields)):
        if side.features:
            records: Sequence[Fields] = fields if fields else [None for _ in texts]
            ids = side.features.encode(records)
            logging.info("Categorical fields missing (id 0) in %d %s: %s", len(texts), name,
                         side.features.missing_counts(ids))


def ann_recall(ann_ids: np.ndarray, exact_ids: np.ndarray, k: int = 10) -> float:
    """Mean over queries of |ANN top-k & exact top-k| / |exact top-k| (ids of -1 ignored)."""
    found = []
    for a, e in zip(ann_ids[:, :k], exact_ids[:, :k], strict=True):
        truth = set(e[e >= 0].tolist())
        if truth:
            found.append(len(truth & set(a.tolist())) / len(truth))
    return float(np.mean(found)) if found else 1.0


@dataclasses.dataclass(frozen=True)
class DenseCorpus:
    """The documents a tower searches: those that give its tokenizer a token. One that
    gives none would be the towers' bias alone, a vector shared by all such documents
    (ranked first for queries the model knows nothing of); it is left out of the dense
    search, counted in the log, and so never retrieved by a tower (lexical systems see the
    whole corpus).

    rows: the corpus positions searched, None for all; k: results per query.
    """
    task: RetrievalTask
    rows: np.ndarray | None
    k: int

    @classmethod
    def of(cls, task: RetrievalTask, tokenizer, k: int) -> DenseCorpus:
        skipped = set(tokenizers.without_tokens(tokenizer, task.corpus))
        if not skipped:
            return cls(task, None, k)
        logging.warning("%d of the %d documents give the model no token (empty, or no "
                        "letter or digit): left out of the towers' search", len(skipped),
                        len(task.corpus))
        rows = np.asarray([i for i in range(len(task.corpus)) if i not in skipped], np.int64)
        return cls(task, rows, min(k, len(rows)))

    @property
    def texts(self) -> Sequence[str]:
        return self.task.corpus if self.rows is None else [self.task.corpus[i] for i in self.rows]

    @property
    def fields(self) -> Sequence[Fields] | None:
        f = self.task.corpus_fields
        return f if f is None or self.rows is None else [f[i] for i in self.rows]

    @property
    def exclude(self) -> np.ndarray:
        """Per query, the searched position it must not retrieve (itself), or -1."""
        own = np.asarray(self.task.query_corpus_index, np.int64)
        if self.rows is None:
            return own
        at = np.full(len(self.task.corpus), -1, np.int64)
        at[self.rows] = np.arange(len(self.rows))
        return np.where(own >= 0, at[np.maximum(own, 0)], -1)

    def ranking(self, found: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """An index's (scores, ids) as (ids, scores) over the whole corpus."""
        scores, ids = found
        if self.rows is None:
            return ids, scores
        return np.where(ids >= 0, self.rows[np.maximum(ids, 0)], -1), scores


def evaluate_split(task: RetrievalTask, towers: dict[str, tuple[EncodeFn, EncodeFn]],
                   inputs: Inputs, spec: EvalSpec,
                   mesh: jax.sharding.Mesh, baselines: Sequence[str] = (),
                   index_dir: str | None = None, ann_systems: Sequence[str] = ("dual_encoder",),
                   index_extra: str = "", hybrid_systems: Sequence[str] | None = None,
                   hybrid_weights: dict[str, float] | None = None
                   ) -> tuple[list[dict], dict[str, Ranking]]:
    """Every system's metrics on one retrieval task (a query never retrieves itself): each
    tower's vectors go through the `TOWER_JOBS`, then the split through the `SPLIT_JOBS`.

    towers: system name -> (encode_queries, encode_documents), reading `inputs` (each
    side's tokens, max length and categorical fields). Each is searched exactly; with
    spec.index = "scann" or "hnsw", the systems in `ann_systems` are also searched with
    that approximate index (saved under `index_dir`), whose row adds `ann_recall@10`
    (overlap with the exact top 10) and `map@100_gap` (exact minus it). Lexical
    `baselines` run on the same task. With spec.hybrid (a lexical system, e.g. "bm25"),
    each tower's (of `hybrid_systems`; None: all) exact ranking is fused with that
    system's (hybrid search, `hybrid.py`) twice: by reciprocal rank fusion
    (spec.hybrid_rrf_k) as the system "<tower>+<lexical>", and by score interpolation as
    "<tower>+<lexical>_interp" with the dense weight `hybrid_weights[tower]`, or, where
    `hybrid_weights` is None (a validation split), the weight that scores best here on
    `spec.select_by` (else map@100); the row says it as "hybrid_weight". Returns (rows
    {"system", "index", metrics...}, {label: its `Ranking`}).
    """
    split = Split.of(task, spec, inputs.document.tokenizer, baselines=tuple(baselines),
                     index_dir=index_dir, ann_systems=tuple(ann_systems),
                     index_extra=index_extra,
                     hybrid_systems=tuple(towers if hybrid_systems is None else hybrid_systems),
                     hybrid_weights=hybrid_weights)
    enc: dict[str, Any] = dict(batch_size=spec.batch_size, mesh=mesh)
    for system, (encode_queries, encode_documents) in towers.items():
        corpus = encode_texts(encode_documents, split.dense.texts, inputs.document,
                              desc=f"{system}: corpus", fields=split.dense.fields, **enc)
        queries = encode_texts(encode_queries, task.queries, inputs.query,
                               desc=f"{system}: queries", fields=task.query_fields, **enc)
        for tower_job in TOWER_JOBS.values():
            tower_job(split, system, corpus, queries)
    for split_job in SPLIT_JOBS.values():
        split_job(split)
    return split.rows, split.ranked


@dataclasses.dataclass
class Split:
    """One split's evaluation as its jobs share it: the task, the spec, the documents the
    towers search (`dense`), k, what `evaluate_split` was asked (the baselines, where
    and for which systems an approximate index, which towers the hybrids fuse and at
    which weights), the rows and rankings so far, and each system's exact ranking
    (`scored`: (ids, scores), what the hybrids fuse) and row (`exact`)."""
    task: RetrievalTask
    spec: EvalSpec
    dense: DenseCorpus
    k: int
    baselines: tuple[str, ...] = ()
    index_dir: str | None = None
    ann_systems: tuple[str, ...] = ()
    index_extra: str = ""
    hybrid_systems: tuple[str, ...] = ()
    hybrid_weights: dict[str, float] | None = None
    rows: list[dict] = dataclasses.field(default_factory=list)
    ranked: dict[str, Ranking] = dataclasses.field(default_factory=dict)
    scored: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)
    exact: dict[str, dict] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, task: RetrievalTask, spec: EvalSpec, tokenizer, **asked) -> Split:
        k = min(spec.top_k, len(task.corpus))
        return cls(task, spec, DenseCorpus.of(task, tokenizer, k), k, **asked)

    def add(self, system: str, kind: str, ranking: tuple[np.ndarray, np.ndarray],
            **extra) -> dict:
        """The row of `system` ranked by searcher `kind` (its metrics on the task)."""
        ids, scores = ranking
        row = {"system": system, "index": kind,
               **metrics.retrieval_metrics(ids, self.task.relevant, grades=self.task.grades),
               **extra}
        self.rows.append(row)
        self.ranked[f"{system} [{kind}]"] = Ranking(np.asarray(ids), np.asarray(scores))
        return row

    def search(self, kind: str, corpus: np.ndarray, queries: np.ndarray, **index_args
               ) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
        """(ids, scores) over the whole corpus of `queries` searched in `corpus` (the dense
        documents' vectors) with searcher `kind`, and the searcher's info."""
        index, info = ann.make_index(kind, corpus, self.spec.index_settings, self.dense.k,
                                     **index_args)
        return self.dense.ranking(index.search(queries, self.dense.k, self.dense.exclude)), info


# The jobs of a split's evaluation, in the order their rows come. A tower job gets
# (split, system, corpus vectors, query vectors) for each tower in turn; a split job
# gets the split once the towers are done. Each decides from the split (its spec, what
# was asked) whether it has anything to do, and adds rows with `split.add`. A job of
# your own is one function registered here (tests/project/test_plugins.py registers one).
TowerJob = Callable[[Split, str, np.ndarray, np.ndarray], None]
SplitJob = Callable[[Split], None]
TOWER_JOBS: Registry[TowerJob] = Registry(
    "tower job", lambda name, known: KeyError(f"no tower job {name!r}; registered: {known}"))
SPLIT_JOBS: Registry[SplitJob] = Registry(
    "split job", lambda name, known: KeyError(f"no split job {name!r}; registered: {known}"))


def _exact(split: Split, system: str, corpus: np.ndarray, queries: np.ndarray) -> None:
    """`system`'s row searched exactly; its ranking is kept for the hybrids, its row for
    the approximate index's gap."""
    split.scored[system], _ = split.search("exact", corpus, queries)
    split.exact[system] = split.add(system, "exact", split.scored[system])


def _prefixes(split: Split, system: str, corpus: np.ndarray, queries: np.ndarray) -> None:
    """`system@m` rows of the `ann_systems`: the first m dimensions of its vectors
    (eval.dims, Matryoshka), searched exactly."""
    if system not in split.ann_systems:
        return
    for m in split.spec.dims:
        if m >= corpus.shape[1]:
            raise ValueError(f"eval.dims: {m} is not below {system}'s "
                             f"{corpus.shape[1]} dimensions")
        found, _ = split.search("exact", np.asarray(losses.prefix(corpus, m)),
                                np.asarray(losses.prefix(queries, m)))
        split.add(f"{system}@{m}", "exact", found)


def _approximate(split: Split, system: str, corpus: np.ndarray, queries: np.ndarray) -> None:
    """The row of one of the `ann_systems` searched with spec.index ("scann" or "hnsw")
    beside its exact one: the overlap of their top 10, the MAP@100 it loses, and the
    index's time to be ready."""
    kind = split.spec.index
    if kind == "exact" or system not in split.ann_systems:
        return
    (ann_ids, ann_scores), info = split.search(kind, corpus, queries,
                                               directory=split.index_dir,
                                               extra=split.index_extra)
    row = split.add(system, kind, (ann_ids, ann_scores),
                    **{"ann_recall@10": ann_recall(ann_ids, split.scored[system][0])})
    row["map@100_gap"] = split.exact[system]["map@100"] - row["map@100"]
    row["index_seconds"] = info["build_seconds"]
    row["index_built"] = info["built"]
    logging.info("%s %s: %s, ready in %.2fs, %.1f MB on disk", kind, system,
                 info["settings"], info["build_seconds"], info["bytes_on_disk"] / 2**20)


def _lexical(split: Split) -> None:
    """The lexical `baselines`' rows over the whole corpus; the ranking of eval.hybrid's
    lexical system is kept for the hybrids (a row only if it is a baseline too)."""
    lexical, baselines = split.spec.hybrid, split.baselines
    task = split.task
    for name in dict.fromkeys(list(baselines) + ([lexical] if lexical else [])):
        scores, ids = baselines_lib.rank_texts(
            name, task.corpus, task.queries, split.k, task.query_corpus_index,
            **baselines_lib.options_for(name, dict(split.spec.bm25)))
        split.scored[name] = (ids, scores)
        if name in baselines:
            split.add(name, "exact", split.scored[name])


def _hybrids(split: Split) -> None:
    """With eval.hybrid, each of `hybrid_systems`' exact ranking fused with its lexical
    one: by reciprocal rank fusion, and by score interpolation at
    `hybrid_weights[system]` (None: the weight best on this split)."""
    spec, lexical, task, k = split.spec, split.spec.hybrid, split.task, split.k
    if not lexical:
        return
    for system in split.hybrid_systems:
        ids, scores = split.scored[lexical]
        split.add(f"{system}+{lexical}", "exact",
                  hybrid.fuse(split.scored[system], (ids, scores), k, rrf_k=spec.hybrid_rrf_k))
        if split.hybrid_weights is None:
            weight, _ = hybrid.choose_weight(split.scored[system], (ids, scores),
                                             task.relevant, k, spec.select_by or "map@100",
                                             grades=task.grades)
        else:
            weight = split.hybrid_weights.get(system, spec.hybrid_weight)
        split.add(f"{system}+{lexical}_interp", "exact",
                  hybrid.fuse(split.scored[system], (ids, scores), k, weight),
                  hybrid_weight=weight)


TOWER_JOBS.add("exact", _exact)  # first: the jobs after it compare with its ranking
TOWER_JOBS.add("prefixes", _prefixes)
TOWER_JOBS.add("approximate", _approximate)
SPLIT_JOBS.add("lexical", _lexical)
SPLIT_JOBS.add("hybrids", _hybrids)  # after the lexical ranking it fuses


def typo_sweep(task: RetrievalTask, towers: dict[str, tuple[EncodeFn, EncodeFn]],
               inputs: Inputs, spec: EvalSpec,
               mesh: jax.sharding.Mesh, probs: Sequence[float], seed: int,
               baselines: Sequence[str] = (), hybrid_systems: Sequence[str] | None = None,
               hybrid_weights: dict[str, float] | None = None) -> list[dict]:
    """Typo robustness (Moscicki 2022, section 4.4): every system's metrics with typos in
    the queries, at each typo probability of `probs`.

    At each p the queries are `typos.typo_texts(task.queries, p, seed)` (each word of two
    or more characters gets one typo with probability p; the same seed and p always give
    the same queries); the corpus, the relevant sets and the self-exclusion
    (`query_corpus_index`: a typo'd query still never retrieves its own clean corpus
    entry) are unchanged. Search is exact only. Returns `evaluate_split`'s rows for every
    p in order, each with a "typo_p" field: {"system", "index", "typo_p", metrics...}.
    """
    rows = []
    for p in probs:
        noisy = dataclasses.replace(task, queries=typos.typo_texts(task.queries, p, seed))
        p_rows, _ = evaluate_split(noisy, towers, inputs, spec, mesh, baselines=baselines,
                                   ann_systems=(), hybrid_systems=hybrid_systems,
                                   hybrid_weights=hybrid_weights or {})
        rows += [{"system": r["system"], "index": r["index"], "typo_p": float(p),
                  **{k: v for k, v in r.items() if k not in ("system", "index")}}
                 for r in p_rows]
    return rows


def row_label(row: dict) -> str:
    return f"{row['system']} [{row['index']}]" if "index" in row else str(row.get("system", ""))


def format_table(rows: Sequence[dict], keys: Sequence[str]) -> str:
    """A plain-text table: one row per dict, the system (and index) column first."""
    header = ["system", *keys]
    lines = [header] + [[row_label(r)] + [f"{r[k]:.4f}" if isinstance(r.get(k), float)
                                                        else str(r.get(k, "")) for k in keys]
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    fmt = lambda line: "  ".join(c.rjust(w) if i else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(line, widths, strict=True)))
    rule = fmt(["-" * w for w in widths])
    return "\n".join([fmt(lines[0]), rule] + [fmt(line) for line in lines[1:]])


def log_metrics(prefix: str, values: dict) -> None:
    logging.info("%s: %s", prefix, ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in values.items()))
