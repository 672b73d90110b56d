"""One workdir, one run, one config: the lock, the saved config, atomic writes, and the
run's signal handling (`Signals`, `Preempted`).

`guard(workdir, config)` wraps a run: it creates the workdir, takes its lock (a second run
on the same workdir is refused, naming the holder; the lock is released on every exit
path, and the kernel releases it when its holder dies, so a killed run never blocks the
next one), compares the config with the one the run started with, and writes
WORKDIR/config.json. A workdir that holds trained state (a vocabulary or a checkpoint)
keeps its config: keys that shape the run (model, tokenizer, data, batch, loss,
optimizer, seed) cannot change on resume, and a difference is refused before any file
is touched, listing old and new values. Cadences, the number of steps, the mesh and
`eval.*` may change; the changes are logged and config.json records the new values.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import re
import socket
import threading
import time
from typing import Any, Callable, Iterator, Sequence, TypeVar

import ml_collections
import numpy as np
from absl import logging

T = TypeVar("T")

# Keys (or groups, ending in ".") that may change when a run resumes.
RESUMABLE = ("num_train_steps", "checkpoint_every_steps", "keep_checkpoints",
             "eval_every_steps", "log_every_steps", "init_from", "mesh.", "eval.",
             "loss.column_block", "train.encode_chunks",  # memory only: the same loss and gradients
             "data.worker_count", "data.prefetch_batches", "data.tfds_dir")


# A full disk, a quota, a read-only or unwritable file system: Python's errnos, and how
# it shows in Orbax / TensorStore errors (a ValueError carrying the status).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
DISK_STATUS = ("RESOURCE_EXHAUSTED", "No space left", "PERMISSION_DENIED", "Read-only file")


class WorkdirError(Exception):
    """The workdir cannot be used for this run; the message says why and what to do."""


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: a reader (or a run
    killed meanwhile) sees the old file or the new one, never half of one."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def file_digests(folder: str, names: Sequence[str]) -> dict[str, str]:
    """{name: sha256 hex of folder/name} (a file's name and bytes: what a bundle or an
    index records, and checks when loaded)."""
    out = {}
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def files_under(folder: str) -> list[str]:
    """Every file below `folder`, as sorted paths relative to it ("scann/meta.json")."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def verify_digests(folder: str, recorded: dict[str, str], what: str) -> None:
    """ValueError naming the first file of `recorded` that is missing or changed."""
    for name, digest in sorted(recorded.items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ValueError(f"{path}: missing from the {what}")
        if file_digests(folder, [name])[name] != digest:
            raise ValueError(f"{path}: changed since the {what} was written (sha256 differs "
                             f"from its record); make the {what} again")


class OutputError(ValueError):
    """An output folder that may not be written: the message names it and says why."""


def check_output(out: str, marker: str, what: str, inputs: Sequence[str] = (),
                 overwrite: bool = False) -> None:
    """Refuses, before any work, an `out` folder that would lose something: one that is
    or holds one of `inputs` (a new folder inside one is fine); an existing file; a
    folder that is not already a `what` (it has no `marker` file); and an existing
    `what` unless `overwrite`."""
    if not out:
        raise OutputError(f"--out is empty: name the {what}'s folder")
    full = os.path.realpath(out)
    for given in inputs:
        source = os.path.realpath(given)
        if full == source or source.startswith(full + os.sep):
            raise OutputError(f"--out={out} would write over its own input {given}: choose "
                              "another folder")
    if os.path.lexists(full) and not os.path.isdir(full):
        raise OutputError(f"--out={out} is a file, not a folder")
    if os.path.isdir(full) and os.listdir(full):
        if not os.path.isfile(os.path.join(full, marker)):
            raise OutputError(f"--out={out} exists and is not a {what} (no {marker}): "
                              "choose an empty or new folder")
        if not overwrite:
            raise OutputError(f"--out={out} already holds a {what}: pass --overwrite to "
                              "replace it")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise OutputError(f"--out={out}: its parent folder {parent} does not exist")


@contextlib.contextmanager
def staged_output(out: str) -> Iterator[Callable[[], str]]:
    """One writer for the folder `out` (export's bundle, index's corpus index): holds its
    lock (`Lock(output=out)`: a second command into the same --out is refused at once,
    naming the first), removes what dead writers left beside it (`out.tmp<pid>` of a
    process that no longer runs: a kill -9), and yields `stage()`, which makes the
    folder to write into, `out.tmp<pid>`. When the block ends, that folder is put at
    `out` (`replace_folder`); when it fails, it is removed and `out` is as it was."""
    parent = os.path.dirname(os.path.abspath(out.rstrip(os.sep)))
    if not os.path.isdir(parent):
        raise OutputError(f"--out={out}: its parent folder {parent} does not exist")
    lock = Lock(output=out)
    lock.acquire()
    tmp = f"{out.rstrip(os.sep)}.tmp{os.getpid()}"
    try:
        _remove_dead_writers(out)

        def stage() -> str:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            return tmp
        yield stage
        if os.path.isdir(tmp):
            replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        lock.release()


def _remove_dead_writers(out: str) -> None:
    """Removes `out.tmp<pid>` and `out.old<pid>` folders whose process is gone."""
    base = out.rstrip(os.sep)
    parent, name = os.path.split(os.path.abspath(base))
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        match = re.fullmatch(re.escape(name) + r"\.(?:tmp|old)(\d+)", entry)
        if match and not _alive(int(match.group(1))):
            logging.warning("removing %s, left by process %s, which no longer runs",
                            os.path.join(parent, entry), match.group(1))
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def replace_folder(tmp: str, out: str) -> None:
    """Puts the finished folder `tmp` at `out` (a folder `check_output` allowed), the old
    one moved aside first and removed only once the new one is in place."""
    old = f"{out.rstrip(os.sep)}.old{os.getpid()}"
    if os.path.isdir(out):
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def atomic_json(path: str | os.PathLike, payload: Any, **dump_args: Any) -> None:
    atomic_write(path, json.dumps(payload, **dump_args) + "\n")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"model.tower": ..., ...}: a nested dict's leaves by dotted key (an empty dict is
    a leaf)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _resumable(key: str) -> bool:
    key = key.split(".", 2)[-1] if key.startswith("tasks.") else key  # tasks.<name>.data...
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


