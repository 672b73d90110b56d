"""Issue 30's cases for the serving drill (`python scripts/drills/drill.py --serving`): text in
every script, a metric's cutoff, data changed under a workdir, folders that are not a
run's, every file of an index, races and signals, one-line errors, and the smaller
items. Each is run as a user runs it, a new process per case, and counts as in
`serving_drill` (refused: exit 1, one line naming what it should; answered: exit 0 and
the right output). Cases that train are `slow` (left out of the test suite's drill).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys

from serving_drill import (
    ROOT,
    Case,
    Setup,
    copy_into,
    edit_file,
    module_command,
    parse_hits,
    python_command,
    run_command,
)

SCRIPTS = {"zh": "北京大学的图书馆很大", "ar": "مكتبة الجامعة كبيرة جدا",
           "ru": "Библиотека университета очень большая", "el": "Η βιβλιοθήκη είναι μεγάλη",
           "hi": "विश्वविद्यालय का पुस्तकालय बहुत बड़ा है", "en": "how do i fix my bike"}
NO_TOKEN = {"e1": "🙂🎉", "e2": "?!", "e3": "👍 ..."}
TINY = ("--config=configs/tiny.py", "--config.eval.index=exact")


def shell(argv: list[str], then: str = "") -> list[str]:
    """`argv` run by bash with stderr into stdout (the check reads both), then `then`."""
    return ["bash", "-c", f"{shlex.join(argv)} 2>&1; echo exit=$?{'; ' + then if then else ''}"]


def exit_code(stdout: str) -> int:
    found = re.findall(r"^exit=(\d+)$", stdout, re.M)
    return int(found[0]) if found else -1


def main_command(workdir: str, *flags: str) -> list[str]:
    return module_command("main", f"--workdir={workdir}", *TINY, *flags)


# ----------------------------------------------------------------------------- class 1
def _scripts_index(s: Setup, d: str) -> None:
    """A BEIR folder of the six scripts and three texts without a letter, indexed."""
    rows = [{"_id": k, "text": t} for k, t in {**SCRIPTS, **NO_TOKEN}.items()]
    os.makedirs(os.path.join(d, "beir"))
    with open(os.path.join(d, "beir", "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    done = run_command(module_command("index", f"--encoder={s.bundle}", f"--corpus={d}/beir",
                        f"--out={d}/idx", "--kind=exact"))
    assert done.returncode == 0, done.stderr[-2000:]


def _each_script_first(s: Setup, stdout: str) -> bool:
    firsts = [h[1] for h in parse_hits(stdout)]
    return firsts == list(SCRIPTS)


def _nothing_for_no_token(s: Setup, stdout: str) -> bool:
    return not parse_hits(stdout) and stdout.count("nothing to search for") == 2


def _pairs(lines: list[str]):
    def mutate(s: Setup, d: str) -> None:
        with open(os.path.join(d, "pairs.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return mutate


_THINGS = [("自行车", "修理"), ("دراجة", "إصلاح"), ("велосипед", "ремонт"),
           ("ποδήλατο", "επισκευή"), ("साइकिल", "मरम्मत"), ("bicycle", "repair")]
SCRIPT_PAIRS = [f"{a} {b} {i}?\t{b} {a} {i}" for i in range(12) for a, b in _THINGS]


def _vocab_has_scripts(s: Setup, stdout: str) -> bool:
    vocab = re.findall(r"^vocab: (.*)$", stdout, re.M)
    return exit_code(stdout) == 0 and bool(vocab) and \
        {"自", "велосипед", "साइकिल", "ποδηλατο", "دراجة"} <= set(vocab[0].split())


# ----------------------------------------------------------------------------- class 3-6
def _rewritten_under_its_workdir(s: Setup, d: str) -> None:
    """A run of 5 steps on a pairs file, then the file rewritten with other words."""
    _pairs(SCRIPT_PAIRS)(s, d)
    done = run_command(main_command(
        f"{d}/w", "--config.data.name=pairs", f"--config.data.path={d}/pairs.tsv",
        "--config.data.test_fraction=0.2", "--config.num_train_steps=5"))
    assert done.returncode == 0, done.stderr[-2000:]
    _pairs([f"how do i fix my {w} {i}?\thow can i repair my {w} {i}"
            for i in range(12) for w in ("lamp", "door", "sink")])(s, d)


def _index_in_a_bundle_copy(s: Setup, d: str) -> None:
    """A copy of the bundle with an index folder put inside it by hand."""
    bundle = copy_into(s.bundle, d, "bundle")
    shutil.copytree(s.indexes["exact"], os.path.join(bundle, "idx"))


def _cut_weights(s: Setup, d: str) -> None:
    bert = os.path.join(d, "bert")
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "pretrained", "tiny_bert"), bert)
    edit_file(os.path.join(bert, "model.safetensors"), lambda b: b[:len(b) // 2])



def _foreign_workdir(s: Setup, d: str) -> None:
    os.makedirs(os.path.join(d, "mine"))
    for name, text in (("config.json", '{"lr": 3}\n'), ("metrics.jsonl", '{"acc": 1}\n')):
        with open(os.path.join(d, "mine", name), "w") as f:
            f.write(text)


def _scann_file_changed(s: Setup, d: str) -> None:
    idx = copy_into(s.indexes["scann"], d, "idx")
    searcher = [os.path.join(base, n) for base, _, names in os.walk(idx) for n in names
                if n.endswith(".npy") and base != idx]
    with open(sorted(searcher)[0], "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x01\x02\x03\x04")


def _dead_writer_left(s: Setup, d: str) -> None:
    os.makedirs(os.path.join(d, "idx.tmp999999"))
    with open(os.path.join(d, "idx.tmp999999", "embeddings.npy"), "wb") as f:
        f.write(b"\0" * 1_000_000)


_RACE = """
import subprocess, sys
cmd = [sys.executable, "-m", "dualjax.index", "--encoder=" + sys.argv[1],
       "--corpus=" + sys.argv[2], "--out=" + sys.argv[3], "--kind=exact"]
