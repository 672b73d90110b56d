"""Issue 43's cases for the serving drill (`python scripts/drills/drill.py --serving`): the
processes of a multi-process index must agree, signals and dead peers in multi-process
commands, config checks before anything is written, prompts that leave room for the
text, run files trec_eval can read, files a run made checked whole, and messages. Each
is run as a user runs it and counts as in `serving_drill` (refused: exit 1, one line
naming what it should; answered: exit 0 and the right output). Cases that train are
`slow` (left out of the test suite's drill).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

from odd_input_drill import TINY, big_corpus, exit_code, main_command, shell
from serving_drill import (
    ROOT,
    Case,
    Setup,
    copy_into,
    edit_file,
    module_command,
    parse_hits,
    python_command,
)

LONG_PROMPT = ("Represent this question for retrieving the paragraphs that answer it best "
               "among all the documents of the collection taking every word into account")

# Two `dualjax.index` processes of 2 CPU devices each; then, with MODE "SIG:WHO", that
# signal to process WHO once both encode. Prints the exit codes, how many lines each
# said ("dualjax.index: ..."), whether a traceback came, and what was left beside OUT
# (a killed process 0's staging folder is reported, then removed: a rerun would).
_TWO = """
import json, os, signal, socket, subprocess, sys, time
encoder, corpus, out, mode = sys.argv[1:5]
extra = json.loads(sys.argv[5])
with socket.socket() as s:
    s.bind(("localhost", 0)); port = s.getsockname()[1]
env = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
procs = [subprocess.Popen(
    [sys.executable, "-m", "dualjax.index", "--encoder=" + encoder, "--corpus=" + corpus,
     "--out=" + out, "--kind=exact", "--batch_size=8", "--num_processes=2",
     f"--coordinator_address=localhost:{port}", f"--process_id={i}", "--peer_timeout=3",
     *extra[i]], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for i in range(2)]
parent, name = os.path.split(out)
if mode != "none":
    sig, who = mode.split(":")
    deadline = time.time() + 120
    while time.time() < deadline and not any(
            len([e for e in os.listdir(os.path.join(parent, p)) if e.startswith("shard-")]) == 2
            for p in os.listdir(parent) if p.startswith(name + ".tmp")):
        time.sleep(0.05)
    procs[int(who)].send_signal(getattr(signal, sig))
outs = [(p.wait(timeout=180), p.stdout.read()) for p in procs]
said = [[l for l in log.splitlines() if l.startswith("dualjax.index:")] for _, log in outs]
left = sorted(n for n in os.listdir(parent) if n.startswith(name))
for n in left:
    if ".tmp" in n:
        import shutil; shutil.rmtree(os.path.join(parent, n))
print("codes:", [c for c, _ in outs], "lines:", [len(s) for s in said],
      "traceback:", any("Traceback" in log for _, log in outs), "left:", left)
print(*sum(said, []), sep="\\n")
"""


def _two(s: Setup, d: str, corpus: str, mode: str = "none",
         extra: tuple[list[str], list[str]] = ([], [])) -> list[str]:
    return python_command("-c", _TWO, s.bundle, corpus, f"{d}/idx", mode, json.dumps(extra))


def _summary(stdout: str) -> dict:
    m = re.search(r"codes: (\[.*?\]) lines: (\[.*?\]) traceback: (\w+) left: (\[.*?\])",
                  stdout)
    if not m:
        return {}
    return {"codes": json.loads(m[1]), "lines": json.loads(m[2]), "traceback": m[3] == "True",
            "left": m[4]}


def _both_refused(names: str):
    """Both processes exit 1 with one line each naming `names`, nothing written."""
    def check(s: Setup, stdout: str) -> bool:
        got = _summary(stdout)
        return (got.get("codes") == [1, 1] and got["lines"] == [1, 1] and not got["traceback"]
                and got["left"] == "[]"
                and len(re.findall(names, stdout)) == 2)
    return check


def _both_stopped(codes: list[int], names: str, left: str = r"\[\]"):
    """Exit `codes`; one line from each process not killed (-9), naming `names` where it
    is another's stop; what is left beside --out matching `left`."""
    def check(s: Setup, stdout: str) -> bool:
        got = _summary(stdout)
        lines = [0 if code == -9 else 1 for code in codes]
        return (got.get("codes") == codes and got["lines"] == lines and not got["traceback"]
                and re.fullmatch(left, got["left"]) is not None
                and len(re.findall(names, stdout)) >= 1)
    return check


def _half_corpus(s: Setup, d: str) -> None:
    """The drill's corpus, and a file of its first half beside it."""
    with open(os.path.join(s.corpus, "corpus.jsonl")) as f:
        lines = f.readlines()
    with open(os.path.join(d, "half.jsonl"), "w") as f:
        f.writelines(lines[:len(lines) // 2])


def _shard_of_another_quantization(s: Setup, d: str) -> None:
    idx = copy_into(s.indexes["exact"], d, "idx")
    path = os.path.join(idx, "shard-00000-of-00001", "shard.json")

    def change(data: bytes) -> bytes:
        meta = json.loads(data)
        meta["build"] = {**meta["build"], "quantize": "int8"}
        return json.dumps(meta).encode()
    edit_file(path, change)


_PORT_TAKEN = """
import socket, subprocess, sys
with socket.socket() as s:
    s.bind(("0.0.0.0", 0)); s.listen(); port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "dualjax.index", "--encoder=" + sys.argv[1],
                          "--corpus=" + sys.argv[2], "--out=" + sys.argv[3],
                          f"--coordinator_address=localhost:{port}", "--num_processes=2",
                          "--process_id=0"], capture_output=True, text=True)
sys.stderr.write(out.stderr)
sys.exit(out.returncode)
"""

# Two `dualjax.main` processes on the tiny config; SIGTERM to process 1 while the data is
# prepared (outside training's steps: nothing to save yet, so it stops at once).
_TWO_TRAINING = """
import os, signal, socket, subprocess, sys, time
workdir = sys.argv[1]
with socket.socket() as s:
    s.bind(("localhost", 0)); port = s.getsockname()[1]
env = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
procs = [subprocess.Popen(
    [sys.executable, "-m", "dualjax.main", "--config=configs/tiny.py", "--workdir=" + workdir,
     "--config.eval.index=exact", "--config.model.similarity=cosine_temperature",
     f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists(os.path.join(workdir, "config.json")):
    time.sleep(0.02)
procs[1].send_signal(signal.SIGTERM)
outs = [(p.wait(timeout=180), p.stdout.read()) for p in procs]
said = [[l for l in log.splitlines() if l.startswith("dualjax:")] for _, log in outs]
print("codes:", [c for c, _ in outs], "lines:", [len(s) for s in said],
      "traceback:", any("Traceback" in log for _, log in outs), "left: []")
print(*sum(said, []), sep="\\n")
"""


def _spaced_beir(s: Setup, d: str) -> None:
    """The drill's BEIR folder with ids holding spaces, a query per document, train and
    test qrels."""
    beir = os.path.join(d, "beir")
    os.makedirs(os.path.join(beir, "qrels"))
    ids = [i for i in s.texts if i.startswith("d")]
    with open(os.path.join(beir, "corpus.jsonl"), "w") as f:
        f.writelines(json.dumps({"_id": f"doc {i}", "text": s.texts[i]}) + "\n" for i in ids)
    with open(os.path.join(beir, "queries.jsonl"), "w") as f:
        f.writelines(json.dumps({"_id": f"q {i}", "text": s.texts[i]}) + "\n" for i in ids)
    for split, part in (("train", ids[:40]), ("test", ids[40:])):
        with open(os.path.join(beir, "qrels", f"{split}.tsv"), "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"q {i}\tdoc {i}\t1\n" for i in part)


def _six_columns(s: Setup, stdout: str) -> bool:
    columns = re.findall(r"^columns: (.*)$", stdout, re.M)
    return exit_code(stdout) == 0 and bool(columns) and columns[0].split() == ["6"] \
        and "%20" in stdout


def _pseudo_run_cut(s: Setup, d: str) -> None:
    """A 2-step pseudo-label run from the tiny BERT on the drill's BEIR folder, then its
    pseudo_pairs.jsonl cut to its first two records."""
    run = os.path.join(d, "run")
    done = _pseudo(s, run)
    assert done.returncode == 0, done.stderr[-2000:]
    path = os.path.join(run, "pseudo_pairs.jsonl")
    with open(path) as f:
        lines = f.readlines()
    with open(path, "w") as f:
        f.writelines(lines[:2])


def _pseudo_command(s: Setup, run: str, steps: int = 2) -> list[str]:
    bert = os.path.join(ROOT, "tests", "fixtures", "pretrained", "tiny_bert")
    return module_command("main", f"--workdir={run}", *TINY, "--config.model.tower=bert",
                   "--config.model.tokenizer=hf", f"--config.model.pretrained={bert}",
                   "--config.data.name=pretrain", f"--config.data.path={s.corpus}",
                   "--config.data.tasks=pseudo", "--config.data.ignore_identical_ids=False",
                   f"--config.num_train_steps={steps}", "--config.global_batch_size=8",
                   "--config.eval.baselines=")


def _pseudo(s: Setup, run: str):
    from serving_drill import run_command
    return run_command(_pseudo_command(s, run))


def _made_again(s: Setup, stdout: str) -> bool:
    return exit_code(stdout) == 0 and "pseudo_pairs.jsonl: no end record" in stdout \
        and "the pairs are made again" in stdout


def _binary_index(s: Setup, d: str) -> None:
    from serving_drill import run_command
    done = run_command(module_command("index", f"--encoder={s.bundle}", f"--corpus={s.corpus}",
                        f"--out={d}/idx", "--kind=exact", "--quantize=binary"))
    assert done.returncode == 0, done.stderr[-2000:]


def _cosines(s: Setup, stdout: str) -> bool:
    hits = parse_hits(stdout)
    return bool(hits) and all(-1 <= h[0] <= 1 for h in hits)


def _nothing_written(names: str):
    """Refused in one line naming `names`, and no workdir made (`ls` says so)."""
    def check(s: Setup, stdout: str) -> bool:
        return exit_code(stdout) == 1 and re.search(names, stdout) is not None \
            and "workdir: absent" in stdout and "Traceback" not in stdout
    return check


def _refused_then(argv: list[str], d: str) -> list[str]:
    return shell(argv, f"test -e {shlex.quote(d)}/w && echo workdir: present || "
                     "echo workdir: absent")


def _diverged_then_corrected(s: Setup, d: str) -> list[str]:
    first = main_command(f"{d}/w", "--config.optimizer.learning_rate=1e38")
    second = main_command(f"{d}/w")
    return ["bash", "-c", f"{shlex.join(first)} > /dev/null 2>&1; {shlex.join(second)} 2>&1; "
                          "echo exit=$?"]


def _encoder_dim(s: Setup, arg: str) -> list[str]:
    return python_command("-c", "import sys, dualjax\ntry:\n dualjax.Encoder.load(sys.argv[1], "
                   f"dim={arg})\nexcept TypeError as e: sys.exit(str(e))", s.bundle)


def cases() -> list[Case]:
    big = lambda d: f"{d}/big/corpus.tsv"
    two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    return [
        # 1. processes that must agree, agree
        Case("two index processes given --quantize=binary and --quantize=int8",
             lambda s, d: _two(s, d, s.corpus, extra=(["--quantize=binary"],
                                                      ["--quantize=int8"])),
             "answered", check=_both_refused(r"different --quantize: process 0 'binary', "
                                             r"process 1 'int8'")),
        Case("two index processes given different --corpus files", lambda s, d: _two(
            s, d, s.corpus, extra=([], [f"--corpus={d}/half.jsonl"])), "answered",
             check=_both_refused(r"different --corpus: process 0 \S+corpus.jsonl \([\d,]+ "
                                 r"bytes, digest \w+\), process 1 \S+half.jsonl"),
             mutate=_half_corpus),
        Case("an index shard built with another quantization", lambda s, d: module_command(
            "search", f"--encoder={s.bundle}", f"--index={d}/idx", "--query=bike"),
             "refused", r"shard-00000-of-00001 was built with another quantize",
             mutate=_shard_of_another_quantization),
        # 2. signals and dead peers
        Case("SIGTERM to process 1 of a two-process index build", lambda s, d: _two(
            s, d, big(d), "SIGTERM:1"), "answered", check=_both_stopped(
            [143, 143], r"process 1 was stopped by SIGTERM; this process stops too"),
             mutate=big_corpus),
        Case("kill -9 of process 0 of a two-process index build", lambda s, d: _two(
            s, d, big(d), "SIGKILL:0"), "answered", check=_both_stopped(
            [-9, 1], r"process 0 stopped answering for 3 s", r"\['idx.tmp\d+'\]"),
             mutate=big_corpus),
        Case("kill -9 of process 1 of a two-process index build", lambda s, d: _two(
            s, d, big(d), "SIGKILL:1"), "answered", check=_both_stopped(
            [1, -9], r"process 1 stopped answering for 3 s"), mutate=big_corpus),
        Case("a coordinator port already in use", lambda s, d: python_command(
            "-c", _PORT_TAKEN, s.bundle, s.corpus, f"{d}/idx"), "refused",
             r"port \d+ is already in use on this host"),
        Case("index --num_processes=0", lambda s, d: module_command(
            "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}", f"--out={d}/idx",
            "--coordinator_address=localhost:1", "--num_processes=0", "--process_id=0"),
             "refused", r"--num_processes=0: give how many processes"),
        Case("index --distributed outside a cluster", lambda s, d: module_command(
            "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}", f"--out={d}/idx",
            "--distributed"), "refused", r"--distributed: no cluster found"),
        Case("SIGTERM to one of two training processes while the data is prepared",
             lambda s, d: python_command("-c", _TWO_TRAINING, f"{d}/w"), "answered",
             check=_both_stopped([143, 143], r"process 1 was stopped by SIGTERM"), slow=True),
        # 3. config checks before anything is written
        Case("loss.matryoshka_dims=32 on a 16-wide model", lambda s, d: _refused_then(
            main_command(f"{d}/w", "--config.loss.matryoshka_dims=32"), d), "answered",
             check=_nothing_written(r"config.loss.matryoshka_dims='32': 32 is not below the "
                                    r"model's 16 dimensions")),
        Case("eval.dims=32 on a 16-wide model", lambda s, d: _refused_then(
            main_command(f"{d}/w", "--config.eval.dims=32"), d), "answered",
             check=_nothing_written(r"config.eval.dims='32': 32 is not below")),
        Case("mesh.model_axis that splits no transformer head", lambda s, d: _refused_then(
            main_command(f"{d}/w", "--config.model.tower=transformer", "--config.mesh.model_axis=2",
                  "--config.model.transformer.num_heads=3",
                  "--config.model.transformer.width=48"), d), "answered",
             check=_nothing_written(r"model_axis=2 does not divide the 3 heads of params/"),
             env=two_devices),
        Case("a run that diverged before its first checkpoint, corrected", lambda s, d:
             _diverged_then_corrected(s, d), "answered",
             check=lambda s, out: exit_code(out) == 0 and "starts over with the new config" in out,
             slow=True),
        # 4. prompts that leave room
        Case("a 23-word query prompt at max_len 16", lambda s, d: _refused_then(
            main_command(f"{d}/w", f"--config.model.query_prompt={LONG_PROMPT}"), d), "answered",
             check=_nothing_written(r"config.model.query_prompt=.* takes \d+ of the side's 16 "
                                    r"tokens")),
        # 5. run files trec_eval reads
        Case("BEIR ids with spaces: run files of six columns", lambda s, d: shell(
            main_command(f"{d}/w", "--config.data.name=beir", f"--config.data.path={d}/beir",
                  "--config.num_train_steps=5"),
            f"echo columns: $(cat {shlex.quote(d)}/w/runs/*.trec | awk '{{print NF}}' | "
            f"sort -u); head -1 {shlex.quote(d)}/w/runs/test_dual_encoder.trec"),
             "answered", check=_six_columns, mutate=_spaced_beir, slow=True),
        # 6. files a run made, checked whole
        Case("pseudo_pairs.jsonl cut short, then resumed", lambda s, d: shell(
            _pseudo_command(s, f"{d}/run", 3)), "answered", check=_made_again,
             mutate=_pseudo_run_cut, slow=True),
        # 7. messages
        Case("search --hybrid_weight=0.3 without --hybrid", lambda s, d: module_command(
            "search", f"--encoder={s.bundle}", f"--index={s.indexes['exact']}",
            "--query=bike", "--hybrid_weight=0.3"), "refused", r"give --hybrid too"),
        Case("export --workdir=<a bundle>", lambda s, d: module_command(
            "export", f"--workdir={s.bundle}", f"--out={d}/b"), "refused",
             r"is a bundle, not a training workdir"),
        Case("export --format=sentence-transformers --platforms=cpu", lambda s, d: module_command(
            "export", f"--workdir={s.workdir}", f"--out={d}/b",
            "--format=sentence-transformers", "--platforms=cpu"), "refused",
             r"--platforms is for --format=bundle"),
        *[Case(f"Encoder.load(dim={arg})", lambda s, d, arg=arg: _encoder_dim(s, arg),
               "refused", rf"dim={re.escape(shown)}: give the number of dimensions as an int")
          for arg, shown in (('"8"', "'8'"), ("True", "True"))],
        Case("search over a binary index prints cosines", lambda s, d: module_command(
            "search", f"--encoder={s.bundle}", f"--index={d}/idx", "--query=bike", "--k=5"),
             "answered", check=_cosines, mutate=_binary_index),
    ]


if __name__ == "__main__":  # (run through scripts/drills/drill.py --serving)
    sys.exit("run: python scripts/drills/drill.py --serving --out=DIR [--only=RE]")
