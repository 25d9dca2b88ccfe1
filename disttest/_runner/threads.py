"""The launcher for ranks that are threads of the test process.

Used by ``MultiThreadedTestCase`` and ``spawn_threads_and_init_comms`` with
the same join loop, outcomes and report as processes. A thread cannot be
killed: stopping one aborts its threaded world (every collective wait
raises at once) and then raises :class:`RankStopped` inside it at its next
Python instruction. A thread blocked in C code outside disttest's
collectives (a long ``time.sleep``) finishes that call first; it is a
daemon thread, so it never keeps the process alive. Rank threads are kept
between tests (:mod:`disttest._runner.thread_pool`).
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TextIO

from disttest._runner import settings, thread_pool
from disttest._runner.board import FR_SETTLE, WORLD_GROUP, InFlight, MemoryBoard
from disttest._runner.deadline import current_frames, raise_in, stop_when_safe, stoppable
from disttest._runner.launcher import stream_lines
from disttest._runner.outcome import ExitStatus, Kind, Outcome, outcome_from_exception
from disttest._runner.progress import find_desync
from disttest._runner.tracking import install_tracking, track_into, untrack_thread
from disttest.pg.threaded import CollectiveAborted, ThreadedWorld, _bind_thread

__unittest = True

__all__ = ["RankStopped", "ThreadLauncher", "format_thread_stack"]

STOP_WAIT = 2.0  # seconds for stopped threads to end
#: Under an outer limit (pytest-timeout's), the stop's wait ends this long
#: before it, for the report (a 3 s limit ended the test in pytest-timeout's
#: words, with no rank named, while the stop waited for a rank blocked in C).
STOP_REPORT_RESERVE = 0.5
RAISE_DELAY_PER_RANK = 0.002  # and per rank, before and while disttest raises into them
#: The collector's threshold for a full pass while rank threads run: never.
NO_FULL_PASS = 2**31 - 1
KEPT = 4000  # characters of each rank thread's output kept for the report
_DONE = ExitStatus(code=0)  # a rank thread's "exit": its test ended


class RankStopped(BaseException):
    """Raised inside a rank thread that disttest stops (not an Exception, so
    ``except Exception`` in test code does not swallow it)."""


#: A rank thread's stack without a frame of the test (it had not started the test's code).
NO_TEST_FRAME = "  (no frame of the test: the rank had not started it, or was between its steps in disttest's code)"


def format_thread_stack(frame: FrameType | None) -> str:
    """A thread's stack in faulthandler's layout (most recent call first),
    without the frames of ``threading`` and of disttest's own rank loop."""
    lines = []
    while frame is not None:
        code = frame.f_code
        if "__unittest" not in frame.f_globals and code.co_filename != threading.__file__:
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        frame = frame.f_back
    # (a rank thread still waiting for its first turn is in disttest's code only)
    return "Stack (most recent call first):\n" + ("\n".join(lines) or NO_TEST_FRAME)


