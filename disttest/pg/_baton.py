"""Turns for the rank threads of one threaded world: one runs at a time.

Rank threads share the GIL, so their Python never runs in parallel anyway;
what concurrency costs them is the hand-offs. Each torch op releases the
GIL, and with four runnable rank threads every release wakes another one,
on another CPU: a 4-rank test with one ``all_reduce`` makes about 45 context
switches and spends half its time in them on a 2-CPU machine. With turns, a
rank thread runs until it waits for its peers in a collective (or its test
ends) and then hands the turn to the next thread that can go on, waking
exactly one: about 10 switches for the same test. The thread woken is
moved to the CPU of the thread that wakes it (which is about to wait), for
the wake-up only: it undoes that as it resumes. Its caches are warm there
and no idle CPU has to be woken: on a 2-CPU VM a hand-off then costs about
4 us instead of 40.

The turn is a performance hint, never a condition for progress: a thread
that holds the turn while it blocks where disttest cannot see (a C++
``Future.wait``, a ``threading.Event`` between ranks, ``time.sleep``)
keeps the others waiting only until the launcher's polls find the turn held
longer than :data:`HOLD_LIMIT` with threads waiting for it and the holder
not using the CPU between two polls (a holder that computes, for instance
the last rank into a collective of a thousand, keeps the turn up to
:data:`BUSY_HOLD_LIMIT`). Then the holder loses the turn: the next thread
that can go on gets it, and the holder runs on without one, beside it,
until its next wait in a collective, where it queues for a turn again.
One rank that sleeps keeps turns for the other thousand: had every
thread been set free, a thousand threads would contend for the GIL for
the rest of the test (2.4x the time of a 1024-rank test whose rank 0
slept 50 ms; a 5000-rank test that timed out reported after minutes).
After :data:`MAX_DEMOTIONS` holders lost their turns so (ranks that meet
outside disttest, a ``threading.Barrier``, each costing a watch), the world
goes *free* for the rest of the test: every waiting thread is woken and
they run as plain threads (as without turns). An aborted world goes free
at once.

Self-contained: used by :mod:`disttest.pg.threaded` (its Work's ``wait``)
and the thread launcher.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.futures import Future

__unittest = True

__all__ = ["BUSY_HOLD_LIMIT", "BUSY_SHARE", "HOLD_LIMIT", "MAX_DEMOTIONS", "Baton", "give_back_cpus", "move_here"]

#: Seconds a thread may keep the turn while others wait for it before the
#: world goes free (checked at the launcher's polls, every 10 ms).
HOLD_LIMIT = 0.005


#: Seconds a thread that runs (uses the CPU) may keep the turn while
#: others wait: a rank's own work (the last rank into a collective hands
#: out a thousand results; an import) is no reason to go free, but a Python
#: loop that spins until another rank acts must not wait for ever.
BUSY_HOLD_LIMIT = 1.0
#: A holder that used at least this share of a CPU between two watches runs.
BUSY_SHARE = 0.1
#: Holders that lose their turn (see the module doc) before the world goes free.
MAX_DEMOTIONS = 8


def _cpu_seconds(tid: int | None) -> float | None:
    """CPU time thread ``tid`` (a native id) has used, or None where the
    system does not say (Linux's schedstat; never a call that could touch a
    thread that has ended)."""
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _Waiter:
    """A thread that can run once it has the turn, and how to wake it."""

    __slots__ = ("ident", "tid", "wake", "active")

    def __init__(self, thread: threading.Thread, wake: Callable[[], None]) -> None:
        self.ident = thread.ident
        self.tid = thread.native_id  # the kernel's id, for its CPU affinity
        self.wake = wake
        self.active = True  # False once the thread stopped waiting (a timeout)


_getcpu: list[Callable[[], int] | None] = []


def move_here(tid: int | None) -> set[int] | None:
    """Allow thread ``tid`` (a native id) only the calling thread's CPU, so
    that waking it next does not wake another CPU; return the CPUs it had,
    for :func:`give_back_cpus` (None if it was not moved: no such call on
    this system, or it may not run there)."""
    if not _getcpu:
        try:
            import ctypes

            _getcpu.append(ctypes.CDLL(None).sched_getcpu if hasattr(os, "sched_setaffinity") else None)
        except (AttributeError, OSError):
            _getcpu.append(None)
    getcpu = _getcpu[0]
    if getcpu is None or tid is None:
        return None
    try:
        cpu, had = getcpu(), os.sched_getaffinity(tid)
        if cpu not in had or len(had) == 1:
            return None
        os.sched_setaffinity(tid, {cpu})
    except OSError:
        return None
    return had


def give_back_cpus(had: set[int] | None) -> None:
    """In a thread :func:`move_here` moved (``had``: what it returned): allow
    the calling thread the CPUs it had again."""
    if had is not None:
        try:
            os.sched_setaffinity(0, had)
        except OSError:
            pass


class Baton:
    """The turn of one threaded world's rank threads (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Waiter] = deque()  # ready to run, in order
        self._holder: int | None = None  # the thread ident whose turn it is
        self._holder_tid: int | None = None  # its native id
        self._sample: tuple[tuple[int | None, float], float, float] | None = None  # the last watch's
        self._since = 0.0  # when the turn last changed hands
        self._pinned: dict[int | None, set[int]] = {}  # thread ident -> the CPUs to give back
        self._joiner: tuple[int, int] | None = None  # (ident, native id) of the thread waiting for the ranks
        self._demotions = 0  # holders that lost their turn (watch)
        #: True once every thread runs freely (for the rest of the world's life).
        self.free = False

    # -- the launcher's side --
    def begin(self, starts: list[tuple[threading.Thread, Callable[[], None]]]) -> None:
        """Start rank threads one turn at a time: ``starts`` holds each
        thread and the call that hands it its job (the job calls
        :meth:`resume` first)."""
        if self.free:
            for _, start in starts:
                start()
            return
        with self._lock:
            self._queue.extend(_Waiter(thread, start) for thread, start in starts)
        self._pass()

    def watch(self, now: float | None = None) -> bool:
        """Take the turn from its holder if it held it longer than
        :data:`HOLD_LIMIT` while a thread waited for it and did not use the
        CPU between two watches past that limit (or held it longer than
        :data:`BUSY_HOLD_LIMIT`): the next thread gets it, or, after
        :data:`MAX_DEMOTIONS` such holders, the world goes free. True if the
        turn was taken, or the world is free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            held = now - self._since
            waited = not self.free and bool(self._queue)
            turn = (self._holder_tid, self._since)
        if not waited or held <= HOLD_LIMIT:
            # NB: no look at the holder before then: most turns end well
            # within it (a short test's whole life), and each look opens a file.
            return self.free
        runs = self._runs(turn, now)  # every watch of a long turn looks, so that the next can judge
        if held > BUSY_HOLD_LIMIT or not runs:
            return self._demote(turn)
        return self.free

    def _demote(self, turn: tuple[int | None, float]) -> bool:
        """The holder of ``turn`` (its native id, since when) runs on without
        it; the next thread waiting gets it (unless the turn has moved on
        meanwhile). After :data:`MAX_DEMOTIONS`, the world goes free."""
        with self._lock:
            if self.free or (self._holder_tid, self._since) != turn:
                return self.free
            self._demotions += 1
            go_free = self._demotions > MAX_DEMOTIONS
            nxt = None if go_free else self._hand_on()
        if go_free:
            self.go_free()
        elif nxt is not None:
            nxt.wake()
        return True

    def _runs(self, turn: tuple[int | None, float], now: float) -> bool:
        """Whether the holder of ``turn`` (its native id, since when) used
        the CPU since the last watch of the same turn; at the first watch of
        a turn, True (unknown yet); False where the system does not say."""
        cpu = _cpu_seconds(turn[0])
        if cpu is None:
            return False
        last, self._sample = self._sample, (turn, now, cpu)
        if last is None or last[0] != turn:
            return True
        return cpu - last[2] >= BUSY_SHARE * (now - last[1])

    def go_free(self) -> None:
        """Every thread runs freely from now on; those waiting for a turn are woken."""
        with self._lock:
            self.free = True
            waiting = [w for w in self._queue if w.active]
            self._queue.clear()
            self._holder = self._holder_tid = None
        for w in waiting:
            w.wake()

    # -- the joining thread (the test's own) --
    def joiner_waits(self) -> None:
        """The calling thread waits for the ranks: a rank that ends may move
        it to its CPU to wake it (:meth:`wake_joiner_here`)."""
        with self._lock:
            self._joiner = (threading.get_ident(), threading.get_native_id())

    def joiner_resumes(self) -> None:
        """The joining thread is done waiting: it gets its CPUs back, and no
        rank moves it until it waits again."""
        with self._lock:
            self._joiner = None
        self.resume()

    def wake_joiner_here(self) -> None:
        """In a rank about to wake the joining thread: move it to this CPU if
        it is waiting (never once the world is free: a stop gave it its CPUs
        back). What it had before the first move is what it gets back."""
        with self._lock:
            if self.free or self._joiner is None:
                return
            ident, tid = self._joiner
            had = move_here(tid)
            if had is not None:
                self._pinned.setdefault(ident, had)

    # -- a rank thread's side --
    def holds(self) -> bool:
        """Whether it is the calling thread's turn."""
        return not self.free and self._holder == threading.get_ident()

    def leave(self) -> None:
        """The calling thread is done (its job ended): pass its turn on."""
        self.resume()
        if self.holds():
            self._pass()

    def resume(self) -> None:
        """The calling thread runs again: it gets back the CPUs it had
        before it was woken on its waker's."""
        give_back_cpus(self._pinned.pop(threading.get_ident(), None))

    def wait_for(self, future: Future[Any], limit: float | None) -> bool:
        """In a rank thread of a world with turns: pass the turn on if it
        holds it (a thread that lost its turn holds none) and sleep until
        ``future`` (a ``torch.futures.Future``) is done and the turn comes
        to it. False if ``limit`` seconds passed with ``future`` not done;
        True once they passed with it done (the thread may then hold the
        turn or not: the limit is the future's, as without turns)."""
        woken = threading.Lock()
        woken.acquire()
        waiter = _Waiter(threading.current_thread(), woken.release)
        holds = self.holds()
        future.add_done_callback(lambda _: self._ready(waiter))
        if holds:
            self._pass()
        if woken.acquire(timeout=-1 if limit is None else limit):
            self.resume()
            return True
        with self._lock:
            waiter.active = False
            if waiter in self._queue:
                self._queue.remove(waiter)
        self.resume()  # NB: after the lock: a hand-off to it that came first has pinned it
        return future.done()

    # -- hand-offs --
    def _ready(self, waiter: _Waiter) -> None:
        # The future it waits for is done: it runs now if nobody holds the
        # turn (or the world is free), else when its turn comes.
        with self._lock:
            if not waiter.active:
                return
            if not self.free and self._holder is not None:
                self._queue.append(waiter)
                return
            if not self.free:
                self._holder, self._holder_tid, self._since = waiter.ident, waiter.tid, time.monotonic()
        waiter.wake()

    def _pass(self) -> None:
        with self._lock:
            nxt = self._hand_on()
        if nxt is not None:
            nxt.wake()

    def _hand_on(self) -> _Waiter | None:
        """(Under the lock.) Give the turn to the next thread waiting for it,
        moved to this CPU for its wake-up; return it, for the caller to wake
        once the lock is released (None: nobody waits; nobody holds it)."""
        nxt = None
        while self._queue:
            w = self._queue.popleft()
            if w.active:
                nxt = w
                break
        self._holder = None if nxt is None else nxt.ident
        self._holder_tid = None if nxt is None else nxt.tid
        self._since = time.monotonic()
        if nxt is not None:
            had = move_here(nxt.tid)
            if had is not None:
                self._pinned[nxt.ident] = had
        return nxt
