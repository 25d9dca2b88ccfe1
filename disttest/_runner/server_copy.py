"""The fork server as a copy of the test process (``DISTTEST_FORK_SERVER=copy``).

:mod:`.zygote` forks its server from the test process where
:func:`copy_safe` says a fork is safe; the child runs :func:`serve_as_copy`,
which makes it look like a fresh server (no inherited pipes, a fresh
interpreter's signal handlers) and never lets it return into the test
process's code. :class:`CopiedServer` is the test process's handle on it,
with the part of ``subprocess.Popen``'s interface the client uses.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import stat
import subprocess
import time
import traceback
from collections.abc import Callable
from multiprocessing import resource_tracker

from disttest._runner import cuda_fork, fork_threads, rank_look, settings, thread_pool

__unittest = True

__all__ = ["CopiedServer", "copy_failed", "copy_safe", "drop_pipes", "serve_as_copy"]

class CopiedServer:
    """A fork server forked from the test process, with the part of
    ``subprocess.Popen``'s interface that the client uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("fork server", timeout)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def serve_as_copy(read_fd: int, write_fd: int, parent_pid: int, inherited: tuple[int, ...],
                  mask: set[int | signal.Signals], serve: Callable[[int, int, int], None]) -> None:
    """In a fork of the test process (every signal blocked): become its fork
    server, and never return into the test process's code (nor run its exit
    handlers)."""
    try:
        # A process group of its own, as a fresh server's (see zygote's client):
        # a Ctrl-C or a kill of the test's group must leave it to clean up.
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        for fd in inherited:
            os.close(fd)
        # As a fresh server's: no terminal input, a fresh interpreter's
        # signal handlers (not the test process's cleanup handlers).
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        # multiprocessing's resource tracker stays the test process's, as
        # for ranks forked from it (pointed at /dev/null, it would look alive).
        tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_fd", None)
        drop_pipes(keep={read_fd, write_fd, devnull, tracker if tracker is not None else -1}, devnull=devnull)
        os.close(devnull)
        rank_look.restore_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        # What the test process left for its collector (a file object in a
        # cycle) is never collected here nor in the ranks: its finaliser
        # would act a second time. It also keeps those pages shared.
        gc.freeze()
        serve(read_fd, write_fd, parent_pid)
    except KeyboardInterrupt:
        pass  # Ctrl-C, which the test process reports (a fresh server's is no failure either)
    except BaseException:  # noqa: BLE001 (the test process learns it from our exit)
        with contextlib.suppress(BaseException):
            # To the fd: sys.stderr may be a copy of pytest's capture buffer.
            os.write(2, f"disttest: the fork server (a fork of the test process) failed:\n"
                        f"{traceback.format_exc()}".encode(errors="replace"))
    finally:
        os._exit(1)


copy_failed: list[str] = []  # a copy did not start: the fresh server serves from then on


def drop_pipes(keep: set[int], devnull: int) -> None:
    """Point the pipes and sockets this copy inherited at ``/dev/null``: held
    here, a pipe's write end would keep its reader from seeing the end (a
    retired fork server, a pytest-xdist worker's channel); a fresh server has
    none. The numbers stay taken, so an object of the test process that
    closes its fd later closes nothing of ours; files stay as they are (a
    log file a module opened is the ranks' too, as in any fork)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return  # not Linux
    for fd in fds:
        if fd <= 2 or fd in keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # the listing's own
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.dup2(devnull, fd, inheritable=False)


def copy_safe(threads: int | None) -> bool:
    """Whether the fork server may be a fork of this (test) process, for
    ranks of ``threads`` OpenMP threads (see the module docstring)."""
    if threads != 1 or copy_failed or not hasattr(os, "fork") or settings.fork_server() != "copy":
        return False
    # NB: asked without a driver call (cuInit would poison fork itself).
    if cuda_fork.cuda_initialised() or not cuda_fork.no_cuda_device():
        return False
    if fork_threads.autograd_started():  # its ranks could run no backward pass
        return False
    # (pytest-xdist's receiver, started with _thread and blocked reading its
    # pipe, is not seen, as for the pool's fork of the test process)
    return thread_pool.alone()
