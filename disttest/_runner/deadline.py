"""A limit on code that runs in one thread of the test process: raising into a thread.

Rank threads are stopped from another thread (:func:`raise_in`, by
:mod:`disttest._runner.threads`; one it could not stop in time is stopped
later, by :func:`stop_when_safe`), and a test that runs in the test's own
thread (a simulated world, :class:`~disttest.SimulatedTestCase`) is held
to its timeout by :class:`Deadline`, which raises :class:`DeadlinePassed`
in the test's thread once the limit passes (see there how). NB: an
exception raised from another thread lands at the thread's next Python
instruction: code blocked in C (a long ``time.sleep``, a C++ kernel) gets
it when that call returns; an outer limit (pytest-timeout's) covers what
never returns.

NB: never raised into code that holds a lock across calls: an exception
between a lock's ``acquire`` and the code that releases it leaks the lock
(logging's handler lock, and every later log call of the process hangs;
the threaded world's lock, and every rank hangs), nor into an import under
way; and for a second not into code that changes what the whole process
sees (:func:`mid_change`, :func:`stoppable`). Such a thread gets it at a
later look.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__unittest = True

__all__ = ["Deadline", "DeadlinePassed", "current_frames", "held", "holds_locks", "mid_change", "raise_in",
           "stop_when_safe", "stoppable"]

#: Where an asynchronous exception can leave a lock held: logging takes its
#: handlers' locks with acquire() before a try.
LOCKING = os.path.dirname(logging.__file__) + os.sep

#: An import under way: stopped half-way, a module would be left half made
#: for the rest of the process (its registrations done, its names not).
IMPORTING = "<frozen importlib"

#: disttest's code that takes locks: the process groups and the harness core.
OWN_LOCKING = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), part, "")
                    for part in ("pg", "_runner"))

#: How often the watcher looks again at a thread it may not raise into yet.
LOOK_AGAIN = 0.01
#: When code caught the exception and ran on: how soon it is raised again.
AGAIN_AFTER = 0.1
#: How long a pending exception may take to land once the body returned.
LAND_WAIT = 1.0
#: How often a thread that could not be stopped in time is raised into
#: again, once at a safe point (it caught the exception and went on).
LINGER_AGAIN = 0.5
#: The longest pause between two looks at such threads: the pause grows
#: from :data:`LOOK_AGAIN` by a tenth a look, so that threads blocked in C
#: for good (each look reads every thread's stack) cost the process little.
LINGER_LOOK_MAX = 0.25
#: How long a thread that is only :func:`mid_change` (a context manager's
#: entry or exit, torch's mode stack; not a lock, an import) is waited for
#: before it is raised into there all the same: most such code is quick,
#: but a context manager may poll in its ``__enter__`` for ever.
MID_CHANGE_GRACE = 1.0
#: The longest single wait of the watcher (a day): a limit longer than a
#: thread's wait can take is waited for in such steps.
WAIT_STEP = 86400.0


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the garbage collector held off.

    NB: CPython (3.11) builds that dict while it holds the lock of its list
    of threads; an allocation there can run a collection, which can free a
    tensor, whose deallocation releases the GIL. A thread that holds the GIL
    while it waits for that lock (a thread starting or ending, a
    ``threading.local`` it sets) then never gets it, and this thread never
    gets the GIL back: the whole process hangs, deaf to SIGTERM (seen with
    1024 rank threads, in the stack dump of a test past its limit).
    Reads are taken one at a time: the collector is the process's, and a
    second reader would turn it back on under the first one's read (the wait
    is bounded: a fork copies the lock held, and a read must still happen).
    """
    held = _FRAMES_READ.acquire(timeout=5)
    try:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()
        finally:
            if enabled:
                gc.enable()
    finally:
        if held:
            _FRAMES_READ.release()


_FRAMES_READ = threading.Lock()


def holds_locks(frame: FrameType | None) -> bool:
    """Whether this stack runs disttest's process groups or core (its
    innermost frame), or logging's code or an import (any frame)."""
    if frame is not None and frame.f_code.co_filename.startswith(OWN_LOCKING):
        return True
    while frame is not None:
        if frame.f_code.co_filename.startswith((LOCKING, IMPORTING)):
            return True
        frame = frame.f_back
    return False


