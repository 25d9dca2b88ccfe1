"""A process's descendants, from /proc: list them, watch for new ones, kill
them (a test leaves no process behind), and become the parent of orphans.

Standard library only (psutil where /proc keeps no children lists): rank
processes, the fork server and the test process use it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable, Sequence

__unittest = True

__all__ = ["DescendantWatch", "child_subreaper_for_now", "children", "descendants", "kill_descendants", "libc",
           "set_child_subreaper"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def child_subreaper_for_now() -> Callable[[], None]:
    """Make this process the parent of its orphaned descendants (Linux), as
    :func:`set_child_subreaper` does, until the returned undo puts back what
    it was: for a test whose ranks are threads of the test process, whose
    daemons (a double fork) would else go to init."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    c = libc()
    was = ctypes.c_int(0)
    if c.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was)) != 0:
        return lambda: None
    c.prctl(PR_SET_CHILD_SUBREAPER, 1)
    return lambda: c.prctl(PR_SET_CHILD_SUBREAPER, was.value)


def set_child_subreaper() -> None:
    """Become the parent of every orphaned descendant (Linux): a process the
    test started in a new session, or whose parent has exited, stays
    reachable, so that :func:`kill_descendants` finds it."""
    if sys.platform.startswith("linux"):
        libc().prctl(PR_SET_CHILD_SUBREAPER, 1)


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, loaded once (a fork server's ranks inherit it)."""
    return ctypes.CDLL(None, use_errno=True)


#: How multiprocessing starts its resource tracker (``python -c '...'``).
_TRACKER_CODE = "from multiprocessing.resource_tracker import main"
#: How long an orphaned resource tracker may take to clean up and end.
TRACKER_GRACE = 3.0


def is_resource_tracker(cmdline: Sequence[str] | int) -> bool:
    """Whether a process (its command line, or its pid) is multiprocessing's
    resource tracker. NB: never killed outright: it ends by itself once the
    process it serves has ended (its pipe closes), after removing the shared
    memory and semaphores that process left; SIGKILLed, it leaves them in
    /dev/shm for good. Nothing else can hold its pipe once its process and
    that one's children are gone."""
    if isinstance(cmdline, int):
        try:
            with open(f"/proc/{cmdline}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace").split("\0")
        except OSError:
            return False
    return any(_TRACKER_CODE in part for part in cmdline)


def kill_descendants(keep: frozenset[int] = frozenset()) -> list[str]:
    """Kill every running descendant process of this one (but ``keep``, and
    resource trackers: see :func:`is_resource_tracker`); return each as
    "pid N: command line" (a test leaves no process behind)."""
    if _childless():
        return []
    kids = _direct_children()
    if kids is not None and not kids - keep:
        return []  # the usual case, in a fraction of psutil's time
    import psutil

    try:
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in keep]
    except psutil.Error:
        return []
    killed, spared = [], set()
    for p in procs:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # ended already; reaped below
            cmdline = p.cmdline()
            if is_resource_tracker(cmdline):
                spared.add(p.pid)
                continue
            what = " ".join(cmdline) or p.name()
            p.kill()
        except psutil.Error:
            continue
        killed.append(f"pid {p.pid}: {what[:120]}")
    psutil.wait_procs([p for p in procs if p.pid not in spared], timeout=1.0)  # reap those that are our children
    return killed


def _direct_children(pid: int | str = "self") -> set[int] | None:
    """The children of process ``pid`` (this one by default), from /proc
    (fast); None where unknown (the system keeps no such lists, or the
    process ended)."""
    # One list per thread. A thread that ends between the listing and its
    # read hands its children to another, maybe one read already: read all
    # again then. (os.open, not open(): a third of the time, and a thread
    # test asks for each thread of the test process twice.)
    for _ in range(5):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
        pids: set[int] = set()
        vanished = False
        for tid in tids:
            try:
                fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
            except FileNotFoundError:
                vanished = True
                continue
            except OSError:
                return None
            try:
                data = b""
                while chunk := os.read(fd, 65536):
                    data += chunk
            except OSError:
                vanished = True
                continue
            finally:
                os.close(fd)
            try:
                pids.update(map(int, data.split()))
            except ValueError:
                return None
        if not vanished:
            return pids
    return None


def children() -> set[int]:
    """This process's children now: /proc's lists where the system keeps
    them, else psutil's (which reads every process of the machine)."""
    kids = _direct_children()
    if kids is not None:
        return kids
    import psutil

    try:
        return {p.pid for p in psutil.Process().children()}
    except psutil.Error:
        return set()


def _childless() -> bool:
    """Whether this process has no child at all, running or ended (one
    system call; /proc lists children per thread, and torch has many)."""
    if not hasattr(os, "waitid"):
        return False
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except OSError:
        return False
    return False


def descendants() -> frozenset[int]:
    """Every descendant of this process running now (its children, theirs...)."""
    if _childless():
        return frozenset()
    # From the children lists in /proc, one per thread of each descendant:
    # psutil reads every process of the machine to find a parent's children
    # (3 ms a call on a busy machine; a thread test asks at each start, and
    # the test process always has a child, the janitor's reaper).
    found: set[int] = set()
    frontier = _direct_children()
    while frontier:
        found |= frontier
        following: set[int] = set()
        for pid in frontier:
            kids = _direct_children(pid)
            if kids is None and os.path.exists(f"/proc/{pid}"):
                frontier = None  # (unknown, not ended: psutil's answer instead)
                break
            following |= kids or set()
        else:
            frontier = following - found
    if frontier is not None:
        return frozenset(found)
    import psutil

    try:
        return frozenset(p.pid for p in psutil.Process().children(recursive=True))
    except psutil.Error:
        return frozenset()


#: The last process or thread ID the kernel handed out in this PID namespace.
LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _last_pid() -> int | None:
    """The last process or thread ID handed out in this PID namespace
    (Linux), or None where that is not known."""
    try:
        fd = os.open(LAST_PID, os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 32))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


class DescendantWatch:
    """A process's descendants, listed again only when a process or thread
    may have been made since the last listing.

    Listing reads /proc's children list of every thread of every descendant
    (0.1 to 0.2 ms in a test process with torch's threads), and a thread
    test asks at its start and at its end. A new process takes the next
    free ID of the PID namespace, as a new thread does; while the
    namespace's last ID has not moved, no descendant can have appeared, and
    the last listing still holds every one running (with maybe some that
    have ended since). NB: the ID is read before the listing, so that a
    process made while the listing runs moves it. Where the ID cannot be
    read, every call lists.
    """

    def __init__(self) -> None:
        #: (this process's ID, the namespace's last ID) when ``_known`` was listed.
        self._mark: tuple[int, int] | None = None
        self._known: frozenset[int] = frozenset()

    def _now(self) -> tuple[int, int] | None:
        last = _last_pid()
        # The process's own ID too: a forked copy of the watch is not its own.
        return None if last is None else (os.getpid(), last)

    def descendants(self) -> frozenset[int]:
        """Every descendant running now (:func:`descendants`), maybe with
        some that have ended since the last listing."""
        mark = self._now()
        if mark is None or mark != self._mark:
            self._known = descendants()
            self._mark = mark
        return self._known

    def unchanged(self) -> bool:
        """Whether no process or thread has been made since the last
        listing: no descendant is new (``kill_descendants(keep=listing)``
        would find nothing)."""
        mark = self._now()
        return mark is not None and mark == self._mark
