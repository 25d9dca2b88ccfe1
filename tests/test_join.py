"""The one join loop (disttest._runner.join) against a launcher stand-in:
what it asks a launcher, and how often."""

from __future__ import annotations

import time
import unittest

from disttest._runner import join as join_mod
from disttest._runner.board import InFlight
from disttest._runner.outcome import ExitStatus, Kind, Outcome, outcome_from_exception
from disttest._runner.verdict import DESYNC_DETAIL, MISMATCH_DETAIL, WAITED_FOR


class SlowBoardLauncher:
    """Two ranks: rank 0 passes at once, rank 1 after ``until`` seconds; its
    desync check takes ``cost`` seconds (a board of a thousand thread ranks)."""

    world_size = 2

    def __init__(self, until: float, cost: float) -> None:
        self.end = time.monotonic() + until
        self.cost = cost
        self.checks = 0
        self.outcomes = {0: outcome_from_exception(0, None)}

    def poll(self) -> dict[int, ExitStatus]:
        if time.monotonic() >= self.end:
            self.outcomes[1] = outcome_from_exception(1, None)
        return dict.fromkeys(self.outcomes, ExitStatus(code=0))

    def outcome(self, rank: int) -> Outcome | None:
        return self.outcomes.get(rank)

    def output(self, rank: int) -> str:
        return ""

    def desync(self, ranks, finished, ended=False, entered_counts=True):
        self.checks += 1
        time.sleep(self.cost)
        return []

    def dump_stacks(self, ranks):
        return {}

    def stop(self) -> None:
        pass

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def pump_output(self, final: bool = False) -> None:
        pass


class JoinTest(unittest.TestCase):
    def test_a_costly_desync_check_takes_a_bounded_share_of_the_time(self):
        # Issue 26: with 1024 thread ranks the check ran at every 10 ms poll
        # and took the GIL from the ranks most of the time.
        launcher = SlowBoardLauncher(until=0.6, cost=0.03)
        outcomes = join_mod.join(launcher, timeout=30)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "PASSED"])
        # Unbounded: 0.6 s / (30 ms + 10 ms poll) = 15 checks; bounded: one
        # per 30 ms check + 9 x 30 ms wait.
        self.assertLessEqual(launcher.checks, 4)
        self.assertGreaterEqual(launcher.checks, 2)

    def test_a_cheap_check_runs_at_every_poll(self):
        launcher = SlowBoardLauncher(until=0.3, cost=0.0)
        join_mod.join(launcher, timeout=30)
        self.assertGreaterEqual(launcher.checks, 10)  # 0.3 s / 10 ms polls, less scheduling noise

    def test_ranks_that_passed_are_judged_once_per_new_fact(self):
        # A poll that brings no new outcome does not judge again: each
        # judgement reads every rank, and the polls of a thousand thread
        # ranks share the GIL with them.
        from unittest import mock

        launcher = SlowBoardLauncher(until=0.3, cost=0.0)
        with mock.patch.object(join_mod, "explain", wraps=join_mod.explain) as explain:
            outcomes = join_mod.join(launcher, timeout=30)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "PASSED"])
        # rank 0's pass, rank 1's, and the final judgement: not one per poll (about 30)
        self.assertEqual(explain.call_count, 3)

    def test_an_errored_rank_is_judged_at_every_poll(self):
        # Its judgement also reads the board (a collective it died in), which
        # changes without a new outcome.
        from unittest import mock

        launcher = SlowBoardLauncher(until=0.3, cost=0.0)
        launcher.outcomes[0] = outcome_from_exception(0, RuntimeError("boom"))
        with mock.patch.object(join_mod, "explain", wraps=join_mod.explain) as explain:
            join_mod.join(launcher, timeout=30, expected_end=lambda rank: True)
        self.assertGreater(explain.call_count, 5)


