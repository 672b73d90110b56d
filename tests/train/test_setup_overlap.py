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


def test_the_first_steps_train_while_the_pairs_are_still_tokenized(tmp_path, monkeypatch):
    """The run does not wait for the whole table (a million pairs took 81 s to tokenize,
    all before step 1): its first steps' batches are encoded as they are read. Here the
    tokenizing waits for step 2 to have trained; a run that waited for it would hang."""
    trained, order = threading.Event(), []
    encode_all = pipeline.pretokenized_pairs

    def tokenize_after_two_steps(*args, **kwargs):
        order.append(("waiting", trained.wait(timeout=30)))
        return encode_all(*args, **kwargs)

    def step(step, metrics):
        order.append(("step", step))
        if step == 2:
            trained.set()
    monkeypatch.setattr(pipeline, "pretokenized_pairs", tokenize_after_two_steps)
    train.train_and_evaluate(tiny(num_train_steps=3, **{"eval.index": "exact"}),
                             str(tmp_path / "run"), hooks=[step])
    assert order == [("step", 1), ("step", 2), ("waiting", True), ("step", 3)], order
