"""The command line of ``python -m disttest.migrate``."""

from __future__ import annotations

import argparse
import ast
import codecs
import contextlib
import difflib
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator

from disttest.migrate._homes import FALLBACK
from disttest.migrate._homes import HOMES as _HOMES

__unittest = True

__all__ = ["NEEDS_LIBCST", "main", "main_piped", "run"]

NEEDS_LIBCST = ("python -m disttest.migrate needs libcst, which is not installed (disttest): "
                "pip install 'torch-disttest[migrate]' (or pip install libcst)")
#: Homes the command may point imports at: disttest's documented modules.
HOMES = tuple(sorted({*_HOMES.values(), *FALLBACK}))


def _skipped_folder(folder: str, name: str) -> bool:
    """Folders a walk leaves alone: hidden ones, caches, and installed
    packages (a virtual environment, site-packages), which are not the suite's."""
    return (name.startswith(".") or name in ("__pycache__", "site-packages")
            or os.path.isfile(os.path.join(folder, name, "pyvenv.cfg")))


def _files(paths: list[str], parser: argparse.ArgumentParser) -> Iterator[str]:
    seen: set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            found: list[str] = []
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _skipped_folder(folder, d))
                for d in dirs:
                    if os.path.islink(os.path.join(folder, d)):  # os.walk does not follow it (a loop could)
                        print(f"{os.path.join(folder, d)}: a link to a folder, not followed; name its target "
                              "to migrate it", file=sys.stderr)
                for n in sorted(names):
                    file = os.path.join(folder, n)
                    if not n.endswith(".py") or n.startswith(".") or not os.path.isfile(file):
                        continue  # NB: not a FIFO: reading it waits forever
                    if os.path.islink(file):  # its target may be outside the suite: writing it would reach there
                        print(f"{file}: a link to a file, not followed; name it to migrate its target",
                              file=sys.stderr)
                        continue
                    found.append(file)
        elif os.path.isfile(path):
            found = [path]
        elif os.path.exists(path):  # a FIFO, a device: reading it could wait forever
            parser.error(f"not a regular file or folder: {path!r} (from the command line)")
        else:
            parser.error(f"no such file or folder: {path!r} (from the command line)")
        for file in found:
            key = os.path.realpath(file)
            if key not in seen:  # a file named twice (or through a link) is read once
                seen.add(key)
                yield file


