"""What the four commands share: `run`, absl's `app.run` with a --help that shows the
command's own docstring and flags however it was started.

absl prints `__main__`'s docstring and the flags that module defines. Started as
`python -m dualjax.search` that module is search.py itself; started as the console script
`dualjax-search`, `__main__` is pip's generated launcher, with no docstring and no flags,
so --help said only "Try --helpfull". absl also ends a --help with exit status 1; asking
for help is not an error, so here it is 0.

Ctrl-C (SIGINT) and SIGTERM end every command in one line, exit 130 and 143, instead of
a traceback (or, for SIGTERM, a silent death): what a command was writing is cleaned up
on the way out (`workdir.staged_output`), so nothing half-written is left. Training
handles both itself (`workdir.Signals`: it saves a checkpoint first).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable

from absl import app, flags

from dualjax.errors import Terminated  # noqa: F401 (raised here)


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
    spec = getattr(sys.modules.get(module), "__spec__", None)  # -m: "__main__" is the module
    app.run(_stoppable(main, spec.name if spec else module), **kwargs)


def _terminate(signum, frame) -> None:
    raise Terminated()


def _stoppable(main: Callable[[list[str]], None], name: str) -> Callable[[list[str]], None]:
    """`main`, ended in one line by SIGINT (exit 130) or SIGTERM (exit 143)."""
    def stoppable(argv: list[str]) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
        try:
            main(argv)
        except KeyboardInterrupt:
            print(f"{name}: stopped by SIGINT (Ctrl-C); nothing half-written was kept",
                  file=sys.stderr)
            sys.exit(130)
        except Terminated:
            print(f"{name}: stopped by SIGTERM; nothing half-written was kept", file=sys.stderr)
            sys.exit(143)
    return stoppable
