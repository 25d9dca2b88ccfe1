"""The pytest side of fault injection (called from :mod:`disttest.pytest_plugin`).

- ``--disttest-fault=SPEC``: a fault for every test (as ``DISTTEST_FAULT``);
- ``--disttest-chaos=SEED``: schedule fuzzing (as ``DISTTEST_CHAOS``);
- ``--disttest-repeat=N``: run each test N times, with ``DISTTEST_CHAOS``
  1..N, and report the seeds that failed. A test class's fixtures (a
  ``MultiProcContinousTest`` pool) are set up again for each seed, so that
  every rank runs with it.

A bad value is a usage error naming it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from typing import Any

from disttest.config import ConfigError
from disttest.faults import (
    CHAOS_ENV,
    FAULT_ENV,
    FAULT_OPTION,
    FAULT_OPTION_ENV,
    judge,
    parse_fault_spec,
    parse_seed,
)

__unittest = True

__all__ = ["REPEAT_SECTION", "SKIPPED_SEEDS", "TIMEOUT_COVERS", "addoption", "configure", "node_down",
           "runtest_protocol", "session_finish", "terminal_summary", "unconfigure"]

REPEAT_SECTION = "disttest chaos"
FAILING_SEEDS = "failing seeds: {seeds} of 1..{n} (reproduce one with {env}={first})"
ALL_PASSED = "all {n} seeds passed ({env}=1..{n})"
#: No seed failed and some skipped: the test is reported skipped, as the
#: first seed that skipped ended (a pass would claim seeds that never ran).
SKIPPED_SEEDS = "skipped on seeds {seeds} of 1..{n} (shown: {env}={first}); {others}"
#: Why --disttest-repeat with a seed given is refused.
REPEAT_WITH_SEED = ("it runs seeds 1..N itself, so the seed of {given} would be dropped: "
                    "give one or the other")
#: When pytest-timeout's limit, set for the whole test, expired during the
#: repeats: the seed that was running then is not blamed.
TIMEOUT_COVERS = ("pytest-timeout's limit of {limit}s covers all {n} runs of --disttest-repeat together and "
                  "expired during seed {seed} after {elapsed:.1f}s, {seed_elapsed:.1f}s into that seed: no seed "
                  "is blamed for it and seeds {seed}..{n} did not finish; give a limit for {n} runs "
                  "(or pytest-timeout's timeout_func_only ini option, which times each run)")
_PYTEST_TIMEOUT = re.compile(r"Timeout \(>([0-9.]+)s\) from pytest-timeout")
#: Why an option whose environment variable says otherwise is refused.
OPTION_AND_ENV = "{env} is also set, to {current!r}: give one or make them agree"


def addoption(group: Any) -> None:
    group.addoption("--disttest-fault", dest="disttest_fault", action="append", default=None, metavar="SPEC",
                    help="inject a fault into every disttest test, e.g. "
                         "rank=1,action=kill,at=all_reduce,nth=3 (repeatable; sets DISTTEST_FAULT)")
    group.addoption("--disttest-chaos", dest="disttest_chaos", default=None, metavar="SEED",
                    help="delay each rank's collectives by seeded random amounts (sets DISTTEST_CHAOS)")
    group.addoption("--disttest-repeat", dest="disttest_repeat", default=None, metavar="N",
                    help="run each test N times with DISTTEST_CHAOS=1..N; report the failing seeds")


def configure(config: Any) -> None:
    import pytest

    try:
        specs = config.getoption("disttest_fault")
        # (given twice, both act: the second replaced the first without a word)
        spec = None if specs is None else ";".join(specs) if isinstance(specs, list) else specs
        if spec is not None:
            parse_fault_spec(spec, FAULT_OPTION)
            _agrees("fault", spec, FAULT_ENV, FAULT_OPTION,
                    lambda text: [dataclasses.replace(f, where="") for f in parse_fault_spec(text)])
        seed = config.getoption("disttest_chaos")
        if seed is not None:
            seed = str(parse_seed(seed, "--disttest-chaos"))
            _agrees("chaos seed", seed, CHAOS_ENV, "--disttest-chaos", lambda text: parse_seed(text, CHAOS_ENV))
        repeat = config.getoption("disttest_repeat")
        if repeat is not None:
            try:
                n = parse_seed(repeat, "--disttest-repeat")
            except ConfigError:
                n = 0  # named as a repeat count below, not as a seed
            if n < 1:
                raise ConfigError("repeat count", repeat, "--disttest-repeat", "expected an int >= 1")
            # The repeats run seeds 1..n themselves: a seed given too would be dropped.
            given = ("--disttest-chaos" if seed is not None else
                     CHAOS_ENV if os.environ.get(CHAOS_ENV, "").strip() else None)
            if given is not None:
                raise ConfigError("repeat count", repeat, "--disttest-repeat", REPEAT_WITH_SEED.format(given=given))
            config._disttest_repeat = n
        # (the plugin puts them back as they were when pytest unconfigures)
        if spec is not None:
            os.environ[FAULT_ENV] = os.environ[FAULT_OPTION_ENV] = spec
        if seed is not None:
            os.environ[CHAOS_ENV] = seed
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    config._disttest_suite_undo = judge.suite_summary_by("pytest")


def unconfigure(config: Any) -> None:
    undo = getattr(config, "_disttest_suite_undo", None)
    if undo is not None:
        undo()


#: A pytest-xdist worker's counts of suite-wide faults, sent to the controller.
_TALLY_KEY = "disttest_suite_faults"


def session_finish(session: Any) -> None:
    """A suite-wide fault that fired in no test fails the run (as one declared
    on a test that never fires fails that test); a worker sends its counts."""
    import pytest

    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_TALLY_KEY] = judge.suite_tally()
    elif judge.unfired_suite_faults() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def node_down(node: Any) -> None:
    """pytest-xdist's controller: add a worker's counts to the run's."""
    judge.merge_suite_tally(getattr(node, "workeroutput", {}).get(_TALLY_KEY, {}))


