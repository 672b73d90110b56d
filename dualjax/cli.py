"""What the four commands share: `run`, absl's `app.run` with a --help that shows the
command's own docstring and flags however it was started.

absl prints `__main__`'s docstring and the flags that module defines. Started as
`python -m dualjax.search` that module is search.py itself; started as the console script
`dualjax-search`, `__main__` is pip's generated launcher, with no docstring and no flags,
so --help said only "Try --helpfull". absl also ends a --help with exit status 1; asking
for help is not an error, so here it is 0.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags


def run(main: Callable[[list[str]], None], module: str, **kwargs) -> None:
    """`app.run(main, **kwargs)`, with `module` (the command's `__name__`) standing in for
    a console script's launcher in --help: its docstring and the flags it defined."""
    launcher = sys.modules["__main__"]
    if module != "__main__" and launcher is not sys.modules.get(module):
        launcher.__doc__ = sys.modules[module].__doc__
        for flag in flags.FLAGS.get_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in sys.argv[1:]):
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    app.run(main, **kwargs)
