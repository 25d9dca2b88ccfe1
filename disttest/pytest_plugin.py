"""disttest's pytest plugin (registered through the ``pytest11`` entry point).

- ``--disttest-timeout=SECONDS``: the default per-test limit of disttest's
  runners (as ``DISTTEST_TIMEOUT``); a bad value is a usage error naming it.
- ``--disttest-mode=threads|processes|pool|simulated``: run tests made with
  ``disttest.run_in`` (and ``disttest.run_simulated``) in that mode only (as
  ``DISTTEST_MODE``).
- ``--disttest-fault``, ``--disttest-chaos``, ``--disttest-repeat``: fault
  injection and schedule fuzzing (:mod:`disttest.faults.pytest_options`).
- ``@pytest.mark.world_size(n)``: run a disttest test (or every test of a
  class) with ``n`` ranks; ``self.world_size`` reads ``n`` in every runner;
  on a plain test function, run the function in ``n`` ranks
  (``mode="threads"`` or ``"processes"``), with the fixtures ``rank`` and
  ``world_size`` (``disttest.runners._pytest``).
- Under pytest-timeout (``--timeout``, ``@pytest.mark.timeout``), disttest's
  own limit for a test stays below pytest-timeout's, so that a hang is
  reported by disttest, with every rank's stack, before pytest-timeout
  kills the process.
- ``@pytest.mark.gpu(count=1)``: a test that needs CUDA and ``count``
  GPUs; skipped, saying why, where this process sees fewer (``-m gpu``
  selects them: ``make gpu-check``).
- A report header line; under pytest-xdist, a slice of the GPUs per worker.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import unittest
from typing import Any

import pytest

from disttest._runner import settings
from disttest._runner.outcome import TB_LOCALS_ENV
from disttest._runner.report import TAIL_CHARS, RankReport, user_traceback
from disttest.config import (
    UNMARKED,
    ConfigError,
    default_timeout,
    mark_world_size,
    parse_timeout,
    parse_world_size,
)
from disttest.faults import CHAOS_ENV, FAULT_ENV, FAULT_OPTION_ENV, SPAWNS, chaos_seed, env_faults
from disttest.faults import pytest_options as _faults_pytest
from disttest.runners import _pytest as _pytest_support
from disttest.runners.modes import FORCED_MODES, MODE_ENV, forced_mode
from disttest.support import janitor

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_plugin_registered",
    "pytest_pyfunc_call",
    "pytest_report_header",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_runtest_protocol",
    "pytest_unconfigure",
    "rank",
    "world_size",
]


#: The name the ``pytest11`` entry point gives the plugin (``-p no:disttest`` turns it off).
ENTRY_POINT = "disttest"


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    # NB: the plugin is one module under two names: the entry point's, and
    # the module's own, which ``-p disttest.pytest_plugin`` and a conftest's
    # ``pytest_plugins = ["disttest.pytest_plugin"]`` register. The second
    # registration of the module, under the other name, was pluggy's "Plugin
    # already registered under a different name", and pytest stopped before
    # it began. The other name is blocked instead: pytest skips it quietly.
    if plugin is sys.modules[__name__]:
        for name in (ENTRY_POINT, __name__):
            if manager.get_plugin(name) is None:
                manager.set_blocked(name)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("disttest", "distributed tests (disttest)")
    group.addoption("--disttest-timeout", dest="disttest_timeout", default=None, metavar="SECONDS",
                    help="default per-test limit of disttest's runners (sets DISTTEST_TIMEOUT)")
    # (case does not count, as in the variables: --disttest-mode=THREADS)
    group.addoption("--disttest-mode", dest="disttest_mode", default=None, choices=FORCED_MODES, type=str.lower,
                    help="run the classes disttest.run_in (or run_simulated) makes in this mode only "
                         "(sets DISTTEST_MODE)")
    group.addoption("--disttest-output", dest="disttest_output", default=None,
                    choices=settings.OUTPUT_MODES, type=str.lower,
                    help="stream: pass on every rank's output as it comes, prefixed [rank N] "
                         "(the default under pytest: captured per test, live with -s); "
                         "tail: only a failing rank's output, in its report (sets DISTTEST_OUTPUT)")
    group.addoption("--disttest-keep-logs", dest="disttest_keep_logs", action="store_true",
                    help="keep every rank's whole output of a failing test in a folder its "
                         "report names (sets DISTTEST_KEEP_LOGS)")
    _faults_pytest.addoption(group)


#: The variables the plugin sets from its options (for its rank processes);
#: put back as they were when pytest unconfigures (``pytest.main`` returns).
PLUGIN_ENV = ("DISTTEST_TIMEOUT", MODE_ENV, settings.OUTPUT_ENV, settings.KEEP_LOGS_ENV, FAULT_ENV, FAULT_OPTION_ENV,
              CHAOS_ENV, TB_LOCALS_ENV)


def pytest_configure(config: Any) -> None:
    config._disttest_environ = {name: os.environ.get(name) for name in PLUGIN_ENV}
    config.addinivalue_line("markers", "world_size(n, mode='threads'): run this disttest test "
                                       "(or plain function: threads or processes) with n ranks")
    config.addinivalue_line("markers", "gpu(count=1): this test needs CUDA and at least count GPUs; "
                                       "skipped, saying why, where there are fewer (disttest)")
    try:
        # Only in a pytest-xdist worker (it has ``workerinput``): a pytest
        # started from inside a worker inherits the worker's PYTEST_XDIST_*
        # variables, and the controller must see every device to hand out.
        if getattr(config, "workerinput", None) is not None:
            _pytest_support.apply_xdist_gpu_slice()
            config._disttest_controller_undo = _pytest_support.end_with_controller()
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    raw = config.getoption("disttest_timeout")
    if raw is not None:
        try:
            seconds = parse_timeout(raw, "--disttest-timeout", text=True)
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        os.environ["DISTTEST_TIMEOUT"] = str(seconds)
        config._disttest_set_by = {"DISTTEST_TIMEOUT": "--disttest-timeout"}
    mode = config.getoption("disttest_mode")
    if mode is not None:
        os.environ[MODE_ENV] = mode
    else:
        try:  # a bad DISTTEST_MODE: a usage error now, not an error collecting each file that uses it
            forced_mode()
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
    output = config.getoption("disttest_output")
    if output is not None or not os.environ.get(settings.OUTPUT_ENV):
        os.environ[settings.OUTPUT_ENV] = output or "stream"
    if config.getoption("disttest_keep_logs"):
        os.environ[settings.KEEP_LOGS_ENV] = "1"
    if config.getoption("showlocals", False):  # (-l: a rank's traceback shows its frames' locals)
        os.environ[TB_LOCALS_ENV] = "1"
    _faults_pytest.configure(config)
    try:  # (each bad one failed every test alone, in its setUp: one usage error now, as for DISTTEST_MODE)
        default_timeout()
        settings.check_run_variables()
        env_faults()
        chaos_seed()
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_unconfigure(config: Any) -> None:
    _faults_pytest.unconfigure(config)
    settings.note_test_streams(None, None)
    janitor.uninstall_signals()  # (pytest.main() returns: SIGTERM as it was)
    undo = getattr(config, "_disttest_controller_undo", None)
    if undo is not None:
        undo()
    for name, value in getattr(config, "_disttest_environ", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_sessionfinish(session: Any) -> None:
    _faults_pytest.session_finish(session)


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's)
def pytest_testnodedown(node: Any) -> None:
    _faults_pytest.node_down(node)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _faults_pytest.terminal_summary(terminalreporter)


#: When the item's protocol began (pytest-timeout's clock).
_STARTED = pytest.StashKey[float]()


def pytest_runtest_protocol(item: Any, nextitem: Any) -> bool | None:
    # pytest-timeout's clock starts about here (setup and teardown count),
    # unless func_only says the test function alone.
    item.stash[_STARTED] = time.monotonic()
    return _faults_pytest.runtest_protocol(item, nextitem)


#: Two ``world_size`` markers that differ on one test (pytest would use one of them).
MARKERS_TWICE = "@pytest.mark.world_size given twice, {markers}, on {where} (disttest): keep one"
#: A ``world_size`` marker given what it does not take (a typo would be ignored).
MARKER_EXTRA = "@pytest.mark.world_size takes one number and mode=, not {extra}, on {where} (disttest)"


@pytest.hookimpl(trylast=True)  # the tests that will run: after -k and -m deselected theirs
def pytest_collection_modifyitems(items: list[Any]) -> None:
    _skip_gpu_tests(items)
    for item in items:
        if not isinstance(item, pytest.Function):
            continue  # (a doctest, another plugin's item: a module's pytestmark reaches it, and it starts no ranks)
        try:
            _read_marker(item)
        except pytest.UsageError as e:
            if not hasattr(item.config, "workerinput"):
                raise
            # In a pytest-xdist worker a usage error is xdist's INTERNALERROR
            # ("assert not crashitem"), and the message is lost: the test
            # errors with it at its setup instead.
            item.setup = functools.partial(_refuse, str(e))  # type: ignore[method-assign]


def _refuse(message: str) -> None:
    pytest.fail(f"usage error: {message}", pytrace=False)


def _nearest_marker(item: Any, cls: Any) -> Any:
    """``item``'s ``world_size`` marker: its own, else that of the nearest
    class of its class's MRO that has one (pytest's closest marker is the
    farthest base's: a subclass's own marker lost to its base's), else the
    module's."""
    for found in (_world_size_marks(getattr(item, "own_markers", ())),
                  *(_world_size_marks(vars(k).get("pytestmark", [])) for k in getattr(cls, "__mro__", ()))):
        if found:
            return found[0]
    return item.get_closest_marker("world_size")


