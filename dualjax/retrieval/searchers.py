"""The registry of searchers (`config.eval.index`, `dualjax.index --kind`): `SEARCHERS`,
name -> `Kind`, and the contract every searcher keeps (`Searcher`, `Saved`).

A searcher is one module that defines its class and registers it. dualjax's three are
exact.py ("exact": chunked matmul, nothing saved), scann_index.py ("scann") and
hnsw_index.py ("hnsw"), built over the corpus once and saved beside it:

    class MySearcher:                      # keeps `Saved` (and so `Searcher`)
        settings: dict
        @classmethod
        def build(cls, corpus, eval_settings, k) -> "MySearcher": ...
        def search(self, queries, k, exclude=None): ...   # (scores, ids) [nq, k] each
        def save(self, directory, fingerprint): ...       # saved.save_index(...)
        @classmethod
        def load(cls, directory, fingerprint, n, dim): ...  # None: build again
        def tune(self, settings): ...         # search-time settings on a loaded one

    register(Kind("mine", MySearcher.build, load=MySearcher.load))

`ann.make_index(name, ...)` then builds it, or loads the one saved under the same
fingerprint (the corpus' bytes and every build setting), for evaluation and for
`dualjax.index`. tests/project/test_plugins.py registers one from a test file.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from dualjax.retrieval.saved import Settings
from dualjax.runtime.registry import Registry


class Searcher(Protocol):
    """What every searcher gives.

    Attributes:
        settings: the settings it runs with (logged, recorded in metrics and manifests).
    """
    settings: dict

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32, ids int32), [len(queries), k] each, best first, by inner
        product; -inf / -1 where fewer than k are found. `exclude` [len(queries)]: a
        corpus row each query must not return (-1: none)."""
        ...


class Saved(Searcher, Protocol):
    """A searcher built once over its corpus and saved in a directory it owns: every file
    in it is the searcher's (`saved.save_index` writes them into a fresh folder, meta.json
    last; `saved.saved_meta` reads it back), and a load that finds another fingerprint,
    corpus size or library version returns None, so the searcher is built again."""

    def save(self, directory: str, fingerprint: str) -> None: ...

    def tune(self, settings: dict) -> None:
        """Applies the search-time settings (`Kind.search_time`) to a loaded searcher."""
        ...


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of searcher.

    Attributes:
        name: what `config.eval.index` and `dualjax.index --kind` call it.
        build: (corpus [n, dim] float32, eval settings, k) -> a searcher; the eval
            settings are `EvalSpec.index_settings` (query_chunk, corpus_chunk, and each
            kind's own mapping under its name, e.g. "scann").
        load: (directory, fingerprint, n, dim) -> the saved searcher or None; None for a
            kind that is never saved (built at once, as "exact").
        settings: (n, dim, k, eval settings) -> the settings a build would use, whose
            build-time part is in the fingerprint; ValueError naming a bad one.
        search_time: the settings left out of the fingerprint (changing them reuses a
            saved searcher, `Saved.tune` applies them).
        missing: None when the searcher's library is installed, else what to install
            (checked with the config, before any work).
        require: imports the library, ImportError saying what to install.
        check: validates the kind's own eval settings at config time (ValueError).
    """
    name: str
    build: Callable[[np.ndarray, Settings, int], Any]
    load: Callable[[str, str, int, int], Any] | None = None
    settings: Callable[[int, int, int, Settings], dict] = lambda n, dim, k, cfg: {}
    search_time: tuple[str, ...] = ()
    missing: Callable[[], str | None] = lambda: None
    require: Callable[[], object] = lambda: None
    check: Callable[[Settings], object] = lambda cfg: None

    @property
    def saves(self) -> bool:
        return self.load is not None


SEARCHERS: Registry[Kind] = Registry(
    "searcher", lambda name, known: ValueError(f"index {name!r} is not one of: {known}"))


def register(kind: Kind) -> Kind:
    """Adds `kind` to SEARCHERS (ValueError if another kind has its name); returns it."""
    return SEARCHERS.add(kind.name, kind)
