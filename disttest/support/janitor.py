"""Last-resort cleanup of the test process's run directories and ranks.

A test's cleanups do not run when the test process is interrupted:
unittest lets ``KeyboardInterrupt`` (Ctrl-C) through without its cleanups,
and SIGTERM's default action ends the process at once. Every run directory
(a test's, a pool's) is registered here with a function that kills its
ranks at once and removes it; they all run

- at interpreter exit (after Ctrl-C: unittest and pytest both exit normally);
- on SIGTERM and SIGHUP (a closed terminal), after which the process ends
  by that signal as it would have (the handler is installed only over the
  signal's default action, from the main thread, and only acts in the
  process that installed it: a rank forked from the test process dies of
  the signal as before).

Neither runs when the test process ends without Python's exit: SIGKILL, or
``os._exit`` (pytest-timeout's ``thread`` method ends a hung test that way).
For those, the folders given with ``paths`` are also held by a reaper: a
small process, started at the first registration and never at import, that
reads the folders to remove on a pipe from the test process and removes
those still listed when the pipe closes, that is when the test process has
ended, however it ended. Then it also kills every process whose
environment carries its token (:data:`TOKEN_ENV`, which each rank process
sets: the ranks end with the test process on their own, but what they
started, in a session of its own, would be left to init), and the process
groups held with :func:`hold_groups` (each rank forked or spawned by the
test process leads one: what it started with an environment of its own,
``Popen(env=...)``, carries no token but is in its group).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

__unittest = True

__all__ = ["TOKEN_ENV", "hold_groups", "rank_environ", "reaper_pids", "register", "release_groups", "run_all",
           "uninstall_signals", "unregister"]

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_cleanups: dict[int, Callable[[], object]] = {}
_ids = itertools.count(1)
_owner: list[int] = []  # the pid whose registrations these are


_paths: dict[int, tuple[str, ...]] = {}


def register(cleanup: Callable[[], object], paths: Sequence[str] = ()) -> int:
    """Run ``cleanup`` (kill ranks now, remove files; fast, never raising
    beyond Exception) if the process ends before :func:`unregister`; and
    remove the folders ``paths`` even if it ends without running it."""
    _own()
    _install_sigterm()
    token = next(_ids)
    _cleanups[token] = cleanup
    if paths:
        _paths[token] = tuple(os.path.abspath(p) for p in paths)
        _tell_reaper("+", _paths[token])
    return token


def _own() -> None:
    """Make this process the owner of the registrations (first use, or a
    forked child: start afresh)."""
    if _owner != [os.getpid()]:
        _cleanups.clear()
        _paths.clear()
        _reaper.clear()
        _owner[:] = [os.getpid()]


def unregister(token: int) -> None:
    _cleanups.pop(token, None)
    paths = _paths.pop(token, ())
    if paths and _owner == [os.getpid()]:
        _tell_reaper("-", paths)


def hold_groups(pgids: Sequence[int]) -> None:
    """Have the reaper kill the process groups ``pgids`` (ranks that lead
    one) if the test process ends before :func:`release_groups`."""
    _own()
    _tell_reaper("+", [f"#{g}" for g in pgids])


def release_groups(pgids: Sequence[int]) -> None:
    """The groups ``pgids`` have ended (their ranks were reaped)."""
    if pgids and _owner == [os.getpid()]:
        _tell_reaper("-", [f"#{g}" for g in pgids])


#: Set in every rank process's environment (so in what it starts): the
#: reaper kills the processes that carry its value once the test process
#: has ended (Linux: it reads /proc/<pid>/environ).
TOKEN_ENV = "DISTTEST_RUN_TOKEN"
#: The reaper: one line per change, "+<path>" or "-<path>" ("#<pgid>" for a
#: process group); at the end of its input (the test process has ended) it
#: kills the processes that carry its token (argv[1]) and the groups still
#: listed, and removes the paths still listed.
_REAPER_CODE = """
import os, shutil, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
held = set()
for line in sys.stdin.buffer:
    path = line[1:].rstrip(b"\\n").decode("utf-8", "surrogateescape")
    (held.add if line[:1] == b"+" else held.discard)(path)
