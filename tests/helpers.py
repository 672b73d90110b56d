"""Test data and helpers shared by test modules of several stage folders (a test module
imports them from here, never from another test module)."""
import json
import os
import signal
import socket

import numpy as np
from conftest import load_config

# Three articles in the Wikispeedia layout. Sentences are long enough to be queries
# (>= 5 words) except "Short caption here." (3 words).
ARTICLES = [
    {"id": "Moon", "title": "Moon", "links": ["Earth"], "paragraphs": [
        {"section": None, "text": "Short caption here."},
        {"section": None, "text": "The Moon is the only natural satellite of Earth. "
                                  "It orbits the planet once every month or so."},
        {"section": "Orbit", "text": "The orbit of the Moon is slightly elliptical in shape. "
                                     "Its distance from the planet varies over time."},
        {"section": "Tides", "text": "Tides on Earth are mostly raised by the Moon today."},
    ]},
    {"id": "Earth", "title": "Earth", "links": ["Moon", "Sun"], "paragraphs": [
        {"section": None, "text": "Earth is the third planet from the Sun in the system. "
                                  "It is the only world known to harbour life so far."},
        {"section": "Life", "text": "Life appeared on the planet about four billion years ago. "
                                    "Oceans cover most of its rocky surface today."},
    ]},
    {"id": "Sun", "title": "Sun", "links": [], "paragraphs": [
        {"section": None, "text": "The Sun is the star at the centre of the system. "
                                  "It is a nearly perfect ball of hot plasma gas."},
    ]},
]


WORDS = "bike car rice swim python guitar garden train river bread coffee paint".split()


def write_corpus(path, n):
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(n):
            words = rng.choice(WORDS, size=int(rng.integers(2, 30)))
            f.write(f"d{i}\thow do i {' '.join(words)}\n" if i % 97 else "\n")  # blank lines
    return path


def free_port() -> int:
    """A port nothing listens on, for the coordinator."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def tiny(**overrides):
    cfg = load_config("tiny")
    cfg.eval.untrained = False
    cfg.eval.baselines = ""
    cfg.update_from_flattened_dict(overrides)
    return cfg


def train_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "train"]


def preempt_at(stop: int, sig: int = signal.SIGTERM):
    """A hook that sends this process `sig` after step `stop` (SIGTERM: a TPU VM
    preemption; SIGINT: Ctrl-C)."""
    def hook(step, _):
        if step == stop:
            os.kill(os.getpid(), sig)
    return hook


# A BEIR folder (tests/data/test_beir.py reads it; serve/test_search.py searches it).
CORPUS = [
    {"_id": "d1", "title": "Jax", "text": "Jax is a library."},
    {"_id": "d2", "title": "", "text": "Flax builds on jax."},
    {"_id": "q3", "text": "How do I learn jax?"},  # no title; the id of query q3
    {"_id": "d4", "title": None, "text": "Optax has optimizers.", "metadata": {"url": "x"}},
    {"_id": "d5", "title": "Orbax", "text": "Checkpoints."},
]
QUERIES = [
    {"_id": "q1", "text": "what is jax"},
    {"_id": "q2", "text": "what is flax", "metadata": {}},
    {"_id": "q3", "text": "How do I learn jax?"},
    {"_id": "q4", "text": "unjudged query"},
    {"_id": "q5", "text": "train query"},
]
HEADER = "query-id\tcorpus-id\tscore\n"
FILES = {
    "corpus.jsonl": "".join(json.dumps(d) + "\n" for d in CORPUS),
    "queries.jsonl": "".join(json.dumps(q) + "\n" for q in QUERIES),
    # Lines 2..7: q3's own document is judged relevant (kept in the qrels, as BEIR does).
    "qrels/test.tsv": HEADER + "q2\td2\t1\nq1\td1\t2\nq1\td4\t0\nq3\tq3\t1\nq3\td1\t1\nq1\td5\t1\n",
    # q3 has only itself; q4 only a 0 score, so it is skipped.
    "qrels/dev.tsv": HEADER + "q3\tq3\t1\nq4\td4\t0\nq1\td2\t1\n",
    "qrels/train.tsv": HEADER + "q5\td5\t1\nq5\td1\t0\nq2\td2\t1\n",
}
EXPECTED_CORPUS = ["Jax. Jax is a library.", "Flax builds on jax.", "How do I learn jax?",
                   "Optax has optimizers.", "Orbax. Checkpoints."]


def _folder(tmp_path, changes: dict | None = None) -> str:
    """A BEIR folder of FILES with `changes` (path: content, or None to leave
    the file out)."""
    files = {**FILES, **(changes or {})}
    for name, content in files.items():
        if content is None:
            continue
        path = tmp_path / "beir" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode("utf-8")
        path.write_bytes(content)
    return str(tmp_path / "beir")
