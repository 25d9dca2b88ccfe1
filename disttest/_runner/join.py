"""The one join loop, shared by every runner.

Waits for every rank's outcome under one deadline. It stops early, within a
poll interval, when a rank fails, errors or dies (the live ranks' stacks are
taken first), and when a live rank waits in a collective that a finished
peer never entered (a desync). On the deadline, it takes the stacks of the
ranks still running, then stops them. It never waits without a bound.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from disttest._runner.board import RECORDER, InFlight
from disttest._runner.crashsite import split_fatal_dump
from disttest._runner.launcher import Launcher
from disttest._runner.outcome import ExitStatus, Kind, Outcome
from disttest._runner.verdict import (
    CALLS_DIFFER_AT,
    DEADLOCK_DETAIL,
    DESYNC_DETAIL,
    MISMATCH_DETAIL,
    WAITED_FOR,
    ended,
    explain,
    who,
)

__unittest = True

__all__ = ["NEVER_ENTERED", "NOT_STARTED", "POLL_INTERVAL", "WAITED_TO_START", "StartUp", "join"]

#: A live rank that never entered the collective in which a peer's wait ran
#: out (the group's own timeout, before the test's): it is the cause, and
#: the peer's timeout its consequence. It was "stopped by disttest after the
#: failure above", and the waiting rank blamed.
NEVER_ENTERED = ("{{who}} never entered {what}, in which rank {rank}/{world} waited for it until the call's "
                 "own timeout ran out: {{who}} hung elsewhere")
#: What an error says when a wait ran out (gloo's and nccl's words).
_WAIT_RAN_OUT = re.compile(r"timed? ?out|timeout", re.IGNORECASE)
#: At most this many live ranks are asked one by one whether they entered
#: the collective a wait ran out in (each may be a hung one).
MAX_ASKED_ALONE = 64
POLL_INTERVAL = 0.01
#: The join loop waits this many times as long as its last desync check
#: took before the next one.
DESYNC_SHARE = 9
#: A desync or deadlock is acted on once the same calls are found again at
#: least this many seconds after they were first found: a rank seen waiting
#: in a call may be about to raise from it (a call torch refuses, after a
#: first-use warning), which is its own error, not a desync.
CONFIRM = 0.1
#: After the first failure, how long the other ranks get to report their own
#: (ranks often fail together, a few ms apart) before they are stopped; not
#: once every live rank waits in a collective that an ended rank never
#: entered (none of them can do anything more of its own).
FAIL_GRACE = 0.5
#: A rank that had not started its test when its start-up's limit ran out.
NOT_STARTED = ("{who} had not started {test!r} {limit}s after it was launched (disttest: its interpreter's "
               "start-up, which the test's own limit does not count)")
#: A rank that had started, stopped because a peer never did.
WAITED_TO_START = "{who} stopped by disttest: {peers} had not started the test {limit}s after launch"


@dataclass
class StartUp:
    """The ranks' start-up (a spawned interpreter's import of torch and of
    the test's module), which the test's limit does not count: the limit
    counts from the moment the last rank has started its test.

    ``started()``: the ranks that have started their test; ``limit``: the
    seconds the start-up may take; ``cap``: the seconds the whole join may
    take, start-up included (an outer limit's share), or None. ``given``,
    set by the join: the seconds the test had once every rank had started
    (less than its limit where the cap cut it short)."""

    started: Callable[[], Collection[int]]
    limit: float
    cap: float | None = None
    given: float | None = None


def _ended(launcher: Launcher, rank: int, status: ExitStatus) -> Outcome:
    reported = launcher.outcome(rank)
    if reported is None:
        site, tail = split_fatal_dump(launcher.output(rank))
        return ended(rank, None, status, tail, site)
    return ended(rank, reported, status)


def _live(world: int, outcomes: dict[int, Outcome]) -> list[int]:
    """The ranks that have not ended."""
    return [r for r in range(world) if r not in outcomes]


def _all_stuck(launcher: Launcher, world: int, outcomes: dict[int, Outcome]) -> bool:
    """Whether every live rank waits in a collective that a rank which has
    ended (passed or not) never entered: none can finish or fail on its own."""
    live = _live(world, outcomes)
    if not live:
        return False
    stuck = {flight.rank for _, flight in launcher.desync(live, list(outcomes))}
    return stuck.issuperset(live)


def _passed(outcome: Outcome | None) -> bool:
    return outcome is not None and outcome.kind in (Kind.PASSED, Kind.SKIPPED)


def _desync_detail(found: tuple[int, InFlight], world: int) -> str:
    # "{who}" and "{waits}" are filled in by the report, so that ranks waiting in the same
    # collective for the same peer are reported together.
    peer, flight = found
    if flight.against:  # the same text for every rank of the cycle, so that the report shows it once
        alike: dict[str, list[int]] = {}  # (ranks in one collective are named together)
        for r, what in flight.cycle:
            alike.setdefault(what, []).append(r)
        return DEADLOCK_DETAIL.format(ranks=who([r for r, _ in flight.cycle], world), calls=", ".join(
            f"{who(ranks, world)} in {what}" for what, ranks in alike.items()))
    return DESYNC_DETAIL.format(peer=peer, world=world, what=flight.describe())


def _timed_out(launcher: Launcher, live: list[int], world: int,
               finished: list[int]) -> tuple[dict[int, Kind], dict[int, str]]:
    """The live ranks at the deadline: a rank that waits in a collective for
    a peer that never entered it, and waits in none itself (it hung in its
    own code), was stopped by that peer's hang; one that waits in a
    collective that a peer which has ``finished`` entered and left had a
    call that did not match the peer's (a desync: the peer, still alive in a
    pool, keeps it waiting); the rest timed out."""
    kinds = dict.fromkeys(live, Kind.TIMED_OUT)
    details: dict[int, str] = {}
    waits = launcher.desync(live, live)
    waiting = {flight.rank for _, flight in waits}
    for peer, flight in waits:
        if peer not in waiting:  # (peers that wait for each other: every one timed out)
            kinds[flight.rank] = Kind.STOPPED
            details[flight.rank] = WAITED_FOR.format(what=flight.describe(), peer=peer, world=world)
    rest = [r for r in live if r not in waiting and r not in finished]
    if finished and rest:
        # (a finished peer that never entered it: a desync the loop reports
        # at once; one just before the deadline is named as such)
        never = {flight.rank: (peer, flight) for peer, flight in launcher.desync(rest, finished)}
        for peer, flight in launcher.desync(rest, finished, entered_counts=False):
            if flight.group.startswith(("send>", "recv<", RECORDER)):  # (the recorder's: entry unknown)
                continue
            kinds[flight.rank] = Kind.DESYNC
            details[flight.rank] = (_desync_detail(never[flight.rank], world) if flight.rank in never
                                    else MISMATCH_DETAIL.format(peer=peer, world=world, what=flight.describe()))
    _differing_calls(launcher, [r for r in live if kinds[r] is Kind.TIMED_OUT], world, kinds, details)
    return kinds, details


def _differing_calls(launcher: Launcher, ranks: list[int], world: int,
                     kinds: dict[int, Kind], details: dict[int, str]) -> None:
    """Of ``ranks`` (live at the deadline, waiting), those waiting in the
    same call of a group (its number) under different operations (one
    ``all_reduce``, the others ``broadcast``): a desync of calls that
    differ (:data:`CALLS_DIFFER_AT`), named with every rank's call; it was
    a bare timeout unless the test's limit outlasted the deadlock check."""
    if len(ranks) < 2:
        return
    by_call: dict[tuple[str, int], dict[str, list[InFlight]]] = {}
    for _, flight in launcher.desync(ranks, ranks, entered_counts=False):
        if flight.group.startswith(("send>", "recv<", RECORDER)):
            continue
        ops = by_call.setdefault((flight.group, flight.seq), {})
        if all(f.rank != flight.rank for fs in ops.values() for f in fs):
            ops.setdefault(flight.op, []).append(flight)
    for ops in by_call.values():
        if len(ops) < 2:
            continue
        calls = ", ".join(f"{who(sorted(f.rank for f in fs), world)} in {fs[0].describe()}" for fs in ops.values())
        for fs in ops.values():
            for f in fs:
                kinds[f.rank] = Kind.DESYNC
                details[f.rank] = CALLS_DIFFER_AT.format(calls=calls)


