"""Rank threads kept between tests: the thread runner's rank loop.

Starting a thread, and the first torch and c10d call in it (torch sets up
its thread-local state), costs more than a short threaded test itself. So
the thread runner keeps its rank threads: each waits for "run this rank of
this test", runs it, and waits for the next. A thread is never reused
after disttest raised into it to stop it, after it could not be stopped,
or when the test left torch's thread-local state changed (grad mode off, a
mode pushed, a trace function set): a later test gets a fresh thread, as
if every test had its own. Idle threads end after :data:`IDLE_EXIT`
seconds, when the test class that used them is torn down
(:func:`release_idle`), and with the process (they are daemons). No thread
exists before the first threaded test.
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from disttest import _compat

__unittest = True

__all__ = ["IDLE_EXIT", "START_LIMIT", "START_TIMEOUT", "PoolThread", "RankThread", "release_idle", "take"]

#: Seconds an idle rank thread waits for its next test before it ends.
IDLE_EXIT = 5.0
IDLE_NAME = "disttest idle thread {n}"  # NB: no " rank " in it (that names a running rank)

_names = itertools.count(1)

#: A rank (a thread, a process) the system would not start: world sizes beyond its limits.
START_LIMIT = (
    "could not start rank {rank} of a world of {world_size} ({what}) (disttest): {error}. This process may not "
    "have more threads or processes (its limits: ulimit -u, a cgroup's pids.max, memory); use a smaller world size"
)

#: Starting the rank threads took the test's whole limit (a world too large for this machine).
START_TIMEOUT = (
    "started {started} of the {world_size} rank threads within the test's limit of {timeout}s, and ran none "
    "(disttest). Use a smaller world size or a longer timeout"
)


def _thread_state() -> tuple[Any, ...]:
    """What a test may leave behind in its thread that a fresh thread would
    not have: torch's thread-local modes, trace and profile functions."""
    return (*_compat.thread_local_modes(), sys.gettrace(), sys.getprofile())


class PoolThread(threading.Thread):
    """The thread of a :class:`RankThread` (a leak check tells it from the test's own)."""


class RankThread:
    """One daemon thread that runs jobs (a rank of a test) one at a time."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._inbox: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], None]] | None] = \
            queue.SimpleQueue()
        #: Set when the thread must not run another job (it ends after this one).
        self.retired = False
        self._fresh: tuple[Any, ...] | None = None
        self.thread = PoolThread(target=self._loop, name=IDLE_NAME.format(n=next(_names)), daemon=True)
        self.thread.start()

    def run(self, job: Callable[[], None], finished: Callable[[], None]) -> None:
        """Run ``job`` in this thread, then ``finished`` (neither may raise),
        once the thread knows whether it will run another job."""
        self._inbox.put((job, finished))

    def _loop(self) -> None:
        try:
            self._fresh = _thread_state()
            while True:
                try:
                    job = self._inbox.get(timeout=IDLE_EXIT)
                except queue.Empty:
                    if self._pool.leave(self):
                        return
                    continue
                if job is None:
                    return
                # NB: a thread inherits its starter's daemon flag. One the job
                # starts is not a daemon, as a rank process's would not be, so
                # that a leak check names it when the test leaves it running.
                # (CPython reads the flag for its exit at a thread's start:
                # this thread stays a daemon there.)
                self.thread._daemonic = False  # type: ignore[attr-defined]
                try:
                    job[0]()
                finally:
                    self.thread._daemonic = True  # type: ignore[attr-defined]
                if _thread_state() != self._fresh:
                    self.retired = True
                job[1]()
                if self.retired:
                    return
        except BaseException:  # noqa: BLE001 (one raised into it by a stop, after its job)
            self.retired = True


class _Pool:
    """The idle rank threads of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[RankThread] = []
        self._pid = os.getpid()

    def take(self, n: int, deadline: float | None = None, timeout: float | None = None) -> list[RankThread]:
        """``n`` rank threads, idle ones first; new ones are started until
        ``deadline`` (a ``time.monotonic()``; ``timeout`` is for the message)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the threads are the parent's
                self._idle, self._pid = [], os.getpid()
            keep = max(0, len(self._idle) - n)
            got, self._idle = self._idle[keep:], self._idle[:keep]
        got = [t for t in got if t.thread.is_alive()]
        try:
            while len(got) < n:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(START_TIMEOUT.format(started=len(got), world_size=n, timeout=timeout))
                got.append(RankThread(self))
        except TimeoutError:
            self.give_back(got)  # idle, they end after IDLE_EXIT
            raise
        except RuntimeError as e:  # "can't start new thread"
            self.give_back(got)
            raise RuntimeError(START_LIMIT.format(rank=len(got), world_size=n, what="a thread", error=e)) from e
        return got

    def give_back(self, threads: list[RankThread]) -> None:
        back = [t for t in threads if not t.retired and t.thread.is_alive()]
        for t in back:
            t.thread.name = IDLE_NAME.format(n=next(_names))
        with self._lock:
            if self._pid == os.getpid():
                self._idle.extend(t for t in back if t not in self._idle)

    def leave(self, t: RankThread) -> bool:
        """An idle thread's end: False if it was taken meanwhile (a job comes)."""
        with self._lock:
            if t in self._idle:
                self._idle.remove(t)
                return True
            return False

    def release_idle(self, wait: float = 0.0) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for t in idle:
            t._inbox.put(None)
        deadline = time.monotonic() + wait
        for t in idle:
            t.thread.join(max(0.0, deadline - time.monotonic()))


_pool = _Pool()


def take(n: int, deadline: float | None = None, timeout: float | None = None) -> list[RankThread]:
    """``n`` rank threads for a test: idle ones first, else new ones,
    started until ``deadline`` (then :data:`START_TIMEOUT`, a TimeoutError)."""
    return _pool.take(n, deadline, timeout)


def give_back(threads: list[RankThread]) -> None:
    """Make the threads of a test that ended available again (but retired ones)."""
    _pool.give_back(threads)


def alone(wait: float = 1.0) -> bool:
    """Whether this thread is the process's only ``threading`` thread, once
    idle rank threads (a threaded class's, ours to end) are gone: a fork
    copies other threads' locks as they are. Threads the threading module
    does not know (started with ``_thread``, or native) are not seen."""
    if threading.active_count() > 1:
        release_idle(wait)
    return threading.active_count() == 1


def release_idle(wait: float = 0.0) -> None:
    """End every idle rank thread (a test class is done with them); wait up
    to ``wait`` seconds for them to be gone (before a fork, say: Python 3.12
    warns when a process with other threads forks)."""
    _pool.release_idle(wait)
