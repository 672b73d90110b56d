"""Every exception dualjax raises on purpose, in one place. Each carries a message of one
line that names the file, key or flag at fault and says what to do; the commands print
it as `dualjax[.COMMAND]: MESSAGE` and exit 1 (`cli.py`, `main.py`).

Raised by: ConfigError (config/validation.py), DataError (data/: a file and its line),
WorkdirError (train/workdir.py, runtime/: the workdir and its disk), SaveError
(train/checkpoints.py), OutputError (an --out folder, runtime/files.py),
PretrainedError (pretrained/), NonFiniteLossError (train/step.py), UsageError (a
command's flags, cli.py); Preempted, Terminated and PeerStopped are the signals' and the
other processes' (runtime/signals.py, cli.py, runtime/peers.py).

Every one but the last two is a `DualjaxError`: `except DualjaxError` catches what
dualjax raises on purpose and nothing else. Terminated and PeerStopped derive from
BaseException (as KeyboardInterrupt does), so that no `except Exception` swallows them.
Import them from here (`from dualjax.errors import ConfigError`), never through the
module that raises them: tests/project/test_layers.py checks it.
"""

import signal


class DualjaxError(Exception):
    """What dualjax raises on purpose: a message of one line that says what to do."""


class ConfigError(DualjaxError, ValueError):
    """A config value that cannot work; the message names the key."""


class DataError(DualjaxError, ValueError):
    """Bad input data; the message names the file and line."""


class WorkdirError(DualjaxError):
    """The workdir cannot be used for this run; the message says why and what to do."""


class OutputError(DualjaxError, ValueError):
    """An output folder that may not be written: the message names it and says why."""


class Preempted(DualjaxError):
    """SIGTERM or SIGINT stopped the run (during training, after saving a checkpoint);
    running the same command again resumes from the last checkpoint. `signum`: the
    signal, when raised by its handler."""
    signum = 0


class SaveError(WorkdirError):
    """A checkpoint could not be written (disk full, quota, permissions); the earlier
    checkpoints are intact."""


class PretrainedError(DualjaxError, ValueError):
    """A pretrained start that cannot be used: the message is one line saying why and
    what to run."""


class NonFiniteLossError(DualjaxError, FloatingPointError):
    """Training produced a non-finite loss, gradient or parameter norm; nothing of that
    state was saved."""


class UsageError(DualjaxError, ValueError):
    """A command-line flag that cannot work: the message names it (said in one line,
    without the usage text)."""


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that its cleanup runs."""


class PeerStopped(BaseException):
    """Another process of a multi-process command stopped or died (`runtime/peers.py`):
    raised where this one is, so that its cleanup runs before it stops too. `signum`:
    the signal that raises it (delivered again if a finalizer or a gc callback swallows
    it: cli.py)."""
    signum = int(signal.SIGUSR1)
