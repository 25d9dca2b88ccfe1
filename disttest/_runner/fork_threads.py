"""Start methods and OpenMP: which ranks a fork server must not fork.

A process forked after OpenMP's thread pool started (a parallel op: a
matmul, a large elementwise op) hangs at its first parallel op: libgomp is
not fork-safe. Ranks of one OpenMP thread (``rank_threads = 1``, the
default) go serial before any op and are safe. Ranks that keep OpenMP's
threads (``rank_threads = None`` or above 1) are not, when the fork server
that forks them has such a pool, which a test module that runs a parallel
op at import starts in it.

The fork server notes its threads (by id) when it starts and before each
import of a test's module. For ranks that keep OpenMP's threads it refuses
to fork (:class:`~.messages.ForkUnsafe`) where threads beyond its own run:

- started by this module's import (``threads``): the module is remembered,
  and its such tests start with ``spawn``, with :data:`FELL_BACK_THREADS`;
- started before it, by an earlier test's module (``threads-earlier``):
  not this module's doing, so the client asks a fresh server instead.

Ids, not counts, and only threads that survive a fork: numpy's OpenBLAS
pool ends before every fork and starts again at its next call (under new
ids), so a count can come back to the server's own while OpenMP's pool
runs, and numpy work at import would look like a new pool. Where threads
beyond the server's own run, it makes a throwaway fork and judges only the
threads still there after it.

torch's autograd engine, once it has started its device threads in a
process, marks every later fork of it unable to run a backward pass
(:func:`autograd_started`): the fork server is then not a copy of the test
process, and ranks that disttest would fork from it go to the fresh server.

The test process forks ranks itself with ``fork`` (the pool's default, a
class defined inside a function, a fork server that could not start). Where
it runs native threads that survive a fork (:func:`parent_refusal`), ranks
that would keep OpenMP's threads go to the fork server when ``fork`` was
disttest's default; else they are forked with one OpenMP thread each, with
:data:`FORKED_SERIAL`.
"""

from __future__ import annotations

import os
import warnings

from disttest._runner.deadline import current_frames
from disttest._runner.messages import UNSAFE_THREADS, UNSAFE_THREADS_EARLIER

__unittest = True

__all__ = [
    "AUTOGRAD_THREAD", "FELL_BACK_THREADS", "FORKED_SERIAL", "PARENT_THREADS", "SERVER_THREADS",
    "SERVER_THREADS_EARLIER", "SERVER_THREADS_LEARNED", "autograd_started", "fell_back", "keeps_openmp",
    "known_refusal", "learned", "parent_refusal", "refusal", "thread_ids",
]

SERVER_THREADS = ("importing {module} started {count} thread(s) in the fork server (OpenMP's pool, after a parallel op "
                  "at import such as a matmul, most likely)")
SERVER_THREADS_LEARNED = ("importing {module} started threads in a fork server earlier in this process (OpenMP's pool, "
                          "after a parallel op at import such as a matmul, most likely)")
SERVER_THREADS_EARLIER = ("the fork server runs {count} thread(s) besides its own, started before {module} was imported "
                          "(by an earlier test's module: OpenMP's pool, after a parallel op at import, most likely)")
FELL_BACK_THREADS = (
    "{test}: its ranks start with 'spawn' instead of {method!r} (from {source}) (disttest): {reason}, and a rank "
    "forked after that hangs at its first parallel op ({cls}.rank_threads is {threads!r}: its ranks keep OpenMP's "
    "threads). To choose 'spawn' yourself and silence this, set start_method = 'spawn' on {cls} or "
    "DISTTEST_START_METHOD=spawn; to keep fork's speed, keep tensor work out of the module's import, or set "
    "rank_threads = 1 on {cls}"
)
PARENT_THREADS = ("the test process runs {count} native thread(s) that survive a fork (OpenMP's pool, after a "
                  "parallel op such as a matmul, most likely)")
FORKED_SERIAL = (
    "{cls}: its ranks are forked from the test process with one OpenMP thread each, not with rank_threads = "
    "{threads!r} (disttest): {reason}, and a rank forked with OpenMP's threads after that hangs at its first "
    "parallel op. To keep OpenMP's threads in the ranks, start them with 'zygote' or 'spawn' (start_method on a "
    "class defined at module level, or DISTTEST_START_METHOD), or run no parallel op in the test process before "
    "the ranks start; set rank_threads = 1 on {cls} to silence this"
)

# Modules whose import started threads in a fork server (learned from its
# refusal): their tests whose ranks keep OpenMP's threads go to spawn.
_threads_at_import: set[str] = set()


def keeps_openmp(threads: int | None) -> bool:
    """Whether ranks of ``rank_threads = threads`` run OpenMP's pool."""
    return threads != 1


