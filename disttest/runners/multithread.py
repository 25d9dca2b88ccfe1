"""``MultiThreadedTestCase``: ranks as threads over the threaded group.

The fastest way to test collective logic: ``world_size`` threads of the test
process, each with its own default group of the in-process ``threaded``
backend (:mod:`disttest.pg.threaded`). The join, timeout, fail-fast, desync
and report are the shared core's, as for processes. NB: the CPU RNG is
shared by the threads, so random values differ between ranks
(``assertEqualOnRank`` checks on one rank only).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import threading
import time
import types
import unittest
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._runner import process_state, proctree, settings, thread_pool
from disttest._runner.join import join
from disttest._runner.outcome import (
    Kind,
    Outcome,
    after_cleanups,
    in_phase,
    subtests_named,
)
from disttest._runner.report import (
    NO_RANKS_STARTED,
    RankError,
    RankFailure,
    raise_for_outcomes,
    warn_at,
)
from disttest._runner.threads import ThreadLauncher
from disttest._runner.verdict import who
from disttest.config import (
    DEFAULT_WORLD_SIZE,
    ConfigError,
    get_timeout,
    parse_timeout,
    parse_world_size,
)
from disttest.faults import SPAWNS, chaos_seed, test_faults
from disttest.faults.judge import Injection
from disttest.faults.rank import armed
from disttest.pg.threaded import BACKEND, install_threaded_pg, uninstall_threaded_pg
from disttest.runners._dispatch import RankDispatch
from disttest.support import janitor
from disttest.support.helpers import set_environ

__unittest = True

__all__ = ["MultiThreadedTestCase", "spawn_threads_and_init_comms"]

LEFT_RUNNING = (
    "{test!r} (disttest): the test left {what} running after its ranks ended: {names}; "
    "disttest made {them} daemon so that the process can exit. Join every thread a test starts "
    "(or make it a daemon)"
)
UNDELIVERED = (
    "{test!r} (disttest): every rank passed, but messages were sent and waited for that no rank received: "
    "{sends}. On gloo or NCCL such a send waits for its receiver until the group's timeout: "
    "receive every message a test sends"
)
LEFT_RUNNING_WAIT = 0.2  # seconds a thread the test started gets to end with it
UNSTOPPABLE = (
    "\n\nNB: the threads of {who} could not be stopped (blocked outside Python, or the test caught "
    "disttest's RankStopped, an except BaseException, and went on); disttest raises RankStopped into "
    "them again whenever they run Python code it may stop, and they are daemon threads, which end with "
    "the process (disttest)"
)


#: The largest world of rank threads. NB: beyond it, thousands of threads
#: contend for the interpreter's lock: 8192 ranks gave no verdict in minutes
#: and the process ignored SIGTERM (its handler runs in the main thread).
MAX_THREAD_WORLD_SIZE = 4096
THREAD_WORLD_TOO_BIG = ("at most {most} rank threads start in one process (beyond, thousands of threads contend "
                        "for the interpreter's lock and the test cannot be stopped in time); for a larger world "
                        "use SimulatedTestCase (one thread, any world size) or with_fake_comms")


def _drop_releases(record: logging.LogRecord) -> bool:
    """A filter of c10d's logger: not the record of each rank's collective
    that disttest released to stop the test (its error is said by the report)."""
    msg = record.msg
    return not (isinstance(msg, dict) and "by disttest" in str(msg.get("error", "")))


class _ThreadRun:
    """One test's threaded ranks: install the world, run, join, uninstall."""

    def __init__(self, world_size: int, body: Callable[[int], None], test: str, timeout: float,
                 test_cls: type | None = None, owner: object = None) -> None:
        """``owner``: what holds the test as attribute ``test``, for the
        faults it declares (default ``test_cls``); ``timeout``: the test's
        limit, which starting the ranks is held to as well. (What the ranks
        change for the whole process is put back by the caller, around all
        of the test: :func:`~disttest._runner.process_state.snapshot`.)"""
        # Each change to the process is undone by close(), also when a later
        # step (a fault declared wrong, a world the system will not start) raises.
        self._undo = contextlib.ExitStack()
        self.timeout = timeout
        if world_size > MAX_THREAD_WORLD_SIZE:
            where = f"{test_cls.__name__}.world_size" if test_cls is not None else f"the world size of {test!r}"
            raise ConfigError("world size", world_size, where, THREAD_WORLD_TOO_BIG.format(most=MAX_THREAD_WORLD_SIZE))
        try:
            turns = settings.thread_scheduling(test_cls) == "turns"
            settings.check_run_variables()
            owner = owner if owner is not None else test_cls
            # Every init_process_group wraps sys.excepthook (c10d's rank prefix):
            # restored after each test, or 10,000 tests nest 20,000 hooks.
            self._undo.callback(restore_hooks, sys.excepthook, threading.excepthook)
            self.world = install_threaded_pg()
            self._undo.callback(uninstall_threaded_pg)
            c10d_log = _compat.c10d_logger()
            if c10d_log is not None:  # (its records reach pytest's capture: one a rank, 1023 at 1024 ranks)
                c10d_log.addFilter(_drop_releases)
                self._undo.callback(c10d_log.removeFilter, _drop_releases)
            # As in upstream's ranks (its helpers register it): undone after the test.
            undo_fake = _compat.install_fake_backend()
            if undo_fake is not None:
                self._undo.callback(undo_fake)
            # The ranks' first assertEqual would import torch.distributed.tensor
            # (about a second, in the test's time, the other ranks blocked on the
            # import lock) only to ask whether an input is a DTensor.
            self._undo.callback(_compat.lazy_dtensor_comparison())
            # Upstream's setUp sets it for the rest of the process; here for the test.
            self._undo.callback(set_environ, set_environ({"TORCH_SHOW_CPP_STACKTRACES": "1"}))
            self.injection = Injection.for_test(owner, test, self.world, world_size) if owner is not None else None
            self._undo.push(torch.autograd.set_multithreading_enabled(False))
            self.test = test
            self.launcher = ThreadLauncher(world_size, self.world, body, name=f"{test} rank", turns=turns)
            self._undo.callback(self.launcher.stop)
            self.launcher.start(deadline=time.monotonic() + timeout, timeout=timeout)
        except BaseException:
            self.close()
            raise

    def join(self, timeout: float) -> list[Outcome]:
        try:
            expected = self.injection.expected_end if self.injection else None
            return join(self.launcher, timeout, expected_end=expected)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the ranks and undo what the run changed (once)."""
        self._undo.close()

    def raise_for(self, outcomes: list[Outcome], timeout: float, always_failure: bool = False,
                  where: Callable[..., Any] | None = None) -> None:
        passed = all(o.kind is Kind.PASSED for o in outcomes)
        if self.injection is not None:
            outcomes = self.injection.judge(outcomes)
        try:
            raise_for_outcomes(self.test, len(outcomes), timeout, outcomes, always_failure,
                               keep_logs=self.launcher.keep_logs, where=where)
            if passed:  # as run, and as judged (a fault that never fired is the report)
                self._raise_for_undelivered(outcomes, timeout)
        except (RankFailure, RankError) as e:
            if self.launcher.unstoppable:
                stuck = who(sorted(self.launcher.unstoppable), len(outcomes))
                e.args = (e.args[0] + UNSTOPPABLE.format(who=stuck),)
            raise

    def _raise_for_undelivered(self, outcomes: list[Outcome], timeout: float) -> None:
        """Every rank passed, but a message was sent that no rank received:
        the test would hang on a real backend (its send waits for the
        receiver), so it fails here too, naming each send."""
        left = self.world.undelivered()
        if left:
            sends = "; ".join(f"rank {src} sent to rank {dst} (tag {tag}, group {group})"
                              for group, src, dst, tag in left)
            raise RankError(UNDELIVERED.format(test=self.test, sends=sends), self.test, len(outcomes),
                            timeout, outcomes)


#: The test process's descendants, listed again only when one may be new
#: (a listing reads /proc for every thread: a tenth of a small test's time).
_DESCENDANTS = proctree.DescendantWatch()


def _hold_rank_processes(test: str, where: Callable[..., Any] | None) -> Callable[[], None]:
    """Keep the processes that ``test``'s rank threads start from outliving
    it; return what ends the hold, killing those still running (a warning
    names them).

    They are the test process's children, so a rank process's parent-death
    signal is not theirs. Those still running at the test's end are killed,
    also if the test process is interrupted (SIGTERM, Ctrl-C). Daemons (a
    double fork) come to the test process while the test runs, not to init.
    If the test process is killed outright (SIGKILL), the janitor's reaper
    kills what carries its token in the environment, as it does for what
    rank processes start: the ranks' environment is the test process's, so
    the token is set there for the test.
    """
    undo_subreaper = proctree.child_subreaper_for_now()
    children = _DESCENDANTS.descendants()
    token = janitor.register(lambda: proctree.kill_descendants(keep=children | janitor.reaper_pids()))
    environ = set_environ(janitor.rank_environ())

    def release() -> None:
        set_environ(environ)
        janitor.unregister(token)
        killed = [] if _DESCENDANTS.unchanged() else proctree.kill_descendants(keep=children | janitor.reaper_pids())
        undo_subreaper()
        if killed:
            warn_at(where, f"{test!r} (disttest): the test left processes running; "
                           f"disttest killed them: {'; '.join(killed)}")

    return release


def restore_hooks(hook: Any, thread_hook: Any) -> None:
    """Put back ``sys.excepthook`` and ``threading.excepthook``: every
    ``init_process_group`` wraps the first in c10d's rank prefix."""
    sys.excepthook, threading.excepthook = hook, thread_hook


