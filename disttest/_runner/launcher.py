"""How ranks start and live: the launcher interface and the process launchers.

Every runner hands the one join loop (:mod:`.join`) an object that follows
:class:`Launcher`. The process launchers differ only in how a rank process
is made:

- ``zygote``: forked by a fork server that imported torch and the test's
  module and did no tensor work (fresh processes at fork speed);
- ``fork``: forked from the test process itself (the rank goes serial,
  one OpenMP thread, to dodge the fork trap); used when the test class
  cannot be imported by name (a class defined inside a function);
- ``spawn``: a fresh interpreter per rank, upstream's way (needed for CUDA).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psutil

from disttest._runner import fork_threads, proctree, settings, thread_pool
from disttest._runner import rank as rank_mod
from disttest._runner.board import InFlight, ProgressBoard
from disttest._runner.channel import Channel
from disttest._runner.crashsite import FATAL
from disttest._runner.messages import Leave
from disttest._runner.outcome import ExitStatus, Outcome
from disttest._runner.progress import find_desync
from disttest._runner.report import warn_at
from disttest.support import janitor

__unittest = True

__all__ = ["SPAWN_SILENT", "ForkLauncher", "Launcher", "ProcessLauncher", "RankProcess", "SpawnLauncher",
           "keep_files"]

STACK_WAIT = 2.0  # seconds to wait for a rank's stack dump
REAP_WAIT = 5.0  # seconds to wait for killed ranks to be reaped
OUTPUT_CHARS = 4000  # of a rank's output kept for the report
NO_STACK = "(no stack: the rank did not answer SIGUSR1 in time)"


class Launcher(Protocol):
    """What the join loop needs from a way of running ranks."""

    world_size: int

    def poll(self) -> dict[int, ExitStatus]:
        """Every rank that has ended so far, with how it ended."""
        ...

    def outcome(self, rank: int) -> Outcome | None:
        """The outcome ``rank`` reported, or None if it reported none."""
        ...

    def output(self, rank: int) -> str:
        """The end of what ``rank`` printed (for a rank that reported nothing)."""
        ...

    def desync(self, ranks: Sequence[int], finished: Sequence[int], ended: bool = False,
               entered_counts: bool = True) -> list[tuple[int, InFlight]]:
        """Each of ``ranks`` waiting in (``ended``: died in) a collective that
        a peer of ``finished`` never entered (without ``entered_counts``:
        takes part in)."""
        ...

    def dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        """The Python stacks (all threads) of the live ``ranks``."""
        ...

    def stop(self) -> None:
        """Stop every live rank; bounded."""
        ...

    def wait(self, seconds: float) -> None:
        """Block for at most ``seconds``, or less when a rank may have ended."""
        ...

    def pump_output(self, final: bool = False) -> None:
        """In stream mode, pass on what the ranks printed since the last call."""
        ...


    def keep_logs(self, test: str) -> str:
        """Copy every rank's whole output into a new folder; return its path."""
        ...


class RankProcess:
    """Upstream's view of a rank process (``self.processes[i]``)."""

    def __init__(self, launcher: ProcessLauncher, rank: int, pid: int) -> None:
        self._launcher = launcher
        self.rank = rank
        self.pid = pid
        self.name = f"process {rank}"

    @property
    def exitcode(self) -> int | None:
        """As multiprocessing: the exit code, -signal, or None while running."""
        status = self._launcher.poll().get(self.rank)
        if status is None:
            return None
        return -status.signal if status.signal is not None else status.code

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self._launcher.kill(self.rank, signal.SIGTERM)

    def kill(self) -> None:
        self._launcher.kill(self.rank, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exitcode is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)


