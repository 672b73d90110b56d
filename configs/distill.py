"""Zero-shot adaptation by distillation: a MiniLM student learns an MPNet teacher's scores.

A sentence of each document of the collection is a pseudo-query; all-mpnet-base-v2 fused
with BM25 (the teacher) ranks the other documents for it, its first is the positive and
k of the rest (those it scores clearly below the positive) are the negatives; the
student (all-MiniLM-L6-v2) learns the teacher's scores of them (listwise KL) beside the
in-batch loss. No query and no label of the collection is read. Fetch both starts once:
    python -m dualjax.pretrained fetch all-MiniLM-L6-v2 all-mpnet-base-v2
    python -m dualjax.main --config=configs/distill.py --workdir=runs/distill_npl \\
        --config.data.path=../shared/data/npl
The teacher's scores are made once (WORKDIR/teacher_scores.jsonl); the evaluation is on
the collection's queries, if it has judgements, against BM25 and fused with it, beside
the student as it started ("start" rows). The settings were chosen on the four shared
collections only; BENCHMARKS.md ("Zero-shot from pretrained starts") has the figures.
"""
import pathlib
import runpy

import ml_collections

_ADAPT = runpy.run_path(str(pathlib.Path(__file__).with_name("adapt.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _ADAPT["get_config"]()      # MiniLM, its max length, temperature, optimizer, eval
    c.data.tasks = "distill"
    c.global_batch_size = 32        # queries per step; each brings 1 + distill.negatives
                                    # documents (128 documents a step, as adapt.py's 64 pairs)
    c.num_train_steps = 300
    c.max_epochs = 2.0              # at most 2 passes over the queries (one per document)
    c.optimizer.learning_rate = 2e-5  # a teacher's graded targets take a higher rate than
    c.optimizer.warmup_steps = 10   # adapt.py's pseudo-labels (MED, TIME and ADI only:
                                    # BENCHMARKS.md)
    c.train.encode_chunks = 4       # GradCache: 8 queries (and their 8 positives, then
                                    # their 24 negatives) at a time; a multiple of 8 devices
    c.distill.teacher = "all-mpnet-base-v2"
    c.distill.teacher_weight = 0.5  # the teacher is MPNet fused with BM25 (w: MPNet's)
    c.distill.negatives = 3
    c.distill.depth = 30
    c.distill.margin = 0.1
    c.distill.loss = "kl"
    c.distill.temperature = 0.1
    return c
