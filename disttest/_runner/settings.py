"""One run configuration for every runner: world size, timeout, start method, scheduling.

Resolved here, once, for the three test-case classes:

- world size: the test method's recorded size (``@pytest.mark.world_size``,
  ``requires_world_size``), else the class's ``world_size`` (attribute or
  property); :func:`pin_world_size` makes ``self.world_size`` read the
  resolved value in the parent and in every rank, whatever the class says;
- timeout: the class's ``timeout`` (seconds or a timedelta, attribute or
  property), else :func:`~disttest.config.get_timeout`; kept below an outer
  limit (pytest-timeout's, set by the plugin for the current test through
  :func:`outer_limit`) so that disttest reports the hang, with every rank's
  stack, before the outer limit kills the process;
- start method: an explicit argument, else ``DISTTEST_START_METHOD``, else
  the class's ``start_method``;
- rank threads: the class's ``rank_threads``, OpenMP threads per forked
  rank process (a positive int, or None for torch's default);
- fork server: ``DISTTEST_FORK_SERVER``: ``copy`` (the default) forks the
  fork server from the test process where that is safe (one thread, no
  CUDA on the host, ranks with one OpenMP thread), so it costs a fork
  instead of a second interpreter that imports torch; ``fresh`` always
  starts a fresh interpreter (see :mod:`disttest._runner.zygote`);
- output: ``DISTTEST_OUTPUT`` (or the plugin's ``--disttest-output``):
  ``stream`` writes every line a rank (process or thread) prints to the
  test process's stdout as it comes, prefixed ``[rank N]`` (under pytest:
  captured per test, live with ``-s``); ``tail`` (the default) keeps it for the report of
  a failing rank only; ``DISTTEST_KEEP_LOGS`` (or ``--disttest-keep-logs``)
  keeps every rank's whole log of a failing test in a folder the report names;
- rank scheduling: ``DISTTEST_RANK_SCHEDULING``, else the class's
  ``rank_scheduling``: ``batch`` (the default) runs rank processes under
  Linux's ``SCHED_BATCH`` policy: a rank woken by a peer's message does not
  preempt the process that is running, so a collective's messages flow
  without a context switch per hop (4 gloo ranks on 2 CPUs: a small
  all_reduce in about 0.5 ms instead of 3 ms; ``benchmarks/bench_continuous.py``),
  and the test process, which is not batch, stays responsive (a run started
  under another policy than the normal one keeps it); ``normal`` leaves the
  ranks under the default policy;
- thread scheduling: ``DISTTEST_THREAD_SCHEDULING``, else the class's
  ``thread_scheduling``: ``turns`` (the default) runs one rank thread at a
  time, each until it waits for its peers in a collective
  (:mod:`disttest.pg._baton`: far fewer context switches; a thread that blocks
  elsewhere frees them all after a few milliseconds); ``free`` lets them
  all run at once from the start.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import operator
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from disttest.config import (
    ConfigError,
    get_timeout,
    marked_world_size,
    parse_flag,
    parse_timeout,
    parse_world_size,
)

__unittest = True

__all__ = [
    "FORK_SERVERS",
    "FORK_SERVER_ENV",
    "KEEP_LOGS_ENV",
    "READS_MARKER",
    "SCHEDULING_ENV",
    "SCHEDULINGS",
    "OUTPUT_ENV",
    "OUTPUT_MODES",
    "START_METHODS",
    "START_METHOD_ENV",
    "TB_LOCALS_ENV",
    "THREAD_SCHEDULINGS",
    "THREAD_SCHEDULING_ENV",
    "check_run_variables",
    "fork_server",
    "keep_logs",
    "note_test_streams",
    "output_mode_applies",
    "outer_cap",
    "outer_left",
    "outer_limit",
    "output_mode",
    "pick",
    "pin_world_size",
    "rank_scheduling",
    "rank_preload",
    "rank_process_options",
    "rank_threads",
    "rebuild_cap",
    "seed",
    "start_method",
    "test_timeout",
    "thread_scheduling",
    "threads_for",
    "world_size",
]

#: Set on the classes whose tests start as many ranks as the pytest marker
#: ``world_size`` says (they read it through :func:`world_size`); the plugin
#: refuses the marker on another TestCase, where it would do nothing.
READS_MARKER = "__disttest_reads_world_size_marker__"
OUTPUT_ENV = "DISTTEST_OUTPUT"
OUTPUT_MODES = ("tail", "stream")
KEEP_LOGS_ENV = "DISTTEST_KEEP_LOGS"
#: Set (to 1) by ``run_tests --showlocals`` and pytest's ``--showlocals``: a
#: rank's traceback shows each frame's locals (the report is made from the
#: rank's text; the test process has none of its frames).
TB_LOCALS_ENV = "DISTTEST_TB_LOCALS"
START_METHODS = ("zygote", "fork", "spawn")
START_METHOD_ENV = "DISTTEST_START_METHOD"
FORK_SERVER_ENV = "DISTTEST_FORK_SERVER"
FORK_SERVERS = ("copy", "fresh")
SCHEDULING_ENV = "DISTTEST_RANK_SCHEDULING"
SCHEDULINGS = ("batch", "normal")
THREAD_SCHEDULING_ENV = "DISTTEST_THREAD_SCHEDULING"
THREAD_SCHEDULINGS = ("turns", "free")
#: Of an outer limit (pytest-timeout's), the share disttest may use; the
#: rest is for collecting stacks, stopping ranks and reporting.
OUTER_SHARE = 0.7
OUTER_RESERVE = 5.0  # seconds kept back at least...
#: ...where the outer limit leaves room for it; below about 7 s disttest
#: takes 35% of it (a 5 s limit kept disttest's at 300 s: 5 - 5 = 0), which
#: leaves time to stop the ranks (a thread runner's wait for a rank it cannot
#: stop ends in time, :func:`outer_left`) and the report.
OUTER_SHARE_SHORT = 0.35
#: What disttest still waits when nothing is left of the outer limit: it
#: reports at once, maybe before the outer limit's end.
OUTER_LEFT_FLOOR = 0.1

#: (the outer limit in seconds, when it started on the monotonic clock)
_outer: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("disttest_outer_limit",
                                                                                   default=None)


@contextlib.contextmanager
def outer_limit(seconds: float | None, since: float | None = None) -> Iterator[None]:
    """While the block runs, the current test is killed by something else
    ``seconds`` after ``since`` (on the monotonic clock; default: when the
    block began), as pytest-timeout does: disttest's own limit stays below
    what is left of it."""
    token = _outer.set(None if seconds is None else (seconds, time.monotonic() if since is None else since))
    try:
        yield
    finally:
        _outer.reset(token)


def _static(owner: Any, name: str) -> Any:
    """``owner.name`` read from the class, so that a property is evaluated
    without a usable instance (as a pool does before any test runs)."""
    cls = owner if isinstance(owner, type) else type(owner)
    raw = inspect.getattr_static(cls, name, None)
    if isinstance(raw, property) and raw.fget is not None:
        if not isinstance(owner, type):
            return raw.fget(owner)
        try:
            return raw.fget(object.__new__(cls))
        except AttributeError:
            return None  # the property needs a test (``self._testMethodName``)
    return raw


#: A class whose ``world_size`` is 0: its tests are skipped.
NO_RANKS = ("{cls}.world_size is 0 (disttest): no rank to run the test in (upstream's harness starts none and "
            "passes it)")


def world_size(owner: Any, method_name: str | None = None) -> int:
    """The number of ranks to start for ``owner`` (a test case or its class)
    running ``method_name``: the method's recorded size, else the class's.
    A class's size of 0 (``min(4, torch.cuda.device_count())`` without GPUs)
    raises ``unittest.SkipTest``."""
    cls = owner if isinstance(owner, type) else type(owner)
    # The pytest marker's first, then requires_world_size's on the method.
    recorded: Any = marked_world_size(cls, method_name)
    for where in (owner, cls):
        if recorded is not None:
            break
        method = getattr(where, method_name, None) if method_name else None
        recorded = getattr(method, "_required_world_size", None)
    if recorded is not None:
        return parse_world_size(recorded, f"the world size recorded on {cls.__name__}.{method_name}")
    size = _static(owner, "world_size")
    if type(size) is int and size == 0:
        # ``min(4, torch.cuda.device_count())`` on a host without GPUs, as
        # PyTorch's FSDP tests declare it: upstream starts no rank and passes.
        import unittest

        raise unittest.SkipTest(NO_RANKS.format(cls=cls.__name__))
    return parse_world_size(size, f"{cls.__name__}.world_size")


def pin_world_size(case: Any, size: int) -> None:
    """Make ``case.world_size`` read ``size`` (the ranks actually started),
    also when its class defines ``world_size`` as a property."""
    cls = type(case)
    if _static(case, "world_size") == size:
        return
    pinned = type(cls.__name__, (cls,), {"world_size": size, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__, "__test__": False})
    case.__class__ = pinned


def test_timeout(owner: Any, test_id: str | None) -> float | None:
    """The per-test limit in seconds (None: none set and no test id)."""
    cls = owner if isinstance(owner, type) else type(owner)
    raw = _static(owner, "timeout")
    if raw is None:
        limit = get_timeout(test_id) if test_id is not None else None
    else:
        if isinstance(raw, timedelta):
            raw = raw.total_seconds()
        limit = parse_timeout(raw, f"{cls.__name__}.timeout")
    inner = outer_cap()
    if inner is not None and limit is not None and inner < limit:
        limit = inner
    return limit


def outer_cap() -> float | None:
    """The most disttest may wait of what is left of the outer limit
    (pytest-timeout's) the current test runs under, leaving the rest for
    stacks and the report; None without one. (What is left: a pool's start
    in the test's first call took its part.)"""
    given = _outer.get()
    if given is None:
        return None
    seconds, since = given
    if seconds <= 0:  # (pytest-timeout's 0: no limit)
        return None
    # (in tenths of a second: a limit reads 3s, not 2.998s, in reports)
    outer = max(seconds - int((time.monotonic() - since) * 10) / 10, 0.0)
    inner = max(min(outer * OUTER_SHARE, outer - OUTER_RESERVE), outer * OUTER_SHARE_SHORT, OUTER_LEFT_FLOOR)
    return int(inner) if float(inner).is_integer() else round(inner, 3)


def outer_left() -> float | None:
    """Seconds left of the outer limit the current test runs under (None
    without one): a wait after disttest's own limit (stopping ranks that do
    not stop) ends in time for the report to come before the outer limit's."""
    given = _outer.get()
    if given is None or given[0] <= 0:
        return None
    seconds, since = given
    return max(seconds - (time.monotonic() - since), 0.0)


def _env_or_class(env: str, cls: type | None, attr: str, default: Any) -> tuple[Any, str]:
    """(value, where it came from): the variable ``env`` if set, else the
    class attribute ``attr`` (else, or without a class, ``default``)."""
    if os.environ.get(env, "").strip():
        return os.environ[env], f"environment variable {env}"
    if cls is None:
        return default, "the default"
    return getattr(cls, attr, default), f"{cls.__name__}.{attr}"


def start_method(cls: type, explicit: str | None = None) -> tuple[str, str]:
    """(start method, where it came from), validated."""
    if explicit is not None:
        raw, where = explicit, "_spawn_processes(start_method=...)"
    else:
        raw, where = _env_or_class(START_METHOD_ENV, cls, "start_method", "zygote")
    return pick("start method", raw, where, START_METHODS), where


def rank_threads(cls: type) -> int | None:
    """``cls.rank_threads``, validated: a positive int, or None."""
    raw = _static(cls, "rank_threads")
    if raw is None:
        return None
    number = _integral(raw)
    if number is not None and number >= 1:
        return number
    raise ConfigError("number of threads per rank", raw, f"{cls.__name__}.rank_threads",
                      "expected a positive int, or None for torch's default")


def threads_for(method: str, cls: type, threads: int | None) -> int | None:
    """The OpenMP threads of ``cls``'s ranks started by ``method``:
    ``threads`` (its ``rank_threads``), but spawned ranks keep torch's
    default unless the suite set ``rank_threads`` itself (disttest's default
    of 1 is for forked ranks: a fork after OpenMP's pool started hangs)."""
    if method != "spawn":
        return threads
    owner = next((k for k in cls.__mro__ if "rank_threads" in vars(k)), None)
    if owner is None or owner.__module__.split(".")[0] == "disttest":
        return None
    return threads


def rank_process_options(cls: type) -> int | None:
    """The options of ``cls``'s rank processes (fresh or pooled), validated
    before any starts: ``rank_preload``, ``DISTTEST_OUTPUT`` and
    ``DISTTEST_KEEP_LOGS``; returns ``rank_threads``."""
    rank_preload(cls)
    check_run_variables()
    return rank_threads(cls)


def rank_preload(cls: type) -> tuple[str, ...]:
    """``cls.rank_preload``, validated: module names whose top-level package
    exists, and the module itself where its package is imported here already
    (found without importing anything: the test process stays as it was)."""
    import importlib.util

    raw = _static(cls, "rank_preload")
    if raw is None:
        return ()
    where = f"{cls.__name__}.rank_preload"
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)) or not all(isinstance(n, str) for n in raw):
        raise ConfigError("list of modules to preload", raw, where, "expected a list or tuple of module names")
    for name in raw:
        top = name.partition(".")[0]
        if not top or importlib.util.find_spec(top) is None:
            raise ConfigError("module to preload", name, where, f"no module named {top!r} can be imported here")
        package = name.rpartition(".")[0]
        if package and package in sys.modules and name not in sys.modules:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):  # (a package that is a plain module; "a..b")
                found = False
            if not found:
                raise ConfigError("module to preload", name, where, f"no module named {name!r} can be imported here")
    return tuple(raw)