def _judged(launcher: Launcher, outcomes: dict[int, Outcome], world: int) -> dict[int, Outcome]:
    """The outcomes with their errors judged as causes or consequences
    (:func:`~.verdict.explain`, from the facts the board holds)."""
    finished = [r for r, o in outcomes.items() if _passed(o)]
    desyncs: dict[int, tuple[int, InFlight]] = {}
    flights: dict[int, InFlight] = {}
    # All errored ranks in one question each (a thousand thread ranks that
    # were released asked a thousand questions of a thousand peers a poll).
    errored = [r for r, o in outcomes.items() if o.kind is Kind.ERRORED]
    if errored:
        for found in launcher.desync(errored, finished, ended=True):
            desyncs.setdefault(found[1].rank, found)
        # Every peer but the rank itself (the launchers skip a rank as its own peer).
        for found in launcher.desync(errored, range(world), ended=True, entered_counts=False):
            flights.setdefault(found[1].rank, found[1])
    return explain(outcomes, world, desyncs, flights)


def _not_started(live: list[int], started: set[int], world: int, test: str,
                 limit: float) -> tuple[dict[int, Kind], dict[int, str]]:
    """The live ranks when the start-up's limit ran out: those that had not
    started timed out in their start-up; those that had were stopped."""
    late = [r for r in live if r not in started]
    kinds = {r: Kind.TIMED_OUT if r in late else Kind.STOPPED for r in live}
    details = {r: WAITED_TO_START.format(who="{who}", peers=who(late, world), limit=limit)
               for r in live if r not in late}
    details.update(dict.fromkeys(late, NOT_STARTED.format(who="{who}", test=test, limit=limit)))
    return kinds, details


