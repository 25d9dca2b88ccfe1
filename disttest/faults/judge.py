"""The parent side of fault injection: judge the outcomes of a test.

:class:`Injection` is what a runner holds for one test: the faults declared
for it (and ``DISTTEST_CHAOS``), where its ranks write which fired, a
predicate for the join loop (a rank whose death was injected does not make
it stop the others) and :meth:`Injection.judge`, which reads the records and
applies :func:`judge_injected`, a pure function:

- a rank whose death (kill, exit) was injected passes: the test passes when
  every other rank passes;
- after an injected death, a rank disttest had to stop, or that raised
  (not an assertion) after it, did not survive it: an error, named as such;
- a declared fault that never fired is an error of the test, naming it;
- every outcome carries what was injected into it (``faults_fired``), which
  the report prints apart from the causes (:func:`injected_lines`), with the
  schedule-fuzzing seed.
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from disttest._runner.outcome import Kind, Outcome
from disttest._runner.report import CHAOS_MARK, DELAYED_MARK, INJECTED, NEVER_MARK, injected_lines
from disttest.config import ConfigError
from disttest.faults import CHAOS_ENV, DEATHS, Fault, chaos_seed, test_faults

__unittest = True

__all__ = ["ALL_DIED", "INJECTED", "NEVER_FIRED", "NOT_IN_WORLD", "NOT_SURVIVED", "SUITE_NEVER_FIRED", "Injection",
           "check_world", "injected_lines", "judge_injected", "merge_suite_tally", "note_suite_faults",
           "say_unfired", "suite_summary_by", "suite_tally", "unfired_suite_faults"]

NEVER_FIRED = "injected fault never fired: {fault}{why}"
#: A suite-wide fault that fired in no test of the run (said at its end;
#: a pytest run fails, as a fault declared on a test that never fires does).
SUITE_NEVER_FIRED = "suite-wide fault fired in no test: {fault}; {tests} disttest test{s} ran, {why}"
SUITE_NO_RANK = "no test's world had its rank"
SUITE_NO_CALL = "no test's rank reached its call"
#: Every rank died by an injected fault: the test's checks never ran.
ALL_DIED = ("every rank was ended by an injected fault before the test finished ({faults}), so nothing "
            "of the test was checked; if that is the point, declare the deaths with ends_test=True")
NOT_SURVIVED = "did not survive the injected fault ({faults}): {detail}"
#: Why a fault declared on a test for a rank outside its world is refused.
NOT_IN_WORLD = ("rank {rank} is not in this test's world of {world_size}; "
                "declare it for a rank the test has (a suite-wide DISTTEST_FAULT acts where its rank exists)")
_CHAOS_PREFIX = CHAOS_MARK + CHAOS_ENV + "="


def judge_injected(outcomes: Sequence[Outcome], faults: Sequence[Fault],
                   fired: dict[int, list[dict[str, Any]]]) -> list[Outcome]:
    """The outcomes as judged with the injected faults (new objects).

    ``fired``: each rank's records (``{"fault": index, "action", "what"}``,
    ``{"chaos": seed}``, ``{"counts": {op: n}}``), ``faults`` indexed alike.
    """
    out = [copy.copy(o) for o in outcomes]
    world = len(out)
    deaths: dict[int, str] = {}
    ending = True  # every injected death declared ends_test
    first_death = float("inf")
    for o in out:
        records = fired.get(o.rank, [])
        o.faults_fired = [r["what"] for r in records if "what" in r]
        o.faults_fired += [f"{_CHAOS_PREFIX}{r['chaos']}" for r in records if "chaos" in r]
        delayed = max((r["delayed"] for r in records if isinstance(r.get("delayed"), (int, float))), default=0.0)
        if delayed:
            o.faults_fired.append(f"{DELAYED_MARK}{delayed:.3f}")
        for r in records:
            if r.get("action") in DEATHS:
                deaths[o.rank] = r["what"]
                first_death = min(first_death, r.get("t", 0.0))
                index = r.get("fault")
                ending &= isinstance(index, int) and index < len(faults) and faults[index].ends_test
    for o in out:
        if o.rank in deaths and o.kind is not Kind.PASSED:
            # Its own death, as declared: expected (a thread rank ends by
            # RankKilled; a process dies by the signal or exit code).
            o.kind, o.detail = Kind.PASSED, f"its death was injected: {deaths[o.rank]}"
            o.exc_type = o.message = o.traceback = o.stacks = ""
            o.exit, o.tb_data = None, None
    if deaths and len(deaths) == world and not ending:
        o = out[0]
        o.kind, o.exc_type, o.message = Kind.ERRORED, "EveryRankDied", ALL_DIED.format(
            faults="; ".join(deaths[r] for r in sorted(deaths)))
    if deaths:
        what = "; ".join(deaths[r] for r in sorted(deaths))
        for o in out:
            # Stopped by disttest, or raised (not an assertion) after the death:
            # the rank did not survive the fault.
            after = o.kind is Kind.ERRORED and o.rank not in deaths and o.at >= first_death
            if o.kind is Kind.STOPPED or after:
                detail = o.message if after else (
                    o.detail or (f"{o.exc_type}: {o.message}" if o.exc_type else "it was stopped"))
                if not after and "{who}" in detail:  # (the report fills these in a detail, not in a message)
                    detail = detail.format(who="it", waits="waited")
                o.kind = Kind.ERRORED
                o.message = NOT_SURVIVED.format(faults=what, detail=detail)
                if not after:
                    o.detail = ""  # (now in the message: the report showed it twice)
                o.exc_type = o.exc_type or "RankStopped"
    for index, fault in enumerate(faults):
        for rank in fault.ranks:
            records = fired.get(rank, [])
            if rank >= world or any(r.get("fault") == index for r in records):
                continue  # (outside the world: a suite-wide fault, which acts where its rank exists)
            target = out[rank]
            counts = next((r["counts"] for r in records if "counts" in r), None)
            message = NEVER_FIRED.format(fault=fault.describe(rank), why=_why(fault, rank, counts))
            target.faults_fired = [*target.faults_fired, NEVER_MARK + fault.describe(rank)]
            # A suite-wide fault acts where a test reaches its call; one
            # declared on the test is a claim that it does.
            if target.kind is Kind.PASSED and not fault.suite_wide:
                target.kind, target.exc_type, target.message = Kind.ERRORED, "UnfiredFault", message
                target.detail = ""
    return out


def check_world(faults: Sequence[Fault], world_size: int) -> None:
    """Refuse a fault declared on the test for a rank outside its world
    (a suite-wide one acts in the tests whose world has its rank)."""
    for fault in faults:
        for rank in fault.ranks:
            if rank >= world_size and not fault.suite_wide:
                raise ConfigError("fault", fault.what(rank), fault.where,
                                  NOT_IN_WORLD.format(rank=rank, world_size=world_size))


def _why(fault: Fault, rank: int, counts: dict[str, int] | None) -> str:
    if counts is None:
        return ""
    made = sum(counts.values()) if fault.at == "any" else counts.get(fault.at, 0)
    name = "collective" if fault.at == "any" else fault.at
    return f": rank {rank} made {made} {name} call{'s' if made != 1 else ''} in the test"


class Injection:
    """One test's injected faults, seen from the parent."""

    def __init__(self, faults: Sequence[Fault], seed: int | None, source: Any) -> None:
        self.faults = tuple(faults)
        self.seed = seed
        self.source = source
        self.active = bool(self.faults) or seed is not None

    @classmethod
    def for_test(cls, test_cls: object, test_name: str, source: Any, world_size: int) -> Injection:
        """``source``: the run directory of rank processes, or the threaded
        world of rank threads (where the ranks write what fired). A fault
        declared on the test for a rank outside its world raises ConfigError."""
        faults = test_faults(getattr(test_cls, test_name, None))
        check_world(faults, world_size)
        return cls(faults, chaos_seed(), source)

    def forget_earlier(self) -> None:
        """Remove what an earlier test's ranks wrote in this run directory
        (a pool's, which every test of the class shares)."""
        if self.active and isinstance(self.source, str):
            from disttest.faults.rank import forget_fired

            forget_fired(self.source)

    @property
    def expected_end(self) -> Callable[[int], bool] | None:
        """For the join loop: whether a rank's end was an injected death
        (None when nothing can be injected)."""
        if not any(f.action in DEATHS for f in self.faults):
            return None

        def died_as_declared(rank: int) -> bool:
            from disttest.faults.rank import read_fired

            records = read_fired(self.source, rank + 1).get(rank, [])
            return any(r.get("action") in DEATHS for r in records)

        return died_as_declared

    def judge(self, outcomes: Sequence[Outcome]) -> list[Outcome]:
        if not self.active:
            return list(outcomes)
        from disttest.faults.rank import read_fired

        fired = read_fired(self.source, len(outcomes))
        note_suite_faults(self.faults, len(outcomes), fired)
        return judge_injected(outcomes, self.faults, fired)