def terminal_summary(reporter: Any) -> None:
    if getattr(reporter.config, "workerinput", None) is not None:
        return
    lines = judge.unfired_suite_faults()
    if lines:
        reporter.section("disttest: suite-wide faults", sep="=", red=True, bold=True)
        for line in lines:
            reporter.line(line, red=True)


def _agrees(what: str, value: str, env: str, option: str, read: Callable[[str], object]) -> None:
    """An option and its environment variable, both set, must say the same
    (as ``read`` reads them: ``07`` is the seed 7, blanks in a spec do not count)."""
    current = os.environ.get(env, "").strip()
    if not current:
        return
    try:
        same = read(current) == read(value)
    except ConfigError:
        same = False  # (the variable's own error: named below with the option's value)
    if not same:
        raise ConfigError(what, value, option, OPTION_AND_ENV.format(env=env, current=current))


def runtest_protocol(item: Any, nextitem: Any) -> bool | None:
    """Run ``item`` once per seed; log the first failing run (or the last)."""
    n = getattr(item.config, "_disttest_repeat", None)
    if not n:
        return None
    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    saved = os.environ.get(CHAOS_ENV)
    failing: list[int] = []
    skipped: list[int] = []
    shown: list[Any] | None = None
    first_skip: list[Any] | None = None
    covered = ""  # pytest-timeout's limit, set for all the runs, expired
    start = time.monotonic()
    try:
        for seed in range(1, n + 1):
            os.environ[CHAOS_ENV] = str(seed)
            began = time.monotonic()
            # Between seeds, tear down the test's class (a pool's workers take the
            # seed at start) and keep what is above it: a session's or a module's
            # fixtures were made again for every seed of every test (NB: pytest
            # tears down up to the nodes that the next item descends from).
            reports = runtestprotocol(item, nextitem=nextitem if seed == n else _kept(item), log=False)
            limit = _expired_limit(reports)
            if limit is not None and time.monotonic() - began < limit:
                # The limit ran out on the runs together, not on this seed alone.
                covered = TIMEOUT_COVERS.format(limit=f"{limit:g}", n=n, seed=seed,
                                                elapsed=time.monotonic() - start,
                                                seed_elapsed=time.monotonic() - began)
                shown = reports
                break
            if any(r.failed for r in reports):
                failing.append(seed)
                if shown is None:
                    shown = reports
            elif any(r.skipped for r in reports):
                skipped.append(seed)
                first_skip = first_skip or reports
            if seed == n and shown is None:
                shown = first_skip or reports
    finally:
        if saved is None:
            os.environ.pop(CHAOS_ENV, None)
        else:
            os.environ[CHAOS_ENV] = saved
    if failing:
        text = FAILING_SEEDS.format(seeds=", ".join(map(str, failing)), n=n, env=CHAOS_ENV, first=failing[0])
    elif skipped:
        passed = [s for s in range(1, n + 1) if s not in skipped]
        text = SKIPPED_SEEDS.format(seeds=", ".join(map(str, skipped)), n=n, env=CHAOS_ENV, first=skipped[0],
                                    others=f"passed on {', '.join(map(str, passed))}" if passed else "no seed passed")
    else:
        text = ALL_PASSED.format(n=n, env=CHAOS_ENV)
    if covered:
        text = covered + (f"; before it, {text}" if failing else "")
    for report in shown or []:
        if report.when == "call" or (not report.passed and report.when != "call"):
            report.sections.append((REPEAT_SECTION, text))
        if report.skipped and not failing and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            # (a skip's report shows no sections: its reason says which seeds skipped)
            path, line, reason = report.longrepr
            report.longrepr = (path, line, f"{reason} [{text}]")
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _kept(item: Any) -> Any:
    """The node above ``item``'s class (or above ``item``), kept between seeds."""
    import pytest

    return (item.getparent(pytest.Class) or item).parent


def _expired_limit(reports: list[Any]) -> float | None:
    """The limit of pytest-timeout when it ended one of ``reports`` (else None)."""
    for report in reports:
        if report.failed:
            found = _PYTEST_TIMEOUT.search(str(report.longrepr))
            if found:
                return float(found.group(1))
    return None
