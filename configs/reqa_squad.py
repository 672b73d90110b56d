"""ReQA on SQuAD v1.1 (Ahmad et al. 2019; the evaluation of Chang et al. 2020).

Each question must retrieve the sentence that holds its answer among every (sentence,
paragraph) candidate of the dataset. SQuAD's articles are split into train/val/test
(80/10/10, seeded); training pairs are (question, answer sentence) from the training
articles. Tower: bow_mlp (mean of embeddings + 2-layer tanh MLP, Chang et al.'s BoW-MLP),
in-batch softmax, Adam with linear warmup and decay.

  python -m dualjax.main --config=configs/reqa_squad.py --workdir=runs/reqa_squad

Reads ../shared/data/squad/dev-v1.1.json from the project root (override with
--config.data.path=...). The original: SQuAD v1.1 (rajpurkar.github.io/SQuAD-explorer).
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 3000
    c.global_batch_size = 256       # ~8.3k training questions: ~90 epochs
    c.checkpoint_every_steps = 1000
    c.eval_every_steps = 1000

    c.data.name = "reqa_squad"      # ../shared/data/squad/dev-v1.1.json unless data.path is set
    c.data.candidates = "all"       # every sentence of every article is a candidate (ReQA)
    c.data.val_fraction = 0.1       # of articles
    c.data.test_fraction = 0.1      # of articles
    c.data.candidate_context = False  # candidate text = the sentence alone

    c.model.vocab_size = 30000
    c.model.num_oov_buckets = 5000
    c.model.max_len = 64            # Chang et al.: 64 query tokens ...
    c.model.query_max_len = 64
    c.model.doc_max_len = 288       # ... and 288 document tokens (a sentence with its
                                    # paragraph, data.candidate_context=True, needs them)
    c.model.tower = "bow_mlp"
    c.model.embed_dim = 256
    c.model.hidden_dim = 512
    c.model.output_dim = 256
    c.model.shared_towers = True    # one tower: with ~8k training questions, two towers
                                    # never learn to match the words of unseen articles
                                    # (val map@100 0.008 after 1,000 steps, one tower: 0.27)

    c.optimizer.name = "adamw"      # Chang et al.: Adam, warmup then linear decay
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 200
    return c
