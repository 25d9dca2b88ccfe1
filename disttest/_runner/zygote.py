"""The fork server: fresh rank processes at fork speed.

One server per test process. It imports torch and disttest, then, per
request, the test's module (once), and forks the ranks; it never runs tensor
code. It reaps its children and reports each exit to the test process. It
dies with the test process (parent-death signal), and its ranks die with
it, so no rank outlives a killed test run.

Where it comes from (``DISTTEST_FORK_SERVER``):

- ``copy`` (the default): a fork of the test process, made for each class
  of fresh-process tests as it sets up (before the class's own
  ``setUpClass`` code when that calls ``super()`` first), or at the class's
  first test that needs it; the previous class's copy ends.
  It costs a fork instead of a second interpreter that imports torch and
  the test's module again (about 2 s on a 2-core machine, the largest part
  of a one-test file's cost). Ranks forked from it see the test process as
  it was then: the modules it had imported, with what their import did,
  and what the module's and class's set-up had done so far.
  Made only where a fork of the test process is safe: one thread (a fork
  copies other threads' locks as they are), no CUDA device on the host (a
  fork of a process that asked CUDA anything cannot use CUDA), and for
  ranks of one OpenMP thread (``rank_threads = 1``, the default): the test
  process may have run a parallel op, after which a fork's next parallel
  op hangs unless it went serial first;
- ``fresh``, and wherever a copy is not safe: a fresh interpreter
  (``subprocess``), started on first use; its children may use OpenMP,
  unless importing the test's module started threads in it (OpenMP's pool,
  after a parallel op at import): then it refuses ranks that keep OpenMP's
  threads (:mod:`.fork_threads`), as it refuses CUDA below; they are
  spawned, or, where an earlier test's module started the threads, a
  fresh server is asked instead.

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
import warnings
from multiprocessing.connection import Connection
from typing import Any

from disttest import _compat
from disttest._runner import cuda_fork, fork_threads, proctree, settings
from disttest._runner import launcher as launcher_mod
from disttest._runner import rank as rank_mod
from disttest._runner.launcher import ProcessLauncher
from disttest._runner.messages import (
    UNSAFE_CUDA,
    UNSAFE_THREADS_EARLIER,
    Exited,
    ForkUnsafe,
    ServerReady,
    Start,
    Started,
    StartFailed,
    deliver,
)
from disttest._runner.outcome import ExitStatus
from disttest._runner.server_copy import CopiedServer, copy_safe, serve_as_copy
from disttest._runner.server_copy import copy_failed as _copy_failed

__unittest = True

__all__ = ["ForkServerUnsafe", "ZygoteLauncher", "ZygoteUnavailable", "main", "prefork", "server_pids"]

START_TIMEOUT = 120.0  # seconds for the server to import torch and answer
#: A copy of the test process has imported torch already: it answers at once.
COPY_START_TIMEOUT = 20.0
SERVER_DIED = ("died with the fork server, which {how} (the next test starts a fresh one)")


class ZygoteUnavailable(RuntimeError):
    """The fork server could not run this test (it says why)."""


class ForkServerUnsafe(ZygoteUnavailable):
    """The fork server will not fork this test's ranks: they could not use
    CUDA, or they would hang at their first parallel op (``kind``, as
    :class:`~.messages.ForkUnsafe`'s)."""

    def __init__(self, reason: str, kind: str = UNSAFE_CUDA) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


# --- server side ----------------------------------------------------------------


def _parent_died(signum: int, frame: object) -> None:
    # The ranks die of their own parent-death signal once this server exits;
    # what they started is killed here (this server is its subreaper).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        proctree.kill_descendants()
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
    proctree.set_child_subreaper()
    # Preload what every rank needs, so that no rank pays for it. Imports
    # only: no tensor work happens here (see the fork trap).
    import numpy.random  # noqa: F401 (set_rng_seed seeds it in every rank)
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.testing  # noqa: F401

    # Not torch.distributed.tensor (0.9 s), which assert_close would import
    # in every rank only to ask whether an input is a DTensor: it is asked
    # only once the package is loaded (the test's module imports it if the
    # test uses DTensor).
    _compat.lazy_dtensor_comparison()

    importlib.import_module("disttest")  # the public API every test module imports
    from disttest._runner import tracking

    tracking.install_tracking()
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, tuple[int, int]] = {}  # pid -> (run_id, rank)
    unsafe: str | None = None  # why this server's forks can no longer use CUDA
    own_threads = fork_threads.thread_ids()  # this server's own, by id
    outbox.send(ServerReady(os.getpid()))
    while True:
        ready, _, _ = select.select([inbox.fileno(), wake_r], [], [], 0.5)
        if wake_r in ready or _trackers:
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
        before = fork_threads.thread_ids()
        if own_threads is not None and before is not None:
            own_threads &= before  # (ids of its own that ended, numpy's at a fork, are not kept for reuse)
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
        if fork_threads.keeps_openmp(spec.threads):  # a fork after OpenMP's pool started hangs in it
            refusal = fork_threads.refusal(spec.module, own_threads, before)
            if refusal is not None:
                outbox.send(ForkUnsafe(run_id, *refusal))
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
    proctree.kill_descendants()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


