"""A seconds-long run for tests: small data, small model, few steps."""
import pathlib
import runpy

import ml_collections

# Loaded by path so this file works from any working directory.
_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 20          # a handful of steps
    c.global_batch_size = 32        # divisible by 8 fake test devices
    c.checkpoint_every_steps = 10   # two saves in a run
    c.keep_checkpoints = 3          # keep them all
    c.eval_every_steps = 0          # only the final evaluation
    c.log_every_steps = 5
    c.data.num_train_clusters = 150  # a few hundred pairs
    c.data.num_val_clusters = 20
    c.data.num_test_clusters = 30
    c.model.vocab_size = 500        # small vocabulary and model
    c.model.num_oov_buckets = 50
    c.model.max_len = 16
    c.model.embed_dim = 16
    c.model.hidden_dim = 32
    c.model.output_dim = 16
    c.eval.batch_size = 512         # each split's queries (or corpus) in one batch, padded
                                    # to 128 rows: one encoder compile per length, not per
                                    # batch (the tests' runs are mostly compiling)
    c.eval.query_chunk = 32
    c.eval.corpus_chunk = 64
    return c