def _world_size_marks(marks: Any) -> list[Any]:
    """The ``world_size`` markers of ``marks`` (a node's own, a class's
    ``pytestmark``: a list, or one marker)."""
    return [m for m in (marks if isinstance(marks, (list, tuple)) else [marks])
            if getattr(m, "name", None) == "world_size"]


def _read_marker(item: Any) -> None:
    """Check ``item``'s ``world_size`` marker and record its size (a
    :class:`pytest.UsageError` names what is wrong)."""
    cls = getattr(item, "cls", None)
    marker = _nearest_marker(item, cls)
    if isinstance(cls, type):
        # (not a size from an earlier session's collection, nor its base's
        # marker on the test it overrides: the marker below, if any, decides)
        mark_world_size(cls, item.name, UNMARKED)
    if marker is None:
        return
    if not marker.args:
        raise pytest.UsageError(f"@pytest.mark.world_size needs a number, on {item.nodeid} (disttest)")
    # Two on the function, or two on its class (not a class's and its base's:
    # the nearer one decides, as for any marker).
    class_marks = vars(cls).get("pytestmark", []) if isinstance(cls, type) else []
    for own, where in ((_world_size_marks(getattr(item, "own_markers", ())), item.nodeid),
                       (_world_size_marks(class_marks), item.nodeid.rpartition("::")[0])):
        # (one of them was silently used; by repr: a bad value may not hash, and is named below)
        if len({repr((m.args, sorted(m.kwargs.items()))) for m in own}) > 1:
            raise pytest.UsageError(MARKERS_TWICE.format(
                markers=", ".join(f"world_size{m.args}" for m in own), where=where))
    extra = [repr(a) for a in marker.args[1:]] + [f"{k}=" for k in sorted(set(marker.kwargs) - {"mode"})]
    if extra:
        raise pytest.UsageError(MARKER_EXTRA.format(extra=", ".join(extra), where=item.nodeid))
    where = f"@pytest.mark.world_size on {item.nodeid}"
    _marker_acts(item)
    try:
        size = parse_world_size(marker.args[0], where)
        if "mode" in marker.kwargs:
            if not _plain_function(item):
                raise ConfigError("mode", marker.kwargs["mode"], where, MODE_NOT_HERE)
            _pytest_support.function_mode(marker.kwargs, where)
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    func = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    decorated = getattr(func, "__disttest_requires_world_size__", None)
    if decorated is not None and decorated != size:  # (the marker's size ran, the skip was the decorator's)
        raise pytest.UsageError(MARKER_AND_REQUIRES.format(marker=size, required=decorated, where=item.nodeid))
    if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
        mark_world_size(cls, item.name, size)


