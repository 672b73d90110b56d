"""The serving drill (`python scripts/drills/drill.py --serving`): a fresh export and index of a
trained tiny run, then every case of issue 21 run as a user would run it, each reported
as refused in one line or answered correctly.

A refusal counts when the command exits 1 with exactly one line on stderr besides the
log (no traceback) and that line names what it should (a file, a flag). An answer counts
when the command exits 0 and its output is right (the verbatim text first, as many hits
as asked, ...). After every case, the drill checks that no input lost a file or changed
(the workdir, the bundle, the corpus, the indexes) and that no `.tmp` or `.old` folder
was left behind.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent import futures

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
WORDS = ("bike car rice bread engine wheel oven pasta chain brake tyre flour garden "
         "window paint roof").split()
BIG = 1_000_000  # characters of the drill's one huge document


def corpus_rows() -> list[dict]:
    """60 short documents, one empty and one of a million characters."""
    rng = np.random.default_rng(0)
    rows = [{"_id": f"d{i}", "text": "how do i " + " ".join(rng.choice(WORDS, 4))}
            for i in range(60)]
    rows.append({"_id": "empty", "text": "   "})
    rows.append({"_id": "huge", "text": ("garden window " * (BIG // 14 + 1))[:BIG]})
    return rows


def write_corpus(folder: str, rows: list[dict]) -> str:
    """`rows` as a BEIR folder (with one query and its qrels): `folder`."""
    os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
    with open(os.path.join(folder, "corpus.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(folder, "queries.jsonl"), "w") as f:
        f.write(json.dumps({"_id": "q0", "text": rows[0]["text"]}) + "\n")
    with open(os.path.join(folder, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    return folder


@dataclasses.dataclass
class Setup:
    out: str
    workdir: str
    bundle: str
    corpus: str                   # a BEIR folder: corpus.jsonl + queries.jsonl + qrels/
    indexes: dict[str, str]       # kind -> folder
    texts: dict[str, str]         # id -> text of the corpus


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


def module_command(name: str, *args: str) -> list[str]:
    return python_command("-m", f"dualjax.{name}", *args)


def run_command(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def prepare(out: str, workdir: str | None = None, bundle: str | None = None,
            kinds: tuple[str, ...] = ("exact", "scann", "hnsw")) -> Setup:
    """A trained tiny workdir (or `workdir`), its bundle (or `bundle`), the drill's corpus
    as a BEIR folder and one index of each kind (hnsw only with faiss)."""
    os.makedirs(out, exist_ok=True)
    if workdir is None:
        workdir = os.path.join(out, "run")
        done = run_command(module_command("main", "--config=configs/tiny.py",
                                          f"--workdir={workdir}", "--config.eval.index=exact"))
        assert done.returncode == 0, done.stderr[-2000:]
    if bundle is None:
        bundle = os.path.join(out, "bundle")
        done = run_command(module_command("export", f"--workdir={workdir}", f"--out={bundle}",
                            "--platforms=cpu"))
        assert done.returncode == 0, done.stderr[-2000:]
    rows = corpus_rows()
    corpus = write_corpus(os.path.join(out, "beir"), rows)
    try:
        import faiss  # noqa: F401  (only to know whether it is there)
    except ImportError:
        kinds = tuple(k for k in kinds if k != "hnsw")
    indexes = {}
    jobs = {}
    with futures.ThreadPoolExecutor(len(kinds)) as pool:
        for kind in kinds:
            indexes[kind] = os.path.join(out, f"index_{kind}")
            jobs[kind] = pool.submit(run_command, module_command(
                "index", f"--encoder={bundle}", f"--corpus={corpus}",
                f"--out={indexes[kind]}", f"--kind={kind}"))
    for _kind, job in jobs.items():
        assert job.result().returncode == 0, job.result().stderr[-2000:]
    return Setup(out, workdir, bundle, corpus, indexes, {r["_id"]: r["text"] for r in rows})


@dataclasses.dataclass
class Case:
    name: str                     # what the issue calls it
    command: Callable[[Setup, str], list[str]]  # (setup, the case's own folder) -> argv
    expect: str                   # "refused": one line naming `names`; "answered": `check`
    names: str = ""               # a regex the refusal must match
    check: Callable[[Setup, str], bool] | None = None  # (setup, stdout) -> right answer
    mutate: Callable[[Setup, str], None] | None = None  # breaks copies in the case folder
    env: dict | None = None
    slow: bool = False            # starts training: left out of the test suite's drill


def copy_into(src: str, case_dir: str, name: str) -> str:
    dst = os.path.join(case_dir, name)
    shutil.copytree(src, dst)
    return dst


def edit_file(path: str, change: Callable[[bytes], bytes]) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(change(data))


SHARD = "shard-00000-of-00001"  # a one-process index's one shard (corpus.jsonl, ...)


def _broken_index(file: str, change: Callable[[bytes], bytes]):
    def mutate(s: Setup, case_dir: str) -> None:
        where = file if file == "index.json" else os.path.join(SHARD, file)
        edit_file(os.path.join(copy_into(s.indexes["exact"], case_dir, "idx"), where), change)
    return mutate


def _broken_bundle(file: str, change: Callable[[bytes], bytes]):
    def mutate(s: Setup, case_dir: str) -> None:
        edit_file(os.path.join(copy_into(s.bundle, case_dir, "bundle"), file), change)
    return mutate


def _json_without(key: str) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        meta = json.loads(data)
        del meta[key]
        return json.dumps(meta).encode()
    return change


def _swap_two_words(data: bytes) -> bytes:
    vocab = json.loads(data)
    words = vocab["vocab"]
    words[5], words[6] = words[6], words[5]
    return json.dumps(vocab).encode()


def _reorder_rows(data: bytes) -> bytes:
    import io
    rows = np.load(io.BytesIO(data))
    buf = io.BytesIO()
    np.save(buf, rows[::-1].copy())
    return buf.getvalue()


def _search(s: Setup, kind: str = "exact", *args: str, case_dir: str | None = None,
            encoder: str | None = None) -> list[str]:
    idx = os.path.join(case_dir, "idx") if case_dir else s.indexes[kind]
    return module_command("search", f"--encoder={encoder or s.bundle}", f"--index={idx}", *args)


def parse_hits(stdout: str) -> list[tuple[float, str, str]]:
    """(score, id, text) of every printed hit."""
    return [(float(m[1]), m[2], m[3]) for m in
            re.finditer(r"^\s*\d+\. ([+-]\d\.\d+)  \[([^\]]*)\]  (.*)$", stdout, re.M)]


def _verbatim_first(s: Setup, stdout: str) -> bool:
    hits = parse_hits(stdout)
    return bool(hits) and hits[0][1] == "d3" and abs(hits[0][0] - 1) < 1e-3


def _all_but_empty(s: Setup, stdout: str) -> bool:
    return len(parse_hits(stdout)) == len(s.texts) - 1  # every document but the empty one


def _printed_cut(s: Setup, stdout: str) -> bool:
    huge = [h for h in parse_hits(stdout) if h[1] == "huge"]
    return bool(huge) and max(map(len, stdout.splitlines())) < 1000 and \
        f"[{BIG:,} characters]" in huge[0][2]


def _no_empty(s: Setup, stdout: str) -> bool:
    hits = parse_hits(stdout)
    return bool(hits) and "empty" not in [h[1] for h in hits]


def _help_of(*flags_: str):
    return lambda s, stdout: all(f"--{f}" in stdout for f in flags_)


def _console(name: str) -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), f"dualjax-{name}"), "--help"]


def _hide_faiss(s: Setup, case_dir: str) -> None:
    os.makedirs(os.path.join(case_dir, "nofaiss", "faiss"))
    with open(os.path.join(case_dir, "nofaiss", "faiss", "__init__.py"), "w") as f:
        f.write("raise ImportError('No module named faiss')\n")


def _file(s: Setup, case_dir: str) -> None:
    with open(os.path.join(case_dir, "a_file"), "w") as f:
        f.write("not a folder\n")


def _queries(content: bytes):
    def mutate(s: Setup, case_dir: str) -> None:
        with open(os.path.join(case_dir, "queries.txt"), "wb") as f:
            f.write(content)
    return mutate


def _verbatim(s: Setup) -> str:
    return f"--query={s.texts['d3']}"


CASES = [
    # 1. outputs never over inputs
    Case("index --out=<its BEIR corpus folder>", lambda s, d: module_command(
        "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}", f"--out={s.corpus}"),
        "refused", "own input"),
    Case("export --out=<its workdir>", lambda s, d: module_command(
        "export", f"--workdir={s.workdir}", f"--out={s.workdir}"), "refused", "own input"),
    Case("index --out=<its bundle>", lambda s, d: module_command(
        "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}", f"--out={s.bundle}"),
        "refused", "own input"),
    # 2-3. files that disagree
    Case("corpus.jsonl without its first 10 lines", lambda s, d: _search(
        s, "exact", "--query=bike", case_dir=d), "refused", r"corpus\.jsonl",
        mutate=_broken_index("corpus.jsonl", lambda b: b"\n".join(b.split(b"\n")[10:]))),
    Case("embeddings.npy reordered", lambda s, d: _search(s, "exact", "--query=bike",
                                                          case_dir=d),
         "refused", r"embeddings\.npy", mutate=_broken_index("embeddings.npy", _reorder_rows)),
    Case("two words of the bundle's vocab.json swapped", lambda s, d: _search(
        s, "exact", "--query=bike", encoder=os.path.join(d, "bundle")), "refused",
        r"vocab\.json", mutate=_broken_bundle("vocab.json", _swap_two_words)),
    # 4. a bare string
    Case("Encoder.encode_queries('a string')", lambda s, d: python_command(
        "-c", "import sys, dualjax\ntry:\n dualjax.Encoder.load(sys.argv[1])"
        ".encode_queries('a string')\nexcept TypeError as e: sys.exit(str(e))", s.bundle),
        "refused", "not one string"),
    # 5. init_from with another vocabulary
    Case("init_from with another model.vocab_size", lambda s, d: module_command(
        "main", "--config=configs/tiny.py", f"--workdir={os.path.join(d, 'w')}",
        f"--config.init_from={s.workdir}", "--config.model.vocab_size=400"),
        "refused", "vocab_size", slow=True),
    # 7. one-line errors
    Case("index --kind=hnsw without faiss", lambda s, d: module_command(
        "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}",
        f"--out={os.path.join(d, 'idx')}", "--kind=hnsw"), "refused", "faiss",
        mutate=_hide_faiss, env={"PYTHONPATH": "{case}/nofaiss"}),
    *[Case(f"search --k={k} ({kind})", lambda s, d, k=k, kind=kind: _search(
        s, kind, "--query=bike", f"--k={k}"), "refused", r"--k=")
      for kind in ("exact", "scann", "hnsw") for k in (-3, 0)],
    *[Case(f"index --batch_size={b}", lambda s, d, b=b: module_command(
        "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}",
        f"--out={os.path.join(d, 'idx')}", f"--batch_size={b}"), "refused", "--batch_size")
      for b in (0, -5)],
    Case("--queries_file missing", lambda s, d: _search(
        s, "exact", f"--queries_file={os.path.join(d, 'nowhere.txt')}"), "refused",
        "nowhere.txt"),
    Case("--queries_file not UTF-8", lambda s, d: _search(
        s, "exact", f"--queries_file={os.path.join(d, 'queries.txt')}"), "refused",
        r"queries\.txt:2: not UTF-8", mutate=_queries(b"bike\n\xff\xfe car\n")),
    Case("--queries_file empty", lambda s, d: _search(
        s, "exact", f"--queries_file={os.path.join(d, 'queries.txt')}"), "refused",
        r"queries\.txt holds no query", mutate=_queries(b"\n  \n")),
    Case("index.json without encoder_id", lambda s, d: _search(
        s, "exact", "--query=bike", case_dir=d), "refused", r"index\.json: no 'encoder_id'",
        mutate=_broken_index("index.json", _json_without("encoder_id"))),
    Case("encoder.json without max_len", lambda s, d: _search(
        s, "exact", "--query=bike", encoder=os.path.join(d, "bundle")), "refused",
        r"encoder\.json: no valid 'max_len'",
        mutate=_broken_bundle("encoder.json", _json_without("max_len"))),
    *[Case(f"a truncated {file}", lambda s, d, where=where: _search(
        s, "exact", "--query=bike", **({"case_dir": d} if where == "index" else
                                       {"encoder": os.path.join(d, "bundle")})),
        "refused", re.escape(file),
        mutate=(_broken_index if where == "index" else _broken_bundle)(
            file, lambda b: b[:len(b) // 2]))
      for file, where in (("query.jax_export", "bundle"), ("params.msgpack", "bundle"),
                          ("embeddings.npy", "index"), ("index.json", "index"),
                          ("corpus.jsonl", "index"))],
    Case("export --out=<a file>", lambda s, d: module_command(
        "export", f"--workdir={s.workdir}", f"--out={os.path.join(d, 'a_file')}"),
        "refused", "is a file", mutate=_file),
    Case("index --out= (empty)", lambda s, d: module_command(
        "index", f"--encoder={s.bundle}", f"--corpus={s.corpus}", "--out="), "refused",
        "--out is empty"),
    Case("export --platforms=bogus", lambda s, d: module_command(
        "export", f"--workdir={s.workdir}", f"--out={os.path.join(d, 'b')}",
        "--platforms=bogus"), "refused", "bogus"),
    # 8. --help
    *[Case(f"dualjax-{name} --help", lambda s, d, name=name: _console(name), "answered",
           check=_help_of(*flags_))
      for name, flags_ in (("train", ("config", "workdir", "coordinator_address")),
                           ("search", ("encoder", "k")),
                           ("export", ("workdir", "out", "platforms")),
                           ("index", ("encoder", "corpus", "kind", "coordinator_address",
                                      "num_processes", "process_id")))],
    # 10. edge cases
    Case("search --query=''", lambda s, d: _search(s, "exact", "--query="), "refused",
         "--query #1 is empty"),
    Case("an unknown-word query (the empty document was not indexed)", lambda s, d: _search(
        s, "exact", "--query=zzqx qqzx", "--k=5"), "answered", check=_no_empty),
    Case("the huge document, printed cut", lambda s, d: _search(
        s, "exact", "--query=garden window", "--k=3"), "answered", check=_printed_cut),
    *[Case(f"the verbatim text first, with its id ({kind})", lambda s, d, kind=kind: _search(
        s, kind, _verbatim(s), "--k=3"), "answered", check=_verbatim_first)
      for kind in ("exact", "scann", "hnsw")],
    *[Case(f"--k above the corpus size ({kind})", lambda s, d, kind=kind: _search(
        s, kind, "--query=bike", "--k=1000"), "answered", check=_all_but_empty)
      for kind in ("exact", "scann", "hnsw")],
]


def _log_line(line: str) -> bool:
    """absl's log lines (I1126 12:00:00.000 ...) and warnings' continuation lines."""
    return bool(re.match(r"[IWEF]\d{4} \d\d:\d\d:\d\d", line)) or not line.strip()


def _digests(folders: list[str]) -> dict[str, str]:
    out = {}
    for folder in folders:
        for base, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(base, name)
                with open(path, "rb") as f:
                    out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


def _leftovers(folder: str) -> list[str]:
    return [os.path.join(base, d) for base, dirs, _ in os.walk(folder) for d in dirs
            if re.search(r"\.(tmp|old)-?\d+$", d)]


def run_case(s: Setup, case: Case, i: int) -> dict:
    d = os.path.join(s.out, "cases", f"{i:02d}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if case.mutate:
        case.mutate(s, d)
    env = {k: v.replace("{case}", d) for k, v in (case.env or {}).items()}
    done = run_command(case.command(s, d), env)
    said = [line for line in done.stderr.splitlines() if not _log_line(line)]
    result = {"case": case.name, "expect": case.expect, "exit": done.returncode,
              "traceback": "Traceback" in done.stderr}
    if case.expect == "refused":
        result["message"] = said[-1] if said else ""
        ok = (done.returncode == 1 and len(said) == 1 and not result["traceback"]
              and re.search(case.names, said[0]) is not None)
        result["outcome"] = "refused in one line" if ok else "NOT REFUSED CLEANLY"
    else:
        ok = done.returncode == 0 and not result["traceback"] and case.check(s, done.stdout)
        result["outcome"] = "answered correctly" if ok else "WRONG ANSWER"
        if not ok:
            result["message"] = (said or done.stdout.splitlines() or [""])[-1][:300]
    result["ok"] = ok
    return result


def run_cases(s: Setup, cases: list[Case] = CASES, workers: int = 2) -> list[dict]:
    """Every case (hnsw ones only with an hnsw index), `workers` at a time; then whether
    an input changed or a .tmp / .old folder was left behind, as one more result."""
    inputs = [s.workdir, s.bundle, s.corpus, *s.indexes.values()]
    before = _digests(inputs)
    cases = [c for c in cases if "hnsw" not in c.name.split("(")[-1] or "hnsw" in s.indexes]
    with futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda ic: run_case(s, ic[1], ic[0]), enumerate(cases)))
    after = _digests(inputs)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    left = _leftovers(s.out) + [p for p in os.listdir(os.path.dirname(os.path.abspath(s.out)))
                                if re.search(r"\.(tmp|old)-?\d+$", p)]
    ok = not changed and not left
    results.append({"case": "no input changed, nothing left behind", "expect": "answered",
                    "outcome": "answered correctly" if ok else "FILES CHANGED OR LEFT",
                    "message": "; ".join(changed[:3] + left[:3]), "ok": ok,
                    "exit": 0, "traceback": False})
    return results


def table(results: list[dict]) -> str:
    lines = ["| case | expected | outcome | message |", "|---|---|---|---|"]
    for r in results:
        msg = r.get("message", "").replace("|", "\\|")
        lines.append(f"| {r['case']} | {r['expect']} | {r['outcome']} | {msg[:160]} |")
    return "\n".join(lines)
