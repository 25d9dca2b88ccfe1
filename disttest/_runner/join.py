"""The one join loop, shared by every runner.

Waits for every rank's outcome under one deadline. It stops early, within a
poll interval, when a rank fails, errors or dies (the live ranks' stacks are
taken first), and when a live rank waits in a collective that a finished
peer never entered (a desync). On the deadline, it takes the stacks of the
ranks still running, then stops them. It never waits without a bound.
"""

from __future__ import annotations

import time

from disttest._runner.launcher import Launcher
from disttest._runner.outcome import ExitStatus, Kind, Outcome

__unittest = True

__all__ = ["POLL_INTERVAL", "join"]

POLL_INTERVAL = 0.01
DESYNC_DETAIL = "rank {peer}/{world} finished; rank {rank}/{world} waits in {what}"


def _ended(launcher: Launcher, rank: int, status: ExitStatus) -> Outcome:
    outcome = launcher.outcome(rank)
    if outcome is None:
        return Outcome(rank, Kind.CRASHED, exit=status)
    outcome.exit = status
    if status.signal is not None and outcome.kind is not Kind.CRASHED:
        outcome.detail = f"after reporting {outcome.kind.value}"
        outcome.kind = Kind.CRASHED
    return outcome


def _stop(launcher: Launcher, live: list[int], outcomes: dict[int, Outcome],
          kind_of: dict[int, Kind], details: dict[int, str]) -> None:
    stacks = launcher.dump_stacks(live)
    launcher.stop()
    for r in live:
        outcomes[r] = Outcome(r, kind_of.get(r, Kind.STOPPED), stacks=stacks.get(r, ""),
                              detail=details.get(r, ""))


def join(launcher: Launcher, timeout: float, poll_interval: float = POLL_INTERVAL) -> list[Outcome]:
    """Wait for all ranks of ``launcher``; return one outcome per rank."""
    world = launcher.world_size
    deadline = time.monotonic() + timeout
    outcomes: dict[int, Outcome] = {}
    while True:
        for r, status in launcher.poll().items():
            if r not in outcomes:
                outcomes[r] = _ended(launcher, r, status)
        live = [r for r in range(world) if r not in outcomes]
        if not live:
            break
        if any(o.kind.is_cause for o in outcomes.values()):
            _stop(launcher, live, outcomes, {}, {})
            break
        found = launcher.desync(live, sorted(outcomes))
        if found is not None:
            peer, flight = found
            detail = DESYNC_DETAIL.format(peer=peer, rank=flight.rank, world=world,
                                          what=flight.describe())
            _stop(launcher, live, outcomes, {flight.rank: Kind.DESYNC}, {flight.rank: detail})
            break
        if time.monotonic() > deadline:
            _stop(launcher, live, outcomes, dict.fromkeys(live, Kind.TIMED_OUT), {})
            break
        time.sleep(poll_interval)
    return [outcomes[r] for r in range(world)]