def _alongside(launcher: Launcher, found: list[tuple[int, InFlight]], live: list[int],
               finished: list[int]) -> list[tuple[int, InFlight]]:
    """Live ranks waiting, now, in a collective of a confirmed desync
    ``found`` for the same peer, not yet confirmed themselves (they entered
    it a moment later): named in the desync with the others, not "stopped
    by disttest"."""
    named = {f.rank for _, f in found}
    calls = {(peer, f.group, f.seq) for peer, f in found if not f.against}
    reported = [r for r in live if _passed(launcher.outcome(r))]
    waiting = [r for r in live if r not in named and r not in reported]
    if not calls or not waiting:
        return []
    return [(peer, f) for peer, f in launcher.desync(waiting, [*finished, *reported])
            if not f.against and (peer, f.group, f.seq) in calls]


def _hung_peers(launcher: Launcher, outcomes: dict[int, Outcome], live: list[int],
                world: int) -> tuple[dict[int, Kind], dict[int, str]]:
    """Of the ``live`` ranks, those that never entered the collective in
    which a rank's wait ran out (:data:`NEVER_ENTERED`): timed out, each a
    cause. Not where another rank ended with a cause of its own (it, not a
    live rank, may be whom the wait was for)."""
    ran_out = [r for r, o in outcomes.items()
               if ((o.kind is Kind.ERRORED and o.comm) or o.wrapped) and _WAIT_RAN_OUT.search(o.message)]
    own = [r for r, o in outcomes.items()
           if r not in ran_out and o.kind.is_cause and not (o.kind is Kind.ERRORED and o.comm)]
    kinds: dict[int, Kind] = {}
    details: dict[int, str] = {}
    if not ran_out or not live or own:
        return kinds, details
    # One question a peer: the board names one absent peer a waiting rank
    # (a few live ranks at a failure; past that, one question for all).
    asked = [[p] for p in live] if len(live) <= MAX_ASKED_ALONE else [live]
    for peers in asked:
        for peer, flight in launcher.desync(ran_out, peers, ended=True):
            if peer in live and peer not in kinds:
                kinds[peer] = Kind.TIMED_OUT
                details[peer] = NEVER_ENTERED.format(what=flight.describe(), rank=flight.rank, world=world)
    return kinds, details


