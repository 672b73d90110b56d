"""The evaluation report: WORKDIR/report.md (systems x metrics, exact vs ScaNN),
WORKDIR/recall_at_k.png (recall@k for k = 1..100, one line per system) and each system's
ranking as a TREC run file, WORKDIR/runs/SPLIT_SYSTEM.trec (`write_runs`); with a typo
sweep, WORKDIR/typo_robustness.png (recall@10 and recall@100 against the typo
probability, one line per system)."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Collection, Sequence

import numpy as np
from absl import logging

from dualjax.eval.scoring import Ranking, row_label
from dualjax.retrieval import metrics
from dualjax.runtime.files import atomic_write


def _pyplot():
    """matplotlib's pyplot, drawing to files only (never a window); imported at the first
    plot, not by every command that imports the evaluation (its import time:
    BENCHMARKS.md, "Figures behind design choices")."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt

KEYS = ("map@100", "recall@1", "recall@10", "recall@100", "mrr@10", "success@1",
        "success@10", "ndcg@10")


def markdown_table(rows: Sequence[dict], keys: Sequence[str] = KEYS) -> str:
    head = "| system | " + " | ".join(keys) + " |"
    rule = "|---|" + "---:|" * len(keys)
    body = ["| " + row_label(r) + " | " + " | ".join(
        f"{r[k]:.4f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys) + " |"
        for r in rows]
    return "\n".join([head, rule, *body])


def ann_section(rows: Sequence[dict]) -> str:
    """ScaNN against exact search on the same queries, per system searched both ways."""
    lines = []
    for ann in (r for r in rows if r.get("index") == "scann"):
        exact = next(r for r in rows if r["system"] == ann["system"] and r["index"] == "exact")
        rel = ann["map@100_gap"] / exact["map@100"] if exact["map@100"] else 0.0
        lines.append(
            f"- {ann['system']}: map@100 exact {exact['map@100']:.4f}, ScaNN {ann['map@100']:.4f} "
            f"(gap {ann['map@100_gap']:+.4f}, {100 * rel:.2f}% of exact; Gillick et al. saw at "
            f"most 0.4%); ScaNN recall@10 against the exact top 10: {ann['ann_recall@10']:.4f}; "
            f"index {'built' if ann['index_built'] else 'loaded'} in {ann['index_seconds']:.2f} s.")
    return "\n".join(lines)


def plot_recall(path: str, ranked: dict[str, Ranking],
                relevant: Sequence[Collection[int]], title: str, max_k: int = 100) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, ranking in ranked.items():
        curve = metrics.recall_curve(ranking.ids, relevant, max_k=max_k)
        ax.plot(np.arange(1, max_k + 1), curve, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    # Fixed margins: tight_layout draws the log axis twice more, paid by every
    # evaluation's report (BENCHMARKS.md, "Figures behind design choices").
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.11, top=0.93)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_typo_robustness(path: str, rows: Sequence[dict], title: str = "",
                         keys: Sequence[str] = ("recall@10", "recall@100")) -> None:
    """One panel per metric of `keys` against the queries' typo probability, one line per
    system: `rows` are `scoring.typo_sweep`'s (each with "typo_p")."""
    curves: dict[str, list[dict]] = {}
    for row in rows:
        curves.setdefault(row_label(row), []).append(row)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), sharey=True,
                             squeeze=False)
    for ax, key in zip(axes[0], keys, strict=False):
        for label, points in curves.items():
            points = sorted(points, key=lambda r: r["typo_p"])
            ax.plot([r["typo_p"] for r in points], [r[key] for r in points], marker="o",
                    label=label)
        ax.set_xlabel("typo probability p (per query word)")
        ax.set_ylabel(key)
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.set_title(key)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_name(task: str = "") -> str:
    """report.md, or report_<task>.md for one task of a multi-task run."""
    return f"report_{task}.md" if task else "report.md"


