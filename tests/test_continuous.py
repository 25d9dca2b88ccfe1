"""MultiProcContinousTest: a self-healing pool, and runs under launchers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import warnings
from unittest import mock

import pool_cases as cases
from runner_cases import live_ranks

import disttest
from disttest._runner.pool import NOT_STARTED

HERE = os.path.dirname(os.path.abspath(__file__))


def run_class(cls) -> tuple[unittest.TestResult, float]:
    result = unittest.TestResult()
    start = time.monotonic()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    return result, time.monotonic() - start


def by_name(entries):
    return {case._testMethodName: text for case, text in entries}


class SelfHealingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.log = tempfile.NamedTemporaryFile(delete=False).name
        with mock.patch.dict(os.environ, {"POOL_LOG": cls.log}):
            cls.result, cls.elapsed = run_class(cases.Mixed)

    @classmethod
    def tearDownClass(cls):
        os.remove(cls.log)

    def test_every_passing_test_passes(self):
        bad = set(by_name(self.result.failures)) | set(by_name(self.result.errors))
        self.assertEqual(self.result.testsRun, 14)
        self.assertFalse({n for n in bad if n.endswith("_pass")}, bad)

    def test_each_bad_test_is_reported_as_what_it_is(self):
        failures, errors = by_name(self.result.failures), by_name(self.result.errors)
        self.assertEqual(set(failures), {"test_02_assertion"})
        self.assertIn("rank 1/2 raised AssertionError", failures["test_02_assertion"])
        self.assertEqual(set(errors), {"test_04_os_exit", "test_06_signal", "test_08_hang",
                                       "test_10_early_return"})
        self.assertIn("rank 1/2 exited with code 3", errors["test_04_os_exit"])
        self.assertIn("rank 0/2 was killed by SIGKILL", errors["test_06_signal"])
        self.assertIn("rank 1/2 did not finish 'test_08_hang' within 3s", errors["test_08_hang"])
        self.assertIn("in stuck_in_pool_helper", errors["test_08_hang"])
        self.assertIn("in barrier", errors["test_08_hang"])  # the other rank's stack
        self.assertIn("rank 1/2 finished; rank 0/2 waits in all_reduce #2 of the default group",
                      errors["test_10_early_return"])
        skipped = by_name(self.result.skipped)
        self.assertEqual(skipped, {"test_12_skip": "not in this rank's mood",
                                   "test_13_exit_code_skip": "c10d not compiled with NCCL support"})

    def test_bounded_and_nothing_left(self):
        self.assertLess(self.elapsed, 40)
        self.assertEqual(live_ranks(), [])

    def test_set_up_and_tear_down_ran_in_the_ranks(self):
        with open(self.log) as f:
            lines = [line.split() for line in f]
        torn = {(name, rank) for _, name, rank, _ in lines}
        self.assertIn(("test_01_pass", "0"), torn)
        self.assertIn(("test_01_pass", "1"), torn)
        self.assertIn(("test_02_assertion", "1"), torn)  # also after a failure

    def test_the_pool_is_kept_until_it_breaks(self):
        with open(self.log) as f:
            pids = {}
            for _, name, rank, pid in (line.split() for line in f):
                pids[(name, rank)] = pid
        # The same processes served tests 01-03 (a failure keeps the pool)...
        self.assertEqual(pids[("test_01_pass", "0")], pids[("test_03_pass", "0")])
        # ...and a crash made a fresh pool.
        self.assertNotEqual(pids[("test_03_pass", "0")], pids[("test_05_pass", "0")])


def run_logging_pids(cls):
    """Run ``cls``, whose tests write "test rank pid" lines to $POOL_LOG:
    (its result, seconds, {(test, rank): pid}, the warnings it gave)."""
    with tempfile.NamedTemporaryFile() as log, mock.patch.dict(os.environ, {"POOL_LOG": log.name}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, elapsed = run_class(cls)
        with open(log.name) as f:
            pids = {(name, rank): pid for name, rank, pid in (line.split() for line in f)}
    return result, elapsed, pids, caught


class PointToPointLeftoversTest(unittest.TestCase):
    def test_a_test_that_leaves_calls_unmatched_gets_the_next_one_fresh_ranks(self):
        # The leftover send was received by the next test's recv, whose own
        # send then waited to the limit: a correct test failed for another's.
        from disttest.runners.continuous import P2P_LEFT

        result, elapsed, pids, caught = run_logging_pids(cases.PointToPoint)
        self.assertEqual((result.testsRun, result.failures, result.errors), (6, [], []))
        self.assertLess(elapsed, 40)
        left = [str(w.message) for w in caught if "left point-to-point calls unmatched" in str(w.message)]
        prefix = "pool_cases.PointToPoint."
        self.assertEqual(left, [
            P2P_LEFT.format(test=prefix + "test_3_leaves_a_send", what="rank 0 sent rank 1 1 message(s) it did not "
                                                                          "receive"),
            P2P_LEFT.format(test=prefix + "test_5_leaves_a_receive", what="rank 1 posted 1 receive(s) from rank 0 "
                                                                             "it did not send")])
        # At the line of the test that left them, not in disttest.
        where = [w for w in caught if "left point-to-point" in str(w.message)][0]
        self.assertEqual(os.path.basename(where.filename), "pool_cases.py")
        # Matched calls keep the pool; leftovers get the next test fresh ranks.
        self.assertEqual(pids[("test_1_matched", "0")], pids[("test_2_matched", "0")])
        self.assertEqual(pids[("test_2_matched", "0")], pids[("test_3_leaves_a_send", "0")])
        self.assertNotEqual(pids[("test_3_leaves_a_send", "1")], pids[("test_4_send_recv", "1")])
        self.assertNotEqual(pids[("test_5_leaves_a_receive", "1")], pids[("test_6_send_recv", "1")])
        self.assertEqual(live_ranks(), [])


class MismatchedCallsTest(unittest.TestCase):
    def test_a_collective_whose_calls_differ_is_named_at_the_limit(self):
        # gloo's all_reduce of 2 elements on rank 0 and 3 on rank 1 returns on
        # rank 0; rank 1 waits, its peer alive in the pool: "rank 1/2 timed
        # out", rank 0 unnamed.
        result, _ = run_class(cases.Mismatched)
        text = by_name(result.errors)["test_sizes_differ"]
        self.assertIn("errored (disttest): desync: rank 0/2 entered all_reduce #1 of the default group and "
                      "finished; rank 1/2 waits in it to the limit: their calls differ (a size, a dtype, the "
                      "operation)\n", text)
        self.assertIn("test_sizes_differ", text.split("its stack:")[1])
        self.assertEqual(live_ranks(), [])


class CollectiveLeftoversTest(unittest.TestCase):
    def test_a_test_that_leaves_a_collective_unmatched_gets_the_next_one_fresh_ranks(self):
        # The next test's all_reduce matched the leftover one: it got the
        # old value (101), and a correct test failed for another's.
        from disttest.runners.continuous import COLLECTIVES_LEFT

        result, elapsed, pids, caught = run_logging_pids(cases.Collectives)
        self.assertEqual((result.testsRun, result.failures, result.errors), (6, [], []))
        self.assertLess(elapsed, 40)
        prefix = "pool_cases.Collectives."
        left = [str(w.message) for w in caught if "left collectives unmatched" in str(w.message)]
        self.assertEqual(len(left), 2, left)
        self.assertEqual(left[0], COLLECTIVES_LEFT.format(
            test=prefix + "test_2_leaves_one", what="in the default group rank 0 entered 2 collective(s), "
                                                    "ranks 1, 2 entered 1"))
        self.assertRegex(left[1], r"test_4_leaves_one_in_a_subgroup left collectives unmatched \(in group \S+ "
                                  r"rank 0 entered 2 collective\(s\), rank 1 entered 1\)")
        # A call that raised on one rank (its argument checks) left nothing.
        self.assertEqual(pids[("test_0_checks_an_argument_error_on_one_rank", "0")], pids[("test_1_matched", "0")])
        self.assertEqual(pids[("test_1_matched", "0")], pids[("test_2_leaves_one", "0")])
        self.assertNotEqual(pids[("test_2_leaves_one", "0")], pids[("test_3_all_reduce", "0")])
        self.assertNotEqual(pids[("test_4_leaves_one_in_a_subgroup", "0")], pids[("test_5_all_reduce", "0")])
        self.assertEqual(live_ranks(), [])


class OutputPerTestTest(unittest.TestCase):
    def test_a_crashed_rank_s_report_shows_only_its_test_s_output(self):
        # It showed what the rank printed in the test before (one log per rank for the pool's life).
        with mock.patch.dict(os.environ, {"DISTTEST_OUTPUT": "tail"}):
            result, _ = run_class(cases.OutputPerTest)
        errors = by_name(result.errors)
        self.assertEqual(list(errors), ["test_2_crashes"])
        self.assertIn("rank 1/2 exited with code 5", errors["test_2_crashes"])
        self.assertNotIn("printed by test_1", errors["test_2_crashes"])
        self.assertEqual(live_ranks(), [])


class GroupLimitTest(unittest.TestCase):
    def test_the_class_s_group_times_out_after_its_longest_test_s_limit(self):
        # Without a class timeout the group waited torch's 30 minutes, also
        # under run_rank (torchrun), where nothing else bounds a rendezvous
        # or a collective that hangs.
        from datetime import timedelta

        from disttest.runners import continuous

        class Limits(disttest.MultiProcContinousTest):
            def test_one(self):
                pass

            def test_ddp_uneven_inputs(self):  # (upstream's per-name override: 400 s)
                pass

        given = {}
        # (upstream's variable: the per-name override wins over it, not over DISTTEST_TIMEOUT)
        env = {k: v for k, v in os.environ.items() if k != "DISTTEST_TIMEOUT"}
        with mock.patch.object(continuous.dist, "init_process_group", lambda **kw: given.update(kw)), \
                mock.patch.object(continuous._compat, "default_group", lambda: None), \
                mock.patch.object(continuous.settings, "outer_cap", lambda: None), \
                mock.patch.dict(os.environ, {**env, "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "5"}, clear=True):
            Limits._init_pg(0, 1, os.devnull)
            self.assertEqual(given["timeout"], timedelta(seconds=400 + continuous.PG_TIMEOUT_MARGIN))
            del Limits.test_ddp_uneven_inputs
            Limits._init_pg(0, 1, os.devnull)
            self.assertEqual(given["timeout"], timedelta(seconds=5 + continuous.PG_TIMEOUT_MARGIN))
            # Under run_rank (torchrun) no join loop reports a hang first: the
            # limit itself (a class of 5 s waited 65 s in a desync).
            # (the group's making keeps the margin: nodes may start apart)
            with mock.patch.object(Limits, "_run_by_launcher", True), \
                    mock.patch.object(continuous._compat, "set_group_timeout") as set_timeout:
                Limits._init_pg(0, 1, os.devnull)
            self.assertEqual(given["timeout"], timedelta(seconds=5 + continuous.PG_TIMEOUT_MARGIN))
            set_timeout.assert_called_once_with(5)


class ProcessStateTest(unittest.TestCase):
    def test_what_a_test_changes_for_its_rank_process_ends_with_it(self):
        # A fresh rank process takes it with it; a pool worker carried a
        # test's environment, folder, dtype and warnings into the next test.
        # (From torch 2.14 on, the matmul precision it sets is also a failure
        # of the test, as upstream's TestCase says: here, what is put back counts.)
        with mock.patch.dict(os.environ, {"PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK": "1"}):
            result, _ = run_class(cases.ProcessState)
        self.assertEqual((result.testsRun, result.failures, result.errors), (2, [], []))


class PoolTest(unittest.TestCase):
    def tearDown(self):
        self.assertEqual(live_ranks(), [])

    def test_unavailable_backend_skips_the_class(self):
        result, _ = run_class(cases.NoBackend)
        reason = disttest.support.skips.nccl_skip_reason()  # CPU-only build or no GPU: tests/test_cuda_build.py
        self.assertEqual(by_name(result.skipped), {"test_never_runs": f"Backend 'nccl' is not available: {reason}"})

    def test_group_that_cannot_be_made_is_an_error(self):
        result, _ = run_class(cases.InitFails)
        text = by_name(result.errors)["test_any"]
        self.assertIn("rank 1/2 raised RuntimeError", text)
        self.assertIn("no group for rank 1", text)

    def test_world_size_property_and_default_backend(self):
        result, _ = run_class(cases.Wide)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    def test_both_spellings(self):
        self.assertIs(disttest.MultiProcContinuousTest, disttest.MultiProcContinousTest)
        self.assertEqual(disttest.MultiProcContinousTest.world_size, 2)


class StartMethodTest(unittest.TestCase):
    def test_idle_rank_threads_do_not_force_the_fork_server(self):
        # A threaded test leaves its rank threads idle (kept for the class);
        # the next pool still forks from the test process, not through the
        # fork server (2 s), because the idle threads are ended first.
        import threading

        import runner_cases

        if threading.active_count() > 1:
            self.skipTest("other threads run in this process")
        result = unittest.TestResult()
        runner_cases.ThreadRunner("test_pass").run(result)  # no tearDownClass: threads stay idle
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertGreater(threading.active_count(), 1)
        self.assertEqual(cases.Scheduled._start_method(), "fork")
        self.assertEqual(threading.active_count(), 1)


class PoolHygieneTest(unittest.TestCase):
    def tearDown(self):
        self.assertEqual(live_ranks(), [])

    def test_each_phase_is_named(self):
        result, _ = run_class(cases.Phases)
        errors, failures = by_name(result.errors), by_name(result.failures)
        self.assertIn("rank 1/2 raised RuntimeError in setUp", errors["test_setup_fails"])
        self.assertIn("rank 0/2 raised ValueError in tearDown", errors["test_teardown_fails"])
        self.assertIn("ranks 0, 1/2 raised KeyError in cleanup", errors["test_cleanup_fails"])
        both = failures["test_both_fail"]
        self.assertIn("raised AssertionError", both)
        self.assertIn("then also raised in tearDown: ValueError: tearDown broke in rank 0", both)
        self.assertIn("raised AssertionError in test (i=2)", failures["test_subtest_fails"])
        self.assertEqual([c._testMethodName for c, _ in result.expectedFailures], ["test_expected_failure"])
        expected = result.expectedFailures[0][1]
        self.assertIn("raised AssertionError", expected)
        # unittest reports it after tearDown; it is the test body's.
        self.assertNotIn("in tearDown", expected)
        self.assertNotIn("in cleanup", expected)
        self.assertNotIn("test_z_pass", set(errors) | set(failures))
        # expectedFailure covers the test body: a rank's setUp or cleanup error is an error
        self.assertIn("rank 1/2 raised RuntimeError in setUp", errors["test_expected_failure_setup_fails"])
        self.assertIn("raised KeyError in cleanup", errors["test_expected_failure_cleanup_fails"])
        # ...and the body's expected failure in the other rank is no cause of it
        # (it was named as one: "rank 1/2 raised AssertionError").
        teardown = errors["test_expected_failure_teardown_fails"]
        self.assertIn("'test_expected_failure_teardown_fails' errored (disttest): rank 0/2 raised ValueError in "
                      "tearDown\n", teardown)
        self.assertNotIn("rank 1/2 raised AssertionError", teardown)
        self.assertNotIn("rank 1/2 raised NotImplementedError", errors["test_expected_error_teardown_fails"])
        self.assertIn("rank 0/2 raised ValueError in tearDown", errors["test_expected_error_teardown_fails"])
        self.assertNotIn("rank 0/2 raised AssertionError", errors["test_expected_failure_setup_fails"])
        interrupt = errors["test_keyboard_interrupt"]
        self.assertIn("rank 1/2 raised KeyboardInterrupt", interrupt)
        self.assertIn('raise KeyboardInterrupt("raised by the test in rank 1")', interrupt)

    def test_a_tear_down_class_without_super_still_closes_the_pool(self):
        result, _ = run_class(cases.ForgetsSuper)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertIsNone(cases.ForgetsSuper.__dict__.get("_pool"))
        # (tearDown checks that no rank is left)

    def test_a_test_s_own_stack_signal_handler_does_not_cost_later_stacks(self):
        result, _ = run_class(cases.TakesTheStackSignal)
        errors = by_name(result.errors)
        self.assertEqual(set(errors), {"test_2_hangs"})
        self.assertIn("in test_2_hangs", errors["test_2_hangs"])
        self.assertNotIn("did not answer", errors["test_2_hangs"])

    def test_output_is_shown_with_the_test_that_printed_it(self):
        source = textwrap.dedent("""
            import sys
            import disttest

            class Out(disttest.MultiProcContinousTest):
                def test_1_unended_line(self):
                    print("MARK-FROM-TEST-1", end="")

                def test_2_fails(self):
                    print("MARK-FROM-TEST-2")
                    assert self.rank != 0
        """)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "test_out.py")
            with open(path, "w") as f:
                f.write(source)
            proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", path],
                                  cwd=tmp, capture_output=True, text=True, timeout=120)
        failures, passes = (proc.stdout.split(" PASSES ") + [""])[:2]
        self.assertIn("[rank 0] MARK-FROM-TEST-1", passes.split("short test summary")[0], proc.stdout)
        self.assertIn("[rank 0] MARK-FROM-TEST-2", failures, proc.stdout)
        self.assertNotIn("MARK-FROM-TEST-1", failures, proc.stdout)  # neither captured nor in the tail

    def test_a_test_that_destroys_the_group_leaves_the_next_a_fresh_pool(self):
        result, _ = run_class(cases.ChangesTheWorld)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(result.testsRun, 4)

    def test_an_interrupted_join_gives_the_next_test_a_fresh_pool(self):
        calls = []

        def interrupted_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("interrupted from outside, as pytest-timeout does")
            return join(*args, **kwargs)

        from disttest.runners import continuous

        join = continuous.join
        with mock.patch.object(continuous, "join", interrupted_once):
            result, elapsed = run_class(cases.Interrupted)
        errors = by_name(result.errors)
        self.assertEqual(set(errors), {"test_1_still_running_when_interrupted"})
        self.assertIn("interrupted from outside", errors["test_1_still_running_when_interrupted"])
        self.assertEqual(result.failures, [])
        self.assertLess(elapsed, 30)

    def test_a_pool_that_cannot_start_fails_the_rest_at_once(self):
        result, elapsed = run_class(cases.StartDies)
        errors = by_name(result.errors)
        self.assertEqual(set(errors), {"test_a", "test_b", "test_c"})
        self.assertRegex(errors["test_a"], r"rank 1/2 exited with code 3 while (starting|making its group)")
        for name in ("test_b", "test_c"):
            self.assertIn("the pool of StartDies could not start", errors[name])
            self.assertIn("exited with code 3", errors[name])
        self.assertLess(elapsed, 20)

    def test_a_rank_that_skips_while_the_pool_starts_skips_the_class_at_once(self):
        # (its peer waited in the rendezvous for the whole start limit, 30 s)
        result, elapsed = run_class(cases.InitSkips)
        self.assertEqual(by_name(result.skipped), {"test_a": "rank 1 has no such device"})
        self.assertLess(elapsed, 15)

    def test_a_pool_start_that_hangs_under_an_outer_limit_is_reported_within_it(self):
        # (pytest-timeout's limit ended it with no report, and each test waited again)
        from disttest._runner import settings

        with settings.outer_limit(8):
            result, elapsed = run_class(cases.InitHangs)
        errors = by_name(result.errors)
        self.assertEqual(set(errors), {"test_a", "test_b"})
        self.assertIn(NOT_STARTED.format(what="make their group", timeout=3), errors["test_a"])
        self.assertRegex(errors["test_a"], r"(?s)rank 1/2's stack:.*in _init_pg")
        self.assertIn("the pool of InitHangs could not start", errors["test_b"])
        self.assertLess(elapsed, 8)

    def test_a_pool_the_system_refuses_is_not_tried_again(self):
        from disttest._runner import thread_pool
        from disttest.runners import continuous

        refused = RuntimeError(thread_pool.START_LIMIT.format(rank=14, world_size=100000, what="a process",
                                                              error="[Errno 11] Resource temporarily unavailable"))
        with mock.patch.object(continuous, "Pool", side_effect=refused) as pool:
            result, _ = run_class(cases.StartDies)
        errors = by_name(result.errors)
        self.assertEqual(set(errors), {"test_a", "test_b", "test_c"})
        for text in errors.values():
            self.assertIn("could not start rank 14 of a world of 100000", text)
        self.assertEqual(pool.call_count, 1)

    def test_rebuilds_are_capped(self):
        result, _ = run_class(cases.Crashes)
        errors = by_name(result.errors)
        self.assertIn("exited with code 5", errors["test_1"])
        self.assertIn("exited with code 5", errors["test_2"])
        self.assertIn("rebuilt 1 times (max_pool_rebuilds)", errors["test_3"])

    def test_a_deep_tmpdir_works(self):
        deep = tempfile.mkdtemp(prefix="disttest-" + "d" * 60)
        deep = os.path.join(deep, *["nested-directory-level"] * 6)
        os.makedirs(deep)
        self.addCleanup(shutil.rmtree, deep.split("/nested-directory-level")[0])
        self.assertGreater(len(deep), 150)
        with mock.patch.object(tempfile, "tempdir", deep), mock.patch.dict(os.environ, {"TMPDIR": deep}):
            result, _ = run_class(cases.Wide)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(result.testsRun, 1)

    def test_world_size_marker_starts_that_many_ranks(self):
        result, _ = run_class(cases.Marked)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(result.testsRun, 2)


class LaunchedAgreementTest(unittest.TestCase):
    """Ranks run by an external launcher (run_rank) agree after each test
    through their group's store (disttest.runners.launched)."""

    def launch(self, mode: str, **env: str) -> list[tuple[int, dict, str]]:
        """Run launched_cases.py's class on two ranks with ``LAUNCHED_MODE=mode``:
        each rank's exit status, its result (JSON) and its output."""
        rdvz = tempfile.mktemp(prefix="disttest-rdvz-")
        self.addCleanup(lambda: os.path.exists(rdvz) and os.remove(rdvz))
        environ = dict(os.environ, LAUNCHED_MODE=mode, **env)
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "launched_cases.py"), str(r), "2", rdvz],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
                 for r in range(2)]
        ranks = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            last = out.strip().splitlines()[-1] if out.strip() else ""
            ranks.append((p.returncode, json.loads(last) if last.startswith("{") else {}, out + err))
        return ranks

    def test_a_test_that_fails_on_one_rank_fails_on_each_and_none_runs_into_the_next(self):
        # Rank 1 failed before the all_reduce and went on to the next test,
        # whose all_reduce met rank 0's: rank 1 passed 'test_b_second' with
        # the values of 'test_a_sum', and rank 0 failed with 2 != 3.
        from disttest.runners.launched import PEER_FAILED

        (rc0, r0, out0), (rc1, r1, out1) = self.launch("fail")
        self.assertEqual((rc0, rc1), (1, 1), out0 + out1)
        self.assertIn("rank 1 fails before the all_reduce", r1["failures"]["test_a_sum"])
        self.assertNotIn("test_b_second ... ok", out1)
        note = PEER_FAILED.format(test="test_a_sum", how="failed", who="rank 1/2", whose="its",
                                  what="AssertionError: rank 1 fails before the all_reduce")
        self.assertIn(note, r0["errors"]["test_a_sum"])  # (its own error: the all_reduce timed out)
        self.assertNotIn("2.0 != 3.0", out0)
        self.assertIn(PEER_FAILED.format(test="test_a_sum", how="failed", who="rank 0/2", whose="its",
                                         what="")[:60], r1["failures"]["test_a_sum"])

    def test_a_peer_that_left_fails_the_rest_at_once(self):
        from disttest.runners.launched import PEER_GONE, PEER_LEFT_CLASS, PEERS_GONE_BEFORE

        start = time.monotonic()
        (rc0, r0, out0), (rc1, r1, out1) = self.launch("set_up_class")
        self.assertEqual((rc0, rc1), (1, 1), out0 + out1)
        self.assertEqual(r1["ran"], 0)
        left = PEER_LEFT_CLASS.format(who="rank 1/2", cls="Launched",
                                      why="setUpClass (__main__.Launched) raised RuntimeError: setUpClass broke "
                                          "on rank 1")
        self.assertIn(left, r0["errors"]["test_a_sum"])
        self.assertIn(PEERS_GONE_BEFORE.format(gone=left), r0["errors"]["test_b_second"])
        self.assertLess(time.monotonic() - start, 4 + 25)  # one collective's timeout, not one a test
        (rc0, r0, out0), (rc1, _, out1) = self.launch("exit")
        self.assertEqual((rc0, rc1), (1, 3), out0 + out1)
        self.assertIn(PEER_GONE.format(who="rank 1/2", test="test_a_sum", limit=4 + 10), r0["errors"]["test_a_sum"])
        self.assertIn("not run: " + PEER_GONE.format(who="rank 1/2", test="test_a_sum", limit=4 + 10),
                      r0["errors"]["test_b_second"])

    def test_an_interrupted_peer_or_one_that_runs_other_tests_is_no_pass(self):
        # Interrupted, rank 1 said "passed" (unittest lets KeyboardInterrupt
        # through with no outcome), and rank 0 passed; ranks that ran other
        # tests at the same place were paired by position.
        from disttest.runners.launched import INTERRUPTED, PEER_LEFT_CLASS, PEER_OTHER_TEST

        (rc0, r0, out0), (rc1, _, out1) = self.launch("interrupt")
        self.assertEqual(rc0, 1, out0)
        self.assertNotEqual(rc1, 0, out1)
        self.assertIn("'test_a_sum' failed on rank 1/2", r0["failures"]["test_a_sum"])
        self.assertIn("KeyboardInterrupt", r0["failures"]["test_a_sum"])
        self.assertIn(PEER_LEFT_CLASS.format(who="rank 1/2", cls="Launched", why=INTERRUPTED.format(
            test="test_a_sum")), r0["errors"]["test_b_second"])
        (rc0, r0, out0), (rc1, r1, out1) = self.launch("", LAUNCHED_K1="*test_b_second*,*test_c_temp_file*")
        self.assertEqual((rc0, rc1), (1, 1), out0 + out1)
        other = PEER_OTHER_TEST.format(who="rank 0/2", theirs="__main__.Launched.test_a_sum",
                                       ours="__main__.Launched.test_b_second")
        self.assertIn(other, r1["failures"]["test_b_second"])  # (it passed there, on rank 0's test_a_sum values)
        (rc0, r0, out0), (rc1, r1, out1) = self.launch("bad_str")  # (a str() that raises broke run_rank)
        self.assertEqual((rc0, rc1), (1, 1), out0 + out1)
        self.assertIn("'test_a_sum' failed on rank 1/2", r0["failures"]["test_a_sum"])

    def test_a_peer_that_skips_skips_the_test_on_every_rank(self):
        # Rank 1 skipped (upstream's sys.exit with a TEST_SKIPS code) while
        # rank 0 waited in an all_reduce: rank 0's timeout failed the test
        # on both ranks, where the core judges it a skip.
        from disttest.runners.launched import PEER_SKIPPED

        for mode in ("skip_exit", "skip_async"):  # (an async Work's wait raises from the test's own frame)
            (_, r0, out0), (_, r1, out1) = self.launch(mode)
            reason = disttest.TEST_SKIPS["multi-gpu-2"].message
            self.assertEqual(r1["skipped"]["test_a_sum"], reason, out1)
            skipped = r0["skipped"].get("test_a_sum", "")
            self.assertTrue(skipped.startswith(reason + " [" + PEER_SKIPPED.format(who="rank 1/2", test="test_a_sum")
                                               + "; this rank's error came after it: RuntimeError: "), out0)
            for result in (r0, r1):
                self.assertNotIn("test_a_sum", {**result["failures"], **result["errors"]})
        # a test with no collective that one rank skips is skipped on every rank, with its reason
        self.assertEqual(r1["skipped"]["test_d_no_collective"], "rank 1 skips alone")
        self.assertEqual(r0["skipped"]["test_d_no_collective"],
                         "rank 1 skips alone [" + PEER_SKIPPED.format(who="rank 1/2", test="test_d_no_collective")
                         + "]")

    def test_a_test_past_its_limit_is_stopped_in_the_rank(self):
        # Under a launcher no disttest parent watches the ranks: a test that
        # slept in Python ran for ever (faulthandler printed its stack, and
        # that was all).
        from disttest.runners.launched import HOLD_GRACE, TIMED_OUT

        start = time.monotonic()
        (rc0, r0, out0), (rc1, r1, out1) = self.launch("hang")
        self.assertLess(time.monotonic() - start, 90)
        self.assertEqual((rc0, rc1), (1, 1), out0 + out1)
        error = r1["errors"]["test_a_sum"]
        self.assertIn(TIMED_OUT.format(test="test_a_sum", limit=4 + HOLD_GRACE, who="rank 1/2", stack="")[:-1], error)
        self.assertIn("time.sleep(3600)", error)
        self.assertIn("'test_a_sum' failed on rank 1/2", r0["failures"].get("test_a_sum", "")
                      + r0["errors"].get("test_a_sum", ""))
        self.assertIn("TORN DOWN", out1)  # (its tearDown had no time left, and was stopped at once)

    def test_a_test_that_will_not_stop_ends_its_rank(self):
        # (a test that caught the stop, except BaseException, held its rank for ever)
        from disttest.runners.launched import EXIT_AFTER, HOLD_GRACE, UNSTOPPED, UNSTOPPED_EXIT_CODE

        start = time.monotonic()
        (rc0, r0, out0), (rc1, _, out1) = self.launch("unstoppable")
        self.assertLess(time.monotonic() - start, 90)
        self.assertEqual((rc0, rc1), (1, UNSTOPPED_EXIT_CODE), out0 + out1)
        self.assertIn(UNSTOPPED.format(test="test_a_sum", who="rank 1/2", after=EXIT_AFTER, stop=4 + HOLD_GRACE,
                                       code=UNSTOPPED_EXIT_CODE), out1)
        self.assertIn("in test_a_sum", out1)  # (its stack)

    def test_a_backend_the_host_lacks_skips_the_class(self):
        ranks = self.launch("", LAUNCHED_BACKEND="mpi")
        for rc, result, out in ranks:
            self.assertEqual(rc, 0, out)
            self.assertEqual(sorted(result["skipped"]), ["test_a_sum", "test_b_second", "test_c_temp_file",
                                                       "test_d_no_collective"])
            self.assertIn("mpi", result["skipped"]["test_a_sum"])

    def test_the_rank_temp_file_goes_however_rank_0_ends(self):
        for mode in ("", "exit_with_temp"):
            with self.subTest(mode=mode or "passes"):
                ranks = self.launch(mode)
                paths = {line.split(" ", 1)[1] for _, _, out in ranks for line in out.splitlines()
                         if line.startswith("TEMP ")}
                self.assertEqual(len(paths), 1, ranks)
                path = paths.pop()
                self.assertIn("disttest-launched-", path)
                deadline = time.monotonic() + 10  # (after os._exit, the reaper removes it)
                while os.path.exists(os.path.dirname(path)) and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertFalse(os.path.exists(os.path.dirname(path)))

    def test_a_second_env_rendezvous_in_one_process_is_refused(self):
        from disttest.runners import continuous
        from disttest.runners.launched import SECOND_CALL

        with mock.patch.object(continuous, "_launched_by_env", ["First"]), \
                mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": "29999"}), \
                self.assertRaises(RuntimeError) as caught:
            cases.Launched.run_rank()
        self.assertEqual(str(caught.exception), SECOND_CALL.format(cls="Launched", first="First"))


