"""A limit on code that runs in one thread of the test process: raising into a thread.

Rank threads are stopped this way (:mod:`disttest._runner.threads`), and a
test that runs in the test's own thread (a simulated world,
:class:`~disttest.SimulatedTestCase`) is held to its timeout by
:class:`Deadline`: when the limit passes, a watcher thread records the
test thread's stack and raises :class:`DeadlinePassed` inside it, at its
next Python instruction. NB: code blocked in C (a long ``time.sleep``, a
C++ kernel) gets it when that call returns; an outer limit
(pytest-timeout's) covers what never returns.

NB: never raised into code that holds a lock across calls: an exception
between a lock's ``acquire`` and the code that releases it leaks the lock
(logging's handler lock, and every later log call of the process hangs;
the threaded world's lock, and every rank hangs), nor into an import under
way. Such a thread gets it at a later look.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType

__unittest = True

__all__ = ["Deadline", "DeadlinePassed", "holds_locks", "raise_in"]

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
#: How long a pending exception may take to land once the body returned.
LAND_WAIT = 1.0


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


class DeadlinePassed(BaseException):  # noqa: N818  (not an error of the test's: its limit)
    """Raised inside a thread whose :class:`Deadline` passed. A
    ``BaseException``, so that the test's own ``except Exception`` does not
    swallow it."""


class Deadline:
    """``with Deadline(seconds):`` raises :class:`DeadlinePassed` inside the
    thread that entered the block once ``seconds`` have passed; ``.frames``
    is then that thread's stack at the moment, innermost last."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.frames = traceback.StackSummary()
        self._thread = threading.current_thread()
        self._over = threading.Event()
        self._lock = threading.Lock()
        self._raised = False
        self._armed = False  # (not raised into Deadline's own code: the watcher's start)
        self._watcher = threading.Thread(target=self._watch, name="disttest-deadline", daemon=True)

    def __enter__(self) -> Deadline:
        self._thread = threading.current_thread()
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
        if self._raised and not _landed(exc):
            # Raised as the body returned: it lands here, not in the caller.
            end = time.monotonic() + LAND_WAIT
            while time.monotonic() < end:
                time.sleep(0.001)

    def _watch(self) -> None:
        if self._over.wait(self.seconds):
            return
        while True:
            with self._lock:
                if self._over.is_set():
                    return
                frame = sys._current_frames().get(self._thread.ident or -1)
                if self._armed and not holds_locks(frame):
                    self.frames = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
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
