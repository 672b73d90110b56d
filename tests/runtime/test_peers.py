"""The processes of a multi-process command end together, each in one line: a signal to
any one of them, a process killed, a coordinator port taken, process flags that cannot
form a run (`runtime/peers.py`, `cli.init_processes`)."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO
from helpers import free_port, write_corpus

from dualjax import cli
from dualjax.errors import UsageError


def start_index(bundle, corpus, out, extra=(), processes=2):
    """`dualjax.index` as two processes of 2 CPU devices; (port, processes)."""
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}", f"--corpus={corpus}",
         f"--out={out}", "--kind=exact", "--batch_size=8", f"--num_processes={processes}",
         f"--coordinator_address=localhost:{port}", f"--process_id={i}", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for i in range(processes)]
    return port, procs


def said(log: str) -> list[str]:
    """What a process said: its lines but absl's log lines and gloo's. Gloo writes
    "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks
    is : 1" from C++, in pieces that can land between ours or split across lines
    ("[Gloo] Rank " on one, "1 is connected ..." on the next), so its pieces are taken
    out of the text wherever they are first."""
    log = _GLOO.sub("", log)
    return [line.strip() for line in log.strip().splitlines()
            if line.strip() and not line.startswith(("I1", "W1", "E1"))]


_GLOO = re.compile(r"\[Gloo\] Rank( \d+)? ?|(\d+ )?is connected to \d+ peer ranks\. ?"
                   r"|Expected number of connected peer ranks is : \d+")


def encoding(tmp_path, timeout=120) -> None:
    """Waits until both processes write their shard (both are encoding)."""
    deadline = time.time() + timeout
    while time.time() < deadline and not any(
            len([e for e in os.listdir(p) if e.startswith("shard-")]) == 2
            for p in tmp_path.glob("idx.tmp*") if p.is_dir()):
        time.sleep(0.05)


@pytest.mark.parametrize("who", [0, 1])
@pytest.mark.slow
def test_a_sigterm_to_one_process_ends_both_in_one_line_each(bundle, tmp_path, who):
    """jax's preemption notifier swallowed it (the build ran on and exited 0): now the
    process signalled and the other end at once, 143, one line each, nothing left."""
    corpus = write_corpus(tmp_path / "corpus.tsv", 60_000)
    _, procs = start_index(bundle, corpus, tmp_path / "idx")
    encoding(tmp_path)
    procs[who].send_signal(signal.SIGTERM)
    outs = [(p.wait(timeout=60), p.stdout.read()) for p in procs]
    assert [code for code, _ in outs] == [143, 143], outs[0][1][-2000:] + outs[1][1][-2000:]
    other = 1 - who
    assert said(outs[who][1]) == [
        "dualjax.index: stopped by SIGTERM; nothing half-written was kept"]
    assert said(outs[other][1]) == [
        f"dualjax.index: process {who} was stopped by SIGTERM; this process stops too; "
        "nothing half-written was kept"]
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv"]  # no staging folder, no lock


def test_a_shard_lost_with_the_staging_folder_stops_for_the_other_process(tmp_path,
                                                                           monkeypatch):
    """Process 0, signalled, removes the staging folder while process 1 still writes its
    shard there: process 1's write fails on a missing file, and it must stop for process
    0's signal (143, its line), not for that file (exit 1: the race the SIGTERM test
    above met one run in a few)."""
    from dualjax.errors import PeerStopped
    from dualjax.runtime import peers
    from dualjax.serve import indexing
    lost = FileNotFoundError(2, "No such file or directory")
    stage = tmp_path / "idx.tmp1"
    stage.mkdir()  # a failure of its own: said to the others in its error file
    assert indexing._shard_failed(ValueError("line 3: no text"), str(stage), 1).args == (
        "line 3: no text",)
    assert (stage / "error-1.txt").read_text() == "line 3: no text"
    reason = "process 0 was stopped by SIGTERM; this process stops too"
    watcher = type("Watcher", (), {"await_stop": lambda self: reason})()
    monkeypatch.setattr(peers, "active", lambda: watcher)
    with pytest.raises(PeerStopped, match=reason):
        indexing._shard_failed(lost, str(tmp_path / "gone"), 1)
    monkeypatch.setattr(peers, "active", lambda: None)  # one process: its own error
    assert indexing._shard_failed(lost, str(tmp_path / "gone"), 1) is lost


@pytest.mark.parametrize("who", [0, 1])
@pytest.mark.slow
def test_a_process_killed_is_noticed_in_seconds_and_said_in_one_line(bundle, tmp_path, who):
    """kill -9 of one process: the other waited for jax's 100 s heartbeat, then aborted
    with two tracebacks and a C++ stack (process 1 killed), or aborted at once with a
    C++ stack (process 0 killed, and the coordination service with it). Now the other
    ends within --peer_timeout, in one line, exit 1."""
    corpus = write_corpus(tmp_path / "corpus.tsv", 60_000)
    _, procs = start_index(bundle, corpus, tmp_path / "idx", ["--peer_timeout=3"])
    encoding(tmp_path)
    procs[who].send_signal(signal.SIGKILL)
    killed = time.time()
    other = procs[1 - who]
    code, log = other.wait(timeout=60), other.stdout.read()
    took = time.time() - killed
    procs[who].wait()
    assert code == 1, log[-3000:]
    assert said(log) == [
        f"dualjax.index: process {who} stopped answering for 3 s (killed, or its host is "
        "down); this process stops too; nothing half-written was kept"], log[-3000:]
    assert took < 20
    if who == 1:  # process 0 removed its staging folder; a killed process 0 could not
        assert sorted(os.listdir(tmp_path)) == ["corpus.tsv"]


@pytest.mark.slow
def test_a_coordinator_port_in_use_is_one_line(bundle, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.tsv", 20)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
             f"--corpus={corpus}", f"--out={tmp_path / 'idx'}",
             f"--coordinator_address=localhost:{port}", "--num_processes=2",
             "--process_id=0"], capture_output=True, text=True, timeout=120, cwd=REPO,
            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 1
    assert said(out.stderr) == [
        f"dualjax.index: --coordinator_address=localhost:{port}: port {port} is already in "
        "use on this host (another run's coordinator?): choose another port"], out.stderr
    assert sorted(os.listdir(tmp_path)) == ["corpus.tsv"]


@pytest.mark.parametrize("args, message", [
    (("--num_processes=0", "--process_id=0"),
     "--num_processes=0: give how many processes run the command, at least 1"),
    (("--num_processes=2", "--process_id=2"), "--process_id=2: give 0 to 1 (--num_processes=2)"),
    (("--num_processes=2", "--process_id=-1"),
     "--process_id=-1: give 0 to 1 (--num_processes=2)"),
    (("--num_processes=2",), "--coordinator_address, --num_processes and --process_id go "
                             "together (or --distributed alone)"),
])
def test_process_flags_that_cannot_form_a_run_are_refused_by_name(args, message):
    flags = dict(a.removeprefix("--").split("=") for a in args)
    address = "localhost:1234" if len(args) > 1 else None
    with pytest.raises(UsageError) as e:
        cli._check_process_flags(address, int(flags["num_processes"]),
                                 int(flags["process_id"]) if "process_id" in flags else None)
    assert str(e.value) == message


@pytest.mark.slow
def test_process_flag_refusals_and_distributed_alone_say_one_line_not_the_usage(bundle,
                                                                                tmp_path):
    """absl's UsageError printed 57 lines of usage before the reason; --distributed
    outside a cluster said only "coordinator_address should be defined"."""
    for args, message in [
            (["--coordinator_address=localhost:1234", "--num_processes=2", "--process_id=5"],
             "dualjax.index: --process_id=5: give 0 to 1 (--num_processes=2)"),
            (["--distributed"], "dualjax.index: --distributed: no cluster found in the "
                                "environment (a Cloud TPU pod slice, SLURM, Open MPI, ...) to "
                                "take the processes from (coordinator_address should be "
                                "defined); elsewhere give --coordinator_address, "
                                "--num_processes and --process_id")]:
        out = subprocess.run(
            [sys.executable, "-m", "dualjax.index", f"--encoder={bundle}",
             f"--corpus={tmp_path}/c.tsv", f"--out={tmp_path / 'idx'}", *args],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert (out.returncode, said(out.stderr)) == (1, [message]), out.stderr


def test_a_second_announcer_waits_until_the_stop_is_with_the_service():
    """The CI failure of 2026-11-29: a SIGTERM reached the watcher (which sends it) and
    the main thread's handler (which exits): the process exited while the watcher's
    message was in flight, and the other process read a dead process (exit 1), not a
    signal (143). Now the second announcer returns only once the message has landed."""
    import threading

    from dualjax.runtime import peers

    class SlowClient:  # the coordination service, answering when `answer` is set
        def __init__(self):
            self.store, self.answer = {}, threading.Event()

        def key_value_set(self, key, value, allow_overwrite=False):
            self.answer.wait(10)
            self.store[key] = value

    client = SlowClient()
    p = peers.Peers(client, me=1, count=2, command="dualjax.index", timeout=10)
    watcher = threading.Thread(target=p.announce, args=("SIGTERM",))
    watcher.start()
    while p.signal is None:  # the watcher's message is in flight
        time.sleep(0.001)
    second = []
    handler = threading.Thread(target=lambda: second.append(
        (p.announce("SIGTERM"), dict(client.store))))
    handler.start()
    time.sleep(0.2)
    assert not second  # still waiting for the first message
    client.answer.set()
    watcher.join(5)
    handler.join(5)
    assert second == [(False, {f"{peers.PREFIX}stop/1": "SIGTERM"})]


class _Store:
    """The coordination service's key-value store, failing its first `failures` writes."""
    def __init__(self, failures=0):
        self.store, self.failures = {}, failures

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("UNAVAILABLE: the service is busy")
        self.store[key] = value


def test_a_stop_the_service_does_not_take_at_once_is_sent_again():
    """A stop lost to one failed write read as a dead process to the others: exit 1 after
    --peer_timeout, not the signal's 143 (a CI run's failure of the SIGTERM test)."""
    from dualjax.runtime import peers
    client = _Store(failures=3)
    p = peers.Peers(client, me=0, count=2, command="dualjax.index", timeout=10)
    assert p.announce("SIGTERM")
    assert client.store == {f"{peers.PREFIX}stop/0": "SIGTERM"}


def test_a_sigterm_tells_the_others_before_the_command_cleans_up(monkeypatch):
    """The handler announces, then raises: a cleanup that meets a collective (process 0
    telling the others it refused) then stops there (leaving) instead of waiting in it
    for processes still encoding."""
    from dualjax.errors import Terminated
    from dualjax.runtime import peers
    client = _Store()
    p = peers.Peers(client, me=1, count=2, command="dualjax.index", timeout=10)
    monkeypatch.setattr(peers, "_active", p)
    with pytest.raises(Terminated):
        cli._terminate(signal.SIGTERM, None)
    assert client.store == {f"{peers.PREFIX}stop/1": "SIGTERM"}
    assert peers.leaving() == "stopped by SIGTERM"
