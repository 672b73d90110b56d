"""Command line: python -m dualjax.main --config=configs/NAME.py --workdir=DIR [--config.KEY=VALUE]

Every config key, its value and its meaning: --config=configs/NAME.py --keys. Several
processes (a TPU pod slice): --distributed, or --coordinator_address, --num_processes and
--process_id (docs/scale.md).

Parses flags and calls `train.train_and_evaluate`; nothing else. Bad input (config, data
files) ends the run with one line naming the key, file or line, and exit status 1; a
SIGTERM or SIGINT saves a checkpoint and exits with status 143.
"""

from __future__ import annotations

import os
import re
import signal
import sys


def _stopped_while_starting(signum, _frame):
    """Until the run installs its own handlers (imports, flags) there is nothing to save.
    A hard exit: SystemExit raised inside an import can be swallowed by a bare except."""
    print(f"dualjax: {signal.Signals(signum).name}: stopped while starting; nothing was "
          "saved; run the same command again", file=sys.stderr, flush=True)
    os._exit(143)


if __name__ == "__main__":  # before the slow imports below
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, _stopped_while_starting)

from absl import app, flags
from ml_collections import config_flags

from dualjax import cli
from dualjax.config import keys as config_keys
from dualjax.errors import DualjaxError, Preempted
from dualjax.runtime.files import DISK_ERRNOS

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, as a process killed by it (also after SIGINT)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file (a get_config() module).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and artifacts.")
_KEYS = flags.DEFINE_bool("keys", False, "List every config key with its value (after any "
                          "--config.KEY=VALUE) and what it means, then exit.")
cli.define_process_flags(__name__)
flags.mark_flags_as_required(["config"])


def _quiet_closed_loops(hook):
    """An unraisable-exception hook that drops "Event loop is closed", which TensorStore
    callbacks raise in Orbax's threads after a failed save (said once by SaveError)."""
    def unraisablehook(args):
        if args.exc_type is RuntimeError and str(args.exc_value) == "Event loop is closed":
            return
        hook(args)
    return unraisablehook


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if _KEYS.value:  # the meanings are the comments of configs/default.py and scann_index.py
        print(config_keys.describe_keys(_CONFIG.value, *config_keys.key_sources()))
        return
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required (a directory for checkpoints, metrics "
                             "and artifacts)")
    # The run's imports (jax, TFDS, Orbax: seconds) after the flags are parsed, so a
    # mistyped flag or config file is refused at once.
    from dualjax.config import run as run_spec
    from dualjax.eval.metrics_log import setup_logging
    from dualjax.train import loop as train
    setup_logging()
    sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
    try:
        cli.init_processes("dualjax", kept="the checkpoints saved before are kept")
        spec = run_spec.resolve(_CONFIG.value, _WORKDIR.value)  # checked, once
        train.train_and_evaluate(spec, _WORKDIR.value)
    except Preempted as e:  # saved; a scheduler must not record the job as done
        print(f"dualjax: {e}", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)
    except KeyboardInterrupt:  # a second signal while the first one's save was pending
        print("dualjax: stopped at once by a second signal; the checkpoints saved before "
              "are kept", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)
    except DualjaxError as e:  # a config key, a data line, a workdir, ...: one line
        sys.exit(f"dualjax: {e}")
    except OSError as e:  # the machine's: a full disk, a quota, a read-only file system
        if e.errno not in DISK_ERRNOS:
            raise
        sys.exit(f"dualjax: {e.filename or _WORKDIR.value}: {e.strerror}; the checkpoints "
                 "saved before are kept: free some space and run the same command again")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with one clear line for a config file that does not load and
    for a bad --config override."""
    config = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
    if config is not None and not os.path.isfile(config.split(":")[0]):
        sys.exit(f"dualjax: --config={config}: no such file")
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        if "Error whilst parsing config file" in lines[0]:  # get_config() raised
            sys.exit(f"dualjax: --config={config}: cannot load it ({lines[-1].strip()})")
        sys.exit(f"dualjax: {lines[0]}")
    except (AttributeError, KeyError) as e:  # ml_collections: no such config key
        found = re.search(r"(\w+)", str(e))
        key = found.group(1) if found else str(e)
        bad = [a.split("=")[0] for a in argv[1:]
               if a.startswith("--config.") and f".{key}" in a.split("=")[0]]
        hint = re.search(r'Did you mean "(\w+)"', str(e))
        sys.exit(f"dualjax: {' '.join(bad) or key}: no such config key '{key}'"
                 + (f"; did you mean '{hint.group(1)}'?" if hint else ""))
    except Exception as e:  # the config module does not even import (a SyntaxError, ...)
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) else ""
        sys.exit(f"dualjax: --config={config}: cannot load it{where}: {type(e).__name__}: "
                 f"{getattr(e, 'msg', None) or e}")


def run() -> None:
    """The `dualjax-train` console script: the same as `python -m dualjax.main`."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stopped_while_starting)
    cli.run(main, __name__, name="dualjax", flags_parser=parse_flags)


if __name__ == "__main__":
    run()
