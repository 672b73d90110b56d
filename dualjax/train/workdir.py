"""One workdir, one run, one config: the workdir's lock and saved config, and the
identity of its input data (the file writes, processes and signals it relies on are in
runtime/).

`guard(workdir, config)` wraps a run: it creates the workdir, takes its lock (a second run
on the same workdir is refused, naming the holder; the lock is released on every exit
path, and the kernel releases it when its holder dies, so a killed run never blocks the
next one), compares the config with the one the run started with, and writes
WORKDIR/config.json. A workdir that holds trained state (a vocabulary or a checkpoint)
keeps its config: keys that shape the run (model, tokenizer, data, batch, loss,
optimizer, seed) cannot change on resume, and a difference is refused before any file
is touched, listing old and new values. Cadences, the number of steps, the mesh and
`eval.*` may change; the changes are logged and config.json records the new values.
Before its first checkpoint a run has trained nothing: a workdir whose run was refused
or stopped then takes a corrected config, and what the run had made from the keys that
changed (the vocabulary, pseudo-labels, teacher scores, metrics) is made again
(`start_over`).

It also records the identity of the run's input files (`check_data`, WORKDIR/data.json:
each file's path, size, modification time and sha256), and refuses to resume on files
whose content changed since, unless the run's `data.rebuild` says to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from absl import logging

from dualjax.config.keys import flatten
from dualjax.config.run import upgraded
from dualjax.errors import WorkdirError
from dualjax.runtime.files import (
    MARKER,
    Lock,
    atomic_json,
    atomic_write,
    has_checkpoint,
    has_state,
    sha256_of,
)
from dualjax.runtime.processes import is_main, main_first

# Keys (or groups, ending in ".") that may change when a run resumes.
RESUMABLE = ("num_train_steps", "checkpoint_every_steps", "keep_checkpoints",
             "eval_every_steps", "log_every_steps", "init_from", "mesh.", "eval.",
             "loss.column_block", "train.encode_chunks",  # memory only: the same loss and gradients
             "data.worker_count", "data.prefetch_batches", "data.tfds_dir",
             "data.rebuild")  # accepts changed input files once (check_data)


def _resumable(key: str) -> bool:
    key = key.split(".", 2)[-1] if key.startswith("tasks.") else key  # tasks.<name>.data...
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


def config_changes(saved: dict, config: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed): "key: old -> new" for each key that differs. A key the saved
    config lacks takes the value dualjax had before the key existed (`config.run.upgrade`:
    a workdir saved before `model.lora_alpha` ran without LoRA, at today's default), and
    any other key it lacks counts as unchanged at an off value (0, "" or False)."""
    old, new = flatten(upgraded(saved)), flatten(config)
    refused: list[str] = []
    allowed: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key not in old and new[key] in (0, "", None):  # a key added since, left off
            continue
        if old.get(key, "(absent)") != new.get(key, "(absent)"):
            change = f"{key}: {old.get(key, '(absent)')!r} -> {new.get(key, '(absent)')!r}"
            (allowed if _resumable(key) else refused).append(change)
    return refused, allowed


# What a run makes from its config before the first checkpoint, and the keys (or groups,
# ending in "."; "" for any) each is made from: `start_over` removes those a change
# concerns, and the run makes them again.
DERIVED = (
    (("vocab.json", "features.json", "pretrained.json", "data.json"),
     ("model.", "data.", "tasks.", "init_from")),
    (("pseudo_pairs*.jsonl",), ("model.", "data.", "tasks.", "seed", "init_from")),
    (("teacher_scores*.jsonl",), ("distill.", "data.", "tasks.", "seed")),
    (("metrics.jsonl", "report.md", "tensorboard", "runs"), ("",)),
)


def start_over(workdir: str, config: dict) -> list[str]:
    """In a workdir without a checkpoint, whose saved config differs from `config` in
    keys that shape the run (a run refused or stopped before it trained): removes what
    that run made from the changed keys (`DERIVED`), so that this run makes it again
    from its own config, and returns the changes ("key: old -> new"); [] otherwise."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path) or has_checkpoint(workdir):
        return []
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return []  # (check_and_write_config names the unreadable file)
    refused, _ = config_changes(saved, config)
    keys = [change.split(":")[0] for change in refused]
    for names, groups in DERIVED:
        if not any(key == g or key.startswith(g) for key in keys for g in groups):
            continue
        for name in names:
            for found in glob.glob(os.path.join(workdir, name)):
                (shutil.rmtree if os.path.isdir(found) else os.remove)(found)
    if refused:
        logging.warning("%s holds no checkpoint yet: its run starts over with the new "
                        "config (%s)", workdir, "; ".join(refused))
    return refused


def check_and_write_config(workdir: str, config: dict,
                           write: bool = True) -> None:
    """Refuses a config that differs from the workdir's in keys that shape the run (when
    the workdir holds a checkpoint: before, `start_over`); writes config.json (with
    `write`)."""
    path = os.path.join(workdir, "config.json")
    current = config
    if os.path.exists(path) and has_checkpoint(workdir):
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
def guard(workdir: str, config: dict,
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
            start_over(workdir, config)
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
        digest = sha256_of(path)
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