def check_left_running(before: set[threading.Thread], test: str) -> None:
    """Raise if the test started a non-daemon thread that is still running
    (after a short wait); it is made daemon first, so that it does not hold
    the process at exit (NB: CPython's private shutdown bookkeeping, 3.11-3.13)."""
    # (A rank thread is not a daemon while it runs a rank: one stuck there is the join's to report.)
    new = [t for t in threading.enumerate() if t not in before and not t.daemon and t.is_alive()
           and not isinstance(t, thread_pool.PoolThread)]
    deadline = time.monotonic() + LEFT_RUNNING_WAIT
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in new if t.is_alive()]
    for t in left:
        t._daemonic = True  # type: ignore[attr-defined]
        lock = getattr(t, "_tstate_lock", None)
        locks = getattr(threading, "_shutdown_locks", None)
        if lock is not None and locks is not None:
            with threading._shutdown_locks_lock:  # type: ignore[attr-defined]
                locks.discard(lock)
    if left:
        names = ", ".join(repr(t.name) for t in left)
        one = len(left) == 1
        raise RuntimeError(LEFT_RUNNING.format(test=test, what="a thread" if one else "threads",
                                               names=names, them="it a" if one else "them"))


class MultiThreadedTestCase(RankDispatch):
    """Runs each test method in ``world_size`` threads over the threaded group.

    Call ``self._spawn_threads()`` in ``setUp``. In every thread the default
    group is initialised (backend ``threaded``), then ``perThreadSetUp``, the
    test body and ``perThreadTearDown`` run. The main thread joins them with
    the shared core: bounded by ``timeout`` (class attribute; else
    ``get_timeout``), failing fast, reporting desyncs and the stacks of the
    threads it had to stop. A thread waiting in a collective is released
    within a poll interval when a peer fails or the test times out; one
    running Python code gets disttest's ``RankStopped`` (a ``BaseException``)
    raised into it (never inside logging's handlers or an import; inside a
    context manager's ``__enter__``/``__exit__`` only after a second), and
    one still running when the test is reported gets it at its first safe
    moment after.
    """

    MAIN_THREAD_RANK = -1
    timeout: float | None = None
    #: "turns" (default) or "free": whether the rank threads run one at a
    #: time, handing on at collectives (see ``DISTTEST_THREAD_SCHEDULING``
    #: in the README).
    thread_scheduling: str = "turns"

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def _current_test_name(self) -> str:
        return self.id().split(".")[-1]

    def __init__(self, method_name: str = "runTest", methodName: str = "runTest") -> None:
        self._run_state: _ThreadRun | None = None
        super().__init__(method_name, methodName)

    def _join(self, fn: Callable[[], Any]) -> None:
        self._join_threads(self.threads, fn)

    @classmethod
    def tearDownClass(cls) -> None:
        # The class's tests are done with the rank threads kept between them.
        thread_pool.release_idle()
        super().tearDownClass()

    def perThreadSetUp(self) -> None:
        """Hook method for setting up each rank thread before the test body."""

    def perThreadTearDown(self) -> None:
        """Hook method for tearing down each rank thread after the test body."""

    def run(self, result: Any = None) -> Any:
        # What the ranks change for the whole process is put back after the
        # whole test (setUp to cleanups), as before it: a context that setUp
        # opened and closed around _spawn_threads() stays closed.
        restore = process_state.snapshot()
        try:
            return super().run(result)
        finally:
            restore()

    def setUp(self) -> None:
        """Runs in the main thread only; use ``perThreadSetUp`` for threads."""
        super().setUp()
        self.rank = self.MAIN_THREAD_RANK
        self.threads: list[Any] = []
        before = set(threading.enumerate())
        self.addCleanup(lambda: check_left_running(before, self._current_test_name))
        self.addCleanup(_hold_rank_processes(self._current_test_name, getattr(type(self), self._testMethodName, None)))
        self.addCleanup(self._cleanup_threads)

    def _cleanup_threads(self) -> None:
        if self._run_state is not None:
            self._run_state.close()
            self._run_state = None
        self.threads = []

    def _spawn_threads(self) -> None:
        """Start the rank threads for the current test (call in ``setUp``)."""
        self._precheck()
        self._refuse_second_start("_spawn_threads()", self._run_state is not None)
        world_size = self._effective_world_size()
        test_name = self._current_test_name
        cls = type(self)

        def body(rank: int) -> None:
            cls._run(test_name, rank, world_size)

        self._run_state = _ThreadRun(world_size, body, test_name, self._test_timeout(), cls)
        self.threads = self._run_state.launcher.threads

    @classmethod
    def _run(cls, test_name: str, rank: int, world_size: int, **kwargs: Any) -> None:
        """Hook, in a rank thread: build the test case and run the test."""
        self = cls(test_name)
        self.rank = rank
        if isinstance(getattr(self, "_tls", None), threading.local):
            # Upstream's device-type tests keep ``precision`` and ``rel_tol``
            # per thread (``DeviceTypeTestBase._tls``), set in the test
            # process's thread only: a rank thread read neither
            # (AttributeError in every ``@ops`` test). Each rank starts with
            # the defaults, as upstream's rank threads do.
            tls = threading.local()
            tls.precision, tls.rel_tol = getattr(cls, "_precision", 0), getattr(cls, "_rel_tol", 0)
            vars(self)["_tls"] = tls  # (the instance's, over the class's)
        settings.pin_world_size(self, world_size)
        self.run_test_with_threaded_pg(test_name, rank, world_size)

    def run_test_with_threaded_pg(self, test_name: str, rank: int, world_size: int) -> None:
        """In a rank thread: init the default group, then perThreadSetUp, the
        test, perThreadTearDown and the cleanups the rank registered; the
        group is destroyed whatever happens."""
        from disttest.pg.threaded import _current_world

        dist.init_process_group(backend=BACKEND, rank=rank, world_size=world_size,
                                store=_current_world().store)
        try:
            exc: BaseException | None = None
            try:
                with in_phase("perThreadSetUp"):
                    self.perThreadSetUp()
                failed: BaseException | None = None
                try:
                    with armed(type(self), test_name, rank), subtests_named(self):
                        getattr(self, test_name)()
                except BaseException as e:  # noqa: BLE001 (raised after perThreadTearDown)
                    failed = e
                try:
                    with in_phase("perThreadTearDown"):
                        self.perThreadTearDown()
                except unittest.SkipTest:
                    # A skip after the test failed does not hide the failure
                    # (it was the rank's outcome: a failure became a skip).
                    if failed is None:
                        raise
                except BaseException as e:
                    if failed is not None and e.__context__ is None:
                        e.__context__ = failed  # (as raised in a finally: the test's error shown first)
                    raise
                if failed is not None:
                    raise failed
            except BaseException as e:  # noqa: BLE001 (raised below, after the cleanups)
                exc = e
            # (also after a failed perThreadSetUp, as unittest's after setUp)
            exc = after_cleanups(self, exc)
            if exc is not None:
                raise exc
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()

    def _join_threads(self, threads: list[Any], fn: Callable[[], Any]) -> None:
        """Hook: wait for the rank threads and raise the test's result."""
        run = self._run_state
        if run is None:
            test = self._current_test_name
            raise RankError(NO_RANKS_STARTED.format(test=test).replace(
                "_spawn_processes()", "_spawn_threads()"), test, 0, None, [])
        timeout = run.timeout  # (as the ranks were started with)
        outcomes = run.join(timeout)
        self._run_state = None
        run.raise_for(outcomes, timeout, where=fn)

    def assertEqualOnRank(self, x: Any, y: Any, msg: str | None = None, *, rank: int = 0) -> None:
        """``assertEqual`` on rank ``rank`` only (the threads share one RNG)."""
        if self.rank == rank:
            self.assertEqual(x, y, msg)

    def assertNotEqualOnRank(self, x: Any, y: Any, msg: str | None = None, *, rank: int = 0) -> None:
        """``assertNotEqual`` on rank ``rank`` only."""
        if self.rank == rank:
            self.assertNotEqual(x, y, msg)


