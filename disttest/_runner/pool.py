"""A pool of rank processes kept for a whole test class.

The workers are started by the ordinary process launchers and run the one
rank loop (:mod:`.rank`) as pool workers: they make the class's process
group, then run the tests the parent sends over the launcher's channel
(:mod:`.channel`). Each test is joined by the one join loop through a
:class:`TestRun`, the per-test view of the pool that the
:class:`~.launcher.Launcher` protocol asks for: a rank has "ended" the test
when it answered (or died). Answers carry the dispatch number, so no result
of one test can be taken for another. A pool that lost or had to stop a
rank is broken: the caller closes it and builds a fresh one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from disttest._runner import rank as rank_mod
from disttest._runner.board import InFlight
from disttest._runner.launcher import ProcessLauncher
from disttest._runner.messages import Leave
from disttest._runner.outcome import ExitStatus, Kind, Outcome
from disttest._runner.progress import unmatched_collectives, unmatched_p2p
from disttest._runner.report import user_stack
from disttest.support import janitor

__unittest = True

__all__ = ["POOL_START_TIMEOUT", "Pool", "PoolUnavailable", "TestRun"]

POOL_START_TIMEOUT = 120.0  # default seconds for every worker to connect and make its group
EXIT_WAIT = 2.0  # seconds for workers to leave after "exit"
INIT_GRACE = 0.5  # seconds the others get once a worker could not make its group
#: No worker made the group in time (the stacks of those that hang follow).
NOT_STARTED = "the pool's ranks did not {what} within {timeout}s"
BROKEN_KINDS = (Kind.CRASHED, Kind.TIMED_OUT, Kind.DESYNC, Kind.DEADLOCK, Kind.STOPPED)


class PoolUnavailable(RuntimeError):
    """The pool's workers did not all start (the message says which, why)."""


