"""Multi-task training (Gillick et al. 2018 §2): the synthetic paraphrases and Quora
question pairs in one run, one shared encoder.

Each step trains on one task's batch, the task drawn with probability proportional to its
weight (uniform here), so the expected loss is the weighted average of the two tasks'
in-batch softmax losses; each task has its own learned similarity scale and bias, and
is evaluated on its own val/test splits (metrics rows carry "task"; report_<task>.md).

  python -m dualjax.main --config=configs/multitask.py --workdir=runs/multitask

Reads ../shared/data/quora/pairs.tsv from the project root (override with
--config.tasks.quora.data.path=...).
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 2000
    c.global_batch_size = 256
    c.eval_every_steps = 1000
    c.checkpoint_every_steps = 1000

    synthetic = ml_collections.ConfigDict(c.data.to_dict())  # configs/default.py's data
    quora = ml_collections.ConfigDict(c.data.to_dict())
    quora.name = "quora"            # ../shared/data/quora/pairs.tsv unless path is set
    quora.candidates = "split"      # the split's own questions (all 137k: configs/quora_*)
    c.tasks = ml_collections.ConfigDict({
        "synthetic": {"data": synthetic, "weight": 1.0},
        "quora": {"data": quora, "weight": 1.0},
    })

    c.model.vocab_size = 50000      # one vocabulary over both tasks' training pairs
    c.model.num_oov_buckets = 10000
    c.model.max_len = 40
    c.eval.baselines = "bm25"
    c.eval.batch_size = 1024
    return c
