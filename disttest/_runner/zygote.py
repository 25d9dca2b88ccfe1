"""The fork server: fresh rank processes at fork speed.

One server per test process, started on first use with a fresh interpreter.
It imports torch and disttest, then, per request, the test's module (once),
and forks the ranks; it never runs tensor code, so its children may use
OpenMP. It reaps its children and reports each exit to the test process.
It dies with the test process (parent-death signal), and its ranks die with
it, so no rank outlives a killed test run.

It speaks the typed messages of :mod:`.messages` over two pipes: ``Start``
-> ``Started`` (or ``StartFailed``), then ``Exited`` per rank. The ranks it
forks talk to the test process over their own channel, as every rank does.

CUDA (:mod:`.cuda_fork`): being a fresh interpreter, the server shares no
CUDA state with the test process, whenever that initialised CUDA. It runs
with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (unless the variable is set), so
that ``torch.cuda.is_available()`` in an imported module does not poison its
forks; when importing a test's module initialises CUDA in it, it answers
``ForkUnsafe`` instead of forking, for that test and every later one: the
client retires it (it ends once its live ranks have) and the next test
starts a fresh server.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import itertools
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

from disttest import _compat
from disttest._runner import cuda_fork
from disttest._runner import launcher as launcher_mod
from disttest._runner import rank as rank_mod
from disttest._runner.launcher import ProcessLauncher
from disttest._runner.messages import (
    Exited,
    ForkUnsafe,
    ServerReady,
    Start,
    Started,
    StartFailed,
    deliver,
)
from disttest._runner.outcome import ExitStatus

__unittest = True

__all__ = ["ForkServerUnsafe", "ZygoteLauncher", "ZygoteUnavailable", "main"]

START_TIMEOUT = 120.0  # seconds for the server to import torch and answer
SERVER_DIED = ("died with the fork server, which {how} (the next test starts a fresh one)")


class ZygoteUnavailable(RuntimeError):
    """The fork server could not run this test (it says why)."""


class ForkServerUnsafe(ZygoteUnavailable):
    """The fork server will not fork this test's ranks: they could not use
    CUDA (importing the test's module initialised CUDA in the server)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- server side ----------------------------------------------------------------


def _parent_died(signum: int, frame: object) -> None:
    # The ranks die of their own parent-death signal once this server exits;
    # what they started is killed here (this server is its subreaper).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        rank_mod.kill_descendants()
    finally:
        os._exit(0)


def main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    """Run the fork server until the test process closes the pipe or dies."""
    # Not SIGKILL: when the test process is killed (SIGKILL, pytest-timeout's
    # os._exit), this server kills every descendant first, also those the
    # ranks started in sessions of their own, which its ranks' SIGKILL (their
    # parent-death signal) leaves to it as their subreaper.
    signal.signal(signal.SIGTERM, _parent_died)
    rank_mod.set_parent_death_signal(parent_pid, signal.SIGTERM)
    # The descendants of a rank that died (a segfault) come to us: killed.
    rank_mod.set_child_subreaper()
    # Preload what every rank needs, so that no rank pays for it. Imports
    # only: no tensor work happens here (see the fork trap).
    import numpy.random  # noqa: F401 (set_rng_seed seeds it in every rank)
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.distributed.tensor  # noqa: F401 (assert_close imports it lazily)
    import torch.testing  # noqa: F401

    importlib.import_module("disttest")  # the public API every test module imports
    from disttest._runner import progress

    progress.install_tracking()
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, tuple[int, int]] = {}  # pid -> (run_id, rank)
    unsafe: str | None = None  # why this server's forks can no longer use CUDA
    outbox.send(ServerReady(os.getpid()))
    while True:
        ready, _, _ = select.select([inbox.fileno(), wake_r], [], [], 0.5)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _kill_orphans(children)
        _reap(children, outbox)
        if read_fd not in ready:
            continue
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            break
        if not isinstance(message, Start):
            continue
        run_id, spec = message.run, message.spec
        try:
            sys.path[:] = spec.sys_path
            # The test module's top-level code sees the test process's argv,
            # as in a spawned rank (and in this server's ranks).
            sys.argv[:] = spec.argv
            cls = rank_mod.resolve_class(spec)
            if "disttest.bases.dynamo" in sys.modules:
                _compat.preload_dynamo()  # once here, not in every rank
            # Modules every rank of this class needs (imported once here).
            for name in getattr(cls, "rank_preload", ()):
                importlib.import_module(name)
        except BaseException:  # noqa: BLE001 (reported to the test process)
            outbox.send(StartFailed(run_id, traceback.format_exc()))
            continue
        # NB: once CUDA is initialised here, no fork of ours can use it, for
        # this test or any later one.
        unsafe = unsafe or cuda_fork.server_refusal(spec.module)
        if unsafe is not None:
            outbox.send(ForkUnsafe(run_id, unsafe))
            continue
        pids = {}
        for r in range(spec.world_size):
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (read_fd, write_fd, wake_r, wake_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                rank_mod.run_rank_process(cls, spec, r, parent_pid=os.getppid())
            children[pid] = (run_id, r)
            pids[r] = pid
        outbox.send(Started(run_id, pids))
    # Every descendant: the ranks and what they started (a child in its own
    # session is still a rank's child, or ours once its rank has died).
    rank_mod.kill_descendants()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


def _kill_orphans(children: dict[int, tuple[int, int]]) -> None:
    """Kill our children that are not ranks: the descendants of a rank that
    ended without killing them (it crashed), handed to us as subreaper."""
    kids = rank_mod._direct_children()
    if kids is not None and kids <= children.keys():
        return  # only ranks (the usual case, in a fraction of psutil's time)
    import psutil

    try:
        procs = psutil.Process().children()
    except psutil.Error:
        return
    for p in procs:
        if p.pid not in children:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _reap(children: dict[int, tuple[int, int]], outbox: Connection) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in children:
            run_id, r = children.pop(pid)
            outbox.send(Exited(run_id, r, status))


# --- client side ----------------------------------------------------------------


class _Client:
    """The test process's handle on its fork server."""

    def __init__(self) -> None:
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        code = (
            f"import sys; sys.path[:0] = {sys.path!r}; "
            f"from disttest._runner.zygote import main; main({child_r}, {child_w}, {os.getpid()})"
        )
        # NB: the ranks get the test process's environment back (RankSpec.environ).
        env = {cuda_fork.NVML_CHECK_ENV: "1", **os.environ}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(child_r, child_w), close_fds=True,
            stdin=subprocess.DEVNULL, env=env,
        )
        os.close(child_r)
        os.close(child_w)
        self.inbox = Connection(parent_r, writable=False)
        self.outbox = Connection(parent_w, readable=False)
        self.runs: dict[int, ZygoteLauncher] = {}
        self.ids = itertools.count(1)
        self.retired = False  # it forks no more; closed once its runs have ended
        if not self.inbox.poll(START_TIMEOUT):
            self.close()
            raise ZygoteUnavailable(f"the fork server did not start within {START_TIMEOUT}s")
        self.inbox.recv()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def died_of(self) -> str:
        """How the server ended: "was killed by SIGKILL", "exited with code 1"."""
        code = self.proc.poll()
        if code is None:
            return "stopped answering"
        return ExitStatus.from_exitcode(code).describe()

    def pump(self, timeout: float = 0.0) -> None:
        """Deliver every message that has arrived (none once it is closed:
        a run of a server that was abandoned learns of it from ``alive``)."""
        if self.inbox.closed:
            return
        while self.inbox.poll(timeout):
            timeout = 0.0
            try:
                message = self.inbox.recv()
            except (EOFError, OSError):
                return
            launcher = self.runs.get(getattr(message, "run", None))  # type: ignore[arg-type]
            if launcher is not None:
                deliver(message, launcher)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.outbox.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self.inbox.close()