def _integral(raw: object) -> int | None:
    """``raw`` as an int where it is one (numpy's ``int64`` too, as a world
    size may be), else None; a bool is not."""
    if isinstance(raw, bool):
        return None
    try:
        return operator.index(raw)  # type: ignore[arg-type]
    except TypeError:
        return None


def rebuild_cap(cls: type) -> int:
    """``cls.max_pool_rebuilds``, validated: an int of at least 0."""
    raw = _static(cls, "max_pool_rebuilds")
    number = _integral(raw)
    if number is not None and number >= 0:
        return number
    raise ConfigError("number of pool rebuilds", raw, f"{cls.__name__}.max_pool_rebuilds",
                      "expected an int of at least 0")


#: What torch, numpy and ``random`` all accept as a seed.
SEED_RANGE = (0, 2**32 - 1)


#: The seed of ``disttest.TestCase`` (upstream's ``SEED``) unless a class sets ``seed``.
DEFAULT_SEED = 1234


def seed(owner: Any) -> int:
    """``owner.seed`` (a test case or its class), validated: an int that
    torch, numpy and ``random`` all accept. A ``seed`` that is None or a
    method is the class's own business (upstream's ``TestCase`` has no such
    setting): :data:`DEFAULT_SEED`."""
    cls = owner if isinstance(owner, type) else type(owner)
    raw: Any = getattr(owner, "seed", None)
    if isinstance(raw, property):  # (read on the class: the pool's, before any test)
        raw = _static(owner, "seed")
    if raw is None or callable(raw):
        return DEFAULT_SEED
    number = _integral(raw)
    if number is not None and SEED_RANGE[0] <= number <= SEED_RANGE[1]:
        return number
    raise ConfigError("seed", raw, f"{cls.__name__}.seed",
                      f"expected an int from {SEED_RANGE[0]} to {SEED_RANGE[1]} (numpy's range)")


