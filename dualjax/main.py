"""Command line: python -m dualjax.main --config=configs/NAME.py --workdir=DIR [--config.KEY=VALUE]

Parses flags and calls `train.train_and_evaluate`; nothing else. Bad input (config, data
files) ends the run with one line naming the key, file or line, and exit status 1.
"""

from __future__ import annotations

import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dualjax import train
from dualjax.metrics_log import setup_logging
from dualjax.config_lib import ConfigError
from dualjax.data.pairs_file import DataError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file (a get_config() module).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and artifacts.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    setup_logging()
    try:
        train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except (ConfigError, DataError, train.NonFiniteLossError) as e:
        logging.error("%s", e)
        sys.exit(f"dualjax: {e}")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with one clear line for a bad --config override."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        sys.exit(f"dualjax: {e}")
    except (AttributeError, KeyError) as e:  # ml_collections: no such config key
        key = re.search(r"(\w+)", str(e)).group(1)
        bad = [a.split("=")[0] for a in argv[1:]
               if a.startswith("--config.") and f".{key}" in a.split("=")[0]]
        hint = re.search(r'Did you mean "(\w+)"', str(e))
        sys.exit(f"dualjax: {' '.join(bad) or key}: no such config key '{key}'"
                 + (f"; did you mean '{hint.group(1)}'?" if hint else ""))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
