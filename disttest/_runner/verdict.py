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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from disttest._runner.board import RECORDER, InFlight
from disttest._runner.outcome import PEER_LOST as _PEER_LOST
from disttest._runner.outcome import SUBTEST_ONLY, ExitStatus, Kind, Outcome
from disttest.pg._local import rank_runs
from disttest.support.skips import skip_for_exit_code

__unittest = True

__all__ = ["CALLS_DIFFER", "CALLS_DIFFER_AT", "CALLS_MISMATCH", "CONSEQUENCE", "DEADLOCK_DETAIL", "DESYNC_DETAIL", "DESYNC_LOST_DETAIL", "MISMATCH_DETAIL", "PEER_LOST", "WAITED_FOR", "RANK", "RANKS", "Status", "Verdict", "ended", "expected_end", "explain",
           "judge", "reclassified", "who"]

HARD = (Kind.FAILED, Kind.ERRORED, Kind.CRASHED, Kind.TIMED_OUT, Kind.DEADLOCK)
RANK = "rank {rank}/{world}"
RANKS = "ranks {ranks}/{world}"
DESYNC_DETAIL = "rank {peer}/{world} finished; {{who}} {{waits}} in {what}"
#: A desync known only from the error a rank got when its peer went away
#: (the board does not say the peer never entered the collective: gloo
#: completes an all_reduce on the rank whose tensor is the smaller).
CALLS_DIFFER = "which lost its peer: the peer never entered it, or their calls differ (a size, a dtype, the operation)"
DESYNC_LOST_DETAIL = "rank {peer}/{world} finished; {{who}} {{waits}} in {what}, " + CALLS_DIFFER
#: The end of a detail that says why a collective that every peer entered did not end.
CALLS_MISMATCH = "to the limit: their calls differ (a size, a dtype, the operation)"
#: Ranks that waited to the test's limit in one call of a group under
#: different operations (``calls``: each rank's, named as itself).
CALLS_DIFFER_AT = "{calls}: the same call of the group, waited in " + CALLS_MISMATCH
#: A rank that, at the test's deadline, waited in a collective that a peer which finished had entered.
MISMATCH_DETAIL = "rank {peer}/{world} entered {what} and finished; {{who}} {{waits}} in it " + CALLS_MISMATCH
CONSEQUENCE = "rank {rank}/{world} failed in {what} after {peers} had {how}"
#: Ranks that wait for each other in a cycle of calls that cannot match
#: (point-to-point calls, or a collective a peer never entered).
DEADLOCK_DETAIL = "{ranks} wait for each other in calls that cannot match: {calls}"
#: A rank that, at the test's deadline, waited in a collective that a live peer never entered.
WAITED_FOR = "{{who}} {{waits}} in {what} for rank {peer}/{world}, which never entered it: that rank hung"
#: What a backend says when a peer went away: the error of a rank whose
#: peer left, not of the rank itself (gloo, nccl, TCPStore, TensorPipe).
PEER_LOST = _PEER_LOST  # (outcome's: one pattern for both)


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
        # An exit with a TEST_SKIPS code is upstream's skip, by os._exit too
        # (its parent reads the exit code, not a report).
        skip = skip_for_exit_code(status.code) if status.signal is None else None
        if skip is not None:
            return Outcome(rank, Kind.SKIPPED, message=skip.message, exit=status, output_tail=output)
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


def who(ranks: Sequence[int], world: int) -> str:
    """``rank 2/4``, ``ranks 0, 1/4`` or, for many, ``ranks 0-516, 518-1023/1024``:
    how every report line names ranks."""
    if len(ranks) == 1:
        return RANK.format(rank=ranks[0], world=world)
    return RANKS.format(ranks=rank_runs(ranks), world=world)