def fork_server() -> str:
    """``copy`` or ``fresh`` (see the module docstring), validated."""
    return _choice("fork server", FORK_SERVER_ENV, None, "fork_server", FORK_SERVERS)


def output_mode() -> str:
    """``stream`` or ``tail`` (see the module docstring), validated."""
    raw = os.environ.get(OUTPUT_ENV, "").strip().lower() or "tail"
    if raw not in OUTPUT_MODES:
        raise ConfigError("output mode", os.environ[OUTPUT_ENV], f"environment variable {OUTPUT_ENV}",
                          f"expected one of {OUTPUT_MODES}")
    return raw


#: The test's own standard streams, noted by the pytest plugin before the
#: test's fixtures run: a stream that a fixture put in their place (capsys)
#: is the test's to read, and thread ranks' lines go there as written.
_test_streams: list[Any] = [None, None]


def note_test_streams(stdout: Any, stderr: Any) -> None:
    """Note the current test's own ``sys.stdout`` and ``sys.stderr`` (None: none noted)."""
    _test_streams[:] = [stdout, stderr]


def output_mode_applies(which: int, stream: Any) -> bool:
    """Whether ``DISTTEST_OUTPUT`` applies to thread ranks' writes to
    ``stream``, the current ``sys.stdout`` (``which`` 0) or ``sys.stderr``
    (1): yes unless the test replaced its own stream (pytest's ``capsys``,
    which the test reads back, as a rank process reads its own copy)."""
    noted = _test_streams[which]
    return noted is None or stream is noted


