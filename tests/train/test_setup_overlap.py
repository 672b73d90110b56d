"""A run's setup overlaps: its training pairs are tokenized in a thread while its model
is built and its start loaded (`loop._train_and_evaluate`), once, and the training
iterator gathers its batches from that table."""

import threading

from helpers import tiny

from dualjax.data import pipeline
from dualjax.train import loop as train


def test_the_training_pairs_are_tokenized_once_beside_the_models_build(tmp_path,
                                                                       monkeypatch):
    started, threads = threading.Event(), []
    encode_all, build = pipeline.pretokenized_pairs, train._build

    def tokenize(*args, **kwargs):
        threads.append(threading.current_thread().name)
        started.set()
        return encode_all(*args, **kwargs)

    def build_when_tokenizing(*args, **kwargs):
        assert started.wait(timeout=60), "the pairs were not being tokenized during the build"
        return build(*args, **kwargs)

    monkeypatch.setattr(pipeline, "pretokenized_pairs", tokenize)
    monkeypatch.setattr(train, "_build", build_when_tokenizing)
    train.train_and_evaluate(tiny(num_train_steps=2, **{"eval.index": "exact"}),
                             str(tmp_path / "run"))
    assert threads == ["tokenize pairs"]  # once, in its thread: the iterator reused it
