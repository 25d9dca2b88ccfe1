"""Facts, then a verdict: pure functions from what the ranks did to a result.

The join loop collects facts (what each rank reported, how it ended, what
disttest had to stop, which collective it was in); the functions here turn
them into outcomes and one immutable :class:`Verdict`, without side
effects, so they are tested on hand-made facts. The report renders a
verdict; nothing else decides one.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from disttest._runner.outcome import ExitStatus, Kind, Outcome

__unittest = True

__all__ = ["Status", "Verdict", "ended", "judge", "reclassified"]

HARD = (Kind.FAILED, Kind.ERRORED, Kind.CRASHED, Kind.TIMED_OUT)


class Status(str, enum.Enum):
    """What unittest records for the test."""

    PASSED = "passed"
    FAILED = "failed"  # every cause an assertion: a unittest failure
    ERRORED = "errored"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Verdict:
    """One test's result: its status, each rank's final outcome and, for a
    skip, the reason."""

    status: Status
    outcomes: tuple[Outcome, ...]
    reason: str = ""

    @property
    def causes(self) -> list[int]:
        """The ranks whose outcome makes the test fail or error."""
        return [o.rank for o in self.outcomes if o.kind.is_cause]


def ended(rank: int, reported: Outcome | None, status: ExitStatus, output: str = "",
          site: str = "") -> Outcome:
    """The outcome of a rank that ended with ``status``, having reported
    ``reported`` (None: nothing; ``site`` is then where it crashed, if
    known). A signal after a report is a crash (the report may be a pass,
    but the rank did not leave cleanly)."""
    if reported is None:
        return Outcome(rank, Kind.CRASHED, exit=status, stacks=site, output_tail=output)
    if status.signal is not None and reported.kind is not Kind.CRASHED:
        return dataclasses.replace(reported, exit=status, kind=Kind.CRASHED,
                                   detail=f"after reporting {reported.kind.value}")
    if reported.exit is status:  # it says so already (a rank thread's report)
        return reported
    return dataclasses.replace(reported, exit=status)


def reclassified(outcome: Outcome, kind: Kind, detail: str) -> Outcome:
    """``outcome`` judged again as ``kind`` (a desync, a consequence), saying why."""
    return dataclasses.replace(outcome, kind=kind, detail=detail)


def judge(outcomes: Sequence[Outcome], always_failure: bool = False,
          expected_exit_codes: Collection[int] = (), lenient_exits: bool = False) -> Verdict:
    """The verdict on one test's outcomes.

    A skip in any rank, with no hard failure, skips the test (the skipping
    rank left its peers waiting: their desyncs and stops are its effect);
    otherwise any cause fails the test: a failure if every cause is an
    assertion (or ``always_failure``), else an error. A rank that died
    without reporting passes when its exit code is in
    ``expected_exit_codes``, or with ``lenient_exits`` (upstream's
    ``special_return_code_checks`` / ``skip_return_code_checks``).
    """
    final = tuple(
        dataclasses.replace(o, kind=Kind.PASSED)
        if o.kind is Kind.CRASHED and o.exit is not None
        and (lenient_exits or o.exit.code in expected_exit_codes)
        else o
        for o in outcomes
    )
    skipped = [o for o in final if o.kind is Kind.SKIPPED]
    if skipped and not any(o.kind in HARD for o in final):
        return Verdict(Status.SKIPPED, final, "; ".join(sorted({o.message for o in skipped})))
    causes = [o for o in final if o.kind.is_cause]
    if not causes:
        return Verdict(Status.PASSED, final)
    if always_failure or all(o.kind is Kind.FAILED for o in causes):
        return Verdict(Status.FAILED, final)
    return Verdict(Status.ERRORED, final)
