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

It also records the identity of the run's input files (`check_data`, WORKDIR/data.json:
each file's path, size, modification time and sha256), and refuses to resume on files
whose content changed since, unless the run's `data.rebuild` says to.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
             "data.worker_count", "data.prefetch_batches", "data.tfds_dir",
             "data.rebuild")  # accepts changed input files once (check_data)


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
                 overwrite: bool = False, not_inside: Sequence[str] = ()) -> None:
    """Refuses, before any work, an `out` folder that would lose something: one that is
    or holds one of `inputs` (a new folder inside one is fine); one inside a folder of
    a kind in `not_inside` (`folder_kind`: a bundle or an index, which an --overwrite
    replaces whole, or a run's workdir); an existing file; a folder that is not already
    a `what` (it has no `marker` file); a `what` holding a file its `marker` does not
    record (an index put inside a bundle, a user's file), which replacing the folder
    would delete; and an existing `what` unless `overwrite`."""
    if not out:
        raise OutputError(f"--out is empty: name the {what}'s folder")
    full = os.path.realpath(out)
    for given in inputs:
        source = os.path.realpath(given)
        if full == source or source.startswith(full + os.sep):
            raise OutputError(f"--out={out} would write over its own input {given}: choose "
                              "another folder")
    folder = os.path.dirname(full)
    while not_inside:
        kind = folder_kind(folder)
        if kind in not_inside:
            why = ("a run's folder holds what the run writes" if kind == "workdir" else
                   f"replacing that {kind} (--overwrite) would delete it")
            raise OutputError(f"--out={out} is inside the {kind} {folder}: {why}; choose a "
                              "folder outside it")
        if folder == os.path.dirname(folder):
            break
        folder = os.path.dirname(folder)
    if os.path.lexists(full) and not os.path.isdir(full):
        raise OutputError(f"--out={out} is a file, not a folder")
    if os.path.isdir(full) and os.listdir(full):
        if not os.path.isfile(os.path.join(full, marker)):
            raise OutputError(f"--out={out} exists and is not a {what} (no {marker}): "
                              "choose an empty or new folder")
        foreign = _unrecorded(full, marker)
        if foreign is None:
            raise OutputError(f"--out={out}: its {marker} does not list the {what}'s files "
                              "(unreadable, or an older format), so replacing the folder "
                              f"could delete files that are not the {what}'s: remove it "
                              "yourself, or choose another folder")
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise OutputError(f"--out={out} holds {foreign[0]}{more}, which is not the "
                              f"{what}'s ({marker} does not record it): replacing the folder "
                              "would delete it; move it out, or choose another folder")
        if not overwrite:
            raise OutputError(f"--out={out} already holds a {what}: pass --overwrite to "
                              "replace it")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise OutputError(f"--out={out}: its parent folder {parent} does not exist")


# The files that mark a command's output folder; each records the others it wrote.
OUTPUT_MARKERS = {"bundle": "encoder.json", "corpus index": "index.json"}


def folder_kind(folder: str) -> str:
    """What `folder` is, by the file that marks it: "bundle", "corpus index", "workdir"
    (MARKER, or a config.json beside a run's vocabulary or checkpoint), else ""."""
    for kind, marker in OUTPUT_MARKERS.items():
        if os.path.isfile(os.path.join(folder, marker)):
            return kind
    if os.path.exists(os.path.join(folder, MARKER)) or (
            os.path.isfile(os.path.join(folder, "config.json")) and has_state(folder)):
        return "workdir"
    return ""


def _unrecorded(folder: str, marker: str) -> list[str] | None:
    """The files under `folder` (relative paths, sorted) that its `marker` JSON does not
    record in its "files", nor is it; None when it records no files."""
    try:
        with open(os.path.join(folder, marker), encoding="utf-8") as f:
            recorded = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return None
    return [name for name in files_under(folder) if name != marker and name not in recorded]


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
def guard(workdir: str, config: ml_collections.ConfigDict,
          data_files: Sequence[DataFile] = ()) -> Iterator[list[str]]:
    """Creates and locks the workdir, checks its config and the identity of its input
    files (`data_files`, `check_data`), then writes both; releases the lock however the
    body ends. Yields the input files accepted as changed (data.rebuild), [] mostly. Of
    several processes (a multi-host run), process 0 does this; the others then check the
    config it wrote, read-only (and yield [])."""
    lock = Lock(workdir)

    def take() -> list[str]:
        if not is_main():
            check_and_write_config(workdir, config, write=False)
            return []
        check_is_workdir(workdir)
        try:
            os.makedirs(workdir, exist_ok=True)
            lock.acquire()
        except OSError as e:
            raise WorkdirError(f"{workdir}: cannot use it as a workdir: {e.strerror or e}"
                               ) from None
        try:
            check_and_write_config(workdir, config, write=False)  # refusals before writes
            changed = check_data(workdir, data_files)
            check_and_write_config(workdir, config)
            if not os.path.exists(os.path.join(workdir, MARKER)):  # once the config holds
                atomic_write(os.path.join(workdir, MARKER), "a dualjax workdir\n")
        except BaseException:
            lock.release()
            raise
        return changed

    changed = main_first(take)
    try:
        yield changed
    finally:
        lock.release()