#: ``mode=`` on a test whose class decides how its ranks run.
MODE_NOT_HERE = ("mode= applies to plain test functions only; a disttest TestCase's class decides how its "
                 "ranks run (MultiThreadedTestCase, MultiProcessTestCase, MultiProcContinousTest, run_in)")


#: A world_size marker and requires_world_size that disagree on one test.
MARKER_AND_REQUIRES = ("@pytest.mark.world_size({marker}) and requires_world_size({required}) on {where} (disttest): "
                       "two world sizes for one test; keep one")
#: A world_size marker where nothing reads it (the test would run as it is).
MARKER_IGNORED = ("@pytest.mark.world_size on {where} (disttest): {what} starts no ranks by the marker; it acts "
                  "on the tests of MultiThreadedTestCase, MultiProcessTestCase, MultiProcContinousTest, "
                  "SimulatedTestCase, run_in and run_simulated classes, and on plain test functions")
#: A world_size marker on a function that starts its ranks itself.
MARKER_AND_SPAWNS = ("@pytest.mark.world_size on {where} (disttest): the function starts its own ranks "
                     "(spawn_threads_and_init_comms), and the marker would start a world around each; "
                     "give the size to one of them")


def _marker_acts(item: Any) -> None:
    """Refuse a world_size marker on a test that no runner starts by it."""
    cls = getattr(item, "cls", None)
    obj = getattr(item, "obj", None)
    if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
        if not getattr(cls, settings.READS_MARKER, False):
            raise pytest.UsageError(MARKER_IGNORED.format(where=item.nodeid, what=f"{cls.__name__}, a TestCase,"))
        return
    if not callable(obj) or not _pytest_support.wants_ranks(obj):
        raise pytest.UsageError(MARKER_IGNORED.format(where=item.nodeid, what="a method of a plain class"))
    if getattr(obj, SPAWNS, False):
        raise pytest.UsageError(MARKER_AND_SPAWNS.format(where=item.nodeid))