class PassedWhileStoppedTest(unittest.TestCase):
    def test_a_rank_that_passes_while_its_stack_is_taken_timed_out(self):
        # It was still running at the limit; taking the stacks takes a second
        # or two, and its pass then was counted (a 1.1 s test passed a 1 s limit).
        class PassesDuringTheDump(SlowBoardLauncher):
            def dump_stacks(self, ranks):
                self.outcomes[1] = outcome_from_exception(1, None)
                return dict.fromkeys(ranks, "stack")

        outcomes = join_mod.join(PassesDuringTheDump(until=3600, cost=0.0), timeout=0.2)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "TIMED_OUT"])
        self.assertEqual(outcomes[1].stacks, "stack")

    def test_a_pass_that_came_before_the_limit_is_read_before_the_stop(self):
        # A process rank's answer waits in its socket until a poll reads it:
        # one that came while the last check ran is a pass.
        class AnswersOnPoll(SlowBoardLauncher):
            def __init__(self) -> None:
                super().__init__(until=3600, cost=0.0)
                self.polls = 0
                self.at_limit = False

            def poll(self):
                if self.at_limit:
                    self.outcomes[1] = outcome_from_exception(1, None)
                return {0: ExitStatus(code=0)}

            def desync(self, ranks, finished, ended=False, entered_counts=True):
                return []

            def dump_stacks(self, ranks):
                return {}

        launcher = AnswersOnPoll()
        original = join_mod._timed_out

        def at_the_limit(*args):
            launcher.at_limit = True  # (its answer arrives just now, unread)
            return original(*args)

        from unittest import mock

        with mock.patch.object(join_mod, "_timed_out", at_the_limit):
            outcomes = join_mod.join(launcher, timeout=0.2)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "PASSED"])


class StartUpTest(unittest.TestCase):
    """A start-up (a spawned interpreter's) that the test's limit does not count."""

    def test_the_limit_counts_from_the_last_ranks_start(self):
        # Rank 1 starts after 0.5 s and ends 0.6 s later; the test's limit is 0.8 s.
        launcher = SlowBoardLauncher(until=1.1, cost=0.0)
        starts = time.monotonic() + 0.5
        start_up = join_mod.StartUp(lambda: [0, 1] if time.monotonic() >= starts else [0], limit=30)
        outcomes = join_mod.join(launcher, timeout=0.8, start_up=start_up)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "PASSED"])

    def test_a_rank_that_never_starts_times_out_in_its_start_up(self):
        launcher = SlowBoardLauncher(until=3600, cost=0.0)
        began = time.monotonic()
        outcomes = join_mod.join(launcher, timeout=30, test="test_x",
                                 start_up=join_mod.StartUp(lambda: [0], limit=0.4))
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "TIMED_OUT"])
        self.assertTrue(outcomes[1].detail.startswith("{who} had not started 'test_x' 0.4s after"), outcomes[1].detail)

    def test_an_outer_cap_bounds_the_start_up_and_the_test_together(self):
        # Started after 0.5 s, the test's 30 s limit would end at 30.5 s; the
        # cap (pytest-timeout's share) ends the whole join at 1 s.
        launcher = SlowBoardLauncher(until=3600, cost=0.0)
        starts = time.monotonic() + 0.5
        began = time.monotonic()
        start_up = join_mod.StartUp(lambda: [0, 1] if time.monotonic() >= starts else [0], limit=30, cap=1.0)
        outcomes = join_mod.join(launcher, timeout=30, start_up=start_up)
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual(outcomes[1].kind.name, "TIMED_OUT")
        self.assertEqual(outcomes[1].detail, "")  # it had started: the test's own time out
        # What the test had once started (the report names it, not the 30 s it was not given).
        assert start_up.given is not None
        self.assertGreaterEqual(start_up.given, 0.1)
        self.assertLessEqual(start_up.given, 0.5)


class FailingLauncher(SlowBoardLauncher):
    """Rank 0 fails at once; rank 1 never ends by itself, and its board says
    it waits in a collective rank 0 never entered (``stuck``) or not."""

    def __init__(self, stuck: bool) -> None:
        super().__init__(until=3600, cost=0.0)
        self.stuck = stuck
        self.outcomes = {0: outcome_from_exception(0, AssertionError("rank 0 is wrong"))}
        self.stopped = False

    def poll(self) -> dict[int, ExitStatus]:
        return dict.fromkeys(self.outcomes, ExitStatus(code=1))

    def desync(self, ranks, finished, ended=False, entered_counts=True):
        from disttest._runner.board import InFlight

        if self.stuck and 1 in ranks and 0 in finished:
            return [(0, InFlight(1, "all_gather", 2, "world", range(2)))]
        return []

    def stop(self) -> None:
        self.stopped = True