def explain(outcomes: Mapping[int, Outcome], world: int, desyncs: Mapping[int, tuple[int, InFlight]],
            flights: Mapping[int, InFlight]) -> dict[int, Outcome]:
    """The ranks' errors judged as causes or consequences, from facts only.

    ``desyncs[rank]``: a finished peer never entered the collective the rank
    raised in (as the board counted); ``flights[rank]``: the collective it
    raised in, when known. An error is *communication* when it came out of
    torch.distributed (``Outcome.comm``, from the traceback) or out of a
    collective the board saw fail. Then, whatever the timing:

    - a communication error in a collective a finished peer never entered
      is a desync;
    - communication errors are consequences of every rank's own end (a
      failure, a crash, a timeout, a desync, any other error, a skip);
    - with none, errors that say a peer went away (:data:`PEER_LOST`) are
      consequences of the other communication errors; with none of those
      either, and a peer that finished, they are a desync;
    - what is left stays a cause.
    """
    out = dict(outcomes)
    if not any(o.kind is Kind.ERRORED for o in out.values()):
        return out  # (what follows judges errors only: the join loop asks at every new fact)
    for r, (peer, flight) in desyncs.items():
        if out[r].kind is Kind.ERRORED:
            out[r] = reclassified(out[r], Kind.DESYNC, DESYNC_DETAIL.format(peer=peer, world=world,
                                                                              what=flight.describe()))
    comm = sorted(r for r, o in out.items() if o.kind is Kind.ERRORED and (o.comm or r in flights))
    own = sorted(r for r, o in out.items() if r not in comm and (o.kind.is_cause or o.kind is Kind.SKIPPED))
    lost = [r for r in comm if PEER_LOST.search(out[r].message)]
    causes, effects = own, comm
    if not own:
        causes = [r for r in comm if r not in lost]
        effects = lost if causes else []
        finished = sorted(r for r, o in out.items() if o.kind is Kind.PASSED)
        if not causes and finished:
            for r in lost:
                out[r] = reclassified(out[r], Kind.DESYNC, DESYNC_LOST_DETAIL.format(
                    peer=finished[0], world=world, what=_what(out[r], flights.get(r))))
    if effects:
        how = "skipped" if all(out[c].kind is Kind.SKIPPED for c in causes) else "failed"
        for r in effects:
            out[r] = reclassified(out[r], Kind.STOPPED, CONSEQUENCE.format(
                rank=r, world=world, what=_what(out[r], flights.get(r)), peers=who(causes, world), how=how))
    return out


def _what(o: Outcome, flight: InFlight | None) -> str:
    """The collective a rank raised in: as the board saw it called from
    Python, else the torch.distributed function (a fact of the traceback),
    else as the flight recorder saw it."""
    if flight is not None and not (o.comm and flight.group.startswith(RECORDER)):
        return flight.describe()
    return o.comm


def expected_end(o: Outcome, expected_exit_codes: Collection[int] = (), lenient_exits: bool = False) -> bool:
    """Whether rank outcome ``o`` is a death the test expects: an exit code
    of ``expected_exit_codes``, or a signal given as its negative number
    (upstream's ``-signal.SIGABRT``, as ``Process.exitcode`` says it), or
    any death with ``lenient_exits``."""
    if o.kind is not Kind.CRASHED or o.exit is None:
        return False
    return lenient_exits or o.exit.code in expected_exit_codes or (
        o.exit.signal is not None and -o.exit.signal in expected_exit_codes)


def judge(outcomes: Sequence[Outcome], always_failure: bool = False,
          expected_exit_codes: Collection[int] = (), lenient_exits: bool = False) -> Verdict:
    """The verdict on one test's outcomes.

    A skip in any rank, with no hard failure, skips the test (the skipping
    rank left its peers waiting: their desyncs and stops are its effect);
    otherwise any cause fails the test: a failure if every cause is an
    assertion (or ``always_failure``), else an error. A rank that died
    without reporting passes when its exit code is in
    ``expected_exit_codes`` (a signal as its negative number), or with ``lenient_exits`` (upstream's
    ``special_return_code_checks`` / ``skip_return_code_checks``).
    """
    final = tuple(
        dataclasses.replace(o, kind=Kind.PASSED) if expected_end(o, expected_exit_codes, lenient_exits) else o
        for o in outcomes
    )
    skipped = [o for o in final if o.kind is Kind.SKIPPED]
    # A rank whose skipped subTests alone made its skip ran the rest of its
    # test: it left no peer waiting, and a peer's desync is its own cause.
    left = any(o.detail != SUBTEST_ONLY for o in skipped) or not any(o.kind.is_cause for o in final)
    if skipped and left and not any(o.kind in HARD for o in final):
        return Verdict(Status.SKIPPED, final, "; ".join(sorted({o.message for o in skipped})))
    causes = [o for o in final if o.kind.is_cause]
    if not causes:
        return Verdict(Status.PASSED, final)
    if always_failure or all(o.kind is Kind.FAILED for o in causes):
        return Verdict(Status.FAILED, final)
    return Verdict(Status.ERRORED, final)
