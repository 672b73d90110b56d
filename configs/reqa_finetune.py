"""Fine-tune on ReQA SQuAD as Chang et al. (2020) and Ahmad et al. (2019) run it.

The questions are split at random (data.train_fraction: Chang et al. use 0.01, 0.05 and
0.8) and every (sentence, paragraph) candidate of the dataset is a candidate for every
question, so a test answer may sit in a paragraph that training questions also used.
Starts from a pre-training run's towers and vocabulary (config.init_from); without it,
this trains from scratch (the paper's "no pre-training" rows). Model settings come from
configs/pretrain.py, so the towers match.

  python -m dualjax.main --config=configs/reqa_finetune.py --workdir=runs/reqa_ft \
      --config.init_from=runs/pretrain [--config.data.train_fraction=0.01]

num_train_steps=0 evaluates the pre-trained towers as they are (zero-shot).
"""
import pathlib
import runpy

import ml_collections

_HERE = pathlib.Path(__file__).parent
_DEFAULT = runpy.run_path(str(_HERE / "default.py"))
_PRETRAIN = runpy.run_path(str(_HERE / "pretrain.py"))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.init_from = ""                # the pre-training workdir ("": from scratch)
    c.num_train_steps = 1000
    c.global_batch_size = 256
    c.checkpoint_every_steps = 500
    c.eval_every_steps = 0

    c.data.name = "reqa_squad"      # ../shared/data/squad/dev-v1.1.json unless data.path is set
    c.data.split_by = "question"    # a random split of the questions, all candidates
    c.data.train_fraction = 0.8     # Chang et al. Table 3: 0.01, 0.05, 0.8
    c.data.val_fraction = 0.0       # the paper has no validation split
    c.data.candidates = "all"

    _PRETRAIN["model_config"](c)
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 100
    c.eval.baselines = "bm25"
    return c
