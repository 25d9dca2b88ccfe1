"""``python -m disttest.conformance --backend NAME --world-size N [--device cuda] [--import MODULE] [--unsupported TOKENS]``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from disttest.config import ConfigError, parse_timeout, parse_world_size
from disttest.conformance import CASES, Declaration, run

__unittest = True

#: An option that takes one value, given twice.
GIVEN_TWICE = "{option} given twice ({first!r} and {second!r}) (disttest): give it once"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disttest.conformance",
        description="Check, case by case, that a torch.distributed backend keeps gloo's and NCCL's "
                    "collective semantics.")
    parser.add_argument("--backend", required=True, action=_Once,
                        help="c10d backend name (gloo, threaded, fake, yours)")
    parser.add_argument("--world-size", required=True, action=_Once, help="number of ranks (3 runs every case)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="module that registers the backend (repeatable); its CONFORMANCE_UNSUPPORTED "
                             "declares what the backend lacks")
    parser.add_argument("--unsupported", action="append", default=[], metavar="TOKENS",
                        help="comma-separated tags the backend lacks by design: a collective (all_to_all), "
                             "an op (PREMUL_SUM), a dtype, an aspect (noncontiguous, barrier_waits), or "
                             "a+b for cases with both")
    parser.add_argument("--lenient", action="store_true",
                        help="count any 'not supported' error as unsupported (the old, fooled rule)")
    parser.add_argument("--json", dest="json_path", action=_Once, metavar="FILE",
                        help="write every case's result to FILE")
    parser.add_argument("--device", action=_Once, help="where the cases' tensors live: cpu, cuda (default: cuda "
                                                       "for nccl, else cpu); results are compared on the CPU")
    parser.add_argument("--timeout", default="60", action=_Once, help="seconds per case (default 60)")
    parser.add_argument("-k", dest="pattern", action="append", default=[],
                        help="only cases whose name matches this pattern (as unittest's -k: fnmatch with a "
                             "wildcard, else a part of the name; repeatable, a case matching any runs)")
    args = parser.parse_args(argv)
    try:
        world_size = parse_world_size(args.world_size, "--world-size", text=True)
        timeout = parse_timeout(args.timeout, "--timeout", text=True)
    except ConfigError as e:
        parser.error(str(e))
    declared = Declaration()
    for tokens in args.unsupported:
        if not any(t.strip() for t in tokens.split(",")):  # (",": no tag, a shell variable left empty)
            parser.error(f"--unsupported {tokens!r}: no tag in it (disttest)")
        declared.extend(tokens, "--unsupported")
    known = set().union(*(c.all_tags for c in CASES))
    for token in declared.reasons:
        unknown = [part for part in token.split("+") if part not in known]
        if unknown:
            parser.error(f"--unsupported {token!r}: {unknown[0]!r} is no tag of any case (disttest); tags are "
                         f"collectives, dtypes, ops and aspects such as noncontiguous, async, subgroup, "
                         f"barrier_waits, missing_peer, argument_errors")
    if args.json_path:
        problem = _unwritable(args.json_path)
        if problem:  # found now, not after every case has run
            parser.error(f"--json {args.json_path!r}: {problem} (disttest)")
    for name in args.imports:
        problem = _import_problem(name)
        if problem:
            parser.error(f"--import {name!r}: {problem} (disttest)")
    try:
        # (the device is checked there, after the --import modules, one of
        # which may register it)
        result = run(args.backend, world_size, args.imports, timeout, args.pattern, declared, args.lenient,
                     args.device, "--device")
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    if not result.cases:
        given = " ".join(f"-k {p!r}" for p in args.pattern)
        parser.error(f"{given} matches no case (disttest): the cases' names start with test_, "
                     "such as test_all_reduce__float32_SUM")
    print(result.table())
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            f.write(result.as_json())
    return 0 if result.ok else 1


class _Once(argparse.Action):
    """An option that takes one value: given twice, a usage error (argparse
    keeps the last, so ``--backend gloo --backend nccl`` ran nccl alone)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in given:
            parser.error(GIVEN_TWICE.format(option=option_string, first=given[self.dest], second=values))
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _unwritable(path: str) -> str | None:
    """Why the report could not be written to ``path``, or None."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a folder; name a file"
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is not writable"
    return None


def _import_problem(name: str) -> str | None:
    """Why module ``name`` cannot be imported, or None: a module that does
    not exist apart from one whose own import fails."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return "no such module"
        return f"importing it failed: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 (whatever the module raises is the user's)
        return f"importing it failed: {type(e).__name__}: {e}"
    return None


if __name__ == "__main__":
    sys.exit(main())