def _why_not_parsed(path: str, data: bytes, error: Exception) -> str:
    """The reason a file could not be read, with CPython's line where it has one."""
    if isinstance(error, RecursionError):
        return "RecursionError: nested too deeply for the parser"
    try:
        compile(data, path, "exec", dont_inherit=True, flags=ast.PyCF_ONLY_AST)
    except SyntaxError as e:
        # (no line: the bytes themselves, a coding cookie that names no codec)
        return f"SyntaxError at line {e.lineno}: {e.msg}" if e.lineno else f"SyntaxError: {e.msg}"
    except ValueError as e:  # NUL bytes: a binary file, UTF-16 text
        return f"{e} (a binary file, or text in an encoding such as UTF-16)"
    except (RecursionError, MemoryError):
        pass
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _lines(text: str) -> list[str]:
    """``text``'s lines as ``diff`` and ``patch`` see them: each ends at a
    newline (a CR or a form feed does not end one, as ``splitlines`` has it)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _diff(path: str, before: str, after: str) -> Iterator[str]:
    """A unified diff that ``patch`` applies (a last line without its
    newline gets the marker)."""
    for line in difflib.unified_diff(_lines(before), _lines(after), fromfile=path, tofile=path):
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"


def _print_diff(lines: Iterator[str], encoding: str) -> None:
    """Print a diff in the file's own encoding (a latin-1 file's diff in
    UTF-8 did not apply: ``patch`` compares bytes)."""
    buffer = getattr(sys.stdout, "buffer", None)
    ours = getattr(sys.stdout, "encoding", None) or "utf-8"
    if buffer is None or codecs.lookup(encoding).name == codecs.lookup(ours).name:
        sys.stdout.writelines(lines)
        return
    sys.stdout.flush()
    buffer.write("".join(lines).encode(encoding, "backslashreplace"))  # (the file's text encodes; a path may not)
    buffer.flush()


def _replace(path: str, data: bytes) -> None:
    """Give the file at ``path`` (a link's target) the content ``data``
    through a temporary file beside it, so that a write that fails (a full
    disk) leaves the file as it was; its permissions are kept. Where the
    folder refuses a new file (the file itself writable), it is written in place."""
    target = os.path.realpath(path)
    try:
        fd, temp = tempfile.mkstemp(prefix=".disttest-migrate-", suffix=".tmp", dir=os.path.dirname(target))
    except PermissionError:
        with open(target, "wb") as f:
            f.write(data)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        shutil.copymode(target, temp)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def main(argv: list[str] | None = None, prog: str = "python -m disttest.migrate") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Move imports of torch.testing._internal's distributed test modules to disttest. "
                    "Exit status: 0 done (or nothing to do), 1 with --check when a file would change "
                    "or when a file could not be read, parsed or written, 2 usage error.")
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
    dry = args.check or args.diff
    for path in files:
        try:
            with open(path, "rb") as f:  # bytes: libcst keeps the encoding, a BOM and the line endings
                data = f.read()
        except OSError as e:
            print(f"{path}: not migrated: {type(e).__name__}: {e.strerror}", file=sys.stderr)
            status = 1
            continue
        try:
            # CPython's parser first: libcst's takes what CPython refuses (300
            # nested parentheses) and takes gigabytes for some it refuses.
            with warnings.catch_warnings():  # (its SyntaxWarnings are the file's, not ours to print)
                warnings.simplefilter("ignore")
                compile(data, path, "exec", dont_inherit=True, flags=ast.PyCF_ONLY_AST)
            result = rewrite(data, offers)
        except (libcst.ParserSyntaxError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError,
                MemoryError) as e:
            print(f"{path}: not migrated: {_why_not_parsed(path, data, e)}", file=sys.stderr)
            status = 1
            continue
        if not result.changes:
            continue
        if result.changed and not dry:
            try:
                _replace(path, result.data)
            except OSError as e:
                print(f"{path}: not migrated: {type(e).__name__}: {e.strerror} (not written)", file=sys.stderr)
                status = 1
                continue
        if result.changed:
            changed += 1
        if result.changed or not args.quiet:
            verb = ("would change" if dry else "changed") if result.changed else "unchanged"
            print(f"{path}: {verb}")
            if not args.quiet:
                for change in result.changes:
                    print(f"{path}:{change.line}: {change.describe()}")
        if result.changed and args.diff:
            # (the BOM stays on the first line: patch compares bytes)
            bom = "\ufeff" if data.startswith(codecs.BOM_UTF8) else ""
            _print_diff(_diff(path, bom + data.decode(result.encoding).removeprefix("\ufeff"),
                              bom + result.source.removeprefix("\ufeff")), result.encoding)
        if result.changed and args.check:
            status = 1
    verb = "would change" if dry else "changed"
    print(f"{len(files)} file(s) read, {changed} {verb}")
    return status


def run() -> None:
    """The ``disttest-migrate`` console script: :func:`main`, its status the exit code."""
    sys.exit(main_piped(prog="disttest-migrate"))


def main_piped(argv: list[str] | None = None, prog: str = "python -m disttest.migrate") -> int:
    """:func:`main` as a command (``-m``, the console script), its output
    maybe read by a command that stops early (``| head``): then status 1,
    without a traceback. NB: then stdout is /dev/null for the rest of the
    process, which is about to exit."""
    try:
        status = main(argv, prog)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # (Python's advice: point stdout at devnull, so that its flush at exit does not raise again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