_clients: dict[int, _Client] = {}  # by pid: a forked child never reuses its parent's
_retired: list[_Client] = []  # servers that fork no more, until their live ranks end
# The launcher leaves the fork servers alone when it sweeps the test process's children.
launcher_mod.HELPER_PIDS.append(lambda: {c.proc.pid for c in [*_clients.values(), *_retired]})


def _client() -> _Client:
    client = _clients.get(os.getpid())
    if client is None or not client.alive():
        if client is not None:  # it died (a rank may have killed it): drop its pipes
            client.close()
        client = _clients[os.getpid()] = _Client()
    return client


def _retire(client: _Client) -> None:
    """Start no more runs on ``client``'s server; close it once its runs end."""
    if _clients.get(os.getpid()) is client:
        del _clients[os.getpid()]
    if not client.retired:
        client.retired = True
        _retired.append(client)
    _close_if_idle(client)


def _abandon(client: _Client) -> None:
    """Kill ``client``'s server now (it stopped answering); the next test
    starts a fresh one."""
    if _clients.get(os.getpid()) is client:
        del _clients[os.getpid()]
    with contextlib.suppress(OSError):
        client.proc.kill()
    client.close()


def _close_if_idle(client: _Client) -> None:
    if client.retired and not client.runs and client in _retired:
        _retired.remove(client)
        client.close()


