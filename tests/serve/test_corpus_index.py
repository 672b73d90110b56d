"""A corpus index in shards: the sharded search answers as one index over the whole
corpus (exact, ScaNN, HNSW), and `dualjax.index` run as two processes with 4 devices
each builds an index that answers as the one-process index does."""

import itertools
import json
import os
import shutil
import subprocess
import sys

import conftest
import numpy as np
import pytest
from conftest import COMPILE_FLAGS

from dualjax.retrieval import ann
from dualjax.retrieval.sharded import ShardedSearcher, merge_top_k

REPO = str(conftest.REPO)


def unit(n, dim, seed):
    x = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_merging_keeps_the_k_best_of_every_shard_by_hand():
    scores = [np.array([[0.9, 0.5, -np.inf]]), np.array([[0.7, 0.5]])]
    ids = [np.array([[3, 1, -1]]), np.array([[10, 12]])]
    s, i = merge_top_k(scores, ids, 4)
    np.testing.assert_array_equal(i, [[3, 10, 1, 12]])  # the tie at 0.5: the earlier shard
    np.testing.assert_allclose(s, [[0.9, 0.7, 0.5, 0.5]])
    s, i = merge_top_k([np.array([[0.2]])], [np.array([[4]])], 3)  # fewer than k: padded
    np.testing.assert_array_equal(i, [[4, -1, -1]])
    assert s[0, 1] == -np.inf


@pytest.mark.parametrize("kind", ["exact", "scann", "hnsw"])
def test_a_sharded_search_answers_as_one_index_over_the_corpus(kind):
    """Shards of 700, 0 and 500 rows searched and merged give the global search's ids and
    scores (ScaNN brute force and a wide HNSW walk are exact at this size), with global
    row ids and a global row excluded from its own query's answers."""
    if kind == "hnsw":
        pytest.importorskip("faiss", reason="HNSW needs faiss-cpu (the test extra)")
    corpus, queries = unit(1200, 16, 0), unit(40, 16, 1)
    cfg = {"query_chunk": 16, "corpus_chunk": 128, "scann": ann.default_scann_config(),
           "hnsw": {**ann.default_hnsw_config(), "ef_search": 1200}}
    sizes = [700, 0, 500]
    bounds = np.cumsum([0, *sizes])
    parts = [ann.make_index(kind, corpus[a:b], cfg, 10)[0] if b > a else None
             for a, b in itertools.pairwise(bounds)]
    sharded = ShardedSearcher(parts, sizes)
    exclude = np.arange(40) * 30  # rows in both shards
    want_s, want_i = ann.exact_search(queries, corpus, 10, exclude)
    got_s, got_i = sharded.search(queries, 10, exclude)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)
    assert not (got_i == exclude[:, None]).any()
    assert (got_i >= 700).any() and (got_i < 700).any()  # answers from both shards
    assert sharded.settings == parts[0].settings


from helpers import WORDS, free_port, write_corpus  # noqa: E402  (shared with test_peers)