runs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
done = [(r.wait(), r.communicate()[1]) for r in runs]
said = [[l for l in err.splitlines() if l.startswith("dualjax.index:")] for _, err in done]
print("codes:", sorted(code for code, _ in done), "lines:", sorted(map(len, said)))
print(*sum(said, []), sep="\\n")
"""


def _one_refused(s: Setup, stdout: str) -> bool:
    """One run builds, the other is refused in one line: by the first's lock while it
    builds ("in use"), or, when the first has finished before the second looks (a quiet
    machine, a small corpus), by the index it left ("already holds a corpus index")."""
    return "codes: [0, 1] lines: [0, 1]" in stdout and (
        "in use" in stdout or "already holds a corpus index" in stdout)


_INTERRUPT = """
import os, re, signal, subprocess, sys, time
cmd = [sys.executable, "-m", "dualjax.index", "--encoder=" + sys.argv[1],
       "--corpus=" + sys.argv[2], "--out=" + sys.argv[3], "--kind=exact"]
run = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
time.sleep(float(sys.argv[4]))
run.send_signal(signal.SIGINT)
code, err = run.wait(), run.communicate()[1]
lines = [l for l in err.splitlines() if l.strip() and not re.match(r"[IWEF]\\d{4} ", l)]
left = [n for n in os.listdir(os.path.dirname(sys.argv[3])) if n != "big"]
print(f"code: {code} lines: {len(lines)} traceback: {'Traceback' in err} left: {left}")
print(*lines, sep="\\n")
"""


def big_corpus(s: Setup, d: str) -> None:
    """400,000 short documents: an index build of several seconds, to be stopped."""
    os.makedirs(os.path.join(d, "big"))
    with open(os.path.join(d, "big", "corpus.tsv"), "w") as f:
        f.writelines(f"d{i}\thow do i fix my bike number {i}\n" for i in range(400_000))


def _stopped_in_one_line(s: Setup, stdout: str) -> bool:
    return "code: 130 lines: 1 traceback: False left: []" in stdout


def _torn_metrics(s: Setup, d: str) -> None:
    run = copy_into(s.workdir, d, "run")
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 40, "split": "te')


def _cut_back(s: Setup, stdout: str) -> bool:
    return exit_code(stdout) == 0 and "torn" in stdout and "Traceback" not in stdout


# ----------------------------------------------------------------------------- class 9
def _below_checkpoint(s: Setup, d: str) -> None:
    copy_into(s.workdir, d, "run")


def _says_the_step(s: Setup, stdout: str) -> bool:
    return exit_code(stdout) == 0 and re.search(r"checkpoint.*step \d+", stdout) is not None


def _beir_with_training(s: Setup, d: str) -> None:
    """The drill's BEIR folder with a query per document and a train split."""
    beir = copy_into(s.corpus, d, "beir")
    ids = [i for i in s.texts if i.startswith("d")]
    with open(os.path.join(beir, "queries.jsonl"), "w") as f:
        f.writelines(json.dumps({"_id": f"q{i}", "text": s.texts[i]}) + "\n" for i in ids)
    for split, part in (("train", ids[:40]), ("test", ids[40:])):
        with open(os.path.join(beir, "qrels", f"{split}.tsv"), "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"q{i}\t{i}\t1\n" for i in part)


def _beir_ids(s: Setup, stdout: str) -> bool:
    hits = parse_hits(stdout)
    return bool(hits) and all(re.fullmatch(r"d\d+|huge", h[1]) for h in hits)


def _encode(s: Setup, arg: str) -> list[str]:
    return python_command("-c", "import sys, dualjax\ntry:\n dualjax.Encoder.load(sys.argv[1])"
                   f".encode_queries({arg})\nexcept TypeError as e: sys.exit(str(e))", s.bundle)


def cases() -> list[Case]:
    scripts_query = [f"--query={t}" for t in SCRIPTS.values()]
    return [
        # 1. text in every script
        Case("a corpus in six scripts: each verbatim query finds its document", lambda s, d:
             module_command("search", f"--encoder={s.bundle}", f"--index={d}/idx", "--k=1",
                     *scripts_query), "answered", check=_each_script_first,
             mutate=_scripts_index),
        Case("'?!' and emoji queries: nothing to search for (no shared vector)", lambda s, d:
             module_command("search", f"--encoder={s.bundle}", f"--index={d}/idx", "--query=?!",
                     "--query=🙂"), "answered", check=_nothing_for_no_token,
             mutate=_scripts_index),
        Case("pairs in six scripts, with digits, train", lambda s, d: shell(
            main_command(f"{d}/w", "--config.data.name=pairs", f"--config.data.path={d}/pairs.tsv",
                  "--config.data.test_fraction=0.2", "--config.num_train_steps=5"),
            f"{shlex.quote(sys.executable)} -c \"import json; print('vocab:', "
            f"*json.load(open('{d}/w/vocab.json'))['vocab'])\""), "answered",
             check=_vocab_has_scripts, mutate=_pairs(SCRIPT_PAIRS), slow=True),
        Case("a pair whose document is emoji only", lambda s, d: main_command(
            f"{d}/w", "--config.data.name=pairs", f"--config.data.path={d}/pairs.tsv"),
             "refused", r"pairs\.tsv:3: document has no letter or digit",
             mutate=_pairs(SCRIPT_PAIRS[:2] + ["什么\t🙂🎉"]), slow=True),
        # 2. a metric's cutoff
        Case("--config.eval.top_k=5 (below recall@100's cutoff)", lambda s, d: main_command(
            f"{d}/w", "--config.eval.top_k=5"), "refused", "eval.top_k", slow=True),
        # 3. data changed under a workdir
        Case("a pairs file rewritten under its workdir, then more steps", lambda s, d: main_command(
            f"{d}/w", "--config.data.name=pairs", f"--config.data.path={d}/pairs.tsv",
            "--config.data.test_fraction=0.2", "--config.num_train_steps=10"), "refused",
             r"pairs\.tsv \(data\.path\) changed .*--config\.data\.rebuild=True",
             mutate=_rewritten_under_its_workdir, slow=True),
        # 4. a folder that is not a workdir; outputs inside each other
        Case("index --out=<a folder inside its bundle>", lambda s, d: module_command(
            "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}",
            f"--out={s.bundle}/idx"), "refused", "inside the bundle"),
        Case("export --overwrite of a bundle holding an index", lambda s, d: module_command(
            "export", f"--workdir={s.workdir}", f"--out={d}/bundle", "--overwrite"),
             "refused", r"holds idx/.*not the bundle's", mutate=_index_in_a_bundle_copy),
        Case("--workdir holding a user's config.json and metrics.jsonl", lambda s, d: main_command(
            f"{d}/mine"), "refused", "not a dualjax run's", mutate=_foreign_workdir, slow=True),
        # 5. every file of an index
        Case("a file of the ScaNN searcher changed in place", lambda s, d: module_command(
            "search", f"--encoder={s.bundle}", f"--index={d}/idx", "--query=bike"),
             "refused", r"idx/.*: changed since the index was written",
             mutate=_scann_file_changed),
        # 6. races and signals
        Case("two index runs into one new --out at once", lambda s, d: python_command(
            "-c", _RACE, s.bundle, s.corpus, f"{d}/idx"), "answered", check=_one_refused),
        Case("what a killed index run left (OUT.tmpPID) is removed", lambda s, d: shell(
            module_command("index", f"--encoder={s.bundle}", f"--corpus={s.corpus}",
                    f"--out={d}/idx", "--kind=exact"),
            f"echo left: $(ls {shlex.quote(d)})"), "answered",
             check=lambda s, out: exit_code(out) == 0 and "\nleft: idx\n" in out,
             mutate=_dead_writer_left),
        Case("Ctrl-C during an index build", lambda s, d: python_command(
            "-c", _INTERRUPT, s.bundle, f"{d}/big/corpus.tsv", f"{d}/idx", "6"), "answered",
             check=_stopped_in_one_line, mutate=big_corpus),
        Case("a torn last line of metrics.jsonl, then the run again", lambda s, d: shell(
            main_command(f"{d}/run")), "answered", check=_cut_back, mutate=_torn_metrics,
             slow=True),
        # 7. one line, not a traceback
        *[Case(f"Encoder.encode_queries({arg})", lambda s, d, arg=arg: _encode(s, arg),
               "refused", names)
          for arg, names in (("[1, 2]", "text 0 is int 1, not str"),
                             ("[b'x']", "text 0 is bytes b'x', not str"),
                             ("None", "not NoneType"))],
        Case("model.pretrained=<a BERT folder whose model.safetensors is cut short>",
             lambda s, d: main_command(f"{d}/w", f"--config.model.pretrained={d}/bert",
                                "--config.model.tower=bert", "--config.model.tokenizer=hf"),
             "refused", r"bert/model\.safetensors: not a whole safetensors file",
             mutate=_cut_weights, slow=True),
        # 9. the smaller items
        Case("search --workdir --task=nope on a one-task run", lambda s, d: module_command(
            "search", f"--workdir={s.workdir}", "--task=nope", "--query=bike"), "refused",
             "single task"),
        Case("num_train_steps below the checkpoint's step", lambda s, d: shell(
            main_command(f"{d}/run", "--config.num_train_steps=5")), "answered",
             check=_says_the_step, mutate=_below_checkpoint, slow=True),
        Case("search --workdir on a BEIR run prints the corpus ids", lambda s, d: shell(
            main_command(f"{d}/w", "--config.data.name=beir", f"--config.data.path={d}/beir",
                  "--config.num_train_steps=5"),
            shlex.join(module_command("search", f"--workdir={d}/w", "--query=bike", "--k=3"))),
             "answered", check=_beir_ids, mutate=_beir_with_training, slow=True),
    ]