#: Orphaned resource trackers (a rank's, once it ended) and when each was
#: first seen: given :data:`~.proctree.TRACKER_GRACE` to clean up and end.
_trackers: dict[int, float] = {}


def _kill_orphans(children: dict[int, tuple[int, int]]) -> None:
    """Kill our children that are not ranks: the descendants of a rank that
    ended without killing them (it crashed), handed to us as subreaper; a
    resource tracker only if it has not ended within its grace."""
    now = time.monotonic()
    orphans = proctree.children() - children.keys()
    for pid in _trackers.keys() - orphans:
        del _trackers[pid]  # (ended, and reaped with the ranks)
    for pid in orphans:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:  # (ended: reaped)
                _trackers.pop(pid, None)
                continue
        if (pid in _trackers or proctree.is_resource_tracker(pid)) and \
                now - _trackers.setdefault(pid, now) < proctree.TRACKER_GRACE:
            continue
        _trackers.pop(pid, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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
    """The test process's handle on its fork server (a copy of the test
    process, or a fresh interpreter)."""

    def __init__(self, copy: bool = False) -> None:
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        self.copy = copy
        self.proc: subprocess.Popen[bytes] | CopiedServer
        if copy:
            for stream in (sys.stdout, sys.stderr):  # else the copy holds what they buffer
                with contextlib.suppress(Exception):
                    stream.flush()
            parent = os.getpid()
            # Blocked across the fork: a Ctrl-C must not reach the copy
            # before it has a fresh interpreter's handlers.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            try:
                pid = os.fork()
            except BaseException:
                _copy_failed.append("fork")
                for fd in (parent_r, child_w, child_r, parent_w):
                    os.close(fd)
                raise
            finally:
                if os.getpid() == parent:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if pid == 0:
                serve_as_copy(child_r, child_w, parent, inherited=(parent_r, parent_w), mask=mask,
                              serve=main)
            self.proc = CopiedServer(pid)
        else:
            code = (
                f"import sys; sys.path[:0] = {sys.path!r}; "
                f"from disttest._runner.zygote import main; main({child_r}, {child_w}, {os.getpid()})"
            )
            # NB: the ranks get the test process's environment back (RankSpec.environ).
            env = {cuda_fork.NVML_CHECK_ENV: "1", **os.environ}
            # NB: a process group of its own. A terminal's Ctrl-C, or a CI job's
            # kill of the test's group, reached this server too: it ended at
            # once, its ranks died by their parent-death signal, and what they
            # had started went to init for good. Out of the group, it outlives
            # the test process (its parent-death signal, the pipe's end) and
            # kills every descendant first (it is their subreaper).
            group: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                                     else {"start_new_session": True})
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], pass_fds=(child_r, child_w), close_fds=True,
                stdin=subprocess.DEVNULL, env=env, **group,
            )
        os.close(child_r)
        os.close(child_w)
        self.inbox = Connection(parent_r, writable=False)
        self.outbox = Connection(parent_w, readable=False)
        self.runs: dict[int, ZygoteLauncher] = {}
        self.ids = itertools.count(1)
        self.retired = False  # it forks no more; closed once its runs have ended
        self.ready = False
        self.owner: tuple[str, str] | None = None  # a copy's class (module, qualified name)
        if not copy:
            self.await_ready()
        # A copy preloads while the test process goes on (its class's set-up);
        # the first test waits for it.

    def await_ready(self) -> None:
        """Wait (within ``START_TIMEOUT``) for the server's ``ServerReady``."""
        if self.ready:
            return
        how = "a fork of the test process" if self.copy else "a fresh interpreter"
        if self.copy:
            _copy_failed.append(how)  # until it answers: a copy that fails is not made again
        limit = COPY_START_TIMEOUT if self.copy else START_TIMEOUT
        if not self.inbox.poll(limit):
            _abandon(self)
            raise ZygoteUnavailable(f"the fork server ({how}) did not start within {limit}s")
        try:
            self.inbox.recv()
        except (EOFError, OSError):
            _abandon(self)
            raise ZygoteUnavailable(f"the fork server ({how}) {self.died_of()} as it started") from None
        self.ready = True
        if self.copy:
            _copy_failed.clear()

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