@atexit.register
def _shutdown() -> None:
    client = _clients.pop(os.getpid(), None)
    if client is not None:
        client.close()
    for client in list(_retired):
        _retired.remove(client)
        client.close()


class ZygoteLauncher(ProcessLauncher):
    """Ranks forked by the fork server."""

    def start(self, cls: type) -> None:
        client = _client()
        self._client = client
        self._run_id = next(client.ids)
        self._error: str | None = None
        self._unsafe: str | None = None
        client.runs[self._run_id] = self
        client.outbox.send(Start(self._run_id, self.spec))
        deadline = time.monotonic() + START_TIMEOUT
        while not self.pids and self._error is None and self._unsafe is None:
            client.pump(0.05)
            if not self.pids and not client.alive():
                # It died after forking some ranks, maybe killed by one (they die
                # with it): the test's ranks are lost; running it again another
                # way could repeat what killed the server.
                lost = ExitStatus(note=SERVER_DIED.format(how=client.died_of()))
                self._exits.update(dict.fromkeys(range(self.world_size), lost))
                client.runs.pop(self._run_id, None)
                return
            if time.monotonic() > deadline:
                # A server that does not answer is broken; the ranks it may still
                # fork would start the test unasked, beside those that replace
                # them: it goes now, and they with it (their parent-death signal).
                client.runs.pop(self._run_id, None)
                _abandon(client)
                raise ZygoteUnavailable(f"the fork server did not answer within {START_TIMEOUT}s")
        if self._unsafe is not None:
            client.runs.pop(self._run_id, None)
            cuda_fork.initialises_cuda_at_import(self.spec.module, learned=True)
            _retire(client)
            raise ForkServerUnsafe(self._unsafe)
        if self._error is not None:
            client.runs.pop(self._run_id, None)
            raise ZygoteUnavailable(f"the fork server could not load the test:\n{self._error}")

    def on_started(self, message: Started) -> None:
        self.pids.update(message.pids)

    def on_startfailed(self, message: StartFailed) -> None:
        self._error = message.text

    def on_forkunsafe(self, message: ForkUnsafe) -> None:
        self._unsafe = message.reason

    def on_exited(self, message: Exited) -> None:
        self._exits[message.rank] = ExitStatus.from_wait_status(message.wait_status)

    def wait(self, seconds: float) -> None:
        # Wake as soon as a rank says something or the server reports an exit.
        self.channel.pump(seconds, also=[self._client.inbox])
        self._client.pump()

    def _reap(self) -> None:
        self._client.pump()
        if not self._client.alive():
            lost = ExitStatus(note=SERVER_DIED.format(how=self._client.died_of()))
            for r in self.pids:
                self._exits.setdefault(r, lost)

    def close(self) -> None:
        super().close()
        self._client.runs.pop(self._run_id, None)
        _close_if_idle(self._client)