def _stop(launcher: Launcher, live: list[int], outcomes: dict[int, Outcome],
          kind_of: dict[int, Kind], details: dict[int, str], dump: list[int] | None = None) -> None:
    """Stop the live ranks; a rank that had reported a pass (and lingered)
    keeps it, the others are what ``kind_of`` says (else STOPPED). The
    stacks of ``dump`` (default: every live rank) are taken first."""
    # NB: now, not after the stacks: a rank that passes while they are taken
    # (a second or two) was still running at the limit, and it is no pass;
    # one whose pass is waiting to be read passed in time (the poll reads it).
    launcher.poll()
    had_passed = {r: o for r in live if (o := launcher.outcome(r)) is not None and _passed(o)}
    stacks = launcher.dump_stacks([r for r in (live if dump is None else dump) if r not in had_passed])
    launcher.stop()
    for r in live:
        # It had passed (it was lingering after reporting): it keeps its report.
        # Any other report made while being stopped is a consequence of the stop.
        if r in had_passed:
            outcomes[r] = had_passed[r]
            continue
        outcomes[r] = Outcome(r, kind_of.get(r, Kind.STOPPED), stacks=stacks.get(r, ""),
                              detail=details.get(r, ""), output_tail=launcher.output(r))


def _confirmed(found: list[tuple[int, InFlight]], suspects: dict[tuple[int, str, int, str], float],
               ) -> tuple[list[tuple[int, InFlight]], dict[tuple[int, str, int, str], float]]:
    """Of the desyncs ``found`` now, those found since at least
    :data:`CONFIRM` ago; and the suspects kept for the next check (each
    found now, since when it was first found)."""
    now = time.monotonic()
    kept = {}
    for _, flight in found:
        key = (flight.rank, flight.op, flight.seq, flight.group)
        kept[key] = suspects.get(key, now)
    return [f for f in found if now - kept[(f[1].rank, f[1].op, f[1].seq, f[1].group)] >= CONFIRM], kept