class Pool:
    """``world_size`` worker processes serving one test class."""

    def __init__(self, cls: type, world_size: int, launcher_cls: type[ProcessLauncher],
                 spec_fields: dict[str, Any], start_timeout: float = POOL_START_TIMEOUT) -> None:
        self.world_size = world_size
        self.start_timeout = start_timeout
        self.run_dir = tempfile.mkdtemp(prefix="disttest-pool-")
        self._janitor = janitor.register(self._close_now, paths=[self.run_dir])
        self.file_name = os.path.join(self.run_dir, "rendezvous")
        self.broken = False
        #: A worker can run no further test (the test destroyed its group):
        #: the class gets a fresh pool, not counted as a breakage.
        self.retired = False
        self.init_outcomes: dict[int, Outcome] = {}
        try:
            spec = rank_mod.RankSpec(
                world_size=world_size, run_dir=self.run_dir, file_name=self.file_name,
                entry="pool", test_name="", **spec_fields,
            )
            self.launcher = launcher_cls(spec)
            self.channel = self.launcher.channel
            self.launcher.start(cls)
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        """Wait until every worker is ready (has made its group, or failed
        to); raise :class:`PoolUnavailable` when one dies or time runs out."""
        deadline = time.monotonic() + self.start_timeout
        ready = self.channel.ready
        while len(ready) < self.world_size:
            if any(o is not None and (o.kind.is_cause or o.kind is Kind.SKIPPED) for o in ready.values()):
                # A peer could not make the group (or skips the class): the
                # others wait in its rendezvous for nothing.
                deadline = min(deadline, time.monotonic() + INIT_GRACE)
            dead = self.launcher.poll()
            if dead:
                raise PoolUnavailable("; ".join(
                    f"rank {r}/{self.world_size} {s.describe()} "
                    + ("while making its group" if r in self.channel.conns else "while starting")
                    for r, s in dead.items()) + _tail(self.launcher, dead))
            if time.monotonic() > deadline:
                waiting = [r for r in range(self.world_size) if r not in ready]
                stacks = self.launcher.dump_stacks(waiting)
                if not any(o is not None for o in ready.values()):
                    what = "make their group" if len(self.channel.conns) == self.world_size else "start"
                    raise PoolUnavailable(NOT_STARTED.format(what=what, timeout=self.start_timeout) + "".join(
                        f"\nrank {r}/{self.world_size}'s stack:\n{user_stack(stacks[r])}" for r in waiting if stacks.get(r)))
                for r in waiting:
                    self.init_outcomes[r] = Outcome(
                        r, Kind.STOPPED, stacks=stacks.get(r, ""),
                        detail=f"rank {r}/{self.world_size} was stopped while making the group")
                self.launcher.stop()
                break
            self.launcher.wait(0.05)
        self.init_outcomes.update({r: o for r, o in ready.items() if o is not None})

    def dispatch(self, test_name: str) -> TestRun:
        """Send ``test_name`` to every worker; return the test's view."""
        # Where each rank's log stands before the test: its report shows what
        # the rank printed in this test, never an earlier test's lines (the
        # ranks flush their output before they answer a test).
        since = [_log_size(self.launcher.log_path(r)) for r in range(self.world_size)]
        return TestRun(self, self.channel.dispatch(test_name), since)

    def note(self, outcomes: Sequence[Outcome]) -> tuple[str | None, str | None]:
        """After a test: a pool that lost or had to stop a rank is broken;
        one whose worker says it can run no further test is retired, and so
        is one whose test left point-to-point calls or collectives unmatched
        in a group: the next test's calls would match them (and get old
        values, or wait for ever). Returns what was left, (point-to-point
        calls, collectives), as :func:`~disttest._runner.progress.unmatched_p2p`
        and :func:`~disttest._runner.progress.unmatched_collectives` say them."""
        if any(o.kind in BROKEN_KINDS for o in outcomes) or self.launcher.poll():
            self.broken = True
        if any(o.retired for o in outcomes):
            self.retired = True
        if self.broken or self.retired:
            return None, None
        left = unmatched_p2p(self.launcher.board), unmatched_collectives(self.launcher.board)
        if left != (None, None):
            self.retired = True
        return left

    def close(self) -> None:
        """Ask the workers to leave; stop those that do not; remove the run
        directory. Bounded."""
        launcher = getattr(self, "launcher", None)
        if launcher is not None:
            for rank in range(self.world_size):
                launcher.channel.send(rank, Leave())
            deadline = time.monotonic() + (0 if self.broken else EXIT_WAIT)
            while len(launcher.poll()) < len(launcher.pids) and time.monotonic() < deadline:
                launcher.wait(0.01)
            launcher.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        janitor.unregister(self._janitor)

    def _close_now(self) -> None:
        """The test process is being interrupted: kill, remove, wait for nothing."""
        launcher = getattr(self, "launcher", None)
        if launcher is not None:
            launcher.kill_now()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _log_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _tail(launcher: ProcessLauncher, dead: dict[int, ExitStatus]) -> str:
    rank = next(iter(dead))
    out = launcher.output(rank).strip()
    return f"; its output ends:\n{out[-2000:]}" if out else ""


class TestRun:
    """One test's view of the pool, for the join loop."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, pool: Pool, seq: int, since: Sequence[int] = ()) -> None:
        self.pool = pool
        self.seq = seq
        self.world_size = pool.world_size
        self._since = list(since) or [0] * pool.world_size  # (each rank's log offset at the test's start)

    def poll(self) -> dict[int, ExitStatus]:
        ended = dict(self.pool.launcher.poll())
        if self.pool.channel.seq == self.seq:
            for rank in self.pool.channel.answers:
                ended.setdefault(rank, ExitStatus(code=0))
        return ended

    def outcome(self, rank: int) -> Outcome | None:
        return self.pool.launcher.outcome(rank) if self.pool.channel.seq == self.seq else None

    def output(self, rank: int) -> str:
        return self.pool.launcher.output(rank, self._since[rank])

    def desync(self, ranks: Sequence[int], finished: Sequence[int], ended: bool = False,
               entered_counts: bool = True) -> list[tuple[int, InFlight]]:
        return self.pool.launcher.desync(ranks, finished, ended, entered_counts)

    def dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        return self.pool.launcher.dump_stacks(ranks)

    def stop(self) -> None:
        self.pool.broken = True
        self.pool.launcher.stop()

    def wait(self, seconds: float) -> None:
        self.pool.launcher.wait(seconds)


    def pump_output(self, final: bool = False) -> None:
        # The ranks flush their output before they answer: a line a test
        # left unended is that test's, shown with it (not with the next).
        self.pool.launcher.pump_output(final)

    def keep_logs(self, test: str) -> str:
        return self.pool.launcher.keep_logs(test)
