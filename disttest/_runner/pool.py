"""A pool of rank processes kept for a whole test class.

The workers are started by the ordinary process launchers, connect back to
the parent over the rank channel (:mod:`.channel`: an abstract Unix socket,
whatever TMPDIR's length), make the class's
process group, then run the tests the parent sends (see
``rank._serve_pool``). Each test is joined by the one join loop through a
:class:`TestRun`, the per-test view of the pool that the
:class:`~.launcher.Launcher` protocol asks for: a rank has "ended" the test
when it answered (or died). Answers carry the dispatch number, so no result
of one test can be taken for another. A pool that lost or had to stop a
rank is broken: the caller closes it and builds a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from disttest._runner import janitor
from disttest._runner import rank as rank_mod
from disttest._runner.channel import Endpoint
from disttest._runner.launcher import ProcessLauncher
from disttest._runner.outcome import ExitStatus, Kind, Outcome
from disttest._runner.progress import InFlight

__unittest = True

__all__ = ["POOL_START_TIMEOUT", "Pool", "PoolUnavailable", "TestRun"]

POOL_START_TIMEOUT = 120.0  # default seconds for every worker to connect and make its group
EXIT_WAIT = 2.0  # seconds for workers to leave after "exit"
INIT_GRACE = 0.5  # seconds the others get once a worker could not make its group
BROKEN_KINDS = (Kind.CRASHED, Kind.TIMED_OUT, Kind.DESYNC, Kind.STOPPED)


class PoolUnavailable(RuntimeError):
    """The pool's workers did not all start (the message says which, why)."""