class ProcessLauncher:
    """Shared by the process launchers: the ranks' channel (their outcomes),
    stack dumps through faulthandler on SIGUSR1 (works while a rank is
    blocked in C++), the progress board, and stopping whole process trees."""

    def __init__(self, spec: rank_mod.RankSpec) -> None:
        single = spec.entry == "test"
        self.channel = Channel(spec.world_size, first_test=spec.test_name if single else None)
        self.spec = dataclasses.replace(spec, address=self.channel.address, token=self.channel.token)
        self.world_size = spec.world_size
        self.pids: dict[int, int] = {}
        self._exits: dict[int, ExitStatus] = {}
        self._single = single  # a fresh-process run: its ranks leave once all answered
        self._released: set[int] = set()
        # Of each rank's log, passed on so far: from what an earlier launcher
        # in this run directory left there (a test run again after its ranks
        # crashed in a copy of the test process), its lines streamed already.
        self._offsets: dict[int, int] = {}
        if settings.output_mode() == "stream":  # (only streaming reads them: no stat per rank otherwise)
            for r in range(spec.world_size):
                with contextlib.suppress(OSError):
                    self._offsets[r] = os.path.getsize(rank_mod.paths(spec.run_dir, r)["log"])
        self._partial: dict[int, str] = {}  # a line not yet ended
        self._dumped: set[int] = set()  # ranks whose fatal-error dump began (no more output shown)
        self.board = ProgressBoard(os.path.join(spec.run_dir, "progress"), spec.world_size, create=True)

    # -- subclasses --
    def start(self, cls: type) -> None:
        raise NotImplementedError

    def _reap(self) -> None:
        """Record in ``self._exits`` every rank that has ended."""
        raise NotImplementedError

    # -- Launcher --
    def poll(self) -> dict[int, ExitStatus]:
        # Exits first, then messages: what a rank sent before it exited is
        # still in its socket, so an exit is never seen without its answer.
        if len(self._exits) < len(self.pids):
            self._reap()
        self.channel.pump(0)
        if len(self._exits) < len(self.pids):
            self._release_when_all_answered()
        return self._exits

    def _release_when_all_answered(self) -> None:
        # A fresh-process rank that answered stays a moment (rank.LINGER) so
        # that its peers can finish talking to it; once every live rank has
        # answered, none needs it any more.
        if not self._single:
            return  # a pool's workers stay for the next test
        live = [r for r in self.pids if r not in self._exits and r not in self._released]
        if live and all(r in self.channel.answers for r in live):
            for r in live:
                self.channel.send(r, Leave())
                self._released.add(r)

    def started(self) -> set[int]:
        """The ranks that have started their test (said they are ready)."""
        return set(self.channel.ready)

    def outcome(self, rank: int) -> Outcome | None:
        # A copy: callers may change it (shallow, as dataclasses.replace's,
        # at a fifth of its cost: the join loop asks at every poll).
        answer = self.channel.answers.get(rank)
        return None if answer is None else copy.copy(answer)

    def output(self, rank: int, since: int = 0) -> str:
        """The end of what ``rank`` printed (after byte ``since`` of its log)."""
        # More when it ends in faulthandler's dump (crashsite), which can be long.
        text = rank_mod.tail(self.log_path(rank), 8 * OUTPUT_CHARS, since)
        return text if FATAL in text else text[-OUTPUT_CHARS:]

    def log_path(self, rank: int) -> str:
        return rank_mod.paths(self.spec.run_dir, rank)["log"]

    def desync(self, ranks: Sequence[int], finished: Sequence[int], ended: bool = False,
               entered_counts: bool = True) -> list[tuple[int, InFlight]]:
        return find_desync(self.board, ranks, finished, ended, entered_counts)

    def dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        files = {r: rank_mod.paths(self.spec.run_dir, r)["stacks"] for r in ranks}
        sizes = {r: _size(files[r]) for r in ranks}
        for r in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pids[r], rank_mod.STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT
        pending = set(ranks)
        last = dict(sizes)
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)
            for r in list(pending):
                size = _size(files[r])
                # Done when the dump grew and then stopped growing.
                if size > sizes[r] and size == last[r]:
                    pending.discard(r)
                last[r] = size
        stacks = {}
        for r in ranks:
            try:
                with open(files[r], "rb") as f:
                    f.seek(sizes[r])
                    text = f.read().decode(errors="replace")
            except OSError:  # the rank had not yet made its file (a tiny timeout)
                text = ""
            stacks[r] = text or NO_STACK
        return stacks

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        pid = self.pids.get(rank)
        if pid is None or rank in self._exits:
            return
        try:
            proc = psutil.Process(pid)
            # (not its resource tracker: it ends by itself once the rest of the
            # tree has, removing what the rank left in /dev/shm)
            tree = [*(p for p in proc.children(recursive=True) if not proctree.is_resource_tracker(p.pid)), proc]
        except psutil.Error:
            return
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def kill_now(self) -> None:
        """SIGKILL every rank's process tree at once, without waiting or
        reading anything (the test process is being interrupted)."""
        for r in list(self.pids):
            self.kill(r, signal.SIGKILL)

    def stop(self) -> None:
        live = [r for r in self.pids if r not in self.poll()]
        for r in live:
            self.kill(r, signal.SIGKILL)
        deadline = time.monotonic() + REAP_WAIT
        while len(self.poll()) < len(self.pids) and time.monotonic() < deadline:
            time.sleep(0.01)

    def wait(self, seconds: float) -> None:
        # Wakes at once when a rank says something.
        self.channel.pump(seconds)

    def close(self) -> None:
        self.stop()
        self._kill_adopted()
        self.pump_output(final=True)
        self.channel.close()
        self.board.close()

    def _adopt_orphans(self) -> None:
        """Until :meth:`close`, the test process adopts what a rank leaves
        when it dies without killing it (a crash; a rank of the fork server
        when the server is killed), to kill it then."""
        self._before: set[int] | None = proctree.children()
        self._was_subreaper = _subreaper()
        proctree.set_child_subreaper()

    def _hold_groups(self) -> None:
        """Each rank leads a process group: what it starts stays in it, an
        environment of its own too (``Popen(env=...)``, without the
        janitor's token). Should the test process be killed outright, the
        janitor's reaper kills those groups (the ranks die by their
        parent-death signal; their children would go to init)."""
        self._groups = list(self.pids.values())
        janitor.hold_groups(self._groups)

    def _kill_adopted(self) -> None:
        janitor.release_groups(getattr(self, "_groups", ()))
        self._groups = []
        before = getattr(self, "_before", None)
        if before is None:
            return
        self._before = None
        keep = before | set(self.pids.values()) | _helpers()
        procs: list[psutil.Process] = []
        trackers: list[psutil.Process] = []
        for pid in proctree.children() - keep:
            with contextlib.suppress(psutil.Error):
                (trackers if proctree.is_resource_tracker(pid) else procs).append(psutil.Process(pid))
        # A rank's resource tracker ends by itself once its rank has, having
        # removed what the rank left in /dev/shm: a moment, then killed.
        _, late = psutil.wait_procs(trackers, timeout=proctree.TRACKER_GRACE) if trackers else ([], [])
        for p in [*procs, *late]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs([*procs, *late], timeout=1.0)
        if not self._was_subreaper and sys.platform.startswith("linux"):
            proctree.libc().prctl(proctree.PR_SET_CHILD_SUBREAPER, 0)

    def _log(self, rank: int) -> str:
        return rank_mod.paths(self.spec.run_dir, rank)["log"]

    def pump_output(self, final: bool = False) -> None:
        if settings.output_mode() != "stream":
            return
        sink = sys.stdout
        for r in sorted(self.pids):
            try:
                with open(self._log(r), "rb") as f:
                    f.seek(self._offsets.get(r, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[r] = self._offsets.get(r, 0) + len(data)
            if r in self._dumped:
                continue
            text, rest = stream_lines(r, self._partial.pop(r, "") + data.decode(errors="replace"), final)
            if rest:
                self._partial[r] = rest
            cut = text.find(f"[rank {r}] {FATAL}")
            if cut >= 0:
                # A fatal-error dump: the report shows where it crashed, its
                # frames in order and trimmed; the stream would show them twice.
                self._dumped.add(r)
                self._partial.pop(r, None)
                text = text[:cut] + f"[rank {r}] {STREAM_DUMP_NOTE}\n"
            sink.write(text)
        sink.flush()

    def keep_logs(self, test: str) -> str:
        return keep_files(test, {r: self._log(r) for r in self.pids})

    def processes(self) -> list[RankProcess]:
        return [RankProcess(self, r, self.pids[r]) for r in sorted(self.pids)]


#: What the streamed output shows of a rank's fatal-error dump.
STREAM_DUMP_NOTE = "(a fatal error: where it crashed is in the test's report)"


def stream_lines(rank: int, text: str, final: bool = False) -> tuple[str, str]:
    """``DISTTEST_OUTPUT=stream``: ``text`` a rank wrote as whole lines, each
    prefixed ``[rank N]``, and the unfinished line left (written as a line
    too when ``final``)."""
    lines = text.split("\n")
    rest = lines.pop()
    if rest and final:
        lines.append(rest)
        rest = ""
    return "".join(f"[rank {rank}] {line}\n" for line in lines), rest


def keep_files(test: str, logs: dict[int, str]) -> str:
    """Copy each rank's log (``{rank: path}``) to ``rankN.log`` in a new
    folder named after ``test``, which outlives the test; return its path."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"disttest-logs-{test}-")
    for r, path in logs.items():
        with contextlib.suppress(OSError):
            shutil.copyfile(path, os.path.join(folder, f"rank{r}.log"))
    return folder


def _subreaper() -> bool:
    """Whether this process is a child subreaper already (Linux)."""
    if not sys.platform.startswith("linux"):
        return True  # nothing to undo
    import ctypes

    flag = ctypes.c_int(0)
    proctree.libc().prctl(proctree.PR_GET_CHILD_SUBREAPER, ctypes.byref(flag))
    return bool(flag.value)


#: Sources of the pids of this process's helpers that outlive tests by
#: design (the fork servers register theirs): a module above this one adds
#: to it, so the launcher never imports its subclasses' modules.
HELPER_PIDS: list[Callable[[], set[int]]] = []


def _helpers() -> set[int]:
    """Children of the test process that outlive tests by design: fork
    servers, the janitor's reaper, multiprocessing's resource tracker."""
    pids: set[int] = janitor.reaper_pids()
    for source in HELPER_PIDS:
        pids |= source()
    return pids | rank_mod.process_helpers()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class ForkLauncher(ProcessLauncher):
    """Fork ranks from the test process; each rank goes serial first."""

    def start(self, cls: type) -> None:
        parent = os.getpid()
        self._adopt_orphans()
        # Idle rank threads (a threaded class's) end first: forking a process
        # with other threads copies their locks as they are.
        thread_pool.release_idle(wait=1.0)
        reason = fork_threads.parent_refusal(self.spec.threads)
        if reason is not None:
            # NB: OpenMP's pool runs here; its forks would hang at their first parallel op.
            warn_at(cls, fork_threads.forked_serial(cls, self.spec.threads, reason))
            self.spec = dataclasses.replace(self.spec, threads=1)
        for rank in range(self.world_size):
            try:
                pid = os.fork()
            except OSError as e:  # EAGAIN: a limit on processes; the caller stops those started
                raise RuntimeError(thread_pool.START_LIMIT.format(
                    rank=rank, world_size=self.world_size, what="a forked process", error=e)) from e
            if pid == 0:
                self.channel.drop_inherited()
                rank_mod.run_rank_process(cls, self.spec, rank, parent)
            self.pids[rank] = pid
        self._hold_groups()

    def _reap(self) -> None:
        for rank, pid in self.pids.items():
            if rank in self._exits:
                continue
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                self._exits[rank] = ExitStatus(code=None)
                continue
            if done:
                self._exits[rank] = ExitStatus.from_wait_status(status)


#: The output of a spawned rank that ended before it connected: what it
#: printed then (an error importing the test's module) went elsewhere.
SPAWN_SILENT = ("(its log is empty: it ended before disttest's code ran in it (disttest); what a spawned "
                "interpreter prints while it imports the test's module, an ImportError for one, goes to the "
                "test process's stderr)")


def _spawn_entry(spec: rank_mod.RankSpec, rank: int, parent: int) -> None:
    rank_mod.run_rank_process(rank_mod.resolve_class(spec), spec, rank, parent)


class SpawnLauncher(ProcessLauncher):
    """A fresh interpreter per rank (multiprocessing's ``spawn``)."""

    def start(self, cls: type) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._adopt_orphans()
        for rank in range(self.world_size):
            p = ctx.Process(target=_spawn_entry, args=(self.spec, rank, os.getpid()),
                            name=f"process {rank}", daemon=True)
            p.start()
            self._procs[rank] = p
            self.pids[rank] = p.pid  # type: ignore[assignment]
        self._hold_groups()

    def _reap(self) -> None:
        for rank, p in self._procs.items():
            if rank not in self._exits and p.exitcode is not None:
                self._exits[rank] = ExitStatus.from_exitcode(p.exitcode)

    def output(self, rank: int, since: int = 0) -> str:
        text = super().output(rank, since)
        if not text.strip() and rank in self._exits and rank not in self.channel.conns:
            return SPAWN_SILENT
        return text