class LaunchersTest(unittest.TestCase):
    def test_run_rank_with_a_rendezvous_file(self):
        rdvz = tempfile.mktemp(prefix="disttest-rdvz-")
        self.addCleanup(lambda: os.path.exists(rdvz) and os.remove(rdvz))
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "pool_cases.py"), str(r), "2", rdvz],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            self.assertEqual(p.returncode, 0, err[-3000:])
            self.assertIn("Ran 3 tests", err)

    def test_a_suite_fault_under_an_external_launcher_is_refused(self):
        # Issue 24: no disttest parent judges it there; it was armed and never reported.
        rdvz = tempfile.mktemp(prefix="disttest-rdvz-")
        self.addCleanup(lambda: os.path.exists(rdvz) and os.remove(rdvz))
        env = dict(os.environ, DISTTEST_FAULT="rank=1,action=kill,at=all_reduce")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "pool_cases.py"), "0", "2", rdvz],
                              capture_output=True, text=True, env=env, timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("Invalid fault 'rank 1 kill at all_reduce #1 (from DISTTEST_FAULT)' from DISTTEST_FAULT "
                      "(disttest): this rank was started by an external launcher (run_rank)", proc.stderr)

    def test_two_torchrun_nodes_on_loopback(self):
        port = str(disttest.find_free_port())
        # torchrun leaves its log folder (torchelastic_*) in the temp folder.
        tmp = tempfile.mkdtemp(prefix="disttest-torchrun-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=tmp)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                 f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}",
                 os.path.join(HERE, "pool_cases.py")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for node in range(2)
        ]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                p.kill()
        for p, (out, err) in zip(procs, outs, strict=True):
            self.assertEqual(p.returncode, 0, (out + err)[-3000:])
            self.assertIn("Ran 3 tests", out + err)
            self.assertIn("OK", out + err)