class TimedOutTest(unittest.TestCase):
    """At the deadline: who hung, and who only waited for it."""

    def launcher(self, waits):
        class Waiting:
            world_size = 3

            def desync(self, ranks, finished, ended=False, entered_counts=True):
                return [(peer, InFlight(rank, "barrier", 1, "world", range(3))) for rank, peer in waits]

        return Waiting()

    def test_ranks_waiting_for_a_rank_that_never_entered_are_its_consequence(self):
        kinds, details = join_mod._timed_out(self.launcher([(0, 2), (1, 2)]), [0, 1, 2], 3, [])
        self.assertEqual(kinds, {0: Kind.STOPPED, 1: Kind.STOPPED, 2: Kind.TIMED_OUT})
        self.assertEqual(details[0], WAITED_FOR.format(what="barrier #1 of group world", peer=2, world=3))

    def test_ranks_that_wait_for_each_other_all_time_out(self):
        kinds, details = join_mod._timed_out(self.launcher([(0, 1), (1, 0)]), [0, 1, 2], 3, [])
        self.assertEqual(kinds, dict.fromkeys(range(3), Kind.TIMED_OUT))
        self.assertEqual(details, {})


class MismatchAtTheLimitTest(unittest.TestCase):
    """At the deadline, a rank waits in a collective that a peer which
    finished had entered (their calls differed), or never entered."""

    def launcher(self, entered):
        flight = InFlight(1, "all_reduce", 1, "default", range(2))

        class Waiting:
            world_size = 2

            def desync(self, ranks, finished, ended=False, entered_counts=True):
                if 1 not in ranks or 0 not in finished or (entered and entered_counts):
                    return []
                return [(0, flight)]

        return Waiting()

    def test_calls_that_differ(self):
        kinds, details = join_mod._timed_out(self.launcher(entered=True), [1], 2, [0])
        self.assertEqual(kinds, {1: Kind.DESYNC})
        self.assertEqual(details[1], MISMATCH_DETAIL.format(peer=0, world=2, what="all_reduce #1 of the default group"))

    def test_a_collective_the_peer_never_entered(self):
        kinds, details = join_mod._timed_out(self.launcher(entered=False), [1], 2, [0])
        self.assertEqual(kinds, {1: Kind.DESYNC})
        self.assertEqual(details[1], DESYNC_DETAIL.format(peer=0, world=2, what="all_reduce #1 of the default group"))

    def test_without_a_finished_peer_it_timed_out(self):
        self.assertEqual(join_mod._timed_out(self.launcher(entered=True), [1], 2, []), ({1: Kind.TIMED_OUT}, {}))


class DeadlockLauncher(SlowBoardLauncher):
    """Two live ranks in a deadlock whose first call raises by itself at
    ``ends`` (a ``time.time()``; None: never); each rank then ends with that
    error."""

    def __init__(self, ends: float | None) -> None:
        super().__init__(until=3600, cost=0.0)
        self.ends = ends
        self.outcomes = {}
        self.stopped = False

    def poll(self) -> dict[int, ExitStatus]:
        if self.ends is not None and time.time() >= self.ends:
            self.outcomes = {r: outcome_from_exception(r, RuntimeError("timed out in recv")) for r in range(2)}
        return dict.fromkeys(self.outcomes, ExitStatus(code=1))

    def desync(self, ranks, finished, ended=False, entered_counts=True):
        if ended:  # (the errors' judgement: no desync)
            return []
        calls = ((0, "recv #1 from rank 1"), (1, "recv #1 from rank 0"))
        return [(1 - r, InFlight(r, "recv", 1, f"recv<{1 - r}", [1 - r], against=calls[1 - r][1], cycle=calls,
                                 ends=self.ends)) for r in ranks]

    def stop(self) -> None:
        self.stopped = True