def _plain_function(item: Any) -> bool:
    """True for a test the marker runs in ranks itself (not a TestCase's method)."""
    cls = getattr(item, "cls", None)
    if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
        return False
    obj = getattr(item, "obj", None)
    return callable(obj) and _pytest_support.wants_ranks(obj)


def _skip_gpu_tests(items: list[Any]) -> None:
    """Mark each test marked ``gpu`` that cannot run here as skipped, with why."""
    reasons: dict[int, str | None] = {}  # by GPU count: the devices are counted once
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        try:
            count = _pytest_support.gpu_count(marker.args, marker.kwargs, f"@pytest.mark.gpu on {item.nodeid}")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        if count not in reasons:
            reasons[count] = _pytest_support.gpu_skip_reason(count)
        reason = reasons[count]
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _pytest_timeout(item: Any) -> float | None:
    """The limit pytest-timeout puts on ``item`` (None: none, or no plugin)."""
    if not item.config.pluginmanager.hasplugin("timeout"):
        return None
    marker = item.get_closest_marker("timeout")
    raw: Any = None
    if marker is not None:
        raw = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    if raw is None:
        raw = item.config.getoption("timeout", None)
    if raw is None:  # (pytest-timeout reads it after the command line, before the ini)
        raw = os.environ.get("PYTEST_TIMEOUT") or None
    if raw is None:
        try:
            raw = item.config.getini("timeout")
        except (ValueError, KeyError):
            raw = None
    try:
        seconds = float(raw) if raw not in (None, "") else 0.0
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_setup(item: Any) -> Any:
    # Innermost: after pytest's capture resumed, before the fixtures (capsys).
    settings.note_test_streams(sys.stdout, sys.stderr)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    marker = item.get_closest_marker("timeout")
    func_only = marker.kwargs.get("func_only") if marker is not None else None
    if func_only is None:
        try:
            func_only = item.config.getini("timeout_func_only")
        except (ValueError, KeyError):
            func_only = False
    # (--disttest-repeat runs the test many times under pytest-timeout's one
    # limit: each run gets its share from its own start, and the repeats
    # tell a limit over all of them from a seed's failure)
    repeats = getattr(item.config, "_disttest_repeat", None)
    since = None if func_only or repeats else item.stash.get(_STARTED, None)
    with settings.outer_limit(_pytest_timeout(item), since):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """A failing distributed test's report shows the user's frames and the
    report's header, then a section per group of ranks (terminal,
    ``--junitxml``): each part once. Properties name the failing ranks and
    each one's output tail (in JUnit XML's ``<properties>``)."""
    result = yield
    report = result.get_result()
    excinfo = call.excinfo
    if call.when == "call":
        # A rerun (pytest-rerunfailures) keeps the item's properties: an earlier
        # run's failing ranks are not this run's.
        item.user_properties[:] = [p for p in item.user_properties if not str(p[0]).startswith(_PROPERTY)]
    if call.when != "call" or excinfo is None:
        return
    if not isinstance(excinfo.value, RankReport):
        if report.failed and _raised_by_the_harness(excinfo.value):
            # Only disttest's and unittest's frames: pytest, which hides
            # them unless nothing is left, showed pages of disttest's source.
            # The test method's line stands for them, as in a rank's report.
            tb = user_traceback([], item.obj)
            if tb is not None:
                report.longrepr = item.repr_failure(
                    pytest.ExceptionInfo.from_exception(excinfo.value.with_traceback(tb)))
        return
    exc = excinfo.value
    if report.failed:
        report.longrepr = item.repr_failure(pytest.ExceptionInfo.from_exception(_summary_only(exc, item.obj)))
        # Sections of the failure itself (not captured output): kept by
        # --show-capture=no and written to JUnit XML with the failure.
        add = getattr(report.longrepr, "addsection", None)
        for title, text in exc.sections:
            if add is not None:
                add(title, text)
            else:  # a --tb=line / --tb=no representation: what pytest shows of any failure
                report.sections.append((title, text))
    causes = [o for o in exc.outcomes if o.kind.is_cause]
    item.user_properties.append(("disttest_failing_ranks", ",".join(str(o.rank) for o in causes)))
    for o in causes:
        item.user_properties.append((f"disttest_rank_{o.rank}", o.kind.value))
        if o.output_tail.strip():
            item.user_properties.append((f"disttest_rank_{o.rank}_output", o.output_tail[-TAIL_CHARS:]))