def has_state(workdir: str) -> bool:
    """Whether the workdir holds what a run trained or built: a vocabulary or a checkpoint."""
    ckpts = os.path.join(workdir, "checkpoints")
    return os.path.exists(os.path.join(workdir, "vocab.json")) or (
        os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts)))


def config_changes(saved: dict, config: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed): "key: old -> new" for each key that differs (a key the saved
    config lacks counts as unchanged at an off value: 0, "" or False)."""
    old, new = flatten(saved), flatten(config)
    refused, allowed = [], []
    for key in sorted(set(old) | set(new)):
        if key not in old and new[key] in (0, "", None):  # a key added since, left off
            continue
        if old.get(key, "(absent)") != new.get(key, "(absent)"):
            change = f"{key}: {old.get(key, '(absent)')!r} -> {new.get(key, '(absent)')!r}"
            (allowed if _resumable(key) else refused).append(change)
    return refused, allowed


def check_and_write_config(workdir: str, config: ml_collections.ConfigDict,
                           write: bool = True) -> None:
    """Refuses a config that differs from the workdir's in keys that shape the run (when
    the workdir holds trained state); writes config.json (with `write`)."""
    path = os.path.join(workdir, "config.json")
    current = config.to_dict()
    if os.path.exists(path) and has_state(workdir):
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as e:
            raise WorkdirError(f"{path}: unreadable ({e}); it records the config this run "
                               "started with") from None
        refused, allowed = config_changes(saved, current)
        if refused:
            raise WorkdirError(
                f"{workdir} holds a run started with another config, and these keys cannot "
                f"change when it resumes: {'; '.join(refused)}. Use another --workdir, or "
                "give the old values back")
        if allowed and write:
            logging.info("Resuming %s with changed settings: %s", workdir, "; ".join(allowed))
    if write:
        atomic_json(path, current, indent=2, sort_keys=True)


class Lock:
    """An exclusive lock on WORKDIR/.lock (flock), with the holder's pid and host in it;
    `output=` the lock of a command's --out folder (`staged_output`) instead."""

    def __init__(self, workdir: str = "", output: str = ""):
        if output:
            out = os.path.abspath(output.rstrip(os.sep))
            self.path = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.lock")
            self.what, self.hint = f"--out={output}", "or choose another --out"
        else:
            self.path = os.path.join(workdir, ".lock")
            self.what, self.hint = os.path.dirname(self.path), "or use another --workdir"
        self.remove = bool(output)  # beside the user's folders: not left behind
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                error = OutputError if self.remove else WorkdirError  # the commands' own
                raise error(f"{self.what} is in use by {holder}; wait for that run to "
                            f"end (or stop it), {self.hint}") from None
            if self._is_current(fd):
                break
            os.close(fd)  # locked a file its holder had just removed: take the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        self._fd = fd

    def _is_current(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            if self.remove:  # removed while held: a later writer locks a new file
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


MARKER = ".dualjax"  # written into every workdir once its config is: the folder is a run's
_OWN = {".lock", "tfds"}  # what dualjax may put in a workdir before its config (data tables)


def check_is_workdir(workdir: str) -> None:
    """WorkdirError for a folder that is not a dualjax workdir and is not empty (a user's
    own files, which a run would overwrite), before anything is written. A workdir is a
    folder with MARKER, or one a run made before the marker existed: with a vocabulary or
    a checkpoint, or a config.json of dualjax's (its model, data and eval groups)."""
    if not os.path.isdir(workdir) or not set(os.listdir(workdir)) - _OWN:
        return  # new, empty, or holding only a run's lock and data tables
    if os.path.exists(os.path.join(workdir, MARKER)) or has_state(workdir):
        return
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            if {"model", "data", "eval"} <= set(json.load(f)):
                return
    except (OSError, ValueError, TypeError):
        pass
    shown = ", ".join(sorted(set(os.listdir(workdir)) - _OWN)[:4])
    raise WorkdirError(f"--workdir={workdir} holds files that are not a dualjax run's "
                       f"({shown}, ...): choose a new or empty folder")


@contextlib.contextmanager
def guard(workdir: str, config: ml_collections.ConfigDict) -> Iterator[None]:
    """Creates and locks the workdir, checks and writes its config; releases the lock
    however the body ends. Of several processes (a multi-host run), process 0 does this;
    the others then check the config it wrote, read-only."""
    lock = Lock(workdir)

    def take() -> None:
        if not is_main():
            check_and_write_config(workdir, config, write=False)
            return
        check_is_workdir(workdir)
        try:
            os.makedirs(workdir, exist_ok=True)
            lock.acquire()
        except OSError as e:
            raise WorkdirError(f"{workdir}: cannot use it as a workdir: {e.strerror or e}"
                               ) from None
        try:
            check_and_write_config(workdir, config)
            if not os.path.exists(os.path.join(workdir, MARKER)):  # once the config holds
                atomic_write(os.path.join(workdir, MARKER), "a dualjax workdir\n")
        except BaseException:
            lock.release()
            raise

    main_first(take)
    try:
        yield
    finally:
        lock.release()


# ----------------------------------------------------------------------------- processes
# A multi-host run is one program per host (jax.distributed): process 0 prepares data and
# writes the workdir's files; the others read what it wrote; every decision that changes
# which collectives run next is process 0's (`agree`), so no process waits on the others.

def is_main() -> bool:
    """Whether this process writes the workdir's files (process 0)."""
    import jax
    return jax.process_index() == 0


def agree(flag: bool) -> bool:
    """Process 0's `flag`, in every process (a collective: all processes call it)."""
    import jax
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))


