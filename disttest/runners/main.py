"""``run_tests()``: the ``if __name__ == "__main__"`` line of a test file,
as upstream's ``common_utils.run_tests``.

Upstream's refuses to run a file whose test classes do not derive from its
own ``TestCase`` ("This test class should extend from
torch.testing._internal.common_utils.TestCase"), so a file migrated to
disttest's bases could not be run as ``python test_file.py``; this one runs
any ``unittest`` classes. It takes upstream's command-line flags that mean
something outside PyTorch's CI (``--accept``, ``--repeat``, ``--subprocess``,
``--use-pytest``, ``--discover-tests``, ``--showlocals``, ``--save-xml``) and
refuses, naming it, each flag it does not act on, rather than ignore it.
Every other argument goes to ``unittest`` (a test name, ``-k``, ``-v``...).
Where upstream's dropped a flag, this one acts on it: ``--accept`` reaches
``assertExpectedInline``, ``--save-xml`` works with ``--use-pytest``, and a
``--subprocess`` child gets the flags its parent was given and ends with it,
and runs once for each test that the names and ``-k`` patterns select
(with ``--use-pytest``, pytest's arguments go to each child).

Runs in the test process, never at import.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import unittest
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from disttest._runner.outcome import TB_LOCALS_ENV
from disttest.faults import judge
from disttest.runners.case import set_rng_seed
from disttest.support import janitor

__unittest = True

__all__ = ["run_tests"]

#: A flag of upstream's ``run_tests`` that this one does not act on.
REFUSED = "{flag} (from the command line) is not taken by disttest's run_tests: {why} (disttest)"
#: ``--save-xml`` without the package upstream uses for it.
NO_XMLRUNNER = ("--save-xml (from the command line) needs the unittest-xml-reporting package "
                "(pip install unittest-xml-reporting), or add --use-pytest: pytest writes the report (disttest)")
#: ``--save-xml`` with ``--use-pytest``: where pytest writes the report (upstream's words).
XML_AT = "Test results will be stored in {path}"
#: Upstream's summary of ``--subprocess`` failures, and how to rerun one.
SUBPROCESS_FAILED = "{n} unit test(s) failed:\n\t{names}"
RERUN = "Test exited with non-zero exitcode {code}. Command to reproduce: {command}"
#: ``--subprocess`` with a test name that names no test of the file.
NO_SUCH_TEST = "--subprocess: {names} (from the command line) names no test of this file (disttest)"
#: A test run in its own process with ``--subprocess`` gets this long (upstream's limit).
SUBPROCESS_TIMEOUT = 15 * 60

_CI_ONLY = "it serves PyTorch's own CI"
_REFUSALS = {
    "jit_executor": ("--jit-executor", "it sets upstream TestCase's TorchScript executor; run TorchScript "
                                       "tests with upstream's run_tests"),
    "test_bailouts": ("--test-bailouts", "it serves upstream TestCase's TorchScript tests"),
    "run_parallel": ("--run-parallel", "run the file with pytest-xdist: --use-pytest -n N"),
    "import_slow_tests": ("--import-slow-tests", _CI_ONLY),
    "import_disabled_tests": ("--import-disabled-tests", _CI_ONLY),
    "rerun_disabled_tests": ("--rerun-disabled-tests", _CI_ONLY),
    "pytest_single_test": ("--pytest-single-test", _CI_ONLY),
    "log_suffix": ("--log-suffix", "it names upstream's XML reports; give --save-xml a path"),
}


def _parser() -> argparse.ArgumentParser:
    # Upstream's flags, as its parse_cmd_line_args declares them.
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--subprocess", action="store_true")
    p.add_argument("--accept", action="store_true")
    p.add_argument("--jit-executor", "--jit_executor", type=str)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--test-bailouts", "--test_bailouts", action="store_true")
    p.add_argument("--use-pytest", action="store_true")
    p.add_argument("--save-xml", nargs="?", type=str, const=os.path.join("test-reports", "python-unittest"))
    p.add_argument("--discover-tests", action="store_true")
    p.add_argument("--log-suffix", type=str)
    p.add_argument("--run-parallel", type=int, default=1)
    p.add_argument("--import-slow-tests", type=str, nargs="?", const="")
    p.add_argument("--import-disabled-tests", type=str, nargs="?", const="")
    p.add_argument("--rerun-disabled-tests", action="store_true")
    p.add_argument("--pytest-single-test", type=str, nargs=1)
    p.add_argument("--showlocals", action=argparse.BooleanOptionalAction, default=False)
    return p


def _usage_error(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _cases(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _cases(test)
        else:
            yield test


def _each_in_a_process(program: str, rest: list[str], names: list[str]) -> None:
    """Run each of the tests ``names`` in a new interpreter, one at a time; exit 1
    naming those whose process failed or outlived :data:`SUBPROCESS_TIMEOUT`."""
    failed = []
    for name in names:
        command = [sys.executable, program, *rest, name]
        started: list[subprocess.Popen[bytes]] = []

        def kill(started: list[subprocess.Popen[bytes]] = started) -> None:
            # The test's own leftovers (its session) go with it. NB: a wait
            # with a limit: this may run in a signal handler while the
            # ``finally`` below waits (a wait without one would wait on its lock).
            for child in started:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)

        # Its own session, so a signal to this one's does not reach it: the
        # janitor kills it if this process is ended (SIGTERM, SIGHUP, exit),
        # its reaper if it is killed. (Registered first: nothing comes
        # between its start and its registration.)
        cleanup = janitor.register(kill)
        try:
            started.append(subprocess.Popen(command, start_new_session=True))
            janitor.hold_groups([started[0].pid])
            try:
                code = started[0].wait(timeout=SUBPROCESS_TIMEOUT)
            except subprocess.TimeoutExpired:
                code = -signal.SIGKILL
        finally:
            kill()
            janitor.unregister(cleanup)
            if started:
                janitor.release_groups([started[0].pid])
        if code != 0:
            print(RERUN.format(code=code, command=" ".join(command)))
            failed.append(name)
    if failed:
        print(SUBPROCESS_FAILED.format(n=len(failed), names="\n\t".join(failed)), file=sys.stderr)
        raise SystemExit(1)


def _selected(main: Any, rest: list[str]) -> tuple[list[str], list[str]]:
    """(the names of the tests that unittest's arguments ``rest`` select in
    ``main``, as unittest.main would run them; the rest of the arguments).
    A ``--subprocess`` child gets its one test's name, not the selection:
    it ran every test of the file (or a named one in every child)."""
    patterns: list[str] = []
    selectors: list[str] = []
    others: list[str] = []
    args = iter(rest)
    for arg in args:
        if arg == "--durations":  # (unittest's, 3.12+: it takes a value)
            others += [arg, next(args, "")]
        elif arg.startswith("-") and not arg.startswith("--") and "k" in arg:
            # -k PAT, -kPAT, and short flags joined before it (-vk PAT)
            flags, _, pattern = arg[1:].partition("k")
            others += [f"-{f}" for f in flags]
            patterns.append(pattern or next(args, ""))
        elif arg.startswith("-"):
            others.append(arg)
        else:
            selectors.append(arg)
    loader = unittest.TestLoader()
    if patterns:  # (unittest's rule: a pattern without a wildcard matches as a substring)
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in patterns]
    suite = loader.loadTestsFromNames(selectors, main) if selectors else loader.loadTestsFromModule(main)
    if loader.errors:  # (a name that names no test: unittest would fail it at once)
        _usage_error(NO_SUCH_TEST.format(names=", ".join(selectors)))
    return [c.id().split(".", 1)[1] for c in _cases(suite)], others


def _forwarded(flags: argparse.Namespace) -> list[str]:
    """The flags a ``--subprocess`` child needs to run its test as this
    process was asked to (upstream's children lost ``--accept``,
    ``--showlocals`` and ``--repeat``)."""
    return [*(["--accept"] if flags.accept else []), *(["--showlocals"] if flags.showlocals else []),
            *(["--repeat", str(flags.repeat)] if flags.repeat != 1 else []),
            *(["--save-xml", flags.save_xml] if flags.save_xml is not None else []),
            *(["--use-pytest"] if flags.use_pytest else [])]


def _report_name(program: str) -> str:
    """The file's name in its report's path, as upstream's: ``dir.test_x``
    for ``dir/test_x.py`` under the working directory."""
    relative = os.path.relpath(os.path.abspath(program))
    if relative.startswith(os.pardir):
        relative = os.path.basename(program)
    return os.path.splitext(relative)[0].replace(os.sep, ".")


def _refuse_what_it_does_not_act_on(parser: argparse.ArgumentParser, flags: argparse.Namespace) -> None:
    for dest, (flag, why) in _REFUSALS.items():
        # A flag left at upstream's default (--run-parallel 1) does nothing there either.
        if getattr(flags, dest) != parser.get_default(dest):
            _usage_error(REFUSED.format(flag=flag, why=why))
    if flags.repeat < 1:
        _usage_error(REFUSED.format(flag=f"--repeat {flags.repeat}", why="it needs a count of 1 or more"))
    if flags.repeat > 1 and flags.use_pytest:
        _usage_error(REFUSED.format(flag=f"--repeat {flags.repeat} with --use-pytest",
                                    why="pytest runs the file once; repeat with pytest-repeat's --count N"))


def run_tests(argv: Sequence[str] | None = None) -> None:
    """Run the tests of the ``__main__`` module, as upstream's ``run_tests``.

    ``argv``: the command line, program first (default ``sys.argv``). The
    process's generators are seeded first (:func:`disttest.set_rng_seed`),
    as upstream's are. Exits as ``unittest.main`` does (status 1 when a test failed); a
    flag of upstream's this does not act on exits with status 2 and names it.
    ``--accept`` also sets ``EXPECTTEST_ACCEPT=1``, which expecttest's
    ``assertExpectedInline`` reads (upstream's flag does not reach it).
    """
    given = list(sys.argv if argv is None else argv)
    program, args = given[0], given[1:]
    parser = _parser()
    flags, rest = parser.parse_known_args(args)
    _refuse_what_it_does_not_act_on(parser, flags)
    import expecttest

    if flags.accept or not expecttest.ACCEPT:  # (else EXPECTTEST_ACCEPT=1 set it already)
        expecttest.ACCEPT = flags.accept
    if flags.accept:
        # NB: expecttest's assertExpectedInline reads the environment, not
        # ACCEPT (upstream's flag never reached it).
        os.environ["EXPECTTEST_ACCEPT"] = "1"
    set_rng_seed()  # as upstream's run starts
    main = sys.modules["__main__"]
    if flags.discover_tests:
        for case in _cases(unittest.defaultTestLoader.loadTestsFromModule(main)):
            print(case.id().split(".", 1)[1])
        return
    if flags.subprocess:
        if flags.use_pytest:  # pytest's node ids: file::Class::test; its arguments go to each child
            names = [c.id().split(".", 1)[1] for c in _cases(unittest.defaultTestLoader.loadTestsFromModule(main))]
            names = [f"{program}::{n.replace('.', '::')}" for n in names]
        else:  # the tests unittest's own arguments select (names, -k), each run alone
            names, rest = _selected(main, rest)
        _each_in_a_process(program, [*_forwarded(flags), *rest], names)
        return
    if flags.showlocals:  # (ranks format their own tracebacks: they read it)
        os.environ[TB_LOCALS_ENV] = "1"
    if flags.use_pytest:
        import pytest

        extra = ["--showlocals", "--tb=long"] if flags.showlocals else []
        if flags.save_xml is not None:
            name = _report_name(program)
            folder = os.path.join(flags.save_xml.replace("python-unittest", "python-pytest"), name)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{name}-{os.urandom(8).hex()}.xml")
            print(XML_AT.format(path=path))
            extra.append(f"--junit-xml={path}")
        # A node id of the file (a --subprocess child's) names the file itself.
        file = [] if any(a.startswith(f"{program}::") for a in rest) else [program]
        code = pytest.main([*file, *extra, *rest])
        # 5: no tests collected (upstream: a file may hold none for a config)
        raise SystemExit(0 if code == 5 else int(code))
    unittest_argv = [program, *(["--locals"] if flags.showlocals else []), *rest]
    runner: unittest.TextTestRunner | None = None  # (unittest.main's default)
    if flags.save_xml is not None:
        try:
            import xmlrunner  # type: ignore[import-not-found]
        except ImportError:
            _usage_error(NO_XMLRUNNER)
        verbose = "-v" in rest or "--verbose" in rest
        folder = os.path.join(flags.save_xml, _report_name(program))
        os.makedirs(folder, exist_ok=True)
        runner = xmlrunner.XMLTestRunner(output=folder, verbosity=2 if verbose else 1)
    judge.suite_summary_by("run_tests")  # (said below, and the run fails)
    for _ in range(flags.repeat - 1):
        if not unittest.main(module=main, argv=unittest_argv, exit=False, testRunner=runner).result.wasSuccessful():
            raise SystemExit(1)
    result = unittest.main(module=main, argv=unittest_argv, exit=False, testRunner=runner).result
    if judge.say_unfired(sys.stderr):  # a suite-wide fault that fired in no test
        raise SystemExit(1)
    if sys.version_info >= (3, 12) and result.testsRun == 0 and not result.skipped:
        raise SystemExit(5)  # (as unittest.main exits: no tests ran)
    raise SystemExit(not result.wasSuccessful())