#: What the names of disttest's properties of a test (JUnit XML) start with.
_PROPERTY = "disttest_"


def _raised_by_the_harness(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in disttest's code with no frame of the
    user's on the way (a pool that could not start, a bad setting)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        if "__unittest" not in tb.tb_frame.f_globals:
            return False
        last = tb
        tb = tb.tb_next
    return last is not None and str(last.tb_frame.f_globals.get("__name__", "")).startswith("disttest.")


def _summary_only(exc: RankReport, test: Any) -> RankReport:
    """The same report with its summary for a message (the sections follow
    on their own) and the user's frames for a traceback: its own where it
    has one, else the test method's (a report raised in the test process,
    such as "no ranks were started", has only disttest's frames, which
    pytest would show rather than none); else, where the test method is
    harness code itself (the conformance suite's), its own frames: pytest
    needs a traceback."""
    short = type(exc)(exc.summary(), exc.test, exc.world_size, exc.timeout, exc.outcomes)
    short.__suppress_context__ = True
    tb = exc.__traceback__
    while tb is not None and "__unittest" in tb.tb_frame.f_globals:
        tb = tb.tb_next
    if tb is None:
        tb = user_traceback([], test) or exc.__traceback__
    return short.with_traceback(tb)


def pytest_report_header(config: Any) -> str:
    return _pytest_support.header_line(set_by=getattr(config, "_disttest_set_by", None))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    marker = pyfuncitem.get_closest_marker("world_size")
    if marker is None or not marker.args or not _pytest_support.wants_ranks(pyfuncitem.obj):
        return None
    where = f"@pytest.mark.world_size on {pyfuncitem.nodeid}"
    if _pytest_support.is_async(pyfuncitem.obj):
        # NB: called plainly, its body would never run and the test pass.
        pytest.fail(_pytest_support.ASYNC_FUNCTION.format(where=pyfuncitem.nodeid), pytrace=False)
    mode = _pytest_support.function_mode(marker.kwargs, where)
    users = _pytest_support.rank_fixture_users(pyfuncitem._fixtureinfo.name2fixturedefs)
    if users:
        pytest.fail(_pytest_support.FIXTURE_USES_RANK.format(where=pyfuncitem.nodeid, fixtures=", ".join(users)),
                    pytrace=False)
    capture = [n for n in pyfuncitem._fixtureinfo.argnames if n in _pytest_support.CAPTURE_FIXTURES]
    if capture and mode == "processes":  # (they were silently empty)
        pytest.fail(_pytest_support.CAPTURE_IN_PROCESSES.format(where=pyfuncitem.nodeid, fixtures=", ".join(capture)),
                    pytrace=False)
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    _pytest_support.run_function(pyfuncitem.obj, kwargs, marker.args[0], mode, pyfuncitem.name)
    return True


@pytest.fixture
def rank() -> int:
    """This rank's number, in a function marked ``world_size`` (-1 elsewhere)."""
    return _pytest_support.NOT_IN_A_RANK


@pytest.fixture
def world_size(request: Any) -> int:
    """The number of ranks of a function marked ``world_size`` (-1 elsewhere)."""
    marker = request.node.get_closest_marker("world_size")
    if marker is None or not marker.args:
        return _pytest_support.NOT_IN_A_RANK
    return parse_world_size(marker.args[0], f"@pytest.mark.world_size on {request.node.nodeid}")
