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

import os
import signal
import sys
import threading
from typing import Callable

from absl import app, flags

from dualjax.errors import Terminated  # noqa: F401 (raised here)


def define_process_flags(module: str) -> None:
    """The flags by which the processes of one run (a TPU pod slice, several GPU hosts,
    CPU processes in the tests) find each other, defined for the command `module`."""
    if module == "__main__":  # absl lists a started module's flags under sys.argv[0]
        module = sys.argv[0]
    flags.DEFINE_string("coordinator_address", None, "Multi-process runs: host:port of "
                        "process 0, the same for every process (with --num_processes and "
                        "--process_id).", module_name=module)
    flags.DEFINE_integer("num_processes", None, "Multi-process runs: how many.",
                         module_name=module)
    flags.DEFINE_integer("process_id", None, "Multi-process runs: this one's index.",
                         module_name=module)
    flags.DEFINE_bool("distributed", False, "Join a multi-host run whose processes find "
                      "each other from the environment (a Cloud TPU pod slice, SLURM, ...), "
                      "with no other flag.", module_name=module)
    flags.DEFINE_integer("coordinator_timeout", 300, "Multi-process runs: seconds to wait "
                         "for every process to join before giving up.", module_name=module)


def init_processes(command: str) -> None:
    """jax.distributed.initialize when the process flags ask for it (explicitly, or from
    the environment). When the processes do not all join within --coordinator_timeout,
    `command` ends in one line, exit status 1: jax itself would abort the process with a
    C++ stack (no Python error to catch), so a watchdog thread says it first. Nothing has
    been written by then."""
    f = flags.FLAGS
    explicit = [f.coordinator_address, f.num_processes, f.process_id]
    if not f.distributed and all(v is None for v in explicit):
        return
    if not f.distributed and any(v is None for v in explicit):
        raise app.UsageError("--coordinator_address, --num_processes and --process_id go "
                             "together (or --distributed alone)")
    if not f.distributed and not 0 <= f.process_id < f.num_processes:
        raise app.UsageError(f"--process_id={f.process_id}: give 0 to --num_processes - 1 "
                             f"({f.num_processes - 1})")
    import jax
    # Several CPU processes (as in the tests) need CPU collectives; no effect elsewhere.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = (f"--coordinator_address={f.coordinator_address}" if f.coordinator_address
             else "--distributed")

    def too_late() -> None:
        print(f"{command}: {where}: the {f.num_processes or ''} processes did not all join "
              f"within {f.coordinator_timeout}s (is every process started, with the same "
              "address?); nothing was written", file=sys.stderr, flush=True)
        os._exit(1)
    watchdog = threading.Timer(f.coordinator_timeout, too_late)
    watchdog.daemon = True
    watchdog.start()
    try:  # jax's own deadline later than the watchdog's
        jax.distributed.initialize(coordinator_address=f.coordinator_address,
                                   num_processes=f.num_processes, process_id=f.process_id,
                                   initialization_timeout=f.coordinator_timeout + 30)
    finally:
        watchdog.cancel()


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