class _Tee:
    """A stand-in for ``sys.stdout`` / ``sys.stderr`` while rank threads run.

    What a rank thread writes is kept, per rank, for the report (the last
    :data:`KEPT` characters; all of it with ``DISTTEST_KEEP_LOGS``), and
    goes on as ``DISTTEST_OUTPUT`` says, as a rank process's output does:
    ``stream``, line by line, prefixed ``[rank N]``; ``tail``, nowhere else;
    ``through`` (a stream the test put in place of its own and reads back,
    pytest's ``capsys``), as written. What other threads write goes where
    it would have gone."""

    def __init__(self, stream: TextIO, ranks: dict[int, int], kept: dict[int, list[str]],
                 output: str, keep_all: bool) -> None:
        self._stream = stream
        self._ranks = ranks  # thread ident -> rank
        self._kept = kept
        self._output = output
        self._keep_all = keep_all
        self._partial: dict[int, str] = {}

    def write(self, text: str) -> int:
        rank = self._ranks.get(threading.get_ident())
        if rank is None or not isinstance(text, str):
            return self._stream.write(text)
        chunks = self._kept[rank]
        chunks.append(text)
        if not self._keep_all and sum(map(len, chunks)) > 2 * KEPT:
            chunks[:] = ["".join(chunks)[-KEPT:]]
        if self._output == "through":
            return self._stream.write(text)
        if self._output == "stream":
            lines, self._partial[rank] = stream_lines(rank, self._partial.get(rank, "") + text)
            if lines:
                self._stream.write(lines)
        return len(text)

    def finish(self) -> None:
        """Write the ranks' unfinished lines (``stream``)."""
        for rank in sorted(self._partial):
            self._stream.write(stream_lines(rank, self._partial.pop(rank), final=True)[0])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ThreadLauncher:
    """Runs ``body(rank)`` in one daemon rank thread per rank, all in
    ``world``; with ``turns``, one at a time (:mod:`disttest.pg._baton`)."""

    def __init__(self, world_size: int, world: ThreadedWorld, body: Callable[[int], None],
                 name: str = "rank", turns: bool = True) -> None:
        self.world_size = world_size
        if not turns:
            world.baton.go_free()
        self.world = world
        self._body = body
        self._name = name
        self._outcomes: dict[int, Outcome] = {}
        self.board = MemoryBoard(world_size)
        self.threads: list[threading.Thread] = []
        self.unstoppable: list[int] = []
        self._in_body: set[int] = set()
        self._done: set[int] = set()
        self._idents: dict[int, int] = {}  # thread ident -> rank
        self._workers: list[thread_pool.RankThread] = []
        self._given_back = False
        self._ended = threading.Event()

    def start(self, deadline: float | None = None, timeout: float | None = None) -> None:
        """Start the rank threads; starting them is held to ``deadline`` (a
        ``time.monotonic()``; ``timeout`` is the limit it came from, for the message)."""
        # NB: torch.testing.assert_close imports torch.distributed.tensor on
        # first use; two rank threads doing it at once register its operators
        # twice ("Tried to register an operator ... multiple times"). With
        # turns a thread keeps its turn while it imports (disttest.pg._baton),
        # so only free-running threads need it imported first (0.5 s).
        if self.world.baton.free:
            import torch.distributed.tensor  # noqa: F401

        self._untrack = install_tracking()
        # The collector makes no full pass while the ranks run: its passes
        # over what existed before them (torch's objects, the suite's) took a
        # fifth of a thousand-rank test. NB: not by freezing those objects:
        # asking whether the process froze some itself (gc.get_freeze_count)
        # walks all that it froze, 27 ms a test with torch's.
        thresholds = gc.get_threshold()
        self._thresholds: tuple[int, int, int] | None = thresholds
        gc.set_threshold(*thresholds[:2], NO_FULL_PASS)
        self._kept: dict[int, list[str]] = {r: [] for r in range(self.world_size)}
        self._streams = (sys.stdout, sys.stderr)
        output, keep_all = settings.output_mode(), settings.keep_logs()
        sys.stdout, sys.stderr = (
            _Tee(stream, self._idents, self._kept,
                 output if settings.output_mode_applies(which, stream) else "through", keep_all)
            for which, stream in enumerate(self._streams))
        self._workers = thread_pool.take(self.world_size, deadline, timeout)
        for rank, worker in enumerate(self._workers):
            worker.thread.name = f"{self._name} {rank}"
            self.threads.append(worker.thread)
            self._idents[worker.thread.ident or 0] = rank
        # One rank thread runs at a time, each until it waits for its peers
        # (disttest.pg._baton): they start in turn.
        self.world.baton.begin([
            (worker.thread, functools.partial(
                worker.run, functools.partial(self._main, rank), functools.partial(self._finished, rank)))
            for rank, worker in enumerate(self._workers)])

    def _main(self, rank: int) -> None:
        self.world.baton.resume()
        _bind_thread(self.world)
        track_into(self.board, rank, per_thread=True)
        exc: BaseException | None = None
        self._in_body.add(rank)
        try:
            self._body(rank)
        except BaseException as e:  # noqa: BLE001 (everything is reported)
            exc = e
        finally:
            self._in_body.discard(rank)
            _bind_thread(None)
            untrack_thread()
        if isinstance(exc, (CollectiveAborted, RankStopped)):
            # Being stopped: the join reports the stack it took before the
            # stop instead, so no traceback is formatted (a thousand ranks
            # end here at once, sharing the GIL). A call released because a
            # peer was killed (an injected fault) says which call it was.
            killed = isinstance(exc, CollectiveAborted) and exc.reason != self.world.abort_reason
            outcome = Outcome(rank, Kind.STOPPED, type(exc).__qualname__, detail=str(exc) if killed else
                              f"rank {rank}/{self.world_size} was released by disttest")
            outcome.at = time.time()
        else:
            outcome = outcome_from_exception(rank, exc)
        outcome.output_tail = self.output(rank)
        outcome.exit = _DONE
        self._outcomes[rank] = outcome
        self.world.baton.leave()

    def _finished(self, rank: int) -> None:
        # The rank's thread is done with this test (it may run another now).
        self._done.add(rank)
        outcome = self._outcomes.get(rank)
        # The join loop wakes when every rank is done, or at once for a
        # failure (peers stopped, fail fast); a pass is seen at its next poll.
        if len(self._done) == self.world_size or outcome is None or outcome.kind.is_cause:
            # The joining thread wakes on this CPU (disttest.pg._baton), only
            # while it waits: what it starts elsewhere must not inherit it.
            self.world.baton.wake_joiner_here()
            self._ended.set()

    # -- Launcher --
    def poll(self) -> dict[int, ExitStatus]:
        self.world.baton.watch()
        # NB: rank threads add to the set meanwhile: iterate over a copy
        # (made in one step under the GIL), never the set itself.
        return {r: _DONE for r in self._done.copy() if r in self._outcomes}

    def outcome(self, rank: int) -> Outcome | None:
        return self._outcomes.get(rank)

    def output(self, rank: int) -> str:
        return "".join(self._kept.get(rank, ()))[-KEPT:]

    def whole_output(self, rank: int) -> str:
        return "".join(self._kept.get(rank, ()))


    def pump_output(self, final: bool = False) -> None:
        pass  # rank threads write to the test process's own streams

    def keep_logs(self, test: str) -> str:
        import tempfile

        folder = tempfile.mkdtemp(prefix=f"disttest-logs-{test}-")
        for r in range(self.world_size):
            with open(os.path.join(folder, f"rank{r}.log"), "w") as f:
                f.write(self.whole_output(r))
        return folder

    def desync(self, ranks: Sequence[int], finished: Sequence[int], ended: bool = False,
               entered_counts: bool = True) -> list[tuple[int, InFlight]]:
        found = find_desync(self.board, ranks, finished, ended, entered_counts)
        seen = {flight.rank for _, flight in found}
        rest = [r for r in ranks if r not in seen]
        return found + (self._world_desync(rest, finished, entered_counts) if rest else [])

    def _world_desync(self, ranks: Sequence[int], finished: Sequence[int],
                      entered_counts: bool) -> list[tuple[int, InFlight]]:
        """What the tracked calls miss (DDP's reducer calls the group from C++):
        a rank's collective of a world-wide group, joined and still pending
        :data:`~.board.FR_SETTLE` s after a peer's test ended without
        joining it, as the threaded world itself counts."""
        if not finished:
            return []
        rank_of = dict(self._idents)
        asked = set(ranks)
        now = time.time()
        found = []
        # The peers that never joined a collective (and when they ended),
        # once per collective, however many ranks wait in it.
        absent: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for call in self.world.pending():
            rank = rank_of.get(call.thread)
            if rank is None or rank not in asked or call.group_size != self.world_size:
                continue
            key = (call.group, call.seq)
            if key not in absent:
                absent[key] = [(peer, outcome.at) for peer in finished
                               if (outcome := self._outcomes.get(peer)) is not None and outcome.at
                               and (not entered_counts or self.world.entered(call.group, peer) < call.seq)]
            for peer, done in absent[key]:
                if peer != rank and now - max(call.since, done) >= FR_SETTLE:
                    flight = InFlight(rank, call.op, call.seq, WORLD_GROUP, range(self.world_size))
                    found.append((peer, flight))
                    break
        return found

    def dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        frames = current_frames()
        stacks = {}
        for r in ranks:
            frame = None if r in self._done else frames.get(self.threads[r].ident or -1)
            stacks[r] = format_thread_stack(frame) if frame is not None else "(the thread has ended)"
        return stacks

    def wait(self, seconds: float) -> None:
        self.world.baton.joiner_waits()
        try:
            if self._ended.wait(seconds):
                self._ended.clear()
        finally:
            self.world.baton.joiner_resumes()

    def stop(self) -> None:
        """Release and end every live rank thread, bounded by
        :data:`STOP_WAIT`; ``self.unstoppable`` lists those still running.

        It runs twice when the join loop stops ranks (then the test's own
        undo): the second time it only notes which of the threads the first
        could not stop have ended since, and waits for none of them again."""
        if self._given_back:
            self.unstoppable = [r for r in self.unstoppable if r not in self._done]
        else:
            self._stop_threads()
        self._put_back()

    def _stop_threads(self) -> None:
        self.world.abort("the test is being stopped")  # no rank moves this thread after it
        self.world.baton.joiner_resumes()
        start = time.monotonic()
        raised: set[int] = set()
        waiting: dict[int, float | None] = {}  # rank -> since when only mid-change code holds it up
        wait = STOP_WAIT + 2 * RAISE_DELAY_PER_RANK * len(self.threads)
        left = settings.outer_left()
        if left is not None:
            wait = min(wait, max(left - STOP_REPORT_RESERVE, settings.OUTER_LEFT_FLOOR))
        while time.monotonic() - start < wait:
            live = [r for r in range(len(self.threads)) if r not in self._done]
            if not live:
                break
            # First let the abort release waits in collectives; then raise
            # in whatever Python code a thread is still running.
            # NB: only into the test body: an exception raised asynchronously
            # inside CPython internals (3.11 builds an AST to format a
            # traceback) can leave the interpreter's state corrupt.
            # Nor into code that holds a lock across calls (an exception
            # between a lock's acquire and the code that releases it leaks
            # the lock: logging's handler lock, and every later log call of
            # the process hangs; the threaded world's own lock, and every
            # rank hangs): disttest's own code and logging's; nor, for a
            # second, into a context manager's __enter__/__exit__ or torch's
            # mode stack, which change what the whole process sees
            # (deadline.stoppable). Such a thread gets it at a later look.
            # (Aborted ranks end by themselves, each through c10d's exception
            # logger: a thousand of them need longer before any is raised into.
            # NB: not sooner into a rank that waited in no collective: ranks
            # that had not started run init_process_group now, and an exception
            # lands later than the look at its frame, inside a lock it took:
            # the world's, logging's, and every rank hung.)
            if time.monotonic() - start > 0.2 + RAISE_DELAY_PER_RANK * len(self.threads):
                frames, now = current_frames(), time.monotonic()
                for r in (set(live) & self._in_body) - raised:
                    ok, waiting[r] = stoppable(frames.get(self.threads[r].ident or -1), waiting.get(r), now)
                    if not ok:
                        continue
                    self._workers[r].retired = True  # never reused: it could get it later
                    raise_in(self.threads[r], RankStopped)
                    raised.add(r)
            self._ended.wait(0.01)
            self._ended.clear()
        self.unstoppable = [r for r in range(len(self.threads)) if r not in self._done]
        for r in self.unstoppable:
            self._workers[r].retired = True
            # (Spinning where it may not be raised into, it runs on into
            # later tests: stopped at its first safe moment instead.)
            stop_when_safe(self.threads[r], RankStopped, functools.partial(self._in_body.__contains__, r))
        self._given_back = True
        thread_pool.give_back([w for r, w in enumerate(self._workers) if r in self._done])

    def _put_back(self) -> None:
        """What the run changed for the process (idempotent)."""
        thresholds = getattr(self, "_thresholds", None)
        if thresholds is not None:
            self._thresholds = None
            if gc.get_threshold() == (*thresholds[:2], NO_FULL_PASS):  # (unless the test set its own)
                gc.set_threshold(*thresholds)
        untrack = getattr(self, "_untrack", None)
        if untrack is not None:
            untrack()
        streams = getattr(self, "_streams", None)
        if streams is not None:
            # Only if nobody replaced them meanwhile (a test's redirect_stdout).
            if isinstance(sys.stdout, _Tee):
                sys.stdout.finish()
                sys.stdout = streams[0]
            if isinstance(sys.stderr, _Tee):
                sys.stderr.finish()
                sys.stderr = streams[1]
