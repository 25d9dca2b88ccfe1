"""A class's tests run by an external launcher (``MultiProcContinousTest.run_rank``
under torchrun, srun or mpirun): each rank process runs them through
unittest on its own, and no disttest parent judges them.

So the ranks agree after each test, through the store their group was made
with (not a collective: a rank whose test failed before a collective would
meet its peers' collective of the same test in its next test, and pass it
with their values). :class:`LaunchedResult` holds a rank's outcome of each
test until every peer has said its own:

- a test fails on every rank when it fails on any (as under the pool: one
  verdict per test), and each rank's report says which rank failed and how;
- a peer that does not say within the test's limit (plus
  :data:`AGREE_MARGIN`) died or hangs: the test fails here, naming it, and
  the class's remaining tests fail at once (``setUp``) instead of waiting in
  collectives it will never join; so do they when a peer left the class
  (its ``setUpClass`` raised or skipped it, it was interrupted) or ran
  another test at the same place in the class's order;
- a rank whose test runs past its limit prints every thread's stack to its
  error output (no join loop is there to ask for it);
- at the end the ranks leave together, bounded, with what went wrong in the
  result (:func:`leave_together`), and the rank that holds an ``env://``
  store waits for the others to be done with it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Callable, Iterator
from typing import Any, cast

from disttest._runner import settings
from disttest._runner.outcome import PEER_LOST, Kind, Outcome, comm_site, safe_str
from disttest._runner.verdict import Status, explain, judge, who
from disttest.support import janitor, tempdirs

__unittest = True

__all__ = ["AGREE_MARGIN", "EXIT_AFTER", "HOLD_GRACE", "INTERRUPTED", "PEERS_GONE_BEFORE", "PEERS_NOT_AT_END",
           "PEER_FAILED", "PEER_GONE", "PEER_LEFT_CLASS", "PEER_OTHER_TEST", "PEER_SKIPPED", "SECOND_CALL",
           "TIMED_OUT", "UNSTOPPED", "UNSTOPPED_EXIT_CODE", "Agreement", "LaunchedResult", "peers_gone",
           "run_folder", "skipping"]

#: Seconds past a test's limit a rank waits for its peers' outcome of it.
AGREE_MARGIN = 10.0
_POLL = 0.01
_FIRST_POLL = 0.0005
#: A test that failed on other ranks: this rank's verdict of it (added to its own failure, if it failed too).
PEER_FAILED = ("{test!r} {how} on {who} (disttest: ranks run by an external launcher agree on each test, which "
               "fails on every rank if it fails on any; {whose} own report is in {whose} output): {what}")
#: A test a peer skipped (the whole test, not a subTest): skipped here too.
PEER_SKIPPED = "{who} skipped {test!r}, and ranks run by an external launcher agree on each test (disttest)"
#: Seconds past a test's limit that a rank under a launcher stops it: a
#: collective that waits for a peer ends at the group's timeout (the
#: class's longest limit: the limit itself unless a test has its own,
#: shorter) and names more than a stop would.
HOLD_GRACE = 5.0
#: Seconds after a test was stopped (its limit plus :data:`HOLD_GRACE`)
#: that a rank whose test did not stop exits (by then its peers have given
#: up on it: :data:`AGREE_MARGIN`).
EXIT_AFTER = AGREE_MARGIN
#: Exit status of such a rank.
UNSTOPPED_EXIT_CODE = 70
#: Printed, with every thread's stack, by a rank whose test did not stop.
UNSTOPPED = ("{test!r} did not stop on {who} {after:g}s after it was stopped at {stop:g}s (disttest): it caught "
             "the stop (except BaseException) or is blocked in C++; the rank exits with status {code}; every "
             "thread's stack:")
#: A test past its limit under a launcher (held to it in the rank: no disttest parent watches it).
TIMED_OUT = ("{test!r} did not finish within {limit:g}s on {who} (disttest): no disttest parent watches ranks "
             "a launcher started, so the rank stopped it where it was:\n{stack}")
#: A peer that did not say how a test ended.
PEER_GONE = ("{who} did not finish {test!r} within {limit:g}s of this rank (disttest): it died, hangs, or its "
             "store is gone (its own output says which); the class's remaining tests fail at once on this rank")
#: A peer that runs no more of the class's tests, and why (its setUpClass
#: raised or skipped the class, it was interrupted).
PEER_LEFT_CLASS = "{who} runs no more of {cls}'s tests: {why} (disttest)"
#: Peers that ran another test at the same place in the class's order.
PEER_OTHER_TEST = ("{who} ran {theirs!r} where this rank ran {ours!r} (disttest): the ranks must run the same "
                   "tests in the same order (the same -k, the same tests defined on every host), or a test's "
                   "collectives meet another's; the class's remaining tests fail at once on this rank")
#: A test that ended with no outcome (unittest lets KeyboardInterrupt through).
INTERRUPTED = "it was interrupted in {test!r} (KeyboardInterrupt)"
#: The class's remaining tests after a peer is gone.
PEERS_GONE_BEFORE = "not run: {gone}"
#: A second ``run_rank`` with ``env://`` in one process.
SECOND_CALL = ("run_rank was called for {cls} after {first} in this process, both through env:// (disttest): "
               "under a launcher, torch's env:// rendezvous cannot be made twice reliably (a peer may still "
               "hold the first one's store); run one class per script (it may gather tests from mixins), "
               "or give each call a rendezvous file of its own (rdvz_file=)")
#: Peers that did not reach the end of the class's tests.
PEERS_NOT_AT_END = ("{who} did not reach the end of {cls}'s tests within {limit:g}s of this rank (disttest): "
                    "it died or hangs")


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # (replaced by an object with no file)
        return 2


def _first_line(err: Any) -> str:
    exc_type, value = err[0], err[1]
    text = safe_str(value).strip().splitlines()
    return f"{exc_type.__name__}: {text[0][:300]}" if text else exc_type.__name__


class Agreement:
    """What a rank shares with its peers through the group's store."""

    def __init__(self, store: Any, cls: type, rank: int, world_size: int) -> None:
        self.store, self.cls, self.rank, self.world_size = store, cls, rank, world_size
        self.prefix = f"disttest/run_rank/{cls.__module__}.{cls.__qualname__}"
        self.count = 0
        #: rank -> why it runs no more of the class's tests.
        self.gone: dict[int, str] = {}

    def say(self, key: str, value: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # (a store that is gone: the peers say so)
            self.store.set(f"{self.prefix}/{key}/{self.rank}", json.dumps(value))

    def _heard(self, key: str, r: int) -> dict[str, Any] | None:
        name = f"{self.prefix}/{key}/{r}"
        if not self.store.check([name]):
            return None
        value: dict[str, Any] = json.loads(self.store.get(name))
        return value

    def hear(self, key: str, limit: float) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """Each live peer's value of ``key``, waiting up to ``limit``; and
        the peers that said nothing (now gone), a peer whose class set-up
        failed meanwhile counted as gone, not as silent."""
        heard: dict[int, dict[str, Any]] = {}
        waiting = [r for r in range(self.world_size) if r != self.rank and r not in self.gone]
        deadline = time.monotonic() + limit
        pause = _FIRST_POLL  # (peers that pass end about together: a first look soon, then less often)
        try:
            while waiting:
                for r in list(waiting):
                    value = self._heard(key, r)
                    if value is None:
                        left = self._heard("left", r)
                        if left is not None:
                            self.gone[r] = PEER_LEFT_CLASS.format(who=who([r], self.world_size),
                                                                  cls=self.cls.__qualname__, why=left["why"])
                            waiting.remove(r)
                        continue
                    heard[r] = value
                    waiting.remove(r)
                if waiting and time.monotonic() > deadline:
                    break
                if waiting:
                    time.sleep(pause)
                    pause = min(pause * 2, _POLL)
        except Exception:  # noqa: BLE001 (the store is gone: its host ended; those not heard are gone)
            pass
        return heard, waiting


class LaunchedResult(unittest.TextTestResult):
    """unittest's text result, holding each test's outcome until the peers
    have said theirs (see the module docstring)."""

    def __init__(self, stream: Any, descriptions: bool, verbosity: int, *, agreement: Agreement,
                 end_limit: float, holds_store: bool, **kwargs: Any) -> None:
        super().__init__(stream, descriptions, verbosity, **kwargs)
        self.agreement = agreement
        self._end_limit, self._holds_store = end_limit, holds_store
        self._held: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._current: Any = None
        self._limit = 0.0
        self._ending = False  # (the end's own error is not a class set-up's)
        self._interrupted = False
        self._exit_timer: threading.Timer | None = None

    # -- holding ---------------------------------------------------------------
    def startTest(self, test: Any) -> None:
        super().startTest(test)
        self._current, self._held = test, []
        self._limit = settings.test_timeout(test, test.id()) or 0.0
        if self._limit:
            # NB: a hang past the limit is seen by nobody else: say where.
            faulthandler.dump_traceback_later(self._limit, exit=False, file=_stderr_fd())
            # A test the rank could not stop (it caught the stop, or C++
            # never returns) would hold the rank for ever: it exits.
            self._exit_timer = threading.Timer(self._limit + HOLD_GRACE + EXIT_AFTER, _exit_unstopped,
                                               (test._testMethodName, self._limit + HOLD_GRACE,
                                                who([self.agreement.rank], self.agreement.world_size)))
            self._exit_timer.daemon = True
            self._exit_timer.start()

    def _hold(self, own: Callable[..., None], *args: Any) -> None:
        """Hold what unittest reports of the current test until the peers
        have said theirs (outside a test, setUpClass's error: at once, and
        the peers are told)."""
        if self._current is not None:
            self._held.append((own, args))
            return
        own(*args)
        if self._ending:
            return
        if own.__name__ == "addError":  # (setUpClass, setUpModule, a class cleanup)
            self.agreement.say("left", {"why": f"{args[0]} raised {_first_line(args[1])}"})
        elif own.__name__ == "addSkip":
            self.agreement.say("left", {"why": f"{args[0]} skipped it: {args[1]}"})

    def addSuccess(self, test: Any) -> None:
        self._hold(super().addSuccess, test)

    def addFailure(self, test: Any, err: Any) -> None:
        self._hold(super().addFailure, test, err)

    def addError(self, test: Any, err: Any) -> None:
        self._hold(super().addError, test, err)

    def addSkip(self, test: Any, reason: str) -> None:
        self._hold(super().addSkip, test, reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._hold(super().addExpectedFailure, test, err)

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._hold(super().addUnexpectedSuccess, test)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        self._hold(super().addSubTest, test, subtest, err)

    def _own_verdict(self, test: Any) -> dict[str, Any]:
        """What this rank says of its test: its ``status`` ("failed",
        "skipped" or "passed"), for a failure its first line (``what``) and
        whether it came out of a collective (``comm``: then a peer's skip may
        be its cause), for a skip of the whole test its reason (``why``)."""
        if not self._held:  # (unittest let KeyboardInterrupt through: no outcome)
            return {"status": "failed", "what": "KeyboardInterrupt", "comm": False}
        why = None
        failures: list[tuple[str, bool]] = []  # (first line, came out of communication)
        for method, args in self._held:
            name = method.__name__
            if name in ("addFailure", "addError") or (name == "addSubTest" and args[2] is not None) \
                    or name == "addUnexpectedSuccess":
                err = args[2] if name == "addSubTest" else (args[1] if len(args) > 1 else None)
                if not err:
                    failures.append(("an unexpected success", False))
                    continue
                # NB: no board here to say the rank was in a collective: a
                # Work's wait raises from the test's own frame, with gloo's
                # words (its timeout) only.
                first = _first_line(err)
                failures.append((first, isinstance(err[1], BaseException) and (
                    bool(comm_site(err[1])) or bool(PEER_LOST.search(first)))))
            elif name == "addSkip" and args[0] is test:  # (a subTest's skip is not the test's)
                why = args[1]
        if failures:  # (communication only if every failure was: one of its own stays its own)
            return {"status": "failed", "what": failures[0][0], "comm": all(c for _, c in failures)}
        return {"status": "passed"} if why is None else {"status": "skipped", "why": why}

    def stopTest(self, test: Any) -> None:
        faulthandler.cancel_dump_traceback_later()
        if self._exit_timer is not None:
            self._exit_timer.cancel()
            self._exit_timer = None
        agreement = self.agreement
        own = self._own_verdict(test)
        status = own["status"]
        n = agreement.count
        agreement.count += 1
        agreement.say(f"test{n}", {"test": test.id(), **own})
        if not self._held:
            # Interrupted: this rank leaves now; its peers are told, not left to wait.
            self._interrupted = True
            agreement.say("left", {"why": INTERRUPTED.format(test=test._testMethodName)})
            super().stopTest(test)
            return
        gone_before = set(agreement.gone)
        heard, silent = agreement.hear(f"test{n}", self._limit + AGREE_MARGIN)
        # (a peer whose setUpClass failed meanwhile: this test waited for it in vain)
        notes = [agreement.gone[r] for r in sorted(set(agreement.gone) - gone_before)]
        for r, value in sorted(heard.items()):
            if value["test"] != test.id():
                agreement.gone[r] = PEER_OTHER_TEST.format(who=who([r], agreement.world_size),
                                                           theirs=value["test"], ours=test.id())
                notes.append(agreement.gone[r])
        ours = {r: v for r, v in heard.items() if v["test"] == test.id()}
        failed = {r: v for r, v in ours.items() if v["status"] == "failed"}
        skipped = {r: v["why"] for r, v in {**ours, agreement.rank: own}.items() if v["status"] == "skipped"}
        held, self._held, self._current = self._held, [], None
        if skipped and not silent and not notes and _judged_skipped({**ours, agreement.rank: own},
                                                                    agreement.world_size):
            # A rank skipped and left its peers waiting: their collectives'
            # errors are its effect, and the test is skipped on every rank.
            reason = "; ".join(sorted(set(skipped.values())))
            if status != "skipped":
                note = PEER_SKIPPED.format(who=who(sorted(r for r in skipped if r != agreement.rank),
                                                   agreement.world_size), test=test._testMethodName)
                what = f" [{note}; this rank's error came after it: {own['what']}]" if status == "failed" \
                    else f" [{note}]"
                held = [(m, a) for m, a in held if m.__name__ not in (
                    "addSuccess", "addFailure", "addError", "addSubTest", "addExpectedFailure")]
                held.append((super().addSkip, (test, reason + what)))
            for method, args in held:
                method(*args)
            super().stopTest(test)
            return
        if failed:
            # (grouped by message, the group of the lowest rank first: the first cause comes first more often)
            for what_failed in sorted({v["what"] for v in failed.values()},
                                      key=lambda w: min(r for r, v in failed.items() if v["what"] == w)):
                ranks = [r for r, v in failed.items() if v["what"] == what_failed]
                notes.append(PEER_FAILED.format(test=test._testMethodName, how="failed", who=who(
                    ranks, agreement.world_size), whose="its" if len(ranks) == 1 else "their", what=what_failed))
        if silent:
            gone = functools.partial(PEER_GONE.format, test=test._testMethodName, limit=self._limit + AGREE_MARGIN)
            for r in silent:
                agreement.gone[r] = gone(who=who([r], agreement.world_size))
            notes.append(gone(who=who(silent, agreement.world_size)))
        if notes and status != "failed":
            # This rank's pass (or skip) is not the test's verdict: the peers' failure is.
            held = [(m, a) for m, a in held if m.__name__ not in ("addSuccess", "addSkip", "addExpectedFailure")]
            held.append((super().addFailure, (test, (AssertionError, AssertionError("\n".join(notes)), None))))
        for method, args in held:
            method(*args)
        if notes and status == "failed":
            self._note(test, "\n".join(notes))
        super().stopTest(test)

    def stopTestRun(self) -> None:
        # (before unittest prints the errors and counts: the end's error is among them)
        self._ending = True
        if not self._interrupted:  # (an interrupted rank leaves at once; its peers know)
            leave_together(self.agreement, self, self._end_limit, self._holds_store)
        super().stopTestRun()

    def _note(self, test: Any, note: str) -> None:
        """Add ``note`` to this rank's own report of ``test`` (its first failure or error)."""
        for entries in (self.failures, self.errors):
            for i, (case, text) in enumerate(entries):
                if case is test:
                    entries[i] = (case, f"{text}\n{note}\n")
                    return


def _judged_skipped(said: dict[int, dict[str, Any]], world: int) -> bool:
    """Whether the core's verdict (:func:`~disttest._runner.verdict.explain`,
    :func:`~disttest._runner.verdict.judge`) on what the ranks ``said`` of a
    test is a skip: a rank skipped, and the others passed or failed only in
    communication, its consequence."""
    outcomes = {r: Outcome(r, Kind.SKIPPED, message=v["why"]) if v["status"] == "skipped"
                else Outcome(r, Kind.ERRORED, comm="communication" if v.get("comm") else "")
                if v["status"] == "failed" else Outcome(r, Kind.PASSED) for r, v in said.items()}
    return judge(list(explain(outcomes, world, {}, {}).values())).status is Status.SKIPPED


def _exit_unstopped(test: str, stop: float, who_: str) -> None:
    """In a timer thread: the rank's test did not stop; say so, print every
    thread's stack and exit (``os._exit``: nothing of the test may run on)."""
    fd = _stderr_fd()
    with contextlib.suppress(OSError):
        os.write(fd, ("\n" + UNSTOPPED.format(test=test, who=who_, after=EXIT_AFTER, stop=stop,
                                              code=UNSTOPPED_EXIT_CODE) + "\n").encode())
        faulthandler.dump_traceback(file=fd, all_threads=True)
    os._exit(UNSTOPPED_EXIT_CODE)


def peers_gone(cls: type) -> str | None:
    """Why the class's next test cannot run here (a peer is gone), or None."""
    agreement = getattr(cls, "_launched", None)
    if agreement is None or not agreement.gone:
        return None
    return PEERS_GONE_BEFORE.format(gone="; ".join(agreement.gone[r] for r in sorted(agreement.gone)))


@contextlib.contextmanager
def skipping(cls: type, reason: str) -> Iterator[None]:
    """While the block runs, unittest skips every test of ``cls`` for ``reason``."""
    before = {name: cls.__dict__[name] for name in ("__unittest_skip__", "__unittest_skip_why__")
              if name in cls.__dict__}
    cls.__unittest_skip__, cls.__unittest_skip_why__ = True, reason  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name in ("__unittest_skip__", "__unittest_skip_why__"):
            if name in before:
                setattr(cls, name, before[name])
            else:
                delattr(cls, name)


@contextlib.contextmanager
def run_folder() -> Iterator[None]:
    """A folder for this rank's run (where :func:`~disttest.rank_temp_file`
    makes its file), removed at the end, and by the janitor's reaper however
    this process ends (a launcher's SIGTERM, ``os._exit``)."""
    folder = tempfile.mkdtemp(prefix="disttest-launched-")
    token = janitor.register(functools.partial(shutil.rmtree, folder, True), paths=[folder])
    previous = tempdirs.use_run_folder(folder)
    try:
        yield
    finally:
        tempdirs.use_run_folder(previous)
        shutil.rmtree(folder, ignore_errors=True)
        janitor.unregister(token)


def leave_together(agreement: Agreement, result: unittest.TestResult, limit: float, holds_store: bool) -> None:
    """Wait (up to ``limit``) for every live peer to reach the end of the
    class's tests; an error in ``result`` names those that did not. The rank
    that holds the store (``holds_store``) waits for the others to be done
    with it, briefly, before it returns and the store goes."""
    agreement.say("end", {})
    _, silent = agreement.hear("end", limit)
    if silent:
        error = RuntimeError(PEERS_NOT_AT_END.format(who=who(silent, agreement.world_size),
                                                     cls=agreement.cls.__qualname__, limit=limit))
        result.addError(cast(Any, _TheEnd(agreement.cls)), cast(Any, (RuntimeError, error, None)))
    agreement.say("done", {})
    if holds_store:
        agreement.hear("done", AGREE_MARGIN)


class _TheEnd:
    """The end of a class's run under a launcher, as a result's entry."""

    failureException = AssertionError

    def __init__(self, cls: type) -> None:
        self._name = f"{cls.__module__}.{cls.__qualname__}: the end of run_rank"

    def id(self) -> str:
        return self._name

    def __str__(self) -> str:
        return self._name

    def shortDescription(self) -> None:
        return None
