"""The training pairs' token arrays kept between runs of one workdir (`WORKDIR/tokenized`).

A run encodes its pairs once, up front (`pipeline.pretokenized_pairs`): at a million
pairs that is minutes on a few cores, and a resumed run (a preempted VM, `eval.rerun`,
more steps) would do it again for the same arrays. They are kept in the workdir, one
folder per task, named by what they are a function of: the table's bytes
(`records.Records.identity`), what names the tokenizer and the categorical fields (the
workdir's vocabulary files), each side's max length, prompt and fields, and the hard
negatives per pair. A run that asks the same reads them back memory-mapped; anything
else is encoded again and replaces them. The folder appears whole or not at all
(written beside it, then renamed), so a run killed while writing leaves nothing a rerun
would take for finished. Process 0 writes; every process reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
from absl import logging

from dualjax.text.sides import Inputs

VERSION = 1  # of the arrays' layout: a change makes every kept folder another key's
_NAMES = "arrays.json"  # the arrays' names, written last into the staged folder


def folder(keep_in: str, source, inputs: Inputs, num_hard_negatives: int,
           inputs_id: str) -> str:
    """Where the arrays of `source` encoded as `inputs` say are kept under `keep_in`;
    "" when they are not (no folder given, or a source that is not a table: generated or
    in-memory pairs)."""
    if not keep_in or not hasattr(source, "identity"):
        return ""
    sides = [{"max_len": s.max_len, "prompt": s.prompt, "fields": s.features.sizes()}
             for s in (inputs.query, inputs.document)]
    key = json.dumps([VERSION, source.identity(), inputs_id, sides, num_hard_negatives],
                     default=str)
    return os.path.join(keep_in, hashlib.sha1(key.encode()).hexdigest()[:16])


def read(path: str) -> dict[str, np.ndarray] | None:
    """The arrays kept at `path` (memory-mapped), or None when there are none."""
    try:
        with open(os.path.join(path, _NAMES)) as f:
            names = json.load(f)
        return {n: np.load(os.path.join(path, f"{n}.npy"), mmap_mode="r") for n in names}
    except (OSError, ValueError) as e:  # absent, or not whole: encoded again
        if os.path.exists(path):
            logging.warning("%s: unreadable (%s); the pairs are encoded again", path, e)
        return None


def write(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Keeps `arrays` at `path`, replacing what the task's folder held (another key's:
    the workdir is one run's at a time). A disk that refuses is said, not raised: the
    run goes on and the next one encodes again."""
    parent = os.path.dirname(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        for entry in os.listdir(parent) if os.path.isdir(parent) else ():
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        os.makedirs(tmp)
        for name, array in arrays.items():
            np.save(os.path.join(tmp, f"{name}.npy"), array)
        with open(os.path.join(tmp, _NAMES), "w") as f:
            json.dump(sorted(arrays), f)
        os.replace(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        logging.warning("could not keep the tokenized pairs in %s (%s); a resumed run "
                        "encodes them again", parent, e)