class RaisingLauncher(SlowBoardLauncher):
    """Rank 0 passes at once; rank 1 is seen in a collective rank 0 never
    entered (``ends``: when its group's timeout raises it) and ends with an
    error after ``until`` seconds."""

    def __init__(self, until: float, ends: float | None = None) -> None:
        super().__init__(until=until, cost=0.0)
        self.ends = ends

    def poll(self) -> dict[int, ExitStatus]:
        if time.monotonic() >= self.end:
            self.outcomes[1] = outcome_from_exception(1, RuntimeError("invalid root rank: 5"))
        return {r: ExitStatus(code=0 if r == 0 else 10) for r in self.outcomes}

    def desync(self, ranks, finished, ended=False, entered_counts=True):
        if ended or 1 in self.outcomes:
            return []
        return [(0, InFlight(1, "broadcast", 1, "0", range(2), ends=self.ends))]


class DesyncConfirmedTest(unittest.TestCase):
    def test_a_rank_seen_in_a_call_it_then_raises_from_is_no_desync(self):
        # A call torch refuses shows as entered for a moment (after a first
        # use's warning, milliseconds): the rank's own error, not a desync.
        outcomes = join_mod.join(RaisingLauncher(until=join_mod.CONFIRM / 3), timeout=30)
        self.assertEqual([o.kind for o in outcomes], [Kind.PASSED, Kind.ERRORED])

    def test_a_desync_found_again_is_reported(self):
        start = time.monotonic()
        outcomes = join_mod.join(RaisingLauncher(until=3600), timeout=30)
        self.assertEqual([o.kind for o in outcomes], [Kind.PASSED, Kind.DESYNC])
        self.assertLess(time.monotonic() - start, 5)

    def test_a_desync_whose_call_raises_by_itself_before_the_limit_is_left_to_raise(self):
        # (a short group timeout the test expects: conformance's rejected calls)
        outcomes = join_mod.join(RaisingLauncher(until=0.5, ends=time.time() + 0.5), timeout=30)
        self.assertEqual([o.kind for o in outcomes], [Kind.PASSED, Kind.ERRORED])
        outcomes = join_mod.join(RaisingLauncher(until=3600, ends=time.time() + 120), timeout=30)
        self.assertEqual([o.kind for o in outcomes], [Kind.PASSED, Kind.DESYNC])


class LateWaiterLauncher(SlowBoardLauncher):
    """Three ranks: rank 1 passes at once; rank 0 waits from the start in a
    collective rank 1 never entered, rank 2 enters it ``late`` seconds later."""

    world_size = 3

    def __init__(self, late: float) -> None:
        super().__init__(until=3600, cost=0.0)
        self.outcomes = {1: outcome_from_exception(1, None)}
        self.entered_2 = time.monotonic() + late

    def poll(self) -> dict[int, ExitStatus]:
        return dict.fromkeys(self.outcomes, ExitStatus(code=0))

    def desync(self, ranks, finished, ended=False, entered_counts=True):
        if ended or 1 not in finished:
            return []
        waiting = [0] + ([2] if time.monotonic() >= self.entered_2 else [])
        return [(1, InFlight(r, "all_reduce", 1, "0", range(3))) for r in ranks if r in waiting]


class DesyncAlongsideTest(unittest.TestCase):
    def test_a_rank_that_entered_the_collective_a_moment_later_is_named_with_the_others(self):
        # (it was "stopped by disttest after the failure above", though it
        # waited in the same collective for the same peer: a pool under pytest)
        outcomes = join_mod.join(LateWaiterLauncher(late=join_mod.CONFIRM * 0.8), timeout=30)
        self.assertEqual([o.kind for o in outcomes], [Kind.DESYNC, Kind.PASSED, Kind.DESYNC])
        self.assertEqual(outcomes[0].detail, outcomes[2].detail)


