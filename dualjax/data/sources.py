"""The registry of data sources (`config.data.name`): `SOURCES`, name -> `Source`.

A data source is one module that says how its data group becomes settings and how the
settings become training pairs and evaluation tasks, and registers both. dualjax's are
synthetic.py ("synthetic_paraphrase", the embedded default), pairs_file.py ("pairs",
"quora"), beir.py ("beir") and reqa.py ("reqa_squad"):

    def settings(data, seed) -> dict:      # data: the config's data group, read as a mapping
        return {"seed": seed, **sources.file_settings(data["path"], "a TSV file")}

    def load(settings) -> clusters.RawData:
        ...  # training pairs, and a RetrievalTask per evaluation split ("val", "test")

    sources.register(sources.Source("mine", load, settings))

builders.py writes what `load` returns as TFDS tables (array_record) once per settings:
the settings are the tables' identity (their digest is in the tables' names), so they
hold everything that shapes the data (file digests, sizes, the seed) and nothing else.
tests/project/test_plugins.py registers one from a test file.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from dualjax.data.clusters import RawData
from dualjax.errors import DataError
from dualjax.runtime import files
from dualjax.runtime.registry import Registry

CANDIDATES = ("split", "all")  # data.candidates of the clustered sources

Settings = Callable[[Mapping[str, Any], int], dict]


@dataclasses.dataclass(frozen=True)
class Source:
    """One data source.

    Attributes:
        name: what `config.data.name` calls it.
        load: its settings -> `RawData` (training pairs, evaluation tasks).
        settings: (the data group, the run's seed) -> the JSON-able settings that shape
            its tables; DataError naming the key or file that cannot work.
        table: the name its TFDS tables are written under (default: `name`).
        default_path: the file read when data.path is empty ("" : data.path is needed).
        reads_path: whether data.path names its input (the workdir records the digests
            of those files, and refuses a changed one).
    """
    name: str
    load: Callable[[dict], RawData]
    settings: Settings
    table: str = ""
    default_path: str = ""
    reads_path: bool = True

    @property
    def table_name(self) -> str:
        return self.table or self.name


SOURCES: Registry[Source] = Registry(
    "data source",
    lambda name, known: DataError(f"unknown dataset data.name={name!r}; known: {known}"))


def register(source: Source) -> Source:
    """Adds `source` to SOURCES (ValueError if another has its name); returns it."""
    return SOURCES.add(source.name, source)


# ----------------------------------------------------------------------------- settings
def file_settings(path: str, what: str) -> dict:
    """The absolute path and a hash of the contents of an input file (or DataError)."""
    if not path:
        raise DataError(f"data.path must name {what}")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        raise DataError(f"{path}: is a folder; data.path must name {what}")
    if not os.path.isfile(full):
        raise DataError(f"{path}: no such file (data.path)")
    return {"path": full, "sha256": files.sha256_of(full)}


def negatives_settings(data: Mapping[str, Any]) -> dict:
    """The mining and pseudo-label settings, only when on (so the data of runs without
    them keeps its hash)."""
    out: dict[str, Any] = {}
    if data.get("hard_negatives", 0):
        out["hard_negatives"] = data["hard_negatives"]
    if data.get("pseudo_labels", 0):
        out["pseudo_labels"] = data["pseudo_labels"]
        if data.get("pseudo_label_queries", ""):
            out.update(pseudo_label_queries=file_settings(data["pseudo_label_queries"],
                                                          "a file of queries, one per line"))
    return out


def clustered_settings(data: Mapping[str, Any], seed: int) -> dict:
    """The settings of a source split by cluster: seed, candidates, coherence filter,
    and the negatives'."""
    if data["candidates"] not in CANDIDATES:
        raise DataError(f"data.candidates={data['candidates']!r} is not one of: "
                        f"{', '.join(CANDIDATES)}")
    return {"seed": seed, "candidates": data["candidates"],
            "min_cluster_coherence": data["min_cluster_coherence"],
            **negatives_settings(data)}