def any_process(flag: bool) -> bool:
    """Whether `flag` holds in any process (a collective: all processes call it)."""
    import jax
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))


def main_first(fn: Callable[[], T]) -> T:
    """fn() in process 0, then in the others (which then read what it wrote, a dataset
    or a vocabulary); if it fails in process 0, the others stop too, with one line."""
    import jax
    if jax.process_count() == 1:
        return fn()
    if is_main():
        try:
            out = fn()
        except BaseException:
            agree(False)
            raise
        agree(True)
        return out
    if not agree(False):
        raise WorkdirError("process 0 stopped (its log says why); this process stops too")
    return fn()


class Preempted(Exception):
    """SIGTERM or SIGINT stopped the run (during training, after saving a checkpoint);
    running the same command again resumes from the last checkpoint."""


class Signals:
    """SIGTERM and SIGINT (Ctrl-C) for the whole run. While `deferring` (the training
    loop), the first one is only recorded (`received`): the loop saves at the end of the
    step and stops; a second one stops at once (KeyboardInterrupt). Elsewhere (data
    preparation, compilation, evaluation) one stops the run at once with `Preempted`,
    saying what `stage` was interrupted. Handlers can only be set from the main thread;
    from another thread the run simply has none."""

    def __init__(self):
        self.received: str | None = None
        self.deferring = False
        self.stage = "before training; nothing was saved"
        self._previous: dict = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle)
                              for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if not self.deferring:
            raise Preempted(f"{name}: stopped {self.stage}; run the same command again "
                            "to resume")
        if self.received:  # asked twice: stop now, without saving
            raise KeyboardInterrupt
        self.received = name
        logging.warning("%s: saving a checkpoint after this step (send it again to stop at "
                        "once)", name)
