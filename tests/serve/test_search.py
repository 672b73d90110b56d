"""The search command: a trained workdir answers typed queries with its saved index."""

import json
import logging
import os
import subprocess
import sys

import conftest
import numpy as np
import pytest
from conftest import load_config

from dualjax import search
from dualjax.train import loop as train

S0 = "shard-00000-of-00001"  # a one-process index's one shard


@pytest.fixture(scope="module")
def workdir(trained_tiny):
    return trained_tiny


def test_searcher_reuses_the_saved_index_and_ranks_by_score(workdir):
    searcher = search.from_workdir(str(workdir), "test", k=5)
    assert searcher.info["built"] is False  # the final evaluation's index, loaded
    query = searcher.corpus[7]
    results = searcher.search([query, "something else entirely"])
    assert len(results) == 2 and all(len(r) == 5 for r in results)
    scores = [s for s, _ in results[0]]
    assert scores == sorted(scores, reverse=True)
    assert results[0][0] == (pytest.approx(1.0, abs=1e-4), query)  # itself, cosine 1


def test_a_changed_corpus_fingerprint_rebuilds(workdir, monkeypatch):
    from dualjax.retrieval import ann
    real = ann.corpus_fingerprint
    monkeypatch.setattr(ann, "corpus_fingerprint", lambda c, extra="": real(c, extra + "x"))
    assert search.from_workdir(str(workdir), "test", k=5).info["built"] is True


@pytest.mark.slow
def test_search_command_line(workdir):
    out = subprocess.run(
        [sys.executable, "-m", "dualjax.search", f"--workdir={workdir}", "--k=3",
         "--query=how do i repair my car", "--query=best way to cook rice"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n> ") == 2
    assert "  1. +" in out.stdout and "  3. " in out.stdout


def test_corpus_files_are_read_with_their_ids_and_bad_lines_named(tmp_path):
    from dualjax.data.corpus_file import read_corpus
    from dualjax.errors import DataError
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"_id": "a", "title": "Cars", "text": "fix a car"}\n'
                     '{"id": 7, "document": "cook rice"}\n{"text": "no id"}\n')
    assert read_corpus(str(jsonl)) == (["a", "7", "3"], ["Cars. fix a car", "cook rice", "no id"])
    tsv = tmp_path / "c.tsv"
    tsv.write_text("d1\tfix a car\nonly a text\n")
    assert read_corpus(str(tsv)) == (["d1", "2"], ["fix a car", "only a text"])
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text('{"_id": "x", "text": "t"}\n')
    assert read_corpus(str(beir)) == (["x"], ["t"])
    for name, body, message in [("dup.tsv", "a\tx\na\ty\n",
                                 r"dup.tsv:2: duplicate id 'a' \(first at line 1\)"),
                                ("tabs.tsv", "a\tb\tc\n", r"tabs.tsv:1: 2 tabs"),
                                ("bad.jsonl", '{"text": "ok"}\n{"title": "t"}\n',
                                 r"bad.jsonl:2: needs a string")]:
        (tmp_path / name).write_text(body)
        with pytest.raises(DataError, match=message):
            read_corpus(str(tmp_path / name))


