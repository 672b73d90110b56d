"""What each config key means, for `python -m dualjax.main --config=FILE --keys` and
docs/config.md (scripts/docs/make_config_doc.py): the comments beside the `c.KEY = VALUE`
lines of configs/default.py and of retrieval/scann_index.py's ScaNN defaults."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import ml_collections

_ASSIGNMENT = re.compile(r"^\s*c\.([\w.]+)\s*=.*?(?:#\s?(.*))?$")
_CONTINUATION = re.compile(r"^\s*#\s?(.*)$")


def key_comments(*sources: tuple[str, str]) -> dict[str, str]:
    """{"model.tower": "what the config file's comment says", ...} from the `c.KEY = VALUE
    # comment` lines of (path, key prefix) sources (and the comment lines right below
    one); a later source's comment for a key replaces an earlier one's."""
    out: dict[str, str] = {}
    for path, prefix in sources:
        key = None
        with open(path) as f:
            for line in f:
                assignment, more = _ASSIGNMENT.match(line), _CONTINUATION.match(line)
                if assignment:
                    key = prefix + assignment.group(1)
                    if assignment.group(2):
                        out[key] = assignment.group(2).strip()
                    else:
                        key = None
                elif more and key is not None and line.startswith(" " * 20):
                    out[key] += " " + more.group(1).strip()
                else:
                    key = None
    return out


def key_sources() -> list[tuple[str, str]]:
    """The files whose comments say what each config key means, with their key prefix:
    configs/default.py (in a checkout, as `pip install -e` leaves it) and
    retrieval/scann_index.py."""
    package = pathlib.Path(__file__).resolve().parent.parent  # dualjax/
    defaults = package.parent / "configs" / "default.py"
    return ([(str(defaults), "")] if defaults.exists() else []) + [
        (str(package / "retrieval" / "scann_index.py"), "eval.scann.")]


def describe_keys(config: ml_collections.ConfigDict, *sources: tuple[str, str]) -> str:
    """Every key of `config` (flattened, sorted) with its value and the comment the
    (config file, key prefix) `sources` give it (configs/default.py, and scann_index.py for
    eval.scann, define them all): what `python -m dualjax.main --config=FILE --keys`
    prints."""
    comments = key_comments(*sources)
    flat = flatten(config.to_dict())
    width = max(len(f"{k} = {v!r}") for k, v in flat.items())
    return "\n".join(f"{k} = {v!r}".ljust(width) + (f"  # {comments[k]}" if k in comments else "")
                     for k, v in sorted(flat.items()))


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
