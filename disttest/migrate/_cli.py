"""The command line of ``python -m disttest.migrate``."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterator

from disttest.migrate._homes import FALLBACK
from disttest.migrate._homes import HOMES as _HOMES

__unittest = True

__all__ = ["NEEDS_LIBCST", "main"]

NEEDS_LIBCST = ("python -m disttest.migrate needs libcst, which is not installed (disttest): "
                "pip install 'torch-disttest[migrate]' (or pip install libcst)")
#: Homes the command may point imports at: disttest's documented modules.
HOMES = tuple(sorted({*_HOMES.values(), *FALLBACK}))


def _files(paths: list[str], parser: argparse.ArgumentParser) -> Iterator[str]:
    for path in paths:
        if os.path.isdir(path):
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
        elif os.path.isfile(path):
            yield path
        else:
            parser.error(f"no such file or folder: {path!r} (from the command line)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disttest.migrate",
        description="Move imports of torch.testing._internal's distributed test modules to disttest. "
                    "Exit status: 0 done (or nothing to do), 1 with --check when a file would change "
                    "or when a file could not be parsed, 2 usage error.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or folders (searched for *.py)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    parser.add_argument("--diff", action="store_true", help="change nothing; print what would change")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the files that change")
    args = parser.parse_args(argv)
    try:
        import libcst
    except ImportError:
        print(NEEDS_LIBCST, file=sys.stderr)
        return 2
    from disttest.migrate._rewrite import module_names, rewrite

    offers = module_names(HOMES)
    status = 0
    files = list(_files(args.paths, parser))
    changed = 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            result = rewrite(source, offers)
        except (OSError, UnicodeDecodeError, libcst.ParserSyntaxError) as e:
            print(f"{path}: not migrated: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  file=sys.stderr)
            status = 1
            continue
        if not result.changes:
            continue
        if result.changed:
            changed += 1
        if result.changed or not args.quiet:
            verb = "would change" if args.check or args.diff else ("changed" if result.changed else "unchanged")
            print(f"{path}: {verb}")
            if not args.quiet:
                for change in result.changes:
                    print(f"  {change.describe()}")
        if args.diff and result.changed:
            sys.stdout.writelines(difflib.unified_diff(
                source.splitlines(keepends=True), result.source.splitlines(keepends=True),
                fromfile=path, tofile=path))
        elif args.check and result.changed:
            status = 1
        elif result.changed and not args.diff:
            with open(path, "w", encoding="utf-8") as f:
                f.write(result.source)
    verb = "would change" if args.check or args.diff else "changed"
    print(f"{len(files)} file(s) read, {changed} {verb}")
    return status