# "#<pgid>": a process group a rank leads ("/..." the folders to remove)
groups = {int(p[1:]) for p in held if p[:1] == "#" and p[1:].isdigit()}
held = {p for p in held if p[:1] != "#"}
mark = b"%s=%s\\0" % (sys.argv[1].encode(), sys.argv[2].encode())
# multiprocessing's resource tracker is spared: it ends by itself once the
# processes it serves are gone, removing what they left in /dev/shm
# (killed, it leaves that for good).
tracker = b"from multiprocessing.resource_tracker import main"
deadline, calm = time.monotonic() + 3, 0
while True:
    # Until nothing carries the token or is in a held group, and the folders
    # stay gone: a rank that is still dying (its parent-death signal) may
    # write into its folder.
    found = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/stat" % pid, "rb") as f:
                state, _, group = f.read().rsplit(b")", 1)[1].split()[:3]
            if state == b"Z":
                continue  # (ended; its parent reaps it)
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if tracker in f.read():
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                ours = mark in b"\\0" + f.read() or int(group) in groups
            if ours:
                os.kill(int(pid), signal.SIGKILL)
                found += 1
        except (OSError, ValueError, IndexError):
            pass
    for path in held:
        shutil.rmtree(path, ignore_errors=True)
    calm = calm + 1 if not found and not any(os.path.lexists(p) for p in held) else 0
    if calm >= 2 or time.monotonic() > deadline:
        break
    time.sleep(0.05)
"""
#: (the reaper's pid, the write end of its input pipe): plain numbers, so
#: that a forked child can drop its copies with no object to clean up.
_reaper: list[tuple[int, int]] = []
_reaper_lock = threading.Lock()


def _tell_reaper(op: str, paths: Sequence[str]) -> None:
    if any("\n" in p for p in paths):
        return  # not sayable on a line (the normal cleanups still remove it)
    with _reaper_lock:
        if not _reaper:
            if op == "-":
                return
            _reaper[:] = [_start_reaper()]
        try:
            os.write(_reaper[0][1], "".join(f"{op}{p}\n" for p in paths).encode("utf-8", "surrogateescape"))
        except OSError:  # it died: the normal cleanups still run
            _reaper.clear()


def rank_environ() -> dict[str, str]:
    """What a rank process adds to its environment: the token by which the
    reaper finds it and what it started, if the test process is killed."""
    _own()  # (before any registration too: the same reaper serves both)
    with _reaper_lock:
        if not _reaper:
            _reaper[:] = [_start_reaper()]
        return {TOKEN_ENV: _token[0]}


_token: list[str] = []


def reaper_pids() -> set[int]:
    """The reaper's pid (a helper of the test process that outlives tests by design)."""
    return {pid for pid, _ in _reaper} if _owner == [os.getpid()] else set()


def _start_reaper() -> tuple[int, int]:
    # Its own session: Ctrl-C in the terminal and a kill of the test's
    # process group do not reach it; it ignores them too and ends when its
    # input does. posix_spawn: no fork of this process (see the fork trap).
    read, write = os.pipe()  # not inheritable: only a fork copies ``write``
    try:
        _token[:] = [f"{os.getpid()}-{os.urandom(6).hex()}"]
        pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _REAPER_CODE, TOKEN_ENV, _token[0]],
                             os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, read, 0),
                                           (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                           (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
                             setsid=True)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    if not _fork_hook:
        _fork_hook.append(True)
        # A rank forked from the test process must not hold the pipe open.
        os.register_at_fork(after_in_child=_forget_reaper)
    return pid, write


_fork_hook: list[bool] = []


def _forget_reaper() -> None:
    for _, write in _reaper:
        with contextlib.suppress(OSError):
            os.close(write)
    _reaper.clear()


def _end_reaper() -> None:
    """Close its input: it ends by itself (not waited for: the test process
    exits now, and init reaps what it leaves)."""
    for pid, write in _reaper:
        with contextlib.suppress(OSError):
            os.close(write)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    _reaper.clear()


@atexit.register
def run_all() -> None:
    """Run every registered cleanup, newest first (only in the process that
    registered them)."""
    if _owner != [os.getpid()]:
        return
    for token in sorted(_cleanups, reverse=True):
        cleanup = _cleanups.pop(token, None)
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
    _paths.clear()
    # Done by the cleanups: the reaper ends with its input (what it still
    # holds was just removed).
    _end_reaper()


_installed: list[bool] = []


def _install_sigterm() -> None:
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed.append(True)
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def uninstall_signals() -> None:
    """Put back the default action of the signals :func:`register` took
    over, where the handler is still this module's and nothing is left to
    clean (``pytest.main()`` returns: its caller's process is as it was)."""
    if not _installed or _cleanups or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, signal.SIG_DFL)
    _installed.clear()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _owner == [os.getpid()]:
        run_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