def index_command(bundle, corpus, out, processes=1, extra=()):
    """`dualjax.index` as `processes` processes of 4 CPU devices each; their outputs."""
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{COMPILE_FLAGS} --xla_force_host_platform_device_count=4"}
    multi = lambda i: [f"--coordinator_address=localhost:{port}",
                       f"--num_processes={processes}", f"--process_id={i}",
                       "--coordinator_timeout=60"] if processes > 1 else []
    procs = [subprocess.Popen([sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
                               f"--corpus={corpus}", f"--out={out}", "--batch_size=32",
                               *multi(i), *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=REPO) for i in range(processes)]
    return [(p.wait(timeout=300), p.stdout.read()) for p in procs]


def last_line(log: str) -> str:
    """The command's last line (gloo's own C++ log lines, which may come after it, left
    out); there must be no traceback."""
    assert "Traceback" not in log, log[-3000:]
    return [line for line in log.strip().splitlines() if not line.startswith("[Gloo]")][-1]


@pytest.mark.slow
def test_two_processes_index_as_one(bundle, tmp_path):
    """2 x 4 devices: each process reads its own byte range and writes its shard; the
    index answers every query with the one-process index's ids and scores; then a shard
    missing, one from another build, a stray one and a changed file are refused by name."""
    import dualjax
    from dualjax.serve.corpus_index import CorpusIndex
    corpus = write_corpus(tmp_path / "corpus.tsv", 900)
    one, two = tmp_path / "one", tmp_path / "two"
    [(code, out)] = index_command(bundle, corpus, one, 1, ["--kind=exact"])
    assert code == 0, out[-3000:]
    results = index_command(bundle, corpus, two, 2, ["--kind=exact"])
    assert [c for c, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert "2 shard(s)" in results[0][1] and "documents" not in results[1][1]
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv", "one", "two"]  # nothing else left

    encoder = dualjax.Encoder.load(bundle)
    a, b = CorpusIndex(str(one), encoder.id), CorpusIndex(str(two), encoder.id)
    assert b.meta["shards"][0] > 300 and b.meta["shards"][1] > 300
    assert sum(b.meta["shards"]) == a.meta["n"] == 900 - len(range(0, 900, 97))
    assert list(b.ids) == list(a.ids) and list(b.texts) == list(a.texts)
    queries = encoder.encode_queries(["how do i bike", "rice coffee bread", "swim river"])
    (sa, ia), (sb, ib) = a.search(queries, 20), b.search(queries, 20)
    np.testing.assert_array_equal(ib, ia)
    np.testing.assert_allclose(sb, sa, atol=1e-5)
    np.testing.assert_allclose(  # the vectors too, shard by shard
        np.concatenate([np.load(f"{f}/embeddings.npy") for f in b.folders]),
        np.load(f"{a.folders[0]}/embeddings.npy"), atol=1e-6)

    s1 = "shard-00001-of-00002"
    broken = tmp_path / "broken"
    for change, message in [
            (lambda d: shutil.rmtree(d / s1), f"{s1}: missing; the index has 2 shard"),
            (lambda d: _rewrite(d / s1 / "shard.json", run="123-0000abcd"),
             f"{s1} was written by another build"),
            (lambda d: _rewrite(d / s1 / "shard.json", encoder_id="0" * 16),
             f"{s1} was encoded with encoder 0000000000000000"),
            (lambda d: _rewrite(d / s1 / "shard.json", build={
                **json.loads((d / s1 / "shard.json").read_text())["build"], "quantize": "int8"}),
             f"{s1} was built with another quantize than the index"),
            (lambda d: shutil.copytree(d / s1, d / "shard-00002-of-00003"),
             "shard-00002-of-00003: a shard this index does not list"),
            (lambda d: (d / s1 / "corpus.jsonl").write_text("x"),
             f"{s1}/corpus.jsonl: changed since the index was written")]:
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(two, broken)
        change(broken)
        with pytest.raises(ValueError, match=message):
            CorpusIndex(str(broken), encoder.id)


@pytest.mark.parametrize("flags, names", [
    ([["--quantize=binary"], ["--quantize=int8"]],
     "--quantize: process 0 'binary', process 1 'int8'"),
    (([], ["--corpus={half}"]), "--corpus: process 0 {corpus} (20,770 bytes"),
])
@pytest.mark.slow
def test_processes_given_different_settings_stop_before_anything_is_written(
        bundle, tmp_path, flags, names):
    """They built an index answering from shard 0 only (quantize), or half of each file
    with duplicate ids (corpus): now every process names the flag and both values."""
    corpus = write_corpus(tmp_path / "corpus.tsv", 200)
    half = tmp_path / "half.tsv"
    half.write_text("".join(corpus.read_text().splitlines(True)[:100]))
    extra = [[f.format(half=half) for f in side] for side in flags]
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}", f"--corpus={corpus}",
         f"--out={tmp_path / 'idx'}", "--kind=exact", "--num_processes=2",
         f"--coordinator_address=localhost:{port}", f"--process_id={i}", *extra[i]],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for i in range(2)]
    results = [(p.wait(timeout=120), p.stdout.read()) for p in procs]
    assert [c for c, _ in results] == [1, 1], results[0][1][-2000:]
    want = names.format(corpus=corpus)
    for _, log in results:
        line = last_line(log)
        assert line.startswith(f"dualjax.index: the processes were given different {want}"), line
        assert line.endswith("give every process the same flags (nothing was written)")
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv", "half.tsv"]


def _rewrite(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.slow
def test_a_build_killed_in_every_process_leaves_no_index_and_the_rerun_finishes(bundle,
                                                                               tmp_path):
    """kill -9 of both processes while they encode: no --out (nothing that looks like an
    index), and the same command again removes what they left and builds the index."""
    import signal
    import time
    corpus = write_corpus(tmp_path / "corpus.tsv", 60_000)
    out = tmp_path / "idx"
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}", f"--corpus={corpus}",
         f"--out={out}", "--kind=exact", "--batch_size=16", "--num_processes=2",
         f"--coordinator_address=localhost:{port}", f"--process_id={i}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        for i in range(2)]
    deadline = time.time() + 120
    while time.time() < deadline and not any(  # both have started their shard
            len([e for e in os.listdir(p) if e.startswith("shard-")]) == 2
            for p in tmp_path.glob("idx.tmp*") if p.is_dir()):
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert not out.exists() and [p.name for p in tmp_path.glob("idx.tmp*")]
    results = index_command(bundle, corpus, out, 2, ["--kind=exact"])
    assert [c for c, _ in results] == [0, 0], results[0][1][-3000:]
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv", "idx"]


