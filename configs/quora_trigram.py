"""Quora-QPR with Gillick et al.'s recipe plus Mościcki 2022's tokens: words and
character trigrams in one bag (subword features for the many test words never seen in
training) and a symmetric in-batch softmax. Same task as configs/quora_gillick.py.

  python -m dualjax.main --config=configs/quora_trigram.py --workdir=runs/quora_trigram
"""
import pathlib
import runpy

import ml_collections

_GILLICK = runpy.run_path(str(pathlib.Path(__file__).with_name("quora_gillick.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _GILLICK["get_config"]()
    c.num_train_steps = 1500        # val map@100 0.811 at step 750
    c.eval_every_steps = 750
    c.checkpoint_every_steps = 750
    c.model.tokenizer = "word+char_trigram"  # words, then the trigrams of the whole string
    c.model.trigram_vocab_size = 40000  # most frequent trigrams (besides 50k words)
    c.model.num_oov_buckets = 20000  # shared hashed buckets for unseen words and trigrams
    c.model.max_len = 96            # a question's words + trigrams (~ its length in chars)
    c.loss.symmetric = True         # also documents -> queries
    return c