def join(launcher: Launcher, timeout: float, poll_interval: float = POLL_INTERVAL,
         expected_end: Callable[[int], bool] | None = None, start_up: StartUp | None = None,
         test: str = "", expected_exit: Callable[[Outcome], bool] | None = None) -> list[Outcome]:
    """Wait for all ranks of ``launcher``; return one outcome per rank.

    ``expected_end(rank)``: whether a rank's end was an injected death
    (disttest.faults); ``expected_exit(outcome)``: whether it was an exit
    the test expects (upstream's ``special_return_code_checks``): neither
    makes the loop stop the others, whose own verdicts still count.
    ``start_up``: the ranks' start-up, not counted in ``timeout``; ``test``
    names the test in what a start-up that ran out says."""
    world = launcher.world_size
    joined = time.monotonic()
    cap = joined + start_up.cap if start_up is not None and start_up.cap is not None else float("inf")
    # Until every rank has started, the start-up's limit; from then, the test's.
    starting = start_up is not None
    deadline = min(joined + (start_up.limit if start_up is not None else timeout), cap)
    grace_end: float | None = None
    outcomes: dict[int, Outcome] = {}  # the facts: as each rank ended
    next_check = 0.0  # when to look for a desync next
    judged: dict[int, Outcome] = {}
    judged_facts = -1  # how many outcomes ``judged`` was made from; -1: judge again
    errored = False  # a rank errored: its judgement also reads the board, which changes
    cause = False  # the judgement names a cause (a failure that stops the others)
    suspects: dict[tuple[int, str, int, str], float] = {}  # desyncs found, not yet confirmed: since when
    while True:
        for r, status in launcher.poll().items():
            if r not in outcomes:
                outcomes[r] = _ended(launcher, r, status)
                errored = errored or outcomes[r].kind is Kind.ERRORED
        # Judged again from all the facts so far, never from an earlier
        # judgement: which rank was seen to end first decides nothing. NB:
        # only when the facts may have changed: the judgement of ranks that
        # did not error reads nothing but their outcomes, and each poll shares
        # the GIL with a thousand rank threads.
        if errored or judged_facts != len(outcomes):
            judged = _judged(launcher, outcomes, world)
            judged_facts = len(outcomes)
            cause = any(o.kind.is_cause and not (expected_end and expected_end(o.rank))
                        and not (expected_exit and expected_exit(o)) for o in judged.values())
        if len(outcomes) == world:
            break
        if grace_end is None and cause:
            grace_end = min(deadline, time.monotonic() + FAIL_GRACE)
        if grace_end is not None and time.monotonic() >= grace_end:
            live = _live(world, outcomes)
            _stop(launcher, live, outcomes, *_hung_peers(launcher, outcomes, live, world))
            break
        found = []
        stuck = False
        if time.monotonic() >= next_check:
            # A rank that reported a pass but has not yet exited (it lingers) has
            # finished too: a peer waiting in a collective it never entered is a
            # desync now, not once the rank's exit has broken the collective.
            began = time.monotonic()
            live = _live(world, outcomes)
            reported = [r for r in live if _passed(launcher.outcome(r))]
            waiting = [r for r in live if r not in reported]
            finished = [r for r, o in judged.items() if _passed(o)]
            found = launcher.desync(waiting, [*finished, *reported]) if waiting else []
            # A desync or deadlock whose call raises by itself before the test's
            # limit (its group's timeout, which the test may expect) is left to raise.
            wall_deadline = time.time() + deadline - time.monotonic()
            found = [f for f in found if not (f[1].ends is not None and f[1].ends < wall_deadline)]
            found, suspects = _confirmed(found, suspects)
            # NB: after the desync check, which names a peer that passed (a
            # cause of its own), and as seldom: each asks every live rank.
            stuck = not found and not suspects and grace_end is not None and _all_stuck(launcher, world, outcomes)
            # The check asks every live rank and reads every waiting rank's
            # record: with a thousand thread ranks (which share the GIL with
            # it) it may take at most a tenth of the time.
            next_check = time.monotonic() + DESYNC_SHARE * (time.monotonic() - began)
            if suspects:
                next_check = min(next_check, min(suspects.values()) + CONFIRM)
        if found:
            found += _alongside(launcher, found, _live(world, outcomes), [r for r, o in judged.items() if _passed(o)])
            kinds = {f[1].rank: Kind.DEADLOCK if f[1].against else Kind.DESYNC for f in found}
            _stop(launcher, _live(world, outcomes), outcomes, kinds,
                  {f[1].rank: _desync_detail(f, world) for f in found})
            break
        if stuck:
            _stop(launcher, _live(world, outcomes), outcomes, {}, {})
            break
        if starting:
            assert start_up is not None
            started = set(start_up.started())
            if started.union(outcomes).issuperset(range(world)):
                starting = False
                now = time.monotonic()
                deadline = min(now + timeout, cap)
                start_up.given = timeout if deadline - now >= timeout else max(int((deadline - now) * 10) / 10, 0.1)
            elif grace_end is None and time.monotonic() > deadline:
                live = _live(world, outcomes)
                _stop(launcher, live, outcomes,
                      *_not_started(live, started, world, test, round(time.monotonic() - joined, 1)),
                      dump=[r for r in live if r in started])
                break
        if grace_end is None and not starting and time.monotonic() > deadline:
            live = _live(world, outcomes)
            finished = [r for r in range(world) if _passed(outcomes.get(r) or launcher.outcome(r))]
            _stop(launcher, live, outcomes, *_timed_out(launcher, live, world, finished))
            break
        launcher.pump_output()
        launcher.wait(poll_interval)
    launcher.pump_output(final=True)
    judged = _judged(launcher, outcomes, world)
    return [judged[r] for r in range(world)]
