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
handles both itself (`workdir.Signals`: it saves a checkpoint first). The processes of
a multi-process command (`init_processes`) end together, each in one line, whichever of
them is signalled, fails or dies (`runtime/peers.py`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import NoReturn

from absl import app, flags

from dualjax.errors import Terminated, UsageError
from dualjax.runtime import coordinator, peers, xla_cache


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
    flags.DEFINE_float("peer_timeout", 10, "Multi-process runs: seconds without a sign of "
                       "life from a process (killed, its host down) before the others stop.",
                       module_name=module)


def init_processes(command: str, kept: str = "nothing half-written was kept") -> None:
    """jax.distributed.initialize when the process flags ask for it (explicitly, or from
    the environment), with the watcher that ends every process with any one of them
    (`runtime/peers.py`; `kept`: what its line says is left after a stop).

    Everything that can be said before the processes meet is said in one line
    (UsageError): flags that do not go together, a process id out of range, a
    coordinator port already taken, --distributed with no cluster to find. When the
    processes do not all join within --coordinator_timeout, `command` ends in one line,
    exit status 1: jax itself would abort the process with a C++ stack (no Python error
    to catch), so a watchdog thread says it first. Nothing has been written by then."""
    f = flags.FLAGS
    explicit = [f.coordinator_address, f.num_processes, f.process_id]
    if not f.distributed and all(v is None for v in explicit):
        return
    if not f.distributed:
        _check_process_flags(f.coordinator_address, f.num_processes, f.process_id)
    import jax
    # Several CPU processes (as in the tests) need CPU collectives; no effect elsewhere.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # jax's preemption notifier would take SIGTERM from dualjax's handlers and swallow
    # it; a training run agrees on its stopping step itself (runtime/signals.py).
    jax.config.update("jax_enable_preemption_service", False)
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
        with _service_beside_process_0(f, where):
            jax.distributed.initialize(coordinator_address=f.coordinator_address,
                                       num_processes=f.num_processes,
                                       process_id=f.process_id,
                                       initialization_timeout=f.coordinator_timeout + 30)
    except UsageError:
        raise
    except ValueError as e:  # what the environment did not give
        if f.distributed:
            raise UsageError("--distributed: no cluster found in the environment (a Cloud "
                             "TPU pod slice, SLURM, Open MPI, ...) to take the processes "
                             f"from ({e.args[0].rstrip('.')}); elsewhere give "
                             "--coordinator_address, --num_processes and --process_id"
                             ) from None
        raise UsageError(f"{where}: {e}") from None
    finally:
        watchdog.cancel()
    if jax.process_count() > 1:
        from jax._src import distributed
        peers.Peers(distributed.global_state.client, jax.process_index(),
                    jax.process_count(), command, f.peer_timeout, kept).start()


def _check_process_flags(address: str | None, count: int | None, me: int | None) -> None:
    """UsageError for process flags that cannot form a run."""
    if address is None or count is None or me is None:
        raise UsageError("--coordinator_address, --num_processes and --process_id go "
                         "together (or --distributed alone)")
    if count < 1:
        raise UsageError(f"--num_processes={count}: give how many processes run the "
                         "command, at least 1")
    if not 0 <= me < count:
        raise UsageError(f"--process_id={me}: give 0 to {count - 1} (--num_processes={count})")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--coordinator_address={address}: give host:port (the host of "
                         "process 0, a free port)")


@contextlib.contextmanager
def _service_beside_process_0(f, where: str) -> Iterator[None]:
    """In process 0: the coordination service started in a process of its own
    (`runtime/coordinator.py`) on a port checked free first, and jax.distributed made to
    use it instead of starting one inside this process. Elsewhere, or where this jax
    has no such seam: nothing (jax serves from process 0 itself)."""
    from jax._src import distributed
    from jax._src.lib import _jax
    if f.process_id != 0 or not hasattr(_jax, "get_distributed_runtime_service") or \
            not hasattr(distributed, "_jax"):
        yield
        return
    port = int(f.coordinator_address.rpartition(":")[2])
    _check_port_free(port, where)
    try:
        coordinator.start(f"[::]:{port}", f.num_processes, f.peer_timeout + 10)
    except OSError as e:
        raise UsageError(f"{where}: the coordination service could not start on port {port} "
                         f"({e}): choose another port") from None
    real = _jax.get_distributed_runtime_service
    _jax.get_distributed_runtime_service = lambda *args, **kwargs: coordinator.Elsewhere()
    try:
        yield
    finally:
        _jax.get_distributed_runtime_service = real


def _check_port_free(port: int, where: str) -> None:
    """UsageError when something listens on `port` already (jax's service would crash
    the process binding it, with a segmentation fault or a 27-line error)."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # (no IPv6 on this host)
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise UsageError(f"{where}: port {port} is already in use on this host "
                                     "(another run's coordinator?): choose another port"
                                     ) from None
                continue
            return


def run(main: Callable[[list[str]], None], module: str, name: str = "", **kwargs) -> None:
    """`app.run(main, **kwargs)`, with `module` (the command's `__name__`) standing in for
    a console script's launcher in --help: its docstring and the flags it defined.
    `name` starts the lines it says (default: the module's, "dualjax.index")."""
    launcher = sys.modules["__main__"]
    if module != "__main__" and launcher is not sys.modules.get(module):
        launcher.__doc__ = sys.modules[module].__doc__
        for flag in flags.FLAGS.get_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in sys.argv[1:]):
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    xla_cache.enable()  # compiled programs kept between runs (runtime/xla_cache.py)
    spec = getattr(sys.modules.get(module), "__spec__", None)  # -m: "__main__" is the module
    app.run(_stoppable(main, name or (spec.name if spec else module)), **kwargs)


def _terminate(signum, frame) -> None:
    """SIGTERM: raised where the command is. In a multi-process command the others are
    told first, before any cleanup: a cleanup that meets a collective then stops there
    (`processes`) instead of waiting in it for processes that are still working."""
    if (watcher := peers.active()) is not None:
        watcher.announce("SIGTERM")
    raise Terminated()


def _signals_again(hook):
    """An unraisable-exception hook that delivers a signal again when its handler's
    exception was raised inside a finalizer (a `__del__` that ran just then) and so
    swallowed: the command would go on as if the signal had not come (once seen: a
    SIGTERM during the final evaluation, a traceback, and exit 0)."""
    def unraisablehook(args):
        signum = {Terminated: signal.SIGTERM, KeyboardInterrupt: signal.SIGINT}.get(
            args.exc_type, getattr(args.exc_value, "signum", 0))
        if signum:  # a moment later, from outside the finalizer (again if need be)
            threading.Timer(0.01, signal.pthread_kill,
                            (threading.main_thread().ident, signum)).start()
            return
        hook(args)
    return unraisablehook


def _stoppable(main: Callable[[list[str]], None], name: str) -> Callable[[list[str]], None]:
    """`main`, ended in one line by SIGINT (exit 130) or SIGTERM (exit 143), and, in a
    multi-process command, ended at once with the others (`runtime/peers.py`): a
    process that fails or stops leaves by os._exit, since jax's own exit would wait at
    its shutdown barrier for processes that are gone."""
    def stoppable(argv: list[str]) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
        sys.unraisablehook = _signals_again(sys.unraisablehook)
        try:
            main(argv)
            # Done: a signal while the interpreter winds down (jax's teardown takes a
            # moment) would kill it with no word and no exit status of its own.
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_IGN)
        except KeyboardInterrupt:
            _end(130, f"{name}: stopped by SIGINT (Ctrl-C); nothing half-written was kept",
                 "SIGINT")
        except Terminated:
            _end(143, f"{name}: stopped by SIGTERM; nothing half-written was kept", "SIGTERM")
        except UsageError as e:
            _end(1, f"{name}: {e}")
        except SystemExit as e:
            if e.code in (None, 0) or peers.active() is None:
                raise
            if isinstance(e.code, str):  # sys.exit("...") prints it on the way out
                _end(1, e.code)
            _end(e.code or 1, None)  # (never 0 or None here)
        except BaseException:
            watcher = peers.active()
            if watcher is None:
                raise
            # PeerStopped, or a collective broken by a process that is gone (its beats
            # say so within --peer_timeout), or this process' own error: then its
            # traceback, and an exit that does not wait at jax's shutdown barrier.
            if peers.leaving() or watcher.await_stop():
                watcher.exit()
            traceback.print_exc()
            watcher.exit(1, None, "an error")
    return stoppable


def _end(code: int, line: str | None, announce: str = "") -> NoReturn:
    """Exits with `code`, saying `line` (None: said already); in a multi-process
    command, through its watcher (`Peers.exit`, which tells the others `announce`)."""
    watcher = peers.active()
    if watcher is not None:
        watcher.exit(code, line, announce)
    if line:
        print(line, file=sys.stderr)
    sys.exit(code)
