"""``python -m disttest.conformance --backend NAME --world-size N [--import MODULE]``."""

from __future__ import annotations

import argparse
import sys

from disttest.config import ConfigError, parse_timeout, parse_world_size
from disttest.conformance import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disttest.conformance",
        description="Check that a torch.distributed backend keeps gloo's and NCCL's collective semantics.")
    parser.add_argument("--backend", required=True, help="c10d backend name (gloo, threaded, yours)")
    parser.add_argument("--world-size", required=True, help="number of ranks")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="module that registers the backend (repeatable)")
    parser.add_argument("--timeout", default="60", help="seconds per test (default 60)")
    parser.add_argument("-k", dest="pattern", help="only tests whose name matches this fnmatch pattern")
    args = parser.parse_args(argv)
    try:
        world_size = parse_world_size(args.world_size, "--world-size", text=True)
        timeout = parse_timeout(args.timeout, "--timeout")
    except ConfigError as e:
        parser.error(str(e))
    try:
        result = run(args.backend, world_size, args.imports, timeout, args.pattern)
    except ModuleNotFoundError as e:
        parser.error(f"--import {e.name!r}: no such module (disttest)")
    print(result.table())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
