"""Pre-training for retrieval (Chang et al. 2020): ICT, BFS and WLP pairs from a collection.

Generates (query, document) pairs from the unlabelled collection at data.path (told apart
by the path: a SQuAD v1.1 .json file, a BEIR folder, or a documents .jsonl file; default
the Wikispeedia articles) and trains the towers on them with the in-batch softmax. There
is no evaluation: fine-tune and evaluate from this workdir with config.init_from, e.g.

  python -m dualjax.main --config=configs/pretrain.py --workdir=runs/pretrain
  python -m dualjax.main --config=configs/reqa_finetune.py --workdir=runs/reqa_ft \
      --config.init_from=runs/pretrain

The tower is bow_mlp (BoW-MLP); --config.model.tower=transformer gives a 4 x 256
Transformer (model.transformer below). Fine-tuning must use the same model settings:
configs/reqa_finetune.py takes them from this file.
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))
WIKISPEEDIA = "../shared/data/wikispeedia/articles.jsonl"


def model_config(c: ml_collections.ConfigDict) -> None:
    """The towers shared by pre-training and fine-tuning (Chang et al.: 64/288 tokens)."""
    m = c.model
    m.tokenizer = "word"
    m.vocab_size = 50000
    m.num_oov_buckets = 5000
    m.max_len = 64
    m.query_max_len = 64            # Chang et al.: 64 query tokens ...
    m.doc_max_len = 288             # ... and 288 for title + passage
    m.tower = "bow_mlp"
    m.shared_towers = True          # one tower (queries and passages share words)
    m.embed_dim = 256
    m.embed_init_std = 0.1
    m.hidden_dim = 512
    m.output_dim = 256
    m.transformer.num_layers = 4    # with model.tower="transformer": 4 x 256, CPU-sized
    m.transformer.width = 256
    m.transformer.num_heads = 4
    m.transformer.mlp_dim = 1024
    m.transformer.max_positions = 288
    m.similarity = "cosine_learned_temperature"  # log tau learned (CLIP), from 0.05
    m.temperature = 0.05


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 2000
    c.global_batch_size = 512       # Chang et al.: 8192 (on TPUs)
    c.checkpoint_every_steps = 500
    c.eval_every_steps = 0          # nothing to evaluate on
    c.log_every_steps = 50

    c.data.name = "pretrain"
    c.data.path = WIKISPEEDIA       # or a SQuAD .json, a BEIR folder, a documents .jsonl
    c.data.tasks = "ict,bfs,wlp"    # any subset, mixed uniformly; or "mlm" (transformer)
    c.data.ict_mask_rate = 0.9
    c.data.min_query_words = 5
    c.data.passage_words = 288

    model_config(c)
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 200
    c.eval.untrained = False
    return c
