"""Files that are whole or absent: atomic writes, digests that say a folder is the one
that was written, one writer per output folder (`Lock`, `staged_output`: written beside
it, then renamed), and the checks that keep an --out from replacing what it must not
(`check_output`). Used by every stage that writes (the workdir, the tokenizers, the
bundle, the corpus index).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from absl import logging

from dualjax.errors import OutputError, WorkdirError
from dualjax.runtime import peers

# A full disk, a quota, a read-only or unwritable file system: Python's errnos, and how
# it shows in Orbax / TensorStore errors (a ValueError carrying the status).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)


DISK_STATUS = ("RESOURCE_EXHAUSTED", "No space left", "PERMISSION_DENIED", "Read-only file")


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: a reader (or a run
    killed meanwhile) sees the old file or the new one, never half of one."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


SETTLED_S = 2.0  # a file last modified this long ago: its digest is kept (`sha256_of`)
_DIGESTS: dict[tuple, str] = {}


def sha256_of(path: str | os.PathLike) -> str:
    """sha256 hex of a file's bytes. A run reads the digests of its data and weight
    files several times (the tables' names, the workdir's record, the start's identity:
    seven reads of the pairs file and the weights before the first table); a file
    last modified SETTLED_S or more before is read once a process, while its size,
    modification time and inode stay the same (a rewrite gives it a newer time; the
    workdir's record trusts the same between runs, `train/workdir.check_data`)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if time.time_ns() - st.st_mtime_ns >= SETTLED_S * 1e9:
        _DIGESTS[key] = digest
    return digest


def file_digests(folder: str, names: Sequence[str]) -> dict[str, str]:
    """{name: sha256 hex of folder/name} (a file's name and bytes: what a bundle or an
    index records, and checks when loaded)."""
    return {name: sha256_of(os.path.join(folder, name)) for name in names}


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
OUTPUT_MARKERS = {"bundle": "encoder.json", "corpus index": "index.json",
                  "sentence-transformers folder": "dualjax_export.json"}


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

    def remove() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
    # (a process of several, ended while blocked in a collective: runtime/peers.py)
    forget = watcher.on_stop(remove) if (watcher := peers.active()) is not None else lambda: None
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
        forget()
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


END = "_end"  # the key of the record a whole JSONL file ends with (`write_records`)


def write_records(path: str | os.PathLike, rows: Sequence[Any]) -> None:
    """`rows` as JSON lines, then an end record {"_end": {"count", "sha256"}} of the
    lines before it, written atomically: `read_records` knows the file whole. For the
    files a run makes and a resume reads back (pseudo-labels, teacher scores): one cut
    at a line end would parse, and be trained on, as fewer records."""
    body = "".join(json.dumps(r) + "\n" for r in rows)
    end = {END: {"count": len(rows), "sha256": hashlib.sha256(body.encode()).hexdigest()}}
    atomic_write(path, body + json.dumps(end) + "\n")


def read_records(path: str | os.PathLike) -> tuple[list[Any] | None, str]:
    """(the rows, "") of a file `write_records` wrote, or (None, why) when it is not
    whole: cut short, changed since, or without an end record (cut there, or written
    before files had one)."""
    with open(path, "rb") as f:
        data = f.read()
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    body = body + b"\n" if body else b""
    try:
        end = json.loads(last)[END]
        count, digest = int(end["count"]), str(end["sha256"])
    except (ValueError, KeyError, TypeError):
        return None, "no end record (cut short, or written before files had one)"
    if hashlib.sha256(body).hexdigest() != digest:
        return None, "its records are not those its end record counts (cut or changed)"
    rows = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
    if len(rows) != count:
        return None, f"{len(rows)} records where its end record says {count}"
    return rows, ""


def has_state(workdir: str) -> bool:
    """Whether the workdir holds what a run trained or built: a vocabulary or a checkpoint."""
    return os.path.exists(os.path.join(workdir, "vocab.json")) or has_checkpoint(workdir)


def has_checkpoint(workdir: str) -> bool:
    """Whether the workdir holds a checkpoint (a run trained in it)."""
    ckpts = os.path.join(workdir, "checkpoints")
    return os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts))


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