def thread_ids() -> frozenset[str] | None:
    """The ids of this process's threads, every library's (``threading``
    sees only Python's; OpenMP's pool is native); None without /proc."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return None


def refusal(module: str, own: frozenset[str] | None, before: frozenset[str] | None) -> tuple[str, str] | None:
    """In the fork server, after importing the test's ``module``, for ranks
    that keep OpenMP's threads: (why it must not fork them, the kind), or
    None. ``own``: the server's threads as it started; ``before``: just
    before the import."""
    now = thread_ids()
    if now is None or own is None or before is None:
        return None  # no /proc: unknown, never a refusal
    if not now - own:
        return None
    now = _surviving_a_fork()
    extra = now - own
    if not extra:
        return None
    started = now - before
    if started:
        return SERVER_THREADS.format(module=module, count=len(started)), UNSAFE_THREADS
    return SERVER_THREADS_EARLIER.format(module=module, count=len(extra)), UNSAFE_THREADS_EARLIER


def _surviving_a_fork() -> frozenset[str]:
    """This process's threads once a fork is made: a throwaway child ends at
    once. Pools that end themselves at a fork (numpy's OpenBLAS) are safe to
    fork and are gone; OpenMP's stays."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return thread_ids() or frozenset()


# parent_refusal's last answer, by (pid, thread ids): asked again only when they change.
_parent_answer: tuple[tuple[int, frozenset[str]], str | None] | None = None


def _python_threads() -> int:
    """How many threads of this process run Python, those started with
    ``_thread`` included (pytest-xdist's receiver), which ``threading`` does
    not list."""
    return len(current_frames())


def parent_refusal(threads: int | None) -> str | None:
    """In the test process, about to fork ranks of ``rank_threads =
    threads``: why their OpenMP threads would hang (native threads that
    survive a fork run here), or None. Threads that run Python are not
    counted: only native ones can be OpenMP's pool."""
    if not keeps_openmp(threads):
        return None
    ids = thread_ids()
    if ids is None or len(ids) <= _python_threads():
        return None
    global _parent_answer
    key = (os.getpid(), ids)
    if _parent_answer is None or _parent_answer[0] != key:
        with warnings.catch_warnings():
            # Python 3.12+ warns at a fork with other threads alive; this
            # child ends at once, without running any code.
            warnings.simplefilter("ignore", DeprecationWarning)
            extra = len(_surviving_a_fork()) - _python_threads()
        _parent_answer = (key, PARENT_THREADS.format(count=extra) if extra > 0 else None)
    return _parent_answer[1]


#: The name torch gives each device thread of its autograd engine.
AUTOGRAD_THREAD = "pt_autograd_"
# (pid, thread ids whose names were read, whether one was autograd's): a
# process stays marked once the engine started them, so each thread is read once.
_autograd_seen: tuple[int, set[str], bool] | None = None


def autograd_started() -> bool:
    """Whether torch's autograd engine started its device threads in this
    process (a backward pass where torch sees a device: torch 2.14's FSDP2
    does so on CPU). From then on torch marks every process forked from this
    one, and a backward pass there raises "Unable to handle autograd's
    threading in combination with fork-based multiprocessing"; a fresh
    interpreter (the fresh fork server, ``spawn``) is unmarked. False
    without /proc."""
    global _autograd_seen
    ids = thread_ids()
    if ids is None:
        return False
    pid = os.getpid()
    if _autograd_seen is None or _autograd_seen[0] != pid:
        _autograd_seen = (pid, set(), False)
    _, read, started = _autograd_seen
    if not started:
        for tid in ids - read:
            read.add(tid)
            if _thread_name(tid).startswith(AUTOGRAD_THREAD):
                started = True
                break
        _autograd_seen = (pid, read, started)
    return started


def _thread_name(tid: str) -> str:
    """The name of this process's thread ``tid`` ("" once it has ended)."""
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def forked_serial(cls: type, threads: int | None, reason: str) -> str:
    """The warning for ranks forked with one OpenMP thread instead of ``threads``."""
    return FORKED_SERIAL.format(cls=cls.__qualname__, threads=threads, reason=reason)


def learned(module: str) -> None:
    """Remember that importing ``module`` starts threads (a server refused it)."""
    _threads_at_import.add(module)


def known_refusal(cls: type) -> str | None:
    """Why ``cls``'s ranks must not come from a fork server, known from an
    earlier refusal, or None."""
    if cls.__module__ in _threads_at_import and keeps_openmp(getattr(cls, "rank_threads", 1)):
        return SERVER_THREADS_LEARNED.format(module=cls.__module__)
    return None


def fell_back(cls: type, test: str, method: str, source: str, reason: str) -> str:
    """The warning for ranks started with ``spawn`` instead of ``method``."""
    return FELL_BACK_THREADS.format(test=test, method=method, source=source, reason=reason, cls=cls.__name__,
                                    threads=getattr(cls, "rank_threads", None))