class Pool:
    """``world_size`` worker processes serving one test class."""

    def __init__(self, cls: type, world_size: int, launcher_cls: type[ProcessLauncher],
                 spec_fields: dict[str, Any], start_timeout: float = POOL_START_TIMEOUT) -> None:
        self.world_size = world_size
        self.start_timeout = start_timeout
        self.run_dir = tempfile.mkdtemp(prefix="disttest-pool-")
        self._janitor = janitor.register(self._close_now)
        self.file_name = os.path.join(self.run_dir, "rendezvous")
        self.broken = False
        self._seq = 0
        self.conns: dict[int, Connection] = {}
        self._answers: dict[int, dict[int, Outcome]] = {}
        self.init_outcomes: dict[int, Outcome] = {}
        self.endpoint = Endpoint(world_size)
        try:
            spec = rank_mod.RankSpec(
                world_size=world_size, run_dir=self.run_dir, file_name=self.file_name,
                entry="pool", address=self.endpoint.address, token=self.endpoint.token,
                test_name="", **spec_fields,
            )
            self.launcher = launcher_cls(spec)
            self.launcher.start(cls)
            self._connect()
        except BaseException:
            self.close()
            raise
        finally:
            self.endpoint.close()

    def _connect(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        pending: list[Connection] = []
        while len(self.conns) < self.world_size:
            dead = self.launcher.poll()
            if dead:
                raise PoolUnavailable(
                    "; ".join(f"rank {r}/{self.world_size} {s.describe()} while starting" for r, s in dead.items())
                    + _tail(self.launcher, dead))
            if time.monotonic() > deadline:
                raise PoolUnavailable(f"the pool's ranks did not start within {self.start_timeout}s")
            wait([self.endpoint.fileno(), *pending], timeout=0.05)
            conn = self.endpoint.accept()
            if conn is not None:
                pending.append(conn)
            for conn in _ready(pending, 0) if pending else []:
                pending.remove(conn)
                try:
                    kind, rank, token = conn.recv()
                except (EOFError, OSError, ValueError, TypeError):
                    conn.close()
                    continue
                if kind != "hello" or token != self.endpoint.token or rank not in range(self.world_size):
                    conn.close()  # not one of our ranks
                    continue
                self.conns[rank] = conn
        waiting = set(self.conns)
        while waiting:
            if any(o.kind.is_cause for o in self.init_outcomes.values()):
                # A peer could not make the group: the others wait in its
                # rendezvous for nothing.
                deadline = min(deadline, time.monotonic() + INIT_GRACE)
            if time.monotonic() > deadline:
                if self.init_outcomes:
                    stacks = self.launcher.dump_stacks(sorted(waiting))
                    for r in waiting:
                        self.init_outcomes[r] = Outcome(
                            r, Kind.STOPPED, stacks=stacks.get(r, ""),
                            detail=f"rank {r}/{self.world_size} was stopped while making the group")
                    self.launcher.stop()
                    return
                raise PoolUnavailable(f"the pool's ranks did not make their group within {self.start_timeout}s")
            dead = self.launcher.poll()
            if dead:
                raise PoolUnavailable(
                    "; ".join(f"rank {r}/{self.world_size} {s.describe()} while making its group"
                              for r, s in dead.items()) + _tail(self.launcher, dead))
            for conn in _ready([self.conns[r] for r in waiting], 0.05):
                try:
                    _, rank, init = conn.recv()
                except (EOFError, OSError):
                    self._lost(next(r for r in waiting if self.conns[r] is conn))
                waiting.discard(rank)
                if init is not None:
                    self.init_outcomes[rank] = init

    def _lost(self, rank: int) -> None:
        """Rank ``rank`` closed its channel while making its group: raise
        with how it ended (it is reaped within a moment)."""
        deadline = time.monotonic() + EXIT_WAIT
        while rank not in self.launcher.poll() and time.monotonic() < deadline:
            self.launcher.wait(0.01)
        status = self.launcher.poll().get(rank)
        how = status.describe() if status is not None else "closed its channel"
        raise PoolUnavailable(f"rank {rank}/{self.world_size} {how} while making its group"
                              + (_tail(self.launcher, {rank: status}) if status is not None else ""))

    def dispatch(self, test_name: str) -> TestRun:
        """Send ``test_name`` to every worker; return the test's view."""
        self._seq += 1
        self._answers = {self._seq: {}}
        for conn in self.conns.values():
            try:
                conn.send(("run", self._seq, test_name))
            except OSError:
                pass  # the worker is gone: the join loop sees its exit
        return TestRun(self, self._seq)

    def pump(self, timeout: float) -> None:
        """Take every answer that has arrived, waiting up to ``timeout``."""
        live = [c for c in self.conns.values() if not c.closed]
        if not live:
            time.sleep(timeout)
            return
        for conn in _ready(live, timeout):
            try:
                _, seq, outcome = conn.recv()
            except (EOFError, OSError):
                conn.close()
                continue
            if seq in self._answers:  # answers to older dispatches are dropped
                self._answers[seq][outcome.rank] = outcome

    def answers(self, seq: int) -> dict[int, Outcome]:
        return self._answers.get(seq, {})

    def note(self, outcomes: Sequence[Outcome]) -> None:
        """After a test: a pool that lost or had to stop a rank is broken."""
        if any(o.kind in BROKEN_KINDS for o in outcomes) or self.launcher.poll():
            self.broken = True

    def close(self) -> None:
        """Ask the workers to leave; stop those that do not; remove the run
        directory. Bounded."""
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.send(("exit",))
        launcher = getattr(self, "launcher", None)
        if launcher is not None:
            deadline = time.monotonic() + (0 if self.broken else EXIT_WAIT)
            while len(launcher.poll()) < len(launcher.pids) and time.monotonic() < deadline:
                launcher.wait(0.01)
            launcher.close()
        for conn in self.conns.values():
            conn.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        janitor.unregister(self._janitor)

    def _close_now(self) -> None:
        """The test process is being interrupted: kill, remove, wait for nothing."""
        launcher = getattr(self, "launcher", None)
        if launcher is not None:
            launcher.kill_now()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _ready(conns: list[Connection], timeout: float) -> list[Connection]:
    return [c for c in wait(conns, timeout=timeout) if isinstance(c, Connection)]


def _tail(launcher: ProcessLauncher, dead: dict[int, ExitStatus]) -> str:
    rank = next(iter(dead))
    out = launcher.output(rank).strip()
    return f"; its output ends:\n{out[-2000:]}" if out else ""


class TestRun:
    """One test's view of the pool, for the join loop."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, pool: Pool, seq: int) -> None:
        self.pool = pool
        self.seq = seq
        self.world_size = pool.world_size

    def poll(self) -> dict[int, ExitStatus]:
        self.pool.pump(0)
        ended = dict(self.pool.launcher.poll())
        for rank in self.pool.answers(self.seq):
            ended.setdefault(rank, ExitStatus(code=0))
        return ended

    def outcome(self, rank: int) -> Outcome | None:
        return self.pool.answers(self.seq).get(rank)

    def output(self, rank: int) -> str:
        return self.pool.launcher.output(rank)

    def desync(self, ranks: Sequence[int], finished: Sequence[int], ended: bool = False,
               entered_counts: bool = True) -> list[tuple[int, InFlight]]:
        return self.pool.launcher.desync(ranks, finished, ended, entered_counts)

    def dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        return self.pool.launcher.dump_stacks(ranks)

    def stop(self) -> None:
        self.pool.broken = True
        self.pool.launcher.stop()

    def wait(self, seconds: float) -> None:
        self.pool.pump(seconds)


    def pump_output(self, final: bool = False) -> None:
        # Lines still unended belong to the pool's next test: never final here.
        self.pool.launcher.pump_output()

    def keep_logs(self, test: str) -> str:
        return self.pool.launcher.keep_logs(test)