#: By (pid, copy): a forked child never reuses its parent's servers. At most
#: a copy (for ranks of one OpenMP thread) and a fresh one (for the others).
_clients: dict[tuple[int, bool], _Client] = {}
_retired: list[_Client] = []  # servers that fork no more, until their live ranks end


def server_pids() -> set[int]:
    """The pids of this process's fork servers (helpers that outlive tests by design)."""
    return {c.proc.pid for c in [*_clients.values(), *_retired]}


# The launcher leaves the fork servers alone when it sweeps the test process's children.
launcher_mod.HELPER_PIDS.append(server_pids)


def _client(threads: int | None = None, owner: tuple[str, str] | None = None) -> _Client:
    """The server to fork ranks of ``threads`` OpenMP threads for the class
    ``owner`` (module, qualified name): the copy of the test process made
    for that class if there is one or it may be made now, else the fresh
    one (started if need be). A copy made for another class is retired: a
    class's ranks see the test process as it was when that class set up,
    not what an earlier class left (a patch it stopped since)."""
    pid = os.getpid()
    for copy in (True, False):
        client = _clients.get((pid, copy))
        if client is not None and not client.alive():
            del _clients[(pid, copy)]  # it died (a rank may have killed it): drop its pipes
            client.close()
            client = None
        if copy and (threads != 1 or settings.fork_server() != "copy"):
            continue
        if copy and client is not None and owner is not None and client.owner not in (None, owner):
            _retire(client)  # another class's: it ends once its ranks have
            client = None
        if client is not None:
            if copy and client.owner is None:
                client.owner = owner
            return client
        if copy and not copy_safe(threads):
            continue
        client = _clients[(pid, copy)] = _Client(copy)
        client.owner = owner if copy else None
        return client
    raise AssertionError("unreachable: a fresh server is always possible")


def prefork(cls: type) -> None:
    """Fork a copy of the test process as the fork server of ``cls``'s
    fresh-process tests now, if they will use one (a class's set-up calls
    this before its own code runs): its ranks then see the test process as
    it is before the class's set-up, and its start overlaps the set-up."""
    try:
        method, _ = settings.start_method(cls)
        if method != "zygote" or "<locals>" in cls.__qualname__:
            return
        owner = (cls.__module__, cls.__qualname__)
        current = _clients.get((os.getpid(), True))
        if current is not None and current.owner == owner:
            return
        if copy_safe(getattr(cls, "rank_threads", None)):
            _client(1, owner)
    except Exception:  # noqa: BLE001 (the first test starts a server as it would have)
        return


def from_copy(launcher: object) -> bool:
    """Whether ``launcher``'s ranks were forked by a copy of the test process."""
    client = getattr(launcher, "_client", None)
    return isinstance(launcher, ZygoteLauncher) and client is not None and client.copy


def distrust_copies(reason: str) -> None:
    """Make no more copies of the test process here (``reason``: why), and
    retire the current one: the fresh server serves from then on."""
    _copy_failed.append(reason)
    client = _clients.pop((os.getpid(), True), None)
    if client is not None:
        _retire(client)


def trust_copies_again(reason: str) -> None:
    """Undo :func:`distrust_copies` (``reason``): the next class makes a copy again."""
    if reason in _copy_failed:
        _copy_failed.remove(reason)


