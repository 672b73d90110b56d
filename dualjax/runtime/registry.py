"""The one registry that every extension point keeps (losses, towers, searchers, data
sources, evaluators): a dict of name -> entry, in the order they were registered, that
refuses a second entry under a taken name and names the registered ones when asked for
an unknown one."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    """name -> entry.

    Args:
        what: what an entry is, for messages ("loss", "searcher", ...).
        unknown: the exception for a name nobody registered, given the name and the
            registered ones joined ("a, b, c").
    """

    def __init__(self, what: str, unknown: Callable[[str, str], Exception]):
        super().__init__()
        self.what, self.unknown = what, unknown

    def add(self, name: str, entry: T) -> T:
        """Registers `entry` as `name` (ValueError if another entry has the name)."""
        if self.get(name, entry) is not entry:
            article = "an" if self.what[:1] in "aeiou" else "a"
            raise ValueError(f"{article} {self.what} named {name!r} is registered already")
        self[name] = entry
        return entry

    def named(self, name: str) -> T:
        """The entry `name`; `unknown` (naming the registered ones) if there is none."""
        if name not in self:
            raise self.unknown(name, ", ".join(self))
        return self[name]

    def put_first(self, names: Iterable[str]) -> None:
        """`names` first, in that order (dualjax's own entries, however their modules
        happened to be imported), then the others as they came."""
        names = list(names)
        rest = {n: self.pop(n) for n in list(self) if n not in names}
        for n in names:
            self[n] = self.pop(n)
        self.update(rest)