def spawn_threads_and_init_comms(
    func: Callable[..., Any] | None = None, timeout: float | None = None,
    world_size: int = DEFAULT_WORLD_SIZE,
) -> Any:
    """Decorator: run a test method of an ordinary TestCase, or a plain test
    function (pytest), in ``world_size`` threads, each with the default group
    initialised (backend ``threaded``).

    A ``SkipTest`` in the ranks skips the test; a failing rank raises
    ``RankFailure``, both ``AssertionError`` and ``RuntimeError``. ``timeout``
    defaults to ``get_timeout(test id)``.
    """
    size = parse_world_size(world_size, "spawn_threads_and_init_comms(world_size=...)")
    limit = None if timeout is None else parse_timeout(timeout, "spawn_threads_and_init_comms(timeout=...)")
    if func is None:
        return functools.partial(spawn_threads_and_init_comms, timeout=timeout, world_size=world_size)
    # Upstream's own tests assert RuntimeError around it: any failing rank
    # is a RankFailure (AssertionError and RuntimeError).
    return threads_test(func, size, limit, always_failure=True)


def threads_test(func: Callable[..., Any], size: int, limit: float | None, always_failure: bool) -> Any:
    """:func:`spawn_threads_and_init_comms`'s wrapper of ``func``, for
    ``size`` threads, ``limit`` seconds (None: the test's timeout); a rank's
    error other than an ``AssertionError`` is a ``RankError`` unless
    ``always_failure``."""
    # A method of a TestCase, or a plain function (pytest's function-style
    # tests, whose fixtures come as keyword arguments).
    takes_self = next(iter(inspect.signature(func).parameters), None) == "self"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from disttest.pg.threaded import _current_world

        self = args[0] if takes_self and args else None
        test = self.id().split(".")[-1] if self is not None and hasattr(self, "id") else func.__name__
        # Faults and the chaos seed apply here as in every runner (DISTTEST_FAULT,
        # --disttest-fault, @inject_fault on the function or method).
        owner = type(self) if self is not None and hasattr(type(self), test) else types.SimpleNamespace(
            **{test: wrapper})
        test_faults(getattr(owner, test, None))
        chaos_seed()

        def body(rank: int) -> None:
            dist.init_process_group(backend=BACKEND, rank=rank, world_size=size,
                                    store=_current_world().store)
            try:
                with armed(owner, test, rank):
                    func(*args, **kwargs)
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()

        before = set(threading.enumerate())
        seconds = limit if limit is not None else get_timeout(test)
        cap = settings.outer_cap()  # kept below pytest-timeout's, as every runner's limit
        if cap is not None and cap < seconds:
            seconds = cap
        restore = process_state.snapshot()  # what the ranks change for the whole process ends with them
        release = _hold_rank_processes(test, func)
        try:
            run = _ThreadRun(size, body, test, seconds, owner=owner)
            outcomes = run.join(seconds)
            try:
                run.raise_for(outcomes, seconds, always_failure=always_failure, where=func)
            finally:
                check_left_running(before, test)
        finally:
            release()
            restore()

    setattr(wrapper, SPAWNS, True)  # a fault declared above it is read by it
    return wrapper