class DeadlockTest(unittest.TestCase):
    def test_a_deadlock_that_never_ends_by_itself_is_reported_at_once(self):
        outcomes = join_mod.join(DeadlockLauncher(ends=None), timeout=60)
        self.assertEqual([o.kind for o in outcomes], [Kind.DEADLOCK, Kind.DEADLOCK])
        self.assertEqual(outcomes[0].detail, "ranks 0, 1/2 wait for each other in calls that cannot match: "
                                             "rank 0/2 in recv #1 from rank 1, rank 1/2 in recv #1 from rank 0")

    def test_a_call_that_raises_by_itself_before_the_limit_is_left_to_raise(self):
        # A group timeout the test may expect (assertRaises around the recv).
        launcher = DeadlockLauncher(ends=time.time() + 0.5)
        outcomes = join_mod.join(launcher, timeout=60)
        self.assertEqual([o.kind for o in outcomes], [Kind.ERRORED, Kind.ERRORED])
        # Its timeout past the test's limit: the deadlock is reported.
        outcomes = join_mod.join(DeadlockLauncher(ends=time.time() + 120), timeout=60)
        self.assertEqual([o.kind for o in outcomes], [Kind.DEADLOCK, Kind.DEADLOCK])


class FailFastTest(unittest.TestCase):
    def test_peers_stuck_behind_a_failure_are_stopped_without_the_grace(self):
        # Rank 1 waits where rank 0, which failed, never comes: waiting the
        # grace out (here 30 s) could bring nothing new.
        from unittest import mock

        launcher = FailingLauncher(stuck=True)
        start = time.monotonic()
        with mock.patch.object(join_mod, "FAIL_GRACE", 30):
            outcomes = join_mod.join(launcher, timeout=60)
        self.assertLess(time.monotonic() - start, 10)
        self.assertTrue(launcher.stopped)
        self.assertEqual([o.kind.name for o in outcomes], ["FAILED", "STOPPED"])

    def test_a_peer_that_may_still_act_gets_the_grace(self):
        from unittest import mock

        launcher = FailingLauncher(stuck=False)
        start = time.monotonic()
        with mock.patch.object(join_mod, "FAIL_GRACE", 0.4):
            join_mod.join(launcher, timeout=60)
        self.assertGreaterEqual(time.monotonic() - start, 0.4)
        self.assertTrue(launcher.stopped)

    def test_a_peer_stuck_behind_a_pass_is_a_desync_not_stopped(self):
        # Rank 1 fails; rank 0 passed without entering the subgroup
        # collective ({0, 2}) rank 2 waits in: two causes, and the end of the
        # grace must not report rank 2 as merely stopped.
        from unittest import mock

        from disttest._runner.board import InFlight

        class Launcher(FailingLauncher):
            world_size = 3

            def __init__(self) -> None:
                super().__init__(stuck=False)
                self.outcomes = {0: outcome_from_exception(0, None),
                                 1: outcome_from_exception(1, AssertionError("rank 1 is wrong"))}

            def poll(self) -> dict[int, ExitStatus]:
                return {r: ExitStatus(code=int(r == 1)) for r in self.outcomes}

            def desync(self, ranks, finished, ended=False, entered_counts=True):
                if 2 in ranks and 0 in finished:
                    return [(0, InFlight(2, "all_reduce", 1, "sub", (0, 2)))]
                return []

        with mock.patch.object(join_mod, "FAIL_GRACE", 30):
            outcomes = join_mod.join(Launcher(), timeout=60)
        self.assertEqual([o.kind.name for o in outcomes], ["PASSED", "FAILED", "DESYNC"])
        self.assertIn("rank 0/3 finished", outcomes[2].detail)

    def test_the_grace_asks_a_costly_board_a_bounded_share_of_the_time(self):
        # With a thousand thread ranks a desync check is costly, and during
        # the grace the ranks that may still report their own failure share
        # the GIL with it: it is asked no more often than outside the grace.
        from unittest import mock

        launcher = FailingLauncher(stuck=False)
        launcher.cost = 0.03
        calls = []
        desync = launcher.desync

        def costly(*args, **kwargs):
            calls.append(args)
            time.sleep(launcher.cost)
            return desync(*args, **kwargs)

        launcher.desync = costly
        with mock.patch.object(join_mod, "FAIL_GRACE", 0.6):
            join_mod.join(launcher, timeout=60)
        # At every 10 ms poll: 0.6 s / (30 ms + 10 ms) = 15 or more; bounded:
        # one per 30 ms check and 9 x 30 ms wait (and the final judgement's).
        self.assertLessEqual(len(calls), 6)


if __name__ == "__main__":
    unittest.main()
