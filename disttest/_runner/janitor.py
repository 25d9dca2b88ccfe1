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
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

__unittest = True

__all__ = ["register", "run_all", "unregister"]

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_cleanups: dict[int, Callable[[], object]] = {}
_ids = itertools.count(1)
_owner: list[int] = []  # the pid whose registrations these are


def register(cleanup: Callable[[], object]) -> int:
    """Run ``cleanup`` (kill ranks now, remove files; fast, never raising
    beyond Exception) if the process ends before :func:`unregister`."""
    if _owner != [os.getpid()]:  # first use, or a forked child: start afresh
        _cleanups.clear()
        _owner[:] = [os.getpid()]
    _install_sigterm()
    token = next(_ids)
    _cleanups[token] = cleanup
    return token


def unregister(token: int) -> None:
    _cleanups.pop(token, None)


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


_installed: list[bool] = []


def _install_sigterm() -> None:
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed.append(True)
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _owner == [os.getpid()]:
        run_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