def _retire(client: _Client) -> None:
    """Start no more runs on ``client``'s server; close it once its runs end."""
    _forget(client)
    if not client.retired:
        client.retired = True
        _retired.append(client)
    _close_if_idle(client)


def _abandon(client: _Client) -> None:
    """Kill ``client``'s server now (it stopped answering); the next test
    starts a fresh one."""
    _forget(client)
    with contextlib.suppress(OSError):
        client.proc.kill()
    client.close()


def _forget(client: _Client) -> None:
    key = (os.getpid(), client.copy)
    if _clients.get(key) is client:
        del _clients[key]


def _close_if_idle(client: _Client) -> None:
    if client.retired and not client.runs and client in _retired:
        _retired.remove(client)
        client.close()


@atexit.register
def _shutdown() -> None:
    for copy in (True, False):
        client = _clients.pop((os.getpid(), copy), None)
        if client is not None:
            client.close()
    for client in list(_retired):
        _retired.remove(client)
        client.close()


class ZygoteLauncher(ProcessLauncher):
    """Ranks forked by the fork server."""

    def start(self, cls: type) -> None:
        owner = (self.spec.module, self.spec.qualname)
        client = _client(self.spec.threads, owner)
        self._client = client
        self._run_id = -1  # (none yet: _ask draws one from the server that is asked)
        try:
            client.await_ready()
        except ZygoteUnavailable as e:
            if not client.copy:
                raise
            # A copy that did not start is not made again: a fresh server runs it.
            warnings.warn(f"disttest: a fresh fork server instead: {e}", stacklevel=2)
            client = self._client = _client(self.spec.threads, owner)
            client.await_ready()
        self._ask(client)
        if self._unsafe is not None and self._unsafe[1] == UNSAFE_THREADS_EARLIER:
            # Threads an earlier test's module started: a fresh server, which
            # imports only this one, is asked instead.
            client.runs.pop(self._run_id, None)
            _retire(client)
            client = self._client = _client(self.spec.threads, owner)
            client.await_ready()
            self._ask(client)
        if self._unsafe is not None:
            reason, kind = self._unsafe
            client.runs.pop(self._run_id, None)
            cuda_fork.learn_unsafe_import(self.spec.module, kind)
            _retire(client)
            raise ForkServerUnsafe(reason, kind)
        if self._error is not None:
            client.runs.pop(self._run_id, None)
            raise ZygoteUnavailable(f"the fork server could not load the test:\n{self._error}")
        # As for ranks of the test process: should the server die (killed), the
        # ranks die with it and what they started comes here, to be killed as
        # the test ends; should the test process die too, the reaper kills
        # the ranks' groups (what they started with an environment of its own).
        self._adopt_orphans()
        self._hold_groups()

    def _end_orphaned_ranks(self) -> None:
        """The server died: its ranks die by their parent-death signal a
        moment later, ours meanwhile (this process is their subreaper); here
        they are killed and reaped first, so that what they started (theirs
        until then) is this process's to kill as the launcher closes."""
        import psutil

        procs = []
        for pid in self.pids.values():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.ppid() == os.getpid():  # (not a process that took a dead rank's number)
                    p.kill()
                    procs.append(p)
        psutil.wait_procs(procs, timeout=launcher_mod.REAP_WAIT)

    def _ask(self, client: _Client) -> None:
        """Send the test to ``client``'s server, under a run id of that
        server's, and wait for its answer."""
        self._run_id = next(client.ids)
        self._error: str | None = None
        self._unsafe: tuple[str, str] | None = None  # (reason, kind) of a ForkUnsafe
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

    def on_started(self, message: Started) -> None:
        self.pids.update(message.pids)

    def on_startfailed(self, message: StartFailed) -> None:
        self._error = message.text

    def on_forkunsafe(self, message: ForkUnsafe) -> None:
        self._unsafe = (message.reason, message.kind)

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
        client = getattr(self, "_client", None)
        if client is not None and self.pids and not client.alive():
            self._end_orphaned_ranks()
        super().close()
        if client is None:
            return  # no server was reached (a bad DISTTEST_FORK_SERVER, a start that failed)
        client.runs.pop(self._run_id, None)
        _close_if_idle(client)