@pytest.mark.slow
def test_a_bad_line_in_one_process_stops_both_naming_it(bundle, tmp_path):
    """A malformed line in process 1's share: both processes end with that line's error,
    and neither --out nor a staging folder is left."""
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"_id": f"d{i}", "text": f"how do i fix my bike {i}"})
             for i in range(400)]
    lines[350] = '{"_id": "bad", "text": '
    corpus.write_text("\n".join(lines) + "\n")
    results = index_command(bundle, corpus, tmp_path / "idx", 2, ["--kind=exact"])
    assert [c for c, _ in results] == [1, 1]
    last = [last_line(out) for _, out in results]
    assert last[1] == f"dualjax.index: {corpus}:351: malformed JSON: " \
        "Expecting value: line 1 column 24 (char 23)", last
    assert last[0] == f"dualjax.index: process 1: {corpus}:351: malformed JSON: " \
        "Expecting value: line 1 column 24 (char 23)", last
    assert sorted(os.listdir(tmp_path)) == ["corpus.jsonl"]


@pytest.mark.slow
def test_a_duplicate_id_across_shards_is_named_with_both_lines(bundle, tmp_path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"d{i % 299}\thow do i fix my bike {i}\n" for i in range(300)))
    results = index_command(bundle, corpus, tmp_path / "idx", 2, ["--kind=exact"])
    assert [c for c, _ in results] == [1, 1]
    assert last_line(results[0][1]) == \
        f"dualjax.index: {corpus}:300: duplicate id 'd0' (first at line 1)"
    assert "process 0 could not finish the index" in results[1][1]
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv"]


@pytest.mark.slow
def test_a_coordinator_that_does_not_answer_is_one_line(bundle, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.tsv", 20)
    port = free_port()
    out = subprocess.run(
        [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}", f"--corpus={corpus}",
         f"--out={tmp_path / 'idx'}", f"--coordinator_address=localhost:{port}",
         "--num_processes=2", "--process_id=1", "--coordinator_timeout=2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"dualjax.index: --coordinator_address=localhost:{port}: the 2 processes did not all "
        "join within 2s (is every process started, with the same address?); nothing was "
        "written"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv"]


def test_a_bundle_encodes_on_several_devices_as_on_one(bundle):
    """Batches dealt to 4 devices in turn (what dualjax.index does with a process' local
    devices) give the one device's vectors, in the texts' order."""
    import jax

    import dualjax
    encoder = dualjax.Encoder.load(bundle)
    texts = [f"how do i {' '.join(WORDS[:1 + i % 11])} {i}" for i in range(37)]
    one = encoder.encode_documents(texts, batch_size=4)
    devices = jax.devices()[:4]
    assert len(devices) == 4
    np.testing.assert_allclose(encoder.encode_documents(texts, batch_size=4, devices=devices),
                               one, atol=1e-6)
    assert set(encoder._device_params) == set(devices)  # one copy of the params each


def test_the_process_flags_are_in_the_index_commands_help():
    out = subprocess.run([sys.executable, "-m", "dualjax.index", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0
    for flag in ("--coordinator_address", "--num_processes", "--process_id", "--distributed",
                 "--coordinator_timeout"):
        assert flag in out.stdout, flag


@pytest.mark.slow
def test_an_out_that_process_0_refuses_stops_every_process_in_one_line(bundle, tmp_path):
    """--out already an index, no --overwrite: process 0 says so, process 1 says process 0
    refused; both exit 1 at once (no process left waiting), the index is as it was."""
    corpus = write_corpus(tmp_path / "corpus.tsv", 50)
    out = tmp_path / "idx"
    [(code, log)] = index_command(bundle, corpus, out, 1, ["--kind=exact"])
    assert code == 0, log[-2000:]
    before = (out / "index.json").read_text()
    results = index_command(bundle, corpus, out, 2, ["--kind=exact"])
    assert [c for c, _ in results] == [1, 1]
    last = [last_line(log) for _, log in results]
    assert last[0] == f"dualjax.index: --out={out} already holds a corpus index: pass " \
        "--overwrite to replace it", last
    assert last[1] == f"dualjax.index: process 0 refused --out={out} (its log says why); " \
        "nothing was written", last
    assert (out / "index.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv", "idx"]