#: Each suite-wide fault (``DISTTEST_FAULT``) of this process's judged tests,
#: by its description: [tests judged, tests whose world had one of its
#: ranks, tests where it fired].
_SUITE: dict[str, list[int]] = {}


#: Who says the unfired ones at the run's end: "exit" (this process, as it
#: exits: a plain unittest run), "pytest" (the plugin's summary, which also
#: fails the run), "run_tests" (it exits with status 1), or "" (said).
_SAYS = ["exit"]


def note_suite_faults(faults: Sequence[Fault], world: int, fired: dict[int, list[dict[str, Any]]]) -> None:
    """Count, for the run's summary, whether each suite-wide fault fired in a test."""
    acted = {r.get("fault") for records in fired.values() for r in records}
    for index, fault in enumerate(faults):
        if fault.suite_wide:
            if not _SUITE and _SAYS[0] == "exit":
                atexit.register(_say_at_exit, os.getpid())
            tally = _SUITE.setdefault(fault.describe(), [0, 0, 0])
            tally[0] += 1
            tally[1] += any(rank < world for rank in fault.ranks)
            tally[2] += index in acted


def suite_tally() -> dict[str, list[int]]:
    """This process's counts (a pytest-xdist worker sends them to the controller)."""
    return {key: list(counts) for key, counts in _SUITE.items()}


