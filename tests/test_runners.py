"""Every runner behaviour, written once, run under every runner."""

from __future__ import annotations

import os
import time
import unittest
import warnings
from unittest import mock

import runner_cases as cases

import disttest
from disttest import RankError, RankFailure
from disttest._runner.verdict import WAITED_FOR
from disttest.runners.multiprocess import START_METHOD_ENV

#: The deadlock tests below judge waits settled after 1 s, not 5 (the
#: parent's join loop reads the constant; tests/test_progress.py pins the
#: rule with the real one): each runner's case ends 4 s sooner.
_settling_sooner = mock.patch("disttest._runner.progress.P2P_SETTLE", 1.0)


def run(cls: type[unittest.TestCase], name: str) -> tuple[unittest.TestResult, float]:
    result = unittest.TestResult()
    start = time.monotonic()
    try:
        cls(name).run(result)
    finally:
        if issubclass(cls, disttest.MultiProcContinousTest):
            cls.tearDownClass()  # one pool per behaviour: no state between them
    return result, time.monotonic() - start


class _Sub:
    """The runner, usable as ``with runner:`` to enter its subTest."""

    def __init__(self, test: unittest.TestCase, runner: type) -> None:
        self.runner = runner
        self._cm = test.subTest(runner=runner.__name__)

    def __enter__(self):
        return self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class BehaviourTest(unittest.TestCase):
    def tearDown(self):
        deadline = time.monotonic() + 5
        while cases.live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(cases.live_ranks(), [], "a rank outlived its test")

    def each(self, name, runners=cases.RUNNERS):
        """Run the body ``name`` under each of ``runners``; yield (runner,
        result, seconds), each inside a subTest."""
        # NB: the subTest must be entered by the caller's loop body, not held
        # open across a yield: a suspended generator inside subTest would be
        # closed later by the garbage collector, after the test has ended.
        for runner in runners:
            result, elapsed = run(runner, name)
            yield _Sub(self, runner), result, elapsed

    def only(self, entries):
        self.assertEqual(len(entries), 1, entries)
        return entries[0][1]

    def test_pass(self):
        for sub, result, _ in self.each("test_pass"):
            with sub:
                self.assertEqual(result.errors + result.failures + result.skipped, [])
                self.assertEqual(result.testsRun, 1)

    def test_assertion_in_one_rank_is_a_failure(self):
        for sub, result, _ in self.each("test_assertion_in_rank_1"):
            with sub:
                text = self.only(result.failures)
                self.assertEqual(result.errors, [])
                self.assertIn("'test_assertion_in_rank_1' failed (disttest): rank 1/2 raised AssertionError", text)
                self.assertIn("Mismatched elements: 1 / 2", text)
                self.assertIn('runner_cases.py", line', text)  # the rank's own traceback

    def test_exception_in_one_rank_is_an_error(self):
        for sub, result, _ in self.each("test_exception_in_rank_1"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/2: ValueError: boom in rank 1", text)
                self.assertIn('raise ValueError(f"boom in rank {self.rank}")', text)

    def test_skiptest_is_a_skip(self):
        for sub, result, _ in self.each("test_skiptest"):
            with sub:
                self.assertEqual(self.only(result.skipped), "not today")

    def test_skip_exit_code_in_one_rank_is_a_skip(self):
        for sub, result, _ in self.each("test_skip_exit_code_in_one_rank"):
            with sub:
                self.assertEqual(self.only(result.skipped), "Need at least 2 CUDA devices")

    def test_a_ranks_own_error_in_torch_is_not_hidden_by_a_peers_skip(self):
        # (an error out of torch.distributed's code was taken for
        # communication, the consequence of rank 0's skip: reported skipped)
        for sub, result, _ in self.each("test_own_error_in_torch_beside_a_skip"):
            with sub:
                self.assertEqual((len(result.errors), len(result.skipped)), (1, 0), result.skipped)
                self.assertIn("pickle", result.errors[0][1])

    def test_a_world_size_check_sees_the_size_the_ranks_get(self):
        # (the parent's check read the class's world_size, 2, and skipped a
        # test that runs with 8 ranks: "Skipped due to small world size")
        for sub, result, _ in self.each("test_size_checks_see_the_ranks_size"):
            with sub:
                self.assertEqual((result.testsRun, result.skipped, result.failures, result.errors), (1, [], [], []))

    def test_a_wait_of_torch_distributed_beyond_c10d_that_a_skip_broke_is_its_consequence(self):
        # (DDP's construction waits on its peers from torch.distributed.utils:
        # its "Connection closed by peer" must stay the skip's consequence)
        for sub, result, _ in self.each("test_ddp_after_a_peer_skips"):
            with sub:
                self.assertEqual(self.only(result.skipped), "rank 0 skips")

    def test_an_exit_code_of_the_suites_own_test_skips_entry_is_a_skip(self):
        # (the map from exit codes was made at import: the suite's entries were errors)
        self.addCleanup(disttest.TEST_SKIPS.pop, cases.SUITE_SKIP_KEY, None)
        for sub, result, _ in self.each("test_suite_own_skip_exit_code"):
            with sub:
                self.assertEqual(self.only(result.skipped), "the suite's own skip reason")

    def test_skip_decorator_is_decided_before_starting_ranks(self):
        starts = {cases.ProcessRunner: "_start_processes", cases.ThreadRunner: "_run",
                  cases.PoolRunner: "_ensure_pool"}
        for runner in cases.RUNNERS:
            start = starts[runner]
            with self.subTest(runner=runner.__name__), mock.patch.object(runner, start) as started:
                result, _ = run(runner, "test_skip_decorator")
                started.assert_not_called()
                self.assertEqual(self.only(result.skipped), "Need at least 2 CUDA devices")

    def test_identical_tracebacks_are_grouped(self):
        for sub, result, _ in self.each("test_wide_identical_failures"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("ranks 1, 2, 3/4: KeyError: 'same everywhere'", text)
                for rank in (1, 2, 3):
                    self.assertNotIn(f"rank {rank}/4: KeyError", text)

    def test_mixed_ranks_name_every_cause(self):
        for sub, result, _ in self.each("test_wide_mixed"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/4: AssertionError: False is not true : rank 1 asserts", text)
                self.assertIn("rank 2/4: OSError: rank 2 raises", text)

    def test_every_rank_counts(self):
        for sub, result, _ in self.each("test_wide_last_rank_fails"):
            with sub:
                self.assertIn("rank 3/4: AssertionError: only the last rank", self.only(result.failures))

    def test_fail_fast_while_a_peer_waits(self):
        for sub, result, elapsed in self.each("test_fail_fast_while_peer_waits"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/2: RuntimeError: early failure", text)
                self.assertLess(elapsed, 6, "the waiting rank held the test")

    def test_an_assertion_while_peers_wait_is_the_one_cause(self):
        # Issue 24: the peers' broken collectives are consequences and the
        # test a FAIL naming rank 2, in every run (more runs, under load:
        # benchmarks/verdicts.py).
        for body in ("test_wide_assert_while_peers_gather", "test_wide_assert_while_peers_reduce"):
            for _ in range(2):
                for sub, result, _ in self.each(body):
                    with sub:
                        self.assertEqual(result.errors, [])
                        text = self.only(result.failures)
                        header = f"{body!r} failed (disttest): "
                        self.assertIn(header + "rank 2/4 raised AssertionError\n", text)

    def test_a_failing_subtest_is_named_and_ends_the_test(self):
        for sub, result, elapsed in self.each("test_subtest_fails_in_rank_1"):
            with sub:
                text = self.only(result.failures)
                self.assertIn("'test_subtest_fails_in_rank_1' failed (disttest): rank 1/2 raised AssertionError "
                              "in test (i=1)\n", text)
                self.assertIn("rank 1 fails i=1", text)
                self.assertNotIn("timed out", text)
                self.assertLess(elapsed, 15, "ranks went on out of step to the timeout")
        for sub, result, _ in self.each("test_subtests_fail_alike"):
            with sub:
                text = self.only(result.failures)
                self.assertIn("ranks 0, 1/2 raised AssertionError in test (step=10, i=1, kind='same')\n", text)
                self.assertNotIn("i=2", text)
        # As under unittest: code around a subTest cannot swallow its failure,
        # and a skipped subTest does not skip the rest of the test.
        for body, header in (("test_subtest_failure_caught_by_the_test", "rank 1/2 raised AssertionError in test (i=0)"),
                             ("test_caught_subtest_failure_then_exit_0", "rank 1/2 raised AssertionError in test (i=0)"),
                             ("test_subtest_skipped_then_fails", "ranks 0, 1/2 raised AssertionError in test (i=1)"),
                             ("test_nested_subtest_fails_in_rank_1",
                              "rank 1/2 raised AssertionError in test (step=1, i=1)")):
            for sub, result, elapsed in self.each(body):
                with sub:
                    self.assertEqual(result.skipped, [])
                    self.assertIn(f"{body!r} failed (disttest): {header}\n", self.only(result.failures))
                    self.assertLess(elapsed, 15, "ranks went on out of step to the timeout")
        # A subTest one rank skipped does not make its peers' desync a skip
        # (the rank ran on: it left no peer waiting by skipping the test).
        for sub, result, elapsed in self.each("test_subtest_skipped_on_one_rank_then_desync"):
            with sub:
                self.assertEqual(result.skipped, [])
                self.assertIn("errored (disttest): desync: rank 1/2 finished; rank 0/2 waits in all_reduce #2",
                              self.only(result.errors))
                self.assertLess(elapsed, 15)
        for sub, result, _ in self.each("test_do_cleanups_in_the_test"):
            with sub:
                self.assertEqual(result.errors + result.failures, [])

    def test_cleanups_a_rank_registers_run_in_the_rank(self):
        # All of them, last first, also after one that fails; the failure is
        # the rank's, in phase cleanup (a failing cleanup passed silently in
        # fresh processes and threads: their ranks never ran cleanups).
        for sub, result, _ in self.each("test_cleanup_in_rank_1_fails"):
            with sub:
                text = self.only(result.failures)
                self.assertIn("'test_cleanup_in_rank_1_fails' failed (disttest): rank 1/2 raised AssertionError "
                              "in cleanup\n", text)
                self.assertIn("rank 1/2 in cleanup: AssertionError: rank 1's cleanup fails\n", text)
                self.assertIn("in fails\n", text)  # the cleanup's own frame
                self.assertNotIn("disttest/", text)
                self.assertNotIn("wrong order", text)
        for sub, result, _ in self.each("test_fails_then_cleanup_fails"):
            with sub:
                text = self.only(result.failures)
                self.assertIn("ranks 0, 1/2 raised AssertionError\n", text)
                # (with the cleanup's message: it was the type alone)
                self.assertIn("rank 1/2: AssertionError: rank 1's test fails\n(then also raised in cleanup: "
                              "AssertionError: the cleanup fails too)\n", text)

    @_settling_sooner
    def test_p2p_calls_that_cannot_match_end_the_test_promptly(self):
        # The threaded group's send is buffered (as a small gloo send may be):
        # its sender finishes, and the receiver waits for a tag never sent.
        for sub, result, elapsed in self.each("test_p2p_tags_differ"):
            with sub:
                text = self.only(result.errors)
                if sub.runner is cases.ThreadRunner:
                    self.assertIn("desync: rank 0/2 finished; rank 1/2 waits in recv #1 from rank 0 (tag 2)", text)
                else:
                    self.assertIn("deadlock: ranks 0, 1/2 wait for each other in calls that cannot match: "
                                  "rank 0/2 in send #1 to rank 1 (tag 1), rank 1/2 in recv #1 from rank 0 (tag 2)",
                                  text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")
        for sub, result, elapsed in self.each("test_both_receive"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("'test_both_receive' errored (disttest): deadlock: ranks 0, 1/2 wait for each other in "
                              "calls that cannot match: rank 0/2 in recv #1 from rank 1, rank 1/2 in recv #1 from "
                              "rank 0\n", text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    @_settling_sooner
    def test_receives_from_any_rank_that_nobody_sends_end_the_test_promptly(self):
        for sub, result, elapsed in self.each("test_both_receive_from_any_rank"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("'test_both_receive_from_any_rank' errored (disttest): deadlock: ranks 0, 1/2 wait for "
                              "each other in calls that cannot match: ranks 0, 1/2 in recv #1 from any rank\n", text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    @_settling_sooner
    def test_waits_on_requests_that_cannot_complete_end_the_test_promptly(self):
        for sub, result, elapsed in self.each("test_both_wait_on_irecv"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("'test_both_wait_on_irecv' errored (disttest): deadlock: ranks 0, 1/2 wait for each "
                              "other in calls that cannot match: rank 0/2 in irecv #1 from rank 1, rank 1/2 in irecv "
                              "#1 from rank 0\n", text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    @_settling_sooner
    def test_a_cycle_of_waits_ends_the_test_promptly(self):
        # Three ranks, and a collective among the calls: each waits for the next.
        for sub, result, elapsed in self.each("test_wide_cycle_of_waits"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("'test_wide_cycle_of_waits' errored (disttest): deadlock: ranks 0, 1, 2/4 wait for each "
                              "other in calls that cannot match: rank 0/4 in recv #1 from rank 1, rank 1/4 in recv #1 "
                              "from rank 2, rank 2/4 in barrier #1 of the default group\n", text)
                # Each call's stack, with the ranks it is of.
                self.assertIn("the stack of ranks 0, 1/4:", text)
                self.assertIn("the stack of rank 2/4:", text)
                self.assertNotIn("timed out", text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    @_settling_sooner
    def test_ranks_in_different_collectives_end_the_test_promptly(self):
        # (under futures: a wait on a call's future is a wait in the call)
        for name in ("test_collectives_differ", "test_collectives_differ_under_futures"):
            for sub, result, elapsed in self.each(name):
                with sub:
                    text = self.only(result.errors)
                    if sub.runner is cases.ThreadRunner:  # the threaded group compares the calls itself
                        self.assertIn("collective #1 on group 0 does not match across ranks (disttest): rank 0 "
                                      "called all_reduce; rank 1 called broadcast", text)
                    else:
                        self.assertIn(f"'{name}' errored (disttest): deadlock: ranks 0, 1/2 wait for each other in "
                                      "calls that cannot match: rank 0/2 in all_reduce #1 of the default group, "
                                      "rank 1/2 in broadcast #1 of the default group from rank 0\n", text)
                    self.assertNotIn("timed out", text)
                    self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    @_settling_sooner
    def test_asynchronous_broadcasts_from_different_roots_end_the_test_promptly(self):
        # An asynchronous call keeps its root for the wait on its Work.
        for sub, result, elapsed in self.each("test_async_roots_differ"):
            with sub:
                text = self.only(result.errors)
                if sub.runner is cases.ThreadRunner:
                    self.assertIn("broadcast #1 on group 0: ranks pass different src (disttest): rank 0 passed "
                                  "src=0; rank 1 passed src=1", text)
                else:
                    self.assertIn("'test_async_roots_differ' errored (disttest): deadlock: ranks 0, 1/2 wait for "
                                  "each other in calls that cannot match: rank 0/2 in broadcast #1 of the default "
                                  "group from rank 0, rank 1/2 in broadcast #1 of the default group from rank 1\n",
                                  text)
                self.assertNotIn("timed out", text)
                self.assertLess(elapsed, 15, "reported at the timeout (30 s), not when found")

    def test_the_fake_backend_is_usable_in_a_rank(self):
        import torch.distributed as dist

        plugins = dist.Backend._plugins
        had = "FAKE" in plugins
        saved = plugins.pop("FAKE", None)  # as in a fresh test process
        try:
            for sub, result, _ in self.each("test_fake_backend"):
                with sub:
                    self.assertEqual(result.errors + result.failures, [])
                    if sub.runner is cases.ThreadRunner:  # registered for the test only
                        self.assertNotIn("FAKE", plugins)
        finally:
            if had:
                plugins["FAKE"] = saved

    def test_hang_reports_the_stack_at_the_timeout(self):
        for sub, result, elapsed in self.each("test_hang"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/2 did not finish 'test_hang' within 2s", text)
                self.assertIn("in stuck_in_a_helper", text)
                # The header names the rank that hung, not the one that waited for it.
                self.assertIn("'test_hang' errored (disttest): rank 1/2 timed out after 2s\n", text)
                self.assertIn(WAITED_FOR.format(what="barrier #1 of the default group", peer=1, world=2).format(
                    who="rank 0/2", waits="waits"), text)
                self.assertIn("in barrier", text)  # where the other rank waits
                self.assertLess(elapsed, 9)

    def test_early_return_is_a_desync(self):
        for sub, result, elapsed in self.each("test_early_return"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/2 finished; rank 0/2 waits in all_reduce #2 of the default group", text)
                self.assertLess(elapsed, 10, "reported at the 30s timeout, not as a desync")

    def test_recv_from_a_finished_peer_is_a_desync(self):
        for sub, result, elapsed in self.each("test_recv_from_a_peer_that_returned"):
            with sub:
                text = self.only(result.errors)
                self.assertIn("rank 1/2 finished; rank 0/2 waits in recv #1 from rank 1", text)
                self.assertLess(elapsed, 10)

    def test_a_desync_in_collectives_issued_from_cpp(self):
        for sub, result, elapsed in self.each("test_ddp_rank_skips_a_step"):
            with sub:
                text = self.only(result.errors)
                seen_by = ("counted by the threaded backend" if sub.runner is cases.ThreadRunner
                           else "seen by c10d's flight recorder")
                self.assertRegex(text, r"desync: rank 1/2 finished; rank 0/2 waits in \w+ #\d+ of the "
                                       r"default group \(" + seen_by + r"\)")
                self.assertLess(elapsed, 10, "reported at the timeout, not as a desync")

    def test_an_exception_whose_str_raises(self):
        for sub, result, elapsed in self.each("test_str_raises"):
            with sub:
                text = self.only(result.failures)  # an AssertionError subclass: a failure
                self.assertIn("rank 1/2: HostileAssertion: <str() failed: RuntimeError: __str__ is broken>", text)
                self.assertIn('raise HostileAssertion("unprintable")', text)  # the user's line
                self.assertLess(elapsed, 10)

    def test_a_rank_that_exits_with_a_skip_code_skips_the_test(self):
        # Upstream's parent reads a rank's exit code: os._exit(77) is a skip
        # there, as sys.exit(77) is (it was "rank 1/2 exited with code 77").
        for sub, result, _ in self.each("test_os_exit_with_a_skip_code_in_rank_1", cases.PROCESS_RUNNERS):
            with sub:
                self.assertEqual(result.errors + result.failures, [])
                self.assertEqual([reason for _, reason in result.skipped], ["Need at least 2 CUDA devices"])

    def test_a_segfault_shows_the_crash_site_first(self):
        for method in ("zygote", "fork"):
            with mock.patch.dict(os.environ, {START_METHOD_ENV: method}):
                for sub, result, elapsed in self.each("test_segfault_in_rank_1", cases.PROCESS_RUNNERS):
                    with sub, self.subTest(start_method=method):
                        text = self.only(result.errors)
                        self.assertIn("rank 1/2 was killed by SIGSEGV", text)
                        site = text.split("where it crashed:\n")[1]
                        lines = site.splitlines()
                        self.assertEqual(lines[0], "Fatal Python error: Segmentation fault")
                        self.assertTrue(lines[1].startswith("Current thread "), site)
                        self.assertIn("in string_at", lines[2])
                        self.assertRegex(lines[3], r'runner_cases.py", line \d+ in test_segfault_in_rank_1')
                        self.assertNotIn("Extension modules", text)
                        self.assertNotIn("unittest", site)  # not the runner's frames (fork)
                        self.assertNotIn("run_rank_process", site)
                        # (A crash in ranks of a copy of the test process runs again
                        # in a fresh fork server's, which starts an interpreter.)
                        again = method == "zygote" and sub.runner is cases.ProcessRunner
                        self.assertLess(elapsed, 20 if again else 10)

    def test_a_rank_that_kills_the_fork_server(self):
        with mock.patch.dict(os.environ, {START_METHOD_ENV: "zygote"}):
            for sub, result, _ in self.each("test_kill_the_fork_server", cases.PROCESS_RUNNERS):
                with sub:
                    text = self.only(result.errors)
                    self.assertIn("died with the fork server, which was killed by SIGKILL", text)
                    self.assertNotIn("code None", text)
                    after, _ = run(sub.runner, "test_pass")  # with a fresh fork server
                    self.assertTrue(after.wasSuccessful(), after.errors + after.failures)

    def test_processes_a_rank_leaves_running_are_killed_and_named(self):
        for sub, result, _ in self.each("test_leave_a_process_running_and_fail"):
            with sub, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the thread runner's (tested below)
                text = self.only(result.errors)
                self.assertIn("rank 1/2: ValueError: fails after starting a process", text)
                if sub.runner is not cases.ThreadRunner:  # a thread's are the test process's
                    self.assertRegex(text, r"rank 1/2 left processes running when its test ended; "
                                           rf"disttest killed them: pid \d+: sleep {cases.LEFT_SLEEP}")
                self.assertEqual(cases.sleeps_left(), [])
        for runner in cases.RUNNERS:
            with self.subTest(runner=runner.__name__, passing=True), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result, _ = run(runner, "test_leave_a_process_running")
                self.assertTrue(result.wasSuccessful(), result.errors)
                self.assertEqual(cases.sleeps_left(), [])
                left = [w for w in seen if f"sleep {cases.LEFT_SLEEP}" in str(w.message)]
                self.assertTrue(left, [str(w.message) for w in seen])
                # At the test's line, not at disttest's or unittest's frame that noticed.
                self.assertEqual({os.path.basename(w.filename) for w in left}, {"runner_cases.py"})

    def test_a_daemon_a_rank_leaves_running_is_killed(self):
        # A thread rank's daemon went to init, outliving the test process
        # (and a pipe on its output never closed).
        for runner in cases.RUNNERS:
            with self.subTest(runner=runner.__name__), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result, _ = run(runner, "test_leave_a_daemon_running")
                self.assertEqual(cases.sleeps_left(), [])
                if runner is cases.ThreadRunner:
                    self.assertTrue(result.wasSuccessful(), result.errors)
                    self.assertTrue(any(f"sleep {cases.LEFT_SLEEP}" in str(w.message) for w in seen),
                                    [str(w.message) for w in seen])
                else:
                    self.assertIn(f"sleep {cases.LEFT_SLEEP}", str(result.errors + result.failures) +
                                  str([str(w.message) for w in seen]))

    def test_multiprocessings_resource_tracker_is_not_left_running(self):
        # It is the rank's, for the rank's life (a pool worker's next test
        # would start another, warning): not killed and named after a test.
        for runner in cases.PROCESS_RUNNERS:
            with self.subTest(runner=runner.__name__), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result, _ = run(runner, "test_use_a_multiprocessing_queue")
                self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
                self.assertEqual([str(w.message) for w in seen if "left processes running" in str(w.message)],
                                 [])

    def test_processes_of_a_crashed_rank_are_killed(self):
        for method in ("zygote", "fork"):
            with mock.patch.dict(os.environ, {START_METHOD_ENV: method}):
                for sub, result, _ in self.each("test_crash_after_starting_a_process", cases.PROCESS_RUNNERS):
                    with sub, self.subTest(start_method=method):
                        self.assertIn("rank 1/2 was killed by SIGSEGV", self.only(result.errors))
                        deadline = time.monotonic() + 3  # the fork server kills them on its next wake
                        while cases.sleeps_left() and time.monotonic() < deadline:
                            time.sleep(0.05)
                        self.assertEqual(cases.sleeps_left(), [])

    def test_a_rank_that_kills_its_process_group_kills_only_itself(self):
        for method in ("zygote", "fork"):
            with mock.patch.dict(os.environ, {START_METHOD_ENV: method}):
                for sub, result, elapsed in self.each("test_kill_own_process_group", cases.PROCESS_RUNNERS):
                    with sub, self.subTest(start_method=method):
                        self.assertIn("rank 1/2 was killed by SIGKILL", self.only(result.errors))
                        self.assertLess(elapsed, 20, "not failing fast")  # rank 0 waits 60 s

    def test_a_failing_rank_s_output_is_in_its_report(self):
        for sub, result, _ in self.each("test_output_of_a_failing_rank"):
            with sub:
                text = self.only(result.failures)
                self.assertIn("its output ends:", text)
                self.assertIn("a note from rank 1", text.split("its output ends:")[1])

    def test_the_next_test_runs_after_each_bad_one(self):
        for runner in cases.RUNNERS:
            for bad in ("test_hang", "test_early_return", "test_fail_fast_while_peer_waits"):
                with self.subTest(runner=runner.__name__, after=bad):
                    run(runner, bad)
                    result, _ = run(runner, "test_pass")
                    self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    def test_report_exceptions(self):
        for runner in (cases.ProcessRunner, cases.ThreadRunner):  # the pool dispatches elsewhere
            case = runner("test_assertion_in_rank_1")
            case.setUp()
            try:
                with self.assertRaises(RuntimeError) as ctx:
                    case.test_assertion_in_rank_1()
            finally:
                case.doCleanups()
            self.assertIsInstance(ctx.exception, RankFailure)
            self.assertEqual(ctx.exception.ranks, [1])
        self.assertTrue(issubclass(RankError, RuntimeError))


class DeclaredOptionsTest(unittest.TestCase):
    """A bad value of a declared option is refused before any rank starts,
    naming the value and where it came from; a good one acts."""

    def only_error(self, runner: type, attrs: dict, env: dict | None = None) -> str:
        cls = type(f"Bad{runner.__name__}", (runner,), attrs)
        with mock.patch.dict(os.environ, env or {}), \
                mock.patch("os.fork", side_effect=AssertionError("a rank started")):
            result, _ = run(cls, "test_pass")
        self.assertEqual((result.testsRun, len(result.errors), result.failures), (1, 1, []), result.errors)
        return result.errors[0][1]

    def test_a_bad_seed(self):
        for runner in cases.RUNNERS:
            for bad in (-1, 2**32, "1", 1.5, True):
                with self.subTest(runner=runner.__name__, seed=bad):
                    error = self.only_error(runner, {"seed": bad})
                    self.assertIn(f"Invalid seed {bad!r} from Bad{runner.__name__}.seed (disttest)", error)
            # None (or a method named seed) is the suite's own: upstream's TestCase has no such setting
            with self.subTest(runner=runner.__name__, seed=None):
                with warnings.catch_warnings():  # (a class made here: the fork server cannot import it)
                    warnings.simplefilter("ignore")
                    result, _ = run(type(f"NoSeed{runner.__name__}", (runner,), {"seed": None}), "test_pass")
                self.assertTrue(result.wasSuccessful(), result.errors)
            # A property, as world_size may be: the pool read it on the class and
            # refused "<property object at ...>" (the other runners read it).
            with self.subTest(runner=runner.__name__, seed="property"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result, _ = run(type(f"PropSeed{runner.__name__}", (runner,), {"seed": property(lambda self: 7)}),
                                "test_pass")
                self.assertTrue(result.wasSuccessful(), result.errors)
                error = self.only_error(runner, {"seed": property(lambda self: -7)})
                self.assertIn(f"Invalid seed -7 from Bad{runner.__name__}.seed (disttest)", error)

    def test_the_start_processes_hook_reads_the_variable(self):
        # Upstream's suites call it from setUp; it read the class's
        # start_method only, so DISTTEST_START_METHOD (even "bogus") was ignored.
        def setUp(self):
            disttest.MultiProcessTestCase.setUp(self)
            self._start_processes()

        error = self.only_error(cases.ProcessRunner, {"setUp": setUp}, {"DISTTEST_START_METHOD": "bogus"})
        self.assertIn("Invalid start method 'bogus' from environment variable DISTTEST_START_METHOD (disttest)",
                      error)

    def test_rank_threads_the_suite_sets_act_in_spawned_ranks(self):
        # Spawned ranks keep torch's default (as upstream's), unless the suite
        # set rank_threads: an explicit 3 was dropped without a word.
        from disttest._runner import settings
        from disttest.runners import multiprocess

        mine = type("Mine", (disttest.MultiProcessTestCase,), {"rank_threads": 3})
        self.assertEqual(settings.threads_for("spawn", mine, 3), 3)
        self.assertIsNone(settings.threads_for("spawn", disttest.MultiProcessTestCase, 1))
        self.assertIsNone(settings.threads_for("spawn", disttest.MultiProcContinousTest, 1))
        self.assertEqual(settings.threads_for("fork", disttest.MultiProcessTestCase, 1), 1)
        handed = []

        def launcher(spec):
            handed.append(spec.threads)
            raise RuntimeError("stopped before any rank starts")

        with mock.patch.dict(multiprocess._LAUNCHERS, {"spawn": launcher}), \
                mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "spawn"}):
            for threads in (3, None):
                attrs = {} if threads is None else {"rank_threads": threads}
                result, _ = run(type(f"Spawned{threads}", (cases.ProcessRunner,), attrs), "test_pass")
                self.assertIn("stopped before any rank starts", str(result.errors))
        self.assertEqual(handed, [3, None])

    def test_a_timeout_given_as_a_string(self):
        # As world_size: a class attribute is a number; only text (a variable) is read as one.
        for runner in cases.RUNNERS:
            with self.subTest(runner=runner.__name__):
                error = self.only_error(runner, {"timeout": "3"})
                self.assertIn(f"Invalid timeout '3' from Bad{runner.__name__}.timeout (disttest)", error)

    def test_a_start_method_is_read_as_every_choice(self):
        # Case and blanks do not count, as for the scheduling variables.
        for runner in cases.PROCESS_RUNNERS:
            for env, attrs in (({"DISTTEST_START_METHOD": " Fork"}, {}), ({}, {"start_method": "FORK"})):
                with self.subTest(runner=runner.__name__, env=env, attrs=attrs), \
                        mock.patch.dict(os.environ, env):
                    cls = type(f"Upper{runner.__name__}", (runner,), attrs)
                    result, _ = run(cls, "test_pass")
                    self.assertTrue(result.wasSuccessful(), result.errors)

    def test_bad_run_variables(self):
        for runner in cases.RUNNERS:
            # Each runner refuses them all, also those it does not read (a run of
            # thread tests went green with a misspelt start method).
            for env, text in ((("DISTTEST_KEEP_LOGS", "maybe"), "Invalid flag 'maybe'"),
                              (("DISTTEST_OUTPUT", "bogus"), "Invalid output mode 'bogus'"),
                              (("DISTTEST_TB_LOCALS", "false!"), "Invalid flag 'false!'"),
                              (("DISTTEST_START_METHOD", "bogus"), "Invalid start method 'bogus'"),
                              (("DISTTEST_FORK_SERVER", "bogus"), "Invalid fork server 'bogus'"),
                              (("DISTTEST_RANK_SCHEDULING", "bogus"), "Invalid rank scheduling 'bogus'"),
                              (("DISTTEST_THREAD_SCHEDULING", "bogus"), "Invalid thread scheduling 'bogus'")):
                with self.subTest(runner=runner.__name__, env=env):
                    error = self.only_error(runner, {}, dict([env]))
                    self.assertIn(f"{text} from environment variable {env[0]} (disttest)", error)

    def test_a_bad_rank_preload(self):
        for runner in cases.PROCESS_RUNNERS:
            for bad, text in (("json", "Invalid list of modules to preload 'json'"),
                              (["no_such_module_xyz"], "Invalid module to preload 'no_such_module_xyz'"),
                              ([5], "Invalid list of modules to preload [5]"),
                              # (the fork server fell back to forking from the test
                              # process, warning; the pool said nothing)
                              (["torch.no_such_submodule"],
                               "Invalid module to preload 'torch.no_such_submodule'"),
                              (["json.decoder.nope"], "Invalid module to preload 'json.decoder.nope'")):
                with self.subTest(runner=runner.__name__, preload=bad):
                    error = self.only_error(runner, {"rank_preload": bad})
                    self.assertIn(f"{text} from Bad{runner.__name__}.rank_preload (disttest)", error)

    def test_a_world_beyond_the_systems_limits(self):
        from disttest._runner import thread_pool

        # Threads: the third "can't start new thread"; the two started go idle.
        real_thread, made = thread_pool.RankThread, []

        def limited_thread(pool):
            if len(made) == 2:
                raise RuntimeError("can't start new thread")
            made.append(real_thread(pool))
            return made[-1]

        thread_pool.release_idle(wait=1.0)
        with mock.patch.object(thread_pool, "RankThread", side_effect=limited_thread), \
                self.assertRaises(RuntimeError) as caught:
            thread_pool.take(5)
        self.assertEqual(str(caught.exception), thread_pool.START_LIMIT.format(
            rank=2, world_size=5, what="a thread", error="can't start new thread"))
        again = thread_pool.take(2)
        self.assertEqual({t.thread for t in again}, {t.thread for t in made})
        thread_pool.give_back(again)
        # Processes: the second fork fails (EAGAIN); the first rank is stopped.
        real_fork, forks = os.fork, []

        def limited_fork():
            if forks:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            forks.append(real_fork())
            return forks[-1]

        cls = type("ForkedRunner", (cases.ProcessRunner,), {"start_method": "fork"})
        with mock.patch("os.fork", side_effect=limited_fork):
            result, _ = run(cls, "test_pass")
        self.assertEqual(len(result.errors), 1, result.failures)
        self.assertIn(thread_pool.START_LIMIT.format(
            rank=1, world_size=cls("test_pass").world_size, what="a forked process",
            error="[Errno 11] Resource temporarily unavailable"), result.errors[0][1])
        deadline = time.monotonic() + 5
        while cases.live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(cases.live_ranks(), [], "the rank started before the failure outlived the test")

    def test_a_bad_fork_server_is_the_error_not_what_cleanup_met(self):
        error = self.only_error(cases.ProcessRunner, {}, {"DISTTEST_FORK_SERVER": "bogus"})
        self.assertIn("Invalid fork server 'bogus' from environment variable DISTTEST_FORK_SERVER", error)
        self.assertNotIn("AttributeError", error)

    def test_the_pools_backend_and_rebuild_cap(self):
        for attrs, text in (
            ({"backend_str": classmethod(lambda cls: "glo")}, "Invalid backend 'glo' from BadPoolRunner.backend_str()"),
            ({"backend_str": classmethod(lambda cls: "cpu:gloo,cuda:ncl")},
             "Invalid backend 'cpu:gloo,cuda:ncl' from BadPoolRunner.backend_str()"),
            ({"max_pool_rebuilds": None}, "Invalid number of pool rebuilds None from BadPoolRunner.max_pool_rebuilds"),
            ({"max_pool_rebuilds": -1}, "Invalid number of pool rebuilds -1 from BadPoolRunner.max_pool_rebuilds"),
        ):
            with self.subTest(attrs=attrs):
                self.assertIn(text, self.only_error(cases.PoolRunner, attrs))

    def test_a_world_size_of_0_skips_the_test(self):
        # PyTorch's FSDP tests declare min(4, torch.cuda.device_count()): 0
        # on a host without GPUs, where upstream starts no rank and passes.
        from disttest._runner import settings

        for runner in (cases.ProcessRunner, cases.ThreadRunner, cases.PoolRunner):
            cls = type(f"No{runner.__name__}", (runner,), {"world_size": property(lambda self: 0)})
            with self.subTest(runner.__name__):
                result, elapsed = run(cls, "test_pass")
                self.assertEqual((result.errors, result.failures), ([], []))
                self.assertEqual([reason for _, reason in result.skipped], [settings.NO_RANKS.format(cls=cls.__name__)])
                self.assertLess(elapsed, 10)
        # Anything else that is no world size is still an error naming it.
        result, _ = run(type("Negative", (cases.ThreadRunner,), {"world_size": -1}), "test_pass")
        self.assertIn("Invalid world size -1 from Negative.world_size (disttest)", result.errors[0][1])

    def test_a_pool_with_a_limit_beyond_the_groups(self):
        # The group's own timeout is the limit plus a margin, capped where
        # gloo keeps it (milliseconds in a C int): 1e13 s broke the start.
        from disttest._runner import settings

        cls = type("LongPool", (cases.PoolRunner,), {"timeout": 1e13})
        with settings.outer_limit(None):  # not kept below pytest-timeout's limit here
            result, _ = run(cls, "test_pass")
        self.assertEqual((result.testsRun, result.errors, result.failures), (1, [], []))