@pytest.mark.slow
def test_an_exported_encoder_and_its_index_answer_without_the_workdir(workdir, bundle, tmp_path,
                                                                   monkeypatch):
    import json

    import numpy as np

    import dualjax
    from dualjax import index as corpus_index
    texts = search.from_workdir(str(workdir), "test", k=5).corpus[:60]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"doc{i}", "text": t}) + "\n"
                              for i, t in enumerate(texts)))
    out = subprocess.run([sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
                          f"--corpus={corpus}", f"--out={tmp_path / 'idx'}", "--kind=scann"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "60 documents" in out.stdout

    # In process: the saved index, loaded by the encoder's id; the corpus is not encoded
    # again, and the answers are exact search over the bundle's own vectors.
    encoder = dualjax.Encoder.load(bundle)
    with monkeypatch.context() as m:
        m.setattr(dualjax.Encoder, "encode_documents", lambda *a, **k: pytest.fail("re-encoded"))
        searcher = search.from_bundle(bundle, str(tmp_path / "idx"), k=4)
        queries = [texts[3], "how do i cook rice ?"]
        got = searcher.search(queries)
    assert searcher.info["encoder_id"] == encoder.id and searcher.info["n"] == 60
    docs, q = encoder.encode_documents(texts), encoder.encode_queries(queries)
    want = np.argsort(-(q @ docs.T), axis=1, kind="stable")[:, :4]
    assert [[t for _, t in row] for row in got] == [[texts[i] for i in row] for row in want]
    assert got[0][0][1] == texts[3]
    fused = searcher.search(queries, hybrid="bm25")
    assert fused[0][0][1] == texts[3]  # first in both rankings
    assert [len(r) for r in searcher.search(queries, "bm25", weight=1.0)] == [4, 4]

    # An index is only read with the encoder that built it.
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    meta["encoder_id"] = "0" * 16
    (tmp_path / "idx" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="was built with encoder 0000000000000000, not"):
        corpus_index.CorpusIndex(str(tmp_path / "idx"), encoder.id)


@pytest.mark.slow
def test_search_command_line_from_a_bundle_says_when_no_token_is_known(bundle, workdir, tmp_path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("a\thow do i repair my car ?\nb\tbest way to cook rice ?\n"
                      "c\thow can i learn to swim ?\n")
    import dualjax
    from dualjax import index as corpus_index
    corpus_index.build(dualjax.Encoder.load(bundle), ["a", "b", "c"],
                       [line.split("\t")[1] for line in corpus.read_text().splitlines()],
                       str(tmp_path / "idx"), kind="exact")
    out = subprocess.run(
        [sys.executable, "-m", "dualjax.search", f"--encoder={bundle}",
         f"--index={tmp_path / 'idx'}", "--k=2", "--query=how do i repair my car",
         "--query=zzqx qqzv", "--hybrid=bm25"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split("\n> ")[1:]
    assert "1. +" in first and "how do i repair my car ?" in first.splitlines()[1]
    assert "no token of this query is in the model's vocabulary" in second
    assert "no token" not in first
    bad = subprocess.run([sys.executable, "-m", "dualjax.search", f"--encoder={bundle}",
                          "--query=x"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "give --encoder and --index" in bad.stderr


def test_an_hnsw_corpus_index_is_built_saved_and_loaded(bundle, tmp_path):
    pytest.importorskip("faiss", reason="eval.index=hnsw needs faiss-cpu (the test extra)")
    import dualjax
    from dualjax import index as corpus_index
    from dualjax.retrieval import ann
    encoder = dualjax.Encoder.load(bundle)
    texts = [f"how do i fix my {w} {i} ?" for i in range(30) for w in ("car", "bike")]
    built = corpus_index.build(encoder, [str(i) for i in range(60)], texts,
                               str(tmp_path / "idx"), kind="hnsw", k=5)
    assert isinstance(built.searcher, ann.HnswIndex)
    assert sorted(os.listdir(tmp_path / "idx" / S0 / "hnsw")) == ["hnsw.faiss", "meta.json"]
    loaded = corpus_index.CorpusIndex(str(tmp_path / "idx"), encoder.id)
    q = encoder.encode_queries(["how do i fix my car 3 ?"])
    np.testing.assert_array_equal(loaded.search(q, 5)[1], built.search(q, 5)[1])
    docs = encoder.encode_documents(texts)
    scores, ids = loaded.search(q, 5)
    assert scores[0, 0] == pytest.approx(float(np.max(q @ docs.T)), abs=1e-5)  # (ties: any id)


@pytest.mark.parametrize("quantize", ["int8", "binary"])
@pytest.mark.slow
def test_a_quantized_corpus_index_keeps_codes_alone_and_answers(bundle, tmp_path, quantize):
    """--quantize: quantized.npz instead of the float vectors, its digest checked; a
    search rescores its candidates and answers as the float index on clear queries; the
    command line refuses --quantize with a kind that keeps float vectors."""
    import dualjax
    from dualjax import index as corpus_index
    from dualjax import search
    from dualjax.retrieval import quantized
    encoder = dualjax.Encoder.load(bundle)
    texts = [f"how do i fix my {w} {i} ?" for i in range(30) for w in ("car", "bike")]
    ids = [str(i) for i in range(60)]
    out = str(tmp_path / "idx")
    built = corpus_index.build(encoder, ids, texts, out, kind="exact", k=5,
                               quantize=quantize, rescore=20)
    assert isinstance(built.searcher, quantized.QuantizedIndex)
    assert "embeddings.npy" not in os.listdir(os.path.join(out, S0))
    meta = json.loads(open(os.path.join(out, "index.json")).read())
    assert meta["quantize"] == quantize and f"{S0}/quantized.npz" in meta["files"]
    searcher = search.from_bundle(bundle, out, k=1)
    found = [r[0][1] for r in searcher.search(texts[:6])]
    if quantize == "int8":  # a byte a dimension: as the float index
        assert found == texts[:6]
    else:  # a bit a dimension of a 16-d model: only the kind of text is sure
        assert [t.split()[4] for t in found] == [t.split()[4] for t in texts[:6]]
    with open(os.path.join(out, S0, "quantized.npz"), "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="quantized.npz: changed since the index"):
        corpus_index.CorpusIndex(out, encoder.id)
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{i}\t{t}\n" for i, t in zip(ids, texts, strict=True)))
    result = subprocess.run([sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
                             f"--corpus={corpus}", f"--out={tmp_path / 'idx2'}",
                             f"--quantize={quantize}", "--kind=scann"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr.strip().splitlines()[-1] == (
        f"dualjax.index: --quantize={quantize} searches the codes themselves: give "
        "--kind=exact (not 'scann', which keeps float vectors)")


def test_a_bundle_refuses_a_bare_string(bundle):
    """One string is not a list of one-character texts."""
    import dualjax
    encoder = dualjax.Encoder.load(bundle)
    for encode in (encoder.encode_queries, encoder.encode_documents):
        with pytest.raises(TypeError, match="a sequence of texts, not one string"):
            encode("how do i fix my bike")
        # A list of something else names the first item that is not a string.
        with pytest.raises(TypeError, match=r"text 1 is int 2, not str"):
            encode(["fine", 2])
        with pytest.raises(TypeError, match=r"text 0 is bytes b'x', not str"):
            encode([b"x"])
        with pytest.raises(TypeError, match="a sequence of texts \\(str\\), not NoneType"):
            encode(None)
    assert encoder.encode_queries(["how do i fix my bike"]).shape == (1, encoder.dim)


def test_outputs_never_replace_their_inputs_or_other_folders(workdir, bundle, tmp_path):
    """export and index refuse, before any work, an --out that is their input (the
    workdir, the bundle, a BEIR folder given as the corpus) or holds it, a folder that is
    not of their kind, or one of their kind without --overwrite; the inputs are intact.
    On the command line the refusal is one line with exit 1."""
    import dualjax
    from dualjax import export
    from dualjax import index as corpus_index
    from dualjax.errors import OutputError
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "a", "text": "how do i fix my bike"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    before = {p: sorted(os.listdir(p)) for p in (str(workdir), bundle, str(beir))}
    encoder = dualjax.Encoder.load(bundle)
    index = lambda out, **kw: corpus_index.build(encoder, ["a"], ["how do i fix my bike"],
                                                 str(out), kind="exact", inputs=(str(beir),),
                                                 **kw)
    for call, message in [
            (lambda: export.export(str(workdir), str(workdir)), "its own input"),
            (lambda: export.export(str(workdir), str(workdir / "..")), "its own input"),
            (lambda: export.export(str(workdir), str(beir)), "is not a bundle"),
            (lambda: export.export(str(workdir), bundle), "--overwrite"),
            (lambda: index(beir), "its own input"),
            (lambda: index(bundle), "its own input"),
            (lambda: index(beir / "corpus.jsonl"), "is a file")]:
        with pytest.raises(OutputError, match=message):
            call()
    assert {p: sorted(os.listdir(p)) for p in before} == before  # (the command line: the drill)
    # A new folder inside the corpus folder is fine, and --overwrite replaces an index.
    index(beir / "idx")
    with pytest.raises(OutputError, match="--overwrite"):
        index(beir / "idx")
    index(beir / "idx", overwrite=True)
    assert sorted(os.listdir(beir)) == ["corpus.jsonl", "idx", "qrels"]


@pytest.mark.slow
def test_an_index_and_a_bundle_never_live_inside_each_other(workdir, bundle, tmp_path):
    """An index inside a bundle, an index or a workdir, and a bundle inside an index or a
    bundle, are refused before any work, naming the folder (a later --overwrite of the
    outer one would delete the inner one); --overwrite refuses a bundle or an index
    holding a file it did not write (an index put there before, a user's notes), naming
    the file, which is kept; without them it replaces as before."""
    import re
    import shutil

    import dualjax
    from dualjax import export
    from dualjax import index as corpus_index
    from dualjax.errors import OutputError
    encoder = dualjax.Encoder.load(bundle)
    index = lambda out, **kw: corpus_index.build(encoder, ["a"], ["how do i fix my bike"],
                                                 str(out), kind="exact", **kw)
    idx, mine = tmp_path / "idx", tmp_path / "mine"
    index(idx)
    shutil.copytree(bundle, mine)  # a bundle of our own, to replace
    before = sorted(os.listdir(tmp_path))
    for call, message in [
            (lambda: index(mine / "idx"), f"--out={mine / 'idx'} is inside the bundle {mine}: "
                                          "replacing that bundle (--overwrite) would delete it"),
            (lambda: index(idx / "idx"), f"is inside the corpus index {idx}: replacing"),
            (lambda: index(workdir / "idx"), f"is inside the workdir {workdir}: a run's folder"),
            (lambda: export.export(str(workdir), str(idx / "b")),
             f"is inside the corpus index {idx}"),
            (lambda: export.export(str(workdir), str(mine / "b")), f"is inside the bundle {mine}")]:
        with pytest.raises(OutputError, match=re.escape(message)):
            call()
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(idx)) == ["index.json", S0]
    assert "idx" not in os.listdir(mine) and "idx" not in os.listdir(workdir)

    shutil.copytree(idx, mine / "idx")  # as an older dualjax let it be made
    (idx / "notes.txt").write_text("mine")
    for call, message in [
            (lambda: export.export(str(workdir), str(mine), platforms=("cpu",), overwrite=True),
             f"--out={mine} holds idx/index.json (and 4 more), which is not the bundle's "
             "(encoder.json does not record it): replacing the folder would delete it"),
            (lambda: index(idx, overwrite=True), f"--out={idx} holds notes.txt, which is not "
                                                 "the corpus index's (index.json")]:
        with pytest.raises(OutputError, match=re.escape(message)):
            call()
    assert (mine / "idx" / "index.json").is_file() and (idx / "notes.txt").read_text() == "mine"
    out = subprocess.run([sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
                          f"--corpus={idx / S0 / 'corpus.jsonl'}", f"--out={bundle}/idx"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        f"dualjax.index: --out={bundle}/idx is inside the bundle {bundle}: replacing that "
        "bundle (--overwrite) would delete it; choose a folder outside it")
    shutil.rmtree(mine / "idx")
    (idx / "notes.txt").unlink()
    index(idx, overwrite=True)
    export.export(str(workdir), str(mine), platforms=("cpu",), overwrite=True)
    assert sorted(os.listdir(mine)) == sorted(os.listdir(bundle))


def test_one_writer_per_output_and_what_dead_writers_left_is_removed(bundle, tmp_path):
    """A second build into an --out that a running one holds is refused in one line
    naming the holder; a kill -9 leaves out.tmp<pid>, which the next build removes (its
    process is gone); the lock file beside --out is not left behind."""
    import dualjax
    from dualjax import index as corpus_index
    from dualjax.errors import OutputError
    from dualjax.runtime.files import Lock
    encoder = dualjax.Encoder.load(bundle)
    out = tmp_path / "idx"
    build = lambda: corpus_index.build(encoder, ["a"], ["how do i fix my bike"], str(out),
                                       kind="exact", overwrite=True)
    held = Lock(output=str(out))
    held.acquire()  # another build, running
    with pytest.raises(OutputError, match=rf"--out={out} is in use by pid {os.getpid()}"):
        build()
    held.release()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"idx.tmp{dead}"
    (stale / "searcher").mkdir(parents=True)  # what a killed build left
    (tmp_path / "idx.tmp1").mkdir()  # pid 1 runs: not this run's to remove
    build()
    assert sorted(os.listdir(tmp_path)) == ["idx", "idx.tmp1"]


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.slow
def test_a_signal_ends_an_index_build_in_one_line_leaving_nothing(bundle, tmp_path, sig,
                                                                   code):
    """Ctrl-C or SIGTERM while `dualjax.index` encodes: one line, exit 130 / 143, and no
    --out, no out.tmp<pid>, no lock file left (SIGINT as a terminal sets it)."""
    import signal
    import time
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"text number {i} about bikes and repairs\n"
                              for i in range(200_000)))
    out = tmp_path / "idx"
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
             " sys.argv[0] = 'dualjax.index'; runpy.run_module('dualjax.index', "
             "run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen(
        [sys.executable, "-c", start, f"--encoder={bundle}", f"--corpus={corpus}",
         f"--out={out}", "--kind=exact"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.time() + 120
    while not (tmp_path / ".idx.lock").exists() and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.05)  # the lock is taken just before the corpus is encoded
    time.sleep(0.5)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert err.strip().splitlines()[-1] == \
        f"dualjax.index: stopped by {sig}{' (Ctrl-C)' if sig == 'SIGINT' else ''}; " \
        "nothing half-written was kept"
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]


def test_a_changed_bundle_or_index_is_refused_naming_the_file(bundle, tmp_path):
    """A bundle checks its files against its id, an index its parts against index.json,
    before answering: a changed vocabulary, a shortened corpus or reordered embeddings
    are refused by file name instead of shifting every answer."""
    import json
    import shutil

    import dualjax
    from dualjax import index as corpus_index
    from dualjax.runtime.files import files_under
    texts = [f"document number {i} about bikes and rice" for i in range(12)]
    encoder = dualjax.Encoder.load(bundle)
    corpus_index.build(encoder, [str(i) for i in range(12)], texts, str(tmp_path / "idx"),
                       kind="exact")

    def broken(folder: str, name: str, change) -> str:
        copy = tmp_path / f"{os.path.basename(folder)}_{name.replace('.', '_').replace('/', '_')}"
        shutil.copytree(folder, copy)
        change(copy / name)
        return str(copy)

    def swap_two_words(path):
        vocab = json.loads(path.read_text())
        vocab["vocab"][0], vocab["vocab"][1] = vocab["vocab"][1], vocab["vocab"][0]
        path.write_text(json.dumps(vocab))

    with pytest.raises(ValueError, match="vocab.json: changed since the bundle was written"):
        dualjax.Encoder.load(broken(bundle, "vocab.json", swap_two_words))
    idx = str(tmp_path / "idx")
    drop_lines = lambda p: p.write_text("".join(p.read_text().splitlines(True)[3:]))
    reorder = lambda p: np.save(p, np.load(p)[::-1])
    for name, change in ((f"{S0}/corpus.jsonl", drop_lines), (f"{S0}/embeddings.npy", reorder)):
        with pytest.raises(ValueError, match=f"{name}: changed since the index was written"):
            corpus_index.CorpusIndex(broken(idx, name, change), encoder.id)
    assert list(corpus_index.CorpusIndex(idx, encoder.id).texts) == texts
    # The searcher's own files are covered too: a ScaNN file altered in place, or a
    # broken JSON among them, is refused by its name before ScaNN reads it.
    corpus_index.build(encoder, [str(i) for i in range(12)], texts, str(tmp_path / "sc"),
                       kind="scann")
    sc = str(tmp_path / "sc")
    names = [n for n in files_under(sc) if n.startswith(f"{S0}/scann")]
    assert len(names) > 2
    for name in names:
        with pytest.raises(ValueError, match=f"{name}: changed since the index was written"):
            corpus_index.CorpusIndex(broken(sc, name, lambda p: p.write_bytes(
                p.read_bytes()[:-1] + b"x")), encoder.id)
    assert list(corpus_index.CorpusIndex(sc, encoder.id).texts) == texts


def _serving_drill():
    import importlib.util
    path = os.path.join(conftest.REPO, "scripts", "drills", "serving_drill.py")
    spec = importlib.util.spec_from_file_location("serving_drill", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["serving_drill"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


# What happens in the commands' main(), one case per command and kind of refusal: the
# rest of the drill's cases are tested in-process (scripts/drills/drill.py --serving runs all).
DRILLED = ("index --out=<its BEIR corpus folder>", "index --kind=hnsw without faiss",
           "search --k=0 (exact)", "--queries_file not UTF-8", "export --platforms=bogus",
           "dualjax-index --help", "search --query=''", "the huge document, printed cut")


@pytest.mark.slow
def test_the_serving_drill_refuses_in_one_line_or_answers_correctly(workdir, bundle, tmp_path):
    """scripts/drills/drill.py --serving's cases for the commands' flags and output, run as a
    user runs them: exit 1 with one line naming the flag or file, or the right answer;
    no input changed and nothing left behind."""
    import dualjax
    from dualjax import index as corpus_index
    drill = _serving_drill()
    rows = drill.corpus_rows()
    setup = drill.Setup(str(tmp_path), str(workdir), bundle, drill.write_corpus(
        str(tmp_path / "beir"), rows), {"exact": str(tmp_path / "index_exact")},
        {r["_id"]: r["text"] for r in rows})
    corpus_index.build(dualjax.Encoder.load(bundle), [r["_id"] for r in rows],
                       [r["text"] for r in rows], setup.indexes["exact"], kind="exact")
    cases = [c for c in drill.CASES if c.name in DRILLED]
    assert len(cases) == len(DRILLED)
    results = drill.run_cases(setup, cases)
    assert [r for r in results if not r["ok"]] == [], drill.table(results)


def test_search_flags_and_output_by_hand(tmp_path):
    from dualjax import search
    f = tmp_path / "q.txt"
    f.write_bytes("\ufefffix my bike\n\n  \n\u00a0\u3000\ncook rice\n".encode())
    assert search.read_queries(["a car"], str(f)) == ["a car", "fix my bike", "cook rice"]
    for given, content, message in (([" "], None, "--query #1 is empty"),
                                    ([], b"\n\n", "holds no query"),
                                    ([], b"ok\n\xff\n", r"q.txt:2: not UTF-8"),
                                    ([], None, "give --query")):
        if content is not None:
            f.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            search.read_queries(given, str(f) if content is not None else None)
    with pytest.raises(ValueError, match="nowhere.txt: No such file"):
        search.read_queries([], str(tmp_path / "nowhere.txt"))
    assert search.snippet("a  b\nc", 0) == "a b c"
    assert search.snippet("x" * 2000, 10) == "xxxxxxxxxx... [2,000 characters]"


def test_bundle_and_index_metadata_errors_name_the_file(workdir, bundle, tmp_path, caplog):
    """A key missing from encoder.json or index.json, a file this jax cannot read, empty
    documents, a bad --batch_size or --platforms: each a ValueError naming the file or
    flag, raised before anything is written."""
    import json
    import shutil

    import dualjax
    from dualjax import export
    from dualjax import index as corpus_index
    from dualjax.runtime.files import file_digests
    from dualjax.serve import bundle as bundle_lib
    copy = shutil.copytree(bundle, tmp_path / "b")
    meta = json.loads((copy / "encoder.json").read_text())
    (copy / "encoder.json").write_text(json.dumps({k: v for k, v in meta.items()
                                                   if k != "max_len"}))
    with pytest.raises(ValueError, match=r"b/encoder.json: no valid 'max_len'"):
        dualjax.Encoder.load(str(copy))
    (copy / "encoder.json").write_text(json.dumps(meta)[:40])
    with pytest.raises(ValueError, match=r"b/encoder.json: not a readable encoder.json"):
        dualjax.Encoder.load(str(copy))
    # Digests that match a file jax cannot read (another version wrote it): named.
    (copy / "query.jax_export").write_bytes(b"\x00" * 16)
    meta["files"] = file_digests(str(copy), list(meta["files"]))
    meta["id"] = bundle_lib.bundle_id(meta["files"])
    (copy / "encoder.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"b/query.jax_export: unreadable by jax"):
        dualjax.Encoder.load(str(copy))

    encoder = dualjax.Encoder.load(bundle)
    with pytest.raises(ValueError, match="--batch_size=0"):
        corpus_index.build(encoder, ["a"], ["x"], str(tmp_path / "i0"), batch_size=0)
    with pytest.raises(ValueError, match="no document that gives the encoder a token"):
        corpus_index.build(encoder, ["a", "b"], ["", " \n"], str(tmp_path / "i1"))
    with caplog.at_level(logging.WARNING):
        built = corpus_index.build(encoder, ["a", "e", "b"], ["fix my bike", "  ", "cook rice"],
                                   str(tmp_path / "idx"), kind="exact")
    assert "skipped 1 documents that give the encoder no token" in caplog.text
    assert "ids e)" in caplog.text
    assert (list(built.ids), list(built.texts)) == (["a", "b"], ["fix my bike", "cook rice"])
    idx_meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    del idx_meta["encoder_id"]
    (tmp_path / "idx" / "index.json").write_text(json.dumps(idx_meta))
    with pytest.raises(ValueError, match=r"idx/index.json: no 'encoder_id'"):
        corpus_index.CorpusIndex(str(tmp_path / "idx"), encoder.id)
    for key, value in (("kind", None), ("files", ["corpus.jsonl"]), ("k", "10")):
        broken = {**idx_meta, "encoder_id": encoder.id, key: value}
        (tmp_path / "idx" / "index.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=f"idx/index.json: its '{key}' is not valid"):
            corpus_index.CorpusIndex(str(tmp_path / "idx"), encoder.id)
    with pytest.raises(ValueError, match="--platforms: bogus"):
        export.export(str(workdir), str(tmp_path / "e"), platforms=("cpu", "bogus"))
    assert not any(".tmp" in p for p in os.listdir(tmp_path))


def test_a_bundle_encodes_each_batch_at_its_own_length(bundle, tmp_path):
    """The exported functions take any length up to max_len: batches of short texts run
    cut to their length bucket (longest texts first), with the vectors of full length."""
    import dualjax
    encoder = dualjax.Encoder.load(bundle)
    assert encoder.meta["length"] == "symbolic"
    texts = ["how do i fix my bike", "rice", "what is the best way to learn to cook rice at home",
             "car", "how can i learn python quickly and well", "swim"]
    max_len = encoder.meta["max_len"]["document"]
    full = encoder.encode_documents(texts, batch_size=2)  # every bucket is max_len
    encoder.min_bucket = 2
    seen, fn = [], encoder._fns["document"]
    encoder._fns["document"] = lambda p, ids, mask: seen.append(ids.shape) or fn(p, ids, mask)
    np.testing.assert_allclose(encoder.encode_documents(texts, batch_size=2), full, atol=1e-6)
    lengths = [shape[1] for shape in seen]  # longest texts first: 2, 4, 6, 8, 12, 16, ...
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] == 2 < max_len, seen
    # dualjax.index encodes the whole corpus longest first, not chunk by chunk in file order.
    from dualjax import index as corpus_index
    seen.clear()
    built = corpus_index.build(encoder, [str(i) for i in range(len(texts))], texts,
                               str(tmp_path / "idx"), kind="exact", batch_size=2)
    lengths = [shape[1] for shape in seen]
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] == 2, seen
    np.testing.assert_allclose(np.load(tmp_path / "idx" / S0 / "embeddings.npy"), full, atol=1e-6)
    assert list(built.texts) == texts


def test_a_task_the_run_does_not_have_is_refused_saying_what_it_has(workdir):
    """A one-task run's task has no name: --task is refused saying so, not with an
    empty list of tasks."""
    with pytest.raises(ValueError, match=r"^--task='nope': this run has a single task, "
                                         r"which has no name; leave --task out$"):
        search.from_workdir(str(workdir), "test", k=3, task="nope")


@pytest.mark.slow
def test_a_beir_run_is_searched_by_its_document_ids(tmp_path):
    """search --workdir over a run trained on a BEIR folder prints each hit's corpus id
    (the folder's _id), not its row number."""
    from helpers import CORPUS, _folder
    cfg = load_config("tiny")
    cfg.data.update(name="beir", path=_folder(tmp_path), ignore_identical_ids=False)
    cfg.update(num_train_steps=2, checkpoint_every_steps=2, global_batch_size=8)
    cfg.eval.update(index="exact", baselines="", untrained=False)
    workdir = tmp_path / "run"
    train.train_and_evaluate(cfg, str(workdir))
    searcher = search.from_workdir(str(workdir), "test", k=5)
    by_text = {t: searcher.doc_id(i) for i, t in enumerate(searcher.corpus)}
    assert by_text == {"Jax. Jax is a library.": "d1", "Flax builds on jax.": "d2",
                       "How do I learn jax?": "q3", "Optax has optimizers.": "d4",
                       "Orbax. Checkpoints.": "d5"}
    out = subprocess.run([sys.executable, "-m", "dualjax.search", f"--workdir={workdir}",
                          "--k=5", "--query=what is jax"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    hits = [line.split("]")[0].split("[")[1] for line in out.stdout.splitlines()
            if line[:5].strip().endswith(".")]
    assert sorted(hits) == sorted(d["_id"] for d in CORPUS)


@pytest.mark.slow
def test_a_corpus_in_every_script_is_searched_and_no_text_shares_a_vector(bundle, tmp_path):
    """Documents in six scripts are indexed (the ones without a letter or digit skipped)
    and each verbatim query finds its own first; "?!" and emoji are not answered with
    the documents that had no token, which once all had the towers' bias as vector."""
    import dualjax
    from dualjax import index as corpus_index
    texts = {"zh": "北京大学的图书馆很大", "ar": "مكتبة الجامعة كبيرة جدا",
             "ru": "Библиотека университета очень большая", "el": "Η βιβλιοθήκη είναι μεγάλη",
             "hi": "विश्वविद्यालय का पुस्तकालय बहुत बड़ा है", "en": "how do i fix my bike",
             "e1": "🙂🎉", "e2": "?!", "e3": "👍 ..."}
    built = corpus_index.build(dualjax.Encoder.load(bundle), list(texts), list(texts.values()),
                               str(tmp_path / "idx"), kind="exact")
    assert sorted(built.ids) == ["ar", "el", "en", "hi", "ru", "zh"]
    searcher = search.from_bundle(bundle, str(tmp_path / "idx"), k=3)
    scripts = [key for key in texts if not key.startswith("e")]
    answers = searcher.ranked([texts[key] for key in scripts] + ["?!", "🙂"])
    assert [searcher.doc_id(a[0][1]) for a in answers[:len(scripts)]] == scripts
    assert answers[-2:] == [[], []]
    out = subprocess.run([sys.executable, "-m", "dualjax.search", f"--encoder={bundle}",
                          f"--index={tmp_path / 'idx'}", "--query=?!"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "nothing to search for" in out.stdout and "1. " not in out.stdout