def merge_suite_tally(other: dict[str, list[int]]) -> None:
    """Add another process's counts (a pytest-xdist worker's) to this one's."""
    for key, counts in other.items():
        tally = _SUITE.setdefault(key, [0, 0, 0])
        for i, n in enumerate(counts[:3]):
            tally[i] += int(n)


def suite_summary_by(who: str) -> Callable[[], None]:
    """Make ``who`` ("pytest", "run_tests") say the unfired suite-wide faults
    at the run's end, starting a new count; return the undo."""
    before, counts = _SAYS[0], dict(_SUITE)
    _SAYS[0] = who
    _SUITE.clear()

    def undo() -> None:
        _SAYS[0] = before
        _SUITE.clear()
        _SUITE.update(counts)

    return undo


def say_unfired(stream: TextIO) -> bool:
    """Write the unfired suite-wide faults to ``stream``, once; whether any."""
    lines = unfired_suite_faults()
    _SAYS[0] = ""
    for line in lines:
        stream.write(f"disttest: {line}\n")
    return bool(lines)


def _say_at_exit(pid: int) -> None:
    if _SAYS[0] == "exit" and os.getpid() == pid:  # (not in a process forked from this one)
        say_unfired(sys.__stderr__ or sys.stderr)


def unfired_suite_faults() -> list[str]:
    """The suite-wide faults that fired in none of the tests judged, each
    said as :data:`SUITE_NEVER_FIRED` (empty when every one fired somewhere)."""
    lines = []
    for fault, (tests, had_rank, fired) in sorted(_SUITE.items()):
        if not fired:
            why = SUITE_NO_RANK if not had_rank else SUITE_NO_CALL
            lines.append(SUITE_NEVER_FIRED.format(fault=fault, tests=tests, s="" if tests == 1 else "s", why=why))
    return lines