def raise_in(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` inside ``thread`` at its next Python instruction."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


def stoppable(frame: FrameType | None, waiting_since: float | None, now: float) -> tuple[bool, float | None]:
    """Whether a thread whose stack is ``frame`` may be raised into ``now``,
    and since when it has waited only for :func:`mid_change` code (None:
    not waiting): never where it :func:`holds_locks`, at once outside
    :func:`mid_change` code, after :data:`MID_CHANGE_GRACE` inside it."""
    if holds_locks(frame):
        return False, waiting_since
    if not mid_change(frame):
        return True, None
    since = now if waiting_since is None else waiting_since
    return now - since >= MID_CHANGE_GRACE, since


def stop_when_safe(thread: threading.Thread, exc_type: type[BaseException],
                   wanted: Callable[[], bool]) -> None:
    """Go on stopping ``thread`` after its test gave up waiting for it: raise
    ``exc_type`` into it at the first look (every :data:`LOOK_AGAIN` seconds
    at first, :data:`LINGER_LOOK_MAX` later) that finds it :func:`stoppable`,
    again every :data:`LINGER_AGAIN` seconds, until it ends or ``wanted()``
    is false.

    A thread that spins in code it may not be stopped in (a loop that logs
    spends most of its time in logging's handlers) can outlast every look of
    a short stop; left running it would slow and write into every later test
    of the process. One daemon watcher serves every such thread, and ends
    when none is left."""
    global _lingering_watcher
    if not _fork_hooked:
        _fork_hooked.append(True)
        # A rank process forked meanwhile has neither the watcher nor the
        # threads: nor may it inherit the lock held, or the log hook.
        os.register_at_fork(after_in_child=_forget_lingering)
    with _lingering_lock:
        if thread.ident is not None:  # (a thread never started has nothing to stop)
            _lingering[thread.ident] = (thread, exc_type, wanted, [0.0, None])
        _install_log_hook()
        if _lingering_watcher is None or not _lingering_watcher.is_alive():
            _lingering_watcher = threading.Thread(target=_stop_lingering, name="disttest-stopper", daemon=True)
            _lingering_watcher.start()


#: Thread ident -> (thread, exception, still wanted, [last raised at, waiting since (see stoppable)]).
_lingering: dict[int, tuple[threading.Thread, type[BaseException], Callable[[], bool], list[Any]]] = {}
_lingering_lock = threading.Lock()
_lingering_watcher: threading.Thread | None = None
_fork_hooked: list[bool] = []


def _forget_lingering() -> None:
    """In a child forked while threads lingered: none of them is its."""
    global _lingering_lock, _lingering_watcher
    _lingering_lock = threading.Lock()
    _lingering.clear()
    _lingering_watcher = None
    _remove_log_hook()


#: While threads linger: (logging's record factory before, disttest's).
_log_hook: list[tuple[Callable[..., logging.LogRecord], Callable[..., logging.LogRecord]]] = []
#: The frames of a log call, from the logger's method to the record factory.
_LOG_CALLS = frozenset({"makeRecord", "_log", "log", "debug", "info", "warning", "warn", "error",
                        "exception", "critical", "fatal"})


def _install_log_hook() -> None:
    """(Under the lock.) Stop a lingering thread in its next log call, where
    logging takes no lock yet: a thread that logs in a loop runs, between
    two looks of the watcher, mostly in its handler's write, where it may
    not be raised into, and each look finds it there. Undone by
    :func:`_remove_log_hook` when no thread lingers."""
    if _log_hook:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        _stop_in_log_call()
        return previous(*args, **kwargs)

    logging.setLogRecordFactory(factory)
    _log_hook.append((previous, factory))


def _remove_log_hook() -> None:
    """(Under the lock.) Put logging's record factory back, unless another
    was set since (then that one stays)."""
    if _log_hook:
        previous, ours = _log_hook.pop()
        if logging.getLogRecordFactory() is ours:
            logging.setLogRecordFactory(previous)


def _stop_in_log_call() -> None:
    entry = _lingering.get(threading.get_ident())
    if entry is None:
        return
    thread, exc_type, wanted, times = entry
    if thread is not threading.current_thread() or not wanted():
        return
    frame: FrameType | None = sys._getframe(2)  # the record factory's caller
    while (frame is not None and frame.f_code.co_name in _LOG_CALLS
           and frame.f_code.co_filename.startswith(LOCKING)):
        frame = frame.f_back
    now = time.monotonic()
    if now - times[0] >= LINGER_AGAIN and not mid_change(frame):  # (not a log call from logging's own code)
        times[0] = now
        raise exc_type()


def _stop_lingering() -> None:
    global _lingering_watcher
    pause, known = LOOK_AGAIN, 0
    while True:
        with _lingering_lock:
            for ident in [i for i, (thread, _, wanted, _) in _lingering.items()
                          if not thread.is_alive() or not wanted()]:
                del _lingering[ident]
            if not _lingering:
                _remove_log_hook()
                _lingering_watcher = None
                return
            if len(_lingering) > known:  # (a thread just handed over: looked at often again)
                pause = LOOK_AGAIN
            known = len(_lingering)
            frames = current_frames()
            now = time.monotonic()
            for thread, exc_type, _, times in _lingering.values():
                ok, times[1] = stoppable(frames.get(thread.ident or -1), times[1], now)
                if ok and now - times[0] >= LINGER_AGAIN:
                    raise_in(thread, exc_type)
                    times[0] = now
        time.sleep(pause)
        pause = min(pause * 1.1, LINGER_LOOK_MAX)


class DeadlinePassed(BaseException):  # noqa: N818  (not an error of the test's: its limit)
    """Raised inside a thread whose :class:`Deadline` passed. A
    ``BaseException``, so that the test's own ``except Exception`` does not
    swallow it."""


#: Code that must not be left half way, besides what :func:`holds_locks`
#: names: a context manager's entry and exit (``__enter__``/``__exit__``,
#: which runs a generator's code for contextlib's: a mode entered and never
#: exited, a flag set and never put back), and torch's dispatch-mode stack.
#: NB: not threading's waits (``Event.wait``): a test that waits forever
#: must stop, and they put their locks back on an exception.
MID_CHANGE = (os.path.join("torch", "utils", "_python_dispatch.py"),)
MID_CHANGE_NAMES = ("__enter__", "__exit__", "__aenter__", "__aexit__", "__del__")
#: The signal that stops a main thread whose limit passed (it interrupts a
#: blocking call, a ``time.sleep``, as a raise from another thread cannot).
#: NB: a real-time signal where there are some, not SIGUSR2: a suite's
#: ``faulthandler.register(SIGUSR2)`` (a common way to ask a CI job for
#: stacks) is invisible to ``signal.getsignal``, so the handler put back
#: after the block was the default action, and the suite's next SIGUSR2
#: killed its process.
STOP_SIGNAL = (signal.SIGRTMAX - 2 if hasattr(signal, "SIGRTMAX")
               else getattr(signal, "SIGUSR2", None))


def mid_change(frame: FrameType | None) -> bool:
    """Whether stopping this stack now could leave state half changed:
    :func:`holds_locks`, or a frame in :data:`MID_CHANGE` code."""
    if holds_locks(frame):
        return True
    while frame is not None:
        code = frame.f_code
        if code.co_name in MID_CHANGE_NAMES or code.co_filename.endswith(MID_CHANGE):
            return True
        frame = frame.f_back
    return False


class Deadline:
    """``with Deadline(seconds):`` raises :class:`DeadlinePassed` inside the
    thread that entered the block once ``seconds`` have passed (with
    ``message``); ``.frames`` is then that thread's stack at the moment,
    innermost last, and ``.passed`` is true, also where the block caught it.

    In the main thread (a test's, as unittest and pytest run them) the
    exception comes from a handler of :data:`STOP_SIGNAL`, sent to the
    thread every :data:`LOOK_AGAIN` seconds until it lands: the handler runs
    in the thread itself, between two instructions, so it sees the very
    stack it raises into and waits while that is :func:`mid_change`; the
    signal also ends a blocking call. The handler is installed for the
    block only, over the one before, which a signal not its own still
    reaches. Elsewhere the exception is raised from the watcher thread
    (:func:`raise_in`), which sees the stack only before it lands; it waits
    as the handler does (:func:`stoppable`)."""

    def __init__(self, seconds: float, message: str = "") -> None:
        self.seconds = seconds
        self.message = message
        self.frames = traceback.StackSummary()
        self._thread = threading.current_thread()
        self._over = threading.Event()
        self._lock = threading.Lock()
        self._raised = False
        self._next_at = 0.0
        self._sent = False
        self._armed = False  # (not raised into Deadline's own code: the watcher's start)
        self._previous: Any = None
        self._by_signal = False
        self._waiting_since: float | None = None  # (see stoppable)
        self._watcher = threading.Thread(target=self._watch, name="disttest-deadline", daemon=True)

    @property
    def passed(self) -> bool:
        """Whether the deadline was raised into the block."""
        return self._raised

    def __enter__(self) -> Deadline:
        self._thread = threading.current_thread()
        if STOP_SIGNAL is not None and self._thread is threading.main_thread():
            self._previous = signal.signal(STOP_SIGNAL, self._on_signal)
            self._by_signal = True
        self._watcher.start()
        with self._lock:
            self._armed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._over.set()
            self._armed = False
        self._watcher.join()
        if self._by_signal:
            signal.signal(STOP_SIGNAL, self._previous)  # type: ignore[arg-type]
        elif self._raised and not _landed(exc):
            # Raised as the body returned: it lands here, not in the caller.
            end = time.monotonic() + LAND_WAIT
            while time.monotonic() < end:
                time.sleep(0.001)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._sent:  # (not ours: the handler it replaced gets it)
            if callable(self._previous):
                self._previous(signum, frame)
            return
        if not self._armed or self._over.is_set():
            return
        ok, self._waiting_since = stoppable(frame, self._waiting_since, time.monotonic())
        if not ok:
            return  # (the watcher sends it again)
        if not self._raised:
            self.frames = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        self._raised = True
        self._next_at = time.monotonic() + AGAIN_AFTER
        raise DeadlinePassed(self.message)

    def _watch(self) -> None:
        # NB: in steps a thread's wait can take: a limit past
        # threading.TIMEOUT_MAX (DISTTEST_TIMEOUT=1e10) raised OverflowError
        # here, the watch ended and the test ran unwatched.
        end = time.monotonic() + self.seconds
        while (left := end - time.monotonic()) > 0:
            if self._over.wait(min(left, WAIT_STEP)):
                return
        while True:
            with self._lock:
                if self._over.is_set():
                    return
                if self._by_signal and signal.getsignal(STOP_SIGNAL) != self._on_signal:  # type: ignore[arg-type]
                    self._by_signal = False  # (the test set its own: not sent where it may kill)
                if self._by_signal:
                    # Again while the block runs on: the code caught it
                    # (``except BaseException``, unittest's ``subTest``).
                    if time.monotonic() >= self._next_at:
                        self._sent = True
                        signal.pthread_kill(self._thread.ident or 0, STOP_SIGNAL)  # type: ignore[arg-type]
                else:
                    frame = current_frames().get(self._thread.ident or -1)
                    ok, self._waiting_since = stoppable(frame, self._waiting_since, time.monotonic())
                    if self._armed and ok:
                        self.frames = (traceback.extract_stack(frame) if frame is not None
                                       else traceback.StackSummary())
                        self._raised = True
                        raise_in(self._thread, DeadlinePassed)
                        return
            if self._over.wait(LOOK_AGAIN):
                return


def _landed(exc: BaseException | None) -> bool:
    """Whether :class:`DeadlinePassed` is ``exc`` or what it was raised in."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DeadlinePassed):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False


def held(call: Callable[..., Any], args: tuple[Any, ...], ends_at: float, message: str) -> str | None:
    """``call(*args)`` (a phase unittest runs: ``setUp``, the test,
    ``tearDown``, a cleanup) held to the ``time.monotonic()`` instant
    ``ends_at`` by a :class:`Deadline` with ``message``. None if it ended
    in time; else where it was stopped, from the test's own frames in
    (unittest's dropped), also where the code caught the exception and
    went on."""
    watch = Deadline(max(ends_at - time.monotonic(), 0.0), message)
    try:
        with watch:
            call(*args)
    except DeadlinePassed:
        pass
    if not watch.passed:
        return None
    import unittest.case

    frames = watch.frames
    runner = [i for i, f in enumerate(frames) if f.name in ("_callSetUp", "_callTestMethod", "_callTearDown",
                                                            "_callCleanup")
              and f.filename == unittest.case.__file__]
    kept = frames[runner[-1] + 1:] if runner else frames
    return "".join(traceback.format_list(kept)).rstrip() or "(no Python frame)"