def write_report(workdir: str, split: str, step: int, rows: Sequence[dict],
                 ranked: dict[str, Ranking], relevant: Sequence[Collection[int]],
                 corpus_size: int, task: str = "") -> None:
    """Writes report.md and recall_at_k.png for one evaluated split (with a task name:
    report_<task>.md and recall_at_k_<task>.png)."""
    suffix = f"_{task}" if task else ""
    title = (f"{'task ' + task + ', ' if task else ''}{split} split, step {step}: "
             f"{len(relevant)} queries, {corpus_size} candidates")
    plot_recall(os.path.join(workdir, f"recall_at_k{suffix}.png"), ranked, relevant, title)
    parts = [f"# dualjax evaluation report\n\n{title}.\n", markdown_table(rows)]
    ann = ann_section(rows)
    if ann:
        parts.append("\n## Approximate (ScaNN) vs exact search\n\n" + ann)
    parts.append(f"\n![recall@k](recall_at_k{suffix}.png)\n")
    with open(os.path.join(workdir, report_name(task)), "w") as f:
        f.write("\n".join(parts))


def run_file_name(split: str, label: str) -> str:
    """"test_bm25.trec" for "bm25 [exact]", "test_dual_encoder_scann.trec" for
    "dual_encoder [scann]": the split, the system, and the index where it is not exact."""
    system, _, kind = label.partition(" [")
    kind = kind.rstrip("]")
    return f"{split}_{system}{'' if kind in ('', 'exact') else '_' + kind}.trec"


def trec_id(key: str) -> str:
    """An id as a run file writes it: as it is, or, when it holds whitespace (a run
    file's column separator), with that whitespace and any '%' percent-escaped ("doc 1"
    -> "doc%201"; `urllib.parse.unquote` reads it back; docs/evaluation.md)."""
    if not any(c.isspace() for c in key):
        return key
    return "".join(urllib.parse.quote(c, safe="") if c.isspace() or c == "%" else c
                   for c in key)


def write_trec_run(path: str, ranking: Ranking, query_keys: Sequence[str],
                   corpus_keys: Sequence[str], tag: str) -> None:
    """`ranking` as a TREC run file: a line `qid Q0 docid rank score tag` per retrieved
    document (rank from 1, -1 padding left out), the ids as the data names them (those
    with whitespace escaped: `trec_id`), so that trec_eval or pytrec_eval can score it
    against the collection's own qrels. (trec_eval orders each query's lines by score,
    so documents of equal score may be ranked among themselves otherwise than here.)"""
    query_keys, corpus_keys = _escaped(query_keys), _escaped(corpus_keys)
    lines = []
    rows = zip(ranking.ids.tolist(), ranking.scores.tolist(), strict=True)
    for q, (ids, scores) in enumerate(rows):
        found = ((d, s) for d, s in zip(ids, scores, strict=True) if d >= 0)
        lines += [f"{query_keys[q]} Q0 {corpus_keys[d]} {r} {s:.8g} {tag}\n"
                  for r, (d, s) in enumerate(found, start=1)]
    atomic_write(path, "".join(lines))


def _escaped(keys: Sequence[str]) -> Sequence[str]:
    """`keys` as run files write them (`trec_id`); said once when any is escaped."""
    escaped = [trec_id(k) for k in keys]
    changed = [k for k, e in zip(keys, escaped, strict=True) if k != e]
    if changed and not _said_escaped[0]:
        _said_escaped[0] = True
        logging.warning("%d ids hold whitespace (%r, ...): the run files write them with "
                        "their whitespace percent-escaped (%r), as docs/evaluation.md says "
                        "(said once)", len(changed), changed[0], trec_id(changed[0]))
    return escaped


_said_escaped = [False]  # once per process


def write_runs(workdir: str, split: str, ranked: dict[str, Ranking],
               query_keys: Sequence[str] | None, corpus_keys: Sequence[str] | None,
               task: str = "") -> str:
    """Every system's ranking of one split as WORKDIR/runs/[TASK/]SPLIT_SYSTEM.trec
    (`run_file_name`); ids are the data's own where it has them (BEIR's "_id"), else row
    numbers. Returns the folder."""
    folder = os.path.join(workdir, "runs", *([task] if task else []))
    os.makedirs(folder, exist_ok=True)
    nq = len(next(iter(ranked.values())).ids) if ranked else 0
    n = 1 + max((int(r.ids.max(initial=-1)) for r in ranked.values()), default=-1)
    query_keys = query_keys or [str(i) for i in range(nq)]
    corpus_keys = corpus_keys or [str(i) for i in range(n)]
    for label, ranking in ranked.items():
        write_trec_run(os.path.join(folder, run_file_name(split, label)), ranking,
                       query_keys, corpus_keys, label.partition(" [")[0])
    return folder