# ----------------------------------------------------------------------------- data identity
# A workdir's vocabulary, tables and checkpoints are made from its input files. The tables'
# names carry their content's digest (data/builders.py), but the vocabulary is built once:
# a file rewritten at the same path and resumed would train on words the vocabulary has
# never seen. So the workdir records what it was made from, and a resume checks it.

DATA_RECORD = "data.json"  # WORKDIR/data.json: {"files": {path: {key, size, mtime_ns, sha256}}}


@dataclasses.dataclass(frozen=True)
class DataFile:
    """An input file a run reads: the config key that names it ("data.path",
    "tasks.quora.data.pseudo_label_queries"; each file of a BEIR folder under the
    folder's key), its absolute path, and whether its data group's `rebuild` is set."""
    key: str
    path: str
    rebuild: bool = False

    @property
    def rebuild_key(self) -> str:
        return _rebuild_key(self.key)


def _rebuild_key(key: str) -> str:
    """The key that accepts a change of the file `key` names: its data group's `rebuild`
    ("tasks.quora.data.path" -> "tasks.quora.data.rebuild")."""
    return key.rsplit(".", 1)[0] + ".rebuild"


def _identity(path: str, key: str) -> dict[str, Any] | None:
    """{key, size, mtime_ns, sha256} of the file at `path`, None when it is not there."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return {"key": key, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}


def _unchanged_stat(path: str, recorded: dict) -> bool:
    """Whether the file's size and modification time are still the recorded ones (then
    its content is taken as unchanged, without reading it)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns) == (recorded.get("size"), recorded.get("mtime_ns"))


def check_data(workdir: str, files: Sequence[DataFile]) -> list[str]:
    """Compares the run's input files with WORKDIR/data.json and records them there.

    A workdir without trained state (no vocabulary, no checkpoint) records the files as
    they are; so does one that has state but no record (made before data.json: its data
    is taken as found, and it resumes). Otherwise each file is compared with its record:
    the same size and modification time are taken as the same file, without reading it;
    else its sha256 decides (a `touch`, or a rewrite with the same bytes, is accepted and
    its new time recorded). A file whose content changed, that is gone, or that is new
    (a BEIR folder's) is refused with a WorkdirError before anything is written, naming
    the file and the two ways out: a new --workdir, or `data.rebuild=True`.

    `data.rebuild=True` accepts the change and records the new identity. The tables are
    then built from the new files (their names carry the content's digest; the old ones
    stay under WORKDIR/tfds), and what the workdir derived from the data is made again
    (pseudo-labelled pairs). The vocabulary (vocab.json, features.json) is kept: the
    checkpoints' embedding rows are tied to its ids, so a new one would change their shape
    or give each row another word; the run says how many of the new training tokens the
    kept vocabulary does not know. Training resumes from the checkpoint (step, optimizer,
    data position, now over the new table); for a vocabulary of the new data, use a new
    --workdir (`init_from` carries the towers with the old vocabulary, too).

    Args:
        workdir: the run's workdir (process 0's: it writes the record).
        files: every input file the run reads (`tasks.data_files`).

    Returns:
        The paths accepted as changed (only with data.rebuild), in path order.
    """
    path = os.path.join(workdir, DATA_RECORD)
    current = {f.path: f for f in files}
    if not has_state(workdir) or not os.path.exists(path):
        if has_state(workdir):
            logging.info("%s: no record of its input files (a workdir from before %s): "
                         "recording them as they are now", workdir, DATA_RECORD)
        record = {p: _identity(p, f.key) for p, f in sorted(current.items())}
        atomic_json(path, {"files": {p: r for p, r in record.items() if r}}, indent=2)
        return []
    try:
        with open(path) as f:
            saved = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WorkdirError(f"{path}: unreadable ({e}); it records the input files this "
                           f"workdir was made from: remove it to record them as they are "
                           "now") from None
    rebuild = {f.rebuild_key: f.rebuild for f in files}
    files_now: dict[str, dict] = {}
    changed: list[tuple[str, str, str]] = []  # (path, key, what happened)
    for p in sorted(set(saved) | set(current)):
        old, key = saved.get(p), (current[p].key if p in current else saved[p]["key"])
        if old is not None and _unchanged_stat(p, old):
            files_now[p] = old
            continue
        new = _identity(p, key)
        if old is None and new is None:
            continue  # named but absent: the data builders say so, naming the key
        if old is None:
            changed.append((p, key, "is new"))
        elif new is None:
            changed.append((p, key, "is gone"))
        elif new["sha256"] != old["sha256"]:
            changed.append((p, key, f"changed (sha256 {old['sha256'][:12]} -> "
                                    f"{new['sha256'][:12]})"))
        if new is not None:
            files_now[p] = new
    refused = [c for c in changed if not rebuild.get(_rebuild_key(c[1]), False)]
    if refused:
        p, key, what = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise WorkdirError(
            f"{p} ({key}) {what}{more} since {workdir} built its vocabulary, tables and "
            f"checkpoints from it: use a new --workdir, or --config.{_rebuild_key(key)}=True "
            "to rebuild the tables from the new data and train on with the old vocabulary "
            "(docs/training.md)")
    for p, key, what in changed:
        logging.warning("%s (%s) %s: %s=True: the tables are built from it again and "
                        "the vocabulary of %s is kept", p, key, what, _rebuild_key(key),
                        workdir)
    if files_now != saved:
        atomic_json(path, {"files": files_now}, indent=2)
    return [p for p, _, _ in changed]


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