def check_run_variables() -> None:
    """Refuse a bad disttest variable as a run starts, whichever runner
    reads it: ``DISTTEST_OUTPUT``, ``DISTTEST_KEEP_LOGS`` and
    ``DISTTEST_TB_LOCALS`` are read when a rank prints or a test fails, where
    a ConfigError would hide the test's own result; the start method, fork
    server and schedulings only by some runners, so that a run of the others
    went green with a misspelt one."""
    output_mode()
    keep_logs()
    parse_flag(os.environ.get(TB_LOCALS_ENV), f"environment variable {TB_LOCALS_ENV}")
    for what, env, choices in (("start method", START_METHOD_ENV, START_METHODS),
                               ("fork server", FORK_SERVER_ENV, FORK_SERVERS),
                               ("rank scheduling", SCHEDULING_ENV, SCHEDULINGS),
                               ("thread scheduling", THREAD_SCHEDULING_ENV, THREAD_SCHEDULINGS)):
        if os.environ.get(env, "").strip():
            pick(what, os.environ[env], f"environment variable {env}", choices)


def keep_logs() -> bool:
    """Whether a failing test's rank logs are kept (``DISTTEST_KEEP_LOGS``)."""
    return parse_flag(os.environ.get(KEEP_LOGS_ENV), f"environment variable {KEEP_LOGS_ENV}")


def rank_scheduling(cls: type) -> str:
    """``batch`` or ``normal`` (see the module docstring), validated."""
    return _choice("rank scheduling", SCHEDULING_ENV, cls, "rank_scheduling", SCHEDULINGS)


def thread_scheduling(cls: type | None) -> str:
    """``turns`` or ``free`` (see the module docstring), validated; without
    a class (``spawn_threads_and_init_comms``), from the environment only."""
    return _choice("thread scheduling", THREAD_SCHEDULING_ENV, cls, "thread_scheduling", THREAD_SCHEDULINGS)


def _choice(what: str, env: str, cls: type | None, attr: str, choices: tuple[str, ...]) -> str:
    # The variable, else the class attribute, else the first choice.
    raw, where = _env_or_class(env, cls, attr, choices[0])
    return pick(what, raw, where, choices)


def pick(what: str, raw: object, where: str, choices: tuple[str, ...]) -> str:
    """``raw`` (from ``where``) as one of ``choices``, read as every
    disttest choice is: case and surrounding blanks do not count."""
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in choices:
        raise ConfigError(what, raw, where, f"expected one of {choices}")
    return str(value)
