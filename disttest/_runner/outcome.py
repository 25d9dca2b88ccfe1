"""The per-rank outcome: what one rank did in one test, as picklable data.

Shared by every runner and by the code inside ranks; depends only on the
standard library and :mod:`disttest.skips` (for the exit-code mapping).
"""

from __future__ import annotations

import enum
import signal
import time
import traceback
import unittest
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from disttest.skips import skip_for_exit_code

__unittest = True

__all__ = ["ExitStatus", "Kind", "Outcome", "outcome_from_exception"]


class Kind(str, enum.Enum):
    """How a rank's part in a test ended."""

    PASSED = "passed"
    FAILED = "failed"  # an AssertionError
    ERRORED = "errored"  # any other exception, or sys.exit(non-skip code)
    SKIPPED = "skipped"
    CRASHED = "crashed"  # died (exit code or signal) without reporting
    TIMED_OUT = "timed out"
    DESYNC = "desync"  # waited in a collective a finished peer never joined
    STOPPED = "stopped"  # stopped by disttest because a peer failed

    @property
    def is_cause(self) -> bool:
        """True for the kinds that make a test fail or error by themselves."""
        return self in (Kind.FAILED, Kind.ERRORED, Kind.CRASHED, Kind.TIMED_OUT, Kind.DESYNC)


@dataclass(frozen=True)
class ExitStatus:
    """How a rank process ended: an exit code, or the signal that killed it."""

    code: int | None = None
    signal: int | None = None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"was killed by {name}"
        return f"exited with code {self.code}"

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        import os

        if os.WIFSIGNALED(status):
            return cls(signal=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status))

    @classmethod
    def from_exitcode(cls, exitcode: int) -> ExitStatus:
        """From multiprocessing's convention (negative: killed by a signal)."""
        return cls(signal=-exitcode) if exitcode < 0 else cls(code=exitcode)


@dataclass
class Outcome:
    """One rank's result for one test."""

    rank: int
    kind: Kind
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    exit: ExitStatus | None = None
    stacks: str = ""
    output_tail: str = ""
    detail: str = ""  # desync or timeout explanation
    #: The rank's traceback (user frames only) as tblib data, so the parent
    #: can attach it to the report and pytest shows the failing line.
    tb_data: dict[str, Any] | None = None
    #: When the rank's test ended (time.time(): one clock for every rank of a
    #: host); 0 when unknown (a rank that died without reporting).
    at: float = 0.0
    #: What disttest injected into this rank in the test ("rank 1 killed at
    #: all_reduce #3"; see disttest.faults), set by the parent's judge.
    faults_fired: list[str] = field(default_factory=list)

    @property
    def skip_reason(self) -> str:
        return self.message if self.kind is Kind.SKIPPED else ""


def _frames(exc: BaseException) -> list[tuple[FrameType, int]]:
    """The traceback's frames without disttest's own (modules that set
    ``__unittest``), as unittest drops them; for a failed assertion, also
    nothing after the user's last frame (the assertion's internals)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    ours = ["__unittest" in f.f_globals for f, _ in frames]
    start = next((i for i, mine in enumerate(ours) if not mine), len(frames))
    end = len(frames)
    if isinstance(exc, AssertionError):
        end = next((i for i in range(start, len(frames)) if ours[i]), end)
    kept = [fr for fr, mine in zip(frames[start:end], ours[start:end], strict=True) if not mine]
    return kept or frames


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _tb_data(exc: BaseException) -> dict[str, Any] | None:
    """The kept frames as tblib data (a chain of the user's frames only)."""
    kept = {id(f) for f, _ in _frames(exc)}
    try:
        from tblib import Traceback

        node: dict[str, Any] | None = Traceback(exc.__traceback__).to_dict()
    except Exception:  # noqa: BLE001 (the text report still has it all)
        return None
    tb = exc.__traceback__
    chain = []
    while node is not None and tb is not None:
        if id(tb.tb_frame) in kept:
            chain.append(node)
        node, tb = node.get("tb_next"), tb.tb_next
    for a, b in zip(chain, chain[1:], strict=False):
        a["tb_next"] = b
    if not chain:
        return None
    chain[-1]["tb_next"] = None
    return chain[0]


def _format(exc: BaseException) -> str:
    chained = ""
    if exc.__cause__ is not None:
        chained = _format(exc.__cause__) + _CAUSE
    elif exc.__context__ is not None and not exc.__suppress_context__:
        chained = _format(exc.__context__) + _CONTEXT
    # FrameSummary without column positions: no caret anchors, so no AST is
    # built here (3.11 parses source for them; ranks may be threads).
    summary = traceback.StackSummary.from_list([
        traceback.FrameSummary(f.f_code.co_filename, lineno, f.f_code.co_name)
        for f, lineno in _frames(exc)
    ])
    return (chained + "Traceback (most recent call last):\n" + "".join(summary.format())
            + "".join(traceback.format_exception_only(type(exc), exc)))


def outcome_from_exception(rank: int, exc: BaseException | None) -> Outcome:
    """Classify how a rank's test body ended (``exc`` None: it returned).

    AssertionError: failed; SkipTest or ``sys.exit`` with a TEST_SKIPS code:
    skipped; ``sys.exit(0)`` or ``sys.exit(None)``: passed (upstream's
    ``_run`` overrides exit this way); other exceptions and exit codes: errored.
    """
    outcome = _classify(rank, exc)
    outcome.at = time.time()
    return outcome


def _classify(rank: int, exc: BaseException | None) -> Outcome:
    if exc is None:
        return Outcome(rank, Kind.PASSED)
    name = type(exc).__qualname__
    if isinstance(exc, unittest.SkipTest):
        return Outcome(rank, Kind.SKIPPED, name, str(exc))
    if isinstance(exc, SystemExit):
        skip = skip_for_exit_code(exc.code)
        if skip is not None:
            return Outcome(rank, Kind.SKIPPED, name, skip.message)
        if exc.code in (0, None):
            return Outcome(rank, Kind.PASSED)
        return Outcome(
            rank, Kind.ERRORED, name, f"sys.exit({exc.code!r}) in the test", _format(exc)
        )
    kind = Kind.FAILED if isinstance(exc, AssertionError) else Kind.ERRORED
    return Outcome(rank, kind, name, str(exc), _format(exc), tb_data=_tb_data(exc))
