"""Gillick et al. 2018 on our Quora data: question-question retrieval (Quora-QPR).

Positive pairs are joined into clusters by transitive closure and split by cluster
(train 85% / val 5% / test 10%); each test question is a query whose relevant items are
the other members of its cluster, and every question of the dataset (137,851) is a
candidate. The model is theirs: averaged word embeddings (bow, 300-d, one tower shared
by both sides), cosine with a learned scale and bias, in-batch softmax, SGD with
momentum at lr 0.01, batch 1000.

  python -m dualjax.main --config=configs/quora_gillick.py --workdir=runs/quora_gillick

Reads ../shared/data/quora/pairs.tsv from the project root (override with
--config.data.path=...). The original: "First Quora Dataset Release: Question Pairs".
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 3000        # ~27 epochs of the 112k training pairs; val map@100 is
                                    # flat after ~1000 steps (0.775, 0.779, 0.778)
    c.global_batch_size = 1000      # Gillick et al.: batch 1000 (999 in-batch negatives)
    c.checkpoint_every_steps = 1000
    c.eval_every_steps = 1000       # val split (candidates: every question)
    c.log_every_steps = 200

    c.data.name = "quora"           # ../shared/data/quora/pairs.tsv unless data.path is set
    c.data.candidates = "all"       # every question of the dataset is a candidate
    c.data.val_fraction = 0.05      # of clusters
    c.data.test_fraction = 0.1      # of clusters

    c.model.vocab_size = 50000      # most frequent training words
    c.model.num_oov_buckets = 10000  # hashed buckets for the rest
    c.model.max_len = 40            # words per question (longer ones are truncated)
    c.model.tower = "bow"           # mean of word embeddings
    c.model.embed_dim = 300         # Gillick et al.: 300-d
    c.model.embed_init_std = 0.01   # TF-style small init (glorot on [V, 300] is ~0.007): with
                                    # SGD at lr 0.01, N(0, 1) embeddings barely move
    c.model.shared_towers = True    # one encoder for questions on both sides
    c.model.similarity = "cosine_affine"  # alpha * cos + beta, both learned
    c.model.init_scale = 10.0

    c.optimizer.name = "sgd"        # Gillick et al.: SGD with momentum, lr 0.01
    c.optimizer.learning_rate = 0.01
    c.optimizer.momentum = 0.9

    c.eval.batch_size = 2048
    c.eval.query_chunk = 512
    c.eval.corpus_chunk = 16384
    return c
