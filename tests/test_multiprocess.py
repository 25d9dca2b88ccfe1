"""What only MultiProcessTestCase does: crashes and signals, stacks taken
inside C++, start methods, upstream hooks, hygiene. The behaviours every
runner shares are in test_runners.py."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import unittest
from unittest import mock

import mp_cases as cases
from runner_cases import live_ranks

import disttest
from disttest import RankError, RankFailure


def run(cls: type[unittest.TestCase], name: str) -> tuple[unittest.TestResult, float]:
    result = unittest.TestResult()
    start = time.monotonic()
    cls(name).run(result)
    return result, time.monotonic() - start


class OutcomeMixin:
    def assertPassed(self, result):
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual(result.skipped, [])
        self.assertEqual(result.testsRun, 1)

    def only(self, entries):
        self.assertEqual(len(entries), 1, entries)
        return entries[0][1]

    def tearDown(self):
        deadline = time.monotonic() + 5
        while live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(live_ranks(), [], "a rank outlived its test")
        super().tearDown()


class OutcomesTest(OutcomeMixin, unittest.TestCase):
    def test_os_exit_in_one_rank(self):
        result, elapsed = run(cases.Outcomes, "test_os_exit_in_rank_1")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 exited with code 3 before finishing 'test_os_exit_in_rank_1'", text)
        self.assertLess(elapsed, 10)

    def test_signal_in_one_rank(self):
        result, _ = run(cases.Outcomes, "test_signal_in_rank_1")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 was killed by SIGSEGV", text)
        self.assertIn("Fatal Python error: Segmentation fault", text)  # faulthandler's dump
        self.assertIn("test_signal_in_rank_1", text)

    def test_a_streamed_crash_dump_is_left_to_the_report(self):
        # Streamed, faulthandler's whole dump (every launcher frame, the
        # extension modules) came after the report's ordered, trimmed one.
        import io

        from disttest._runner.launcher import STREAM_DUMP_NOTE

        out = io.StringIO()
        with mock.patch.dict(os.environ, {"DISTTEST_OUTPUT": "stream"}), mock.patch.object(sys, "stdout", out):
            result, _ = run(cases.Outcomes, "test_signal_in_rank_1")
        self.assertIn("Fatal Python error: Segmentation fault", self.only(result.errors))
        self.assertIn(f"[rank 1] {STREAM_DUMP_NOTE}", out.getvalue())
        self.assertNotIn("Fatal Python error", out.getvalue())
        self.assertNotIn("Extension modules", out.getvalue())

    def test_an_exit_with_status_0_before_the_test_finished_is_an_error(self):
        # (upstream passes it: the rest of the rank's test never ran; documented)
        result, _ = run(cases.Outcomes, "test_os_exit_zero_in_rank_1")
        self.assertIn("rank 1/2 exited with code 0 before finishing 'test_os_exit_zero_in_rank_1'",
                      self.only(result.errors))
        result, _ = run(cases.Outcomes, "test_sys_exit_zero_in_rank_1")
        self.assertTrue(result.wasSuccessful(), result.errors)

    def test_sys_exit_nonzero_is_an_error(self):
        result, _ = run(cases.Outcomes, "test_sys_exit_nonzero")
        self.assertIn("rank 0/2: SystemExit: sys.exit(5) in the test", self.only(result.errors))


class ClosedChannelTest(OutcomeMixin, unittest.TestCase):
    def test_a_rank_that_closed_its_channel_still_shows_its_error(self):
        # (it was "exited with code 10" and nothing more: the error was lost with the channel)
        from disttest._runner.rank import UNREPORTED

        result, _ = run(cases.ClosedChannel, "test_closes_its_descriptors_then_fails")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 exited with code 10 before finishing 'test_closes_its_descriptors_then_fails'", text)
        self.assertIn(UNREPORTED.format(rank=1, test="test_closes_its_descriptors_then_fails",
                                        error="[Errno 9] Bad file descriptor",
                                        outcome="errored: ValueError: rank 1's error, after closing its descriptors"),
                      text)
        self.assertIn('raise ValueError("rank 1\'s error, after closing its descriptors")', text)


class RefusedCallTest(OutcomeMixin, unittest.TestCase):
    """A call torch refused on one rank (its own argument error, raised
    before the call communicated) is that rank's own error, whatever its
    peer did and whenever: not a consequence of the peer's end, not a desync."""

    def test_a_peer_that_skips_later_does_not_hide_it(self):
        # (it was a skip: the error, from torch.distributed, counted as the skip's consequence)
        result, _ = run(cases.Refusals, "test_refused_then_peer_skips")
        self.assertEqual(result.skipped, [])
        text = self.only(result.errors)
        self.assertIn("errored (disttest): rank 0/2 raised RuntimeError", text)
        self.assertIn("Incorrect input list size 1", text)

    def test_a_peer_that_passes_makes_no_desync(self):
        result, _ = run(cases.Refusals, "test_refused_peer_passes")
        text = self.only(result.errors)
        self.assertIn("errored (disttest): rank 0/2 raised RuntimeError", text)
        self.assertIn("invalid root rank: 5", text)
        self.assertNotIn("desync", text)

    def test_a_peer_s_own_later_error_is_a_second_cause(self):
        result, _ = run(cases.Refusals, "test_refused_by_c10d_then_peer_fails")
        text = self.only(result.errors)
        self.assertIn("rank 0/2 raised ValueError; rank 1/2 raised KeyError", text)
        self.assertNotIn("consequence", text)


class FailFastTest(OutcomeMixin, unittest.TestCase):
    def test_a_hang_in_a_cleanup_with_no_frame_of_the_test_says_so(self):
        # (it said "the rank was in disttest's own code")
        from disttest._runner.report import IN_CLEANUP

        result, _ = run(cases.Hangs, "test_hang_in_a_cleanup")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 did not finish 'test_hang_in_a_cleanup' within 2s", text)
        self.assertIn(IN_CLEANUP.split("{")[0], text)
        self.assertRegex(text, r'File ".*outcome\.py", line \d+ in after_cleanups\)$')

    def test_stack_of_a_rank_blocked_in_a_collective(self):
        result, _ = run(cases.Hangs, "test_blocked_in_collective")
        text = self.only(result.errors)
        # Taken while rank 0 was inside gloo's C++ all_reduce, for rank 1, which hung.
        self.assertIn("rank 0/2 waits in all_reduce #1 of the default group for rank 1/2", text)
        self.assertIn("in all_reduce", text)
        self.assertIn("in stuck_in_a_helper", text)

    def test_a_peer_that_never_entered_the_collective_whose_wait_ran_out_is_the_cause(self):
        # (rank 0's timeout was the cause, and rank 1 "stopped by disttest after the failure above")
        result, elapsed = run(cases.GroupTimeout, "test_group_times_out_for_a_hung_peer")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 never entered all_reduce #1 of the default group, in which rank 0/2 waited for it "
                      "until the call's own timeout ran out: rank 1/2 hung elsewhere", text)
        self.assertIn("in stuck_in_a_helper", text)  # where it hung
        self.assertIn("rank 0/2 failed in all_reduce #1 of the default group after rank 1/2 had failed", text)
        self.assertNotIn("stopped by disttest after the failure above", text)
        self.assertLess(elapsed, 15)

    def test_every_hung_peer_is_named(self):
        # (the board names one absent peer a waiting rank: rank 2 was "stopped by disttest")
        result, _ = run(cases.GroupTimeoutTwoHung, "test_group_times_out_for_two_hung_peers")
        text = self.only(result.errors)
        self.assertIn("ranks 1, 2/3 never entered all_reduce #1 of the default group, in which rank 0/3 waited", text)
        self.assertNotIn("stopped by disttest after the failure above", text)

    def test_calls_that_differ_at_the_limit_are_named(self):
        # (a limit shorter than the deadlock check's: it was a bare timeout of every rank)
        result, elapsed = run(cases.DifferentCalls, "test_all_reduce_against_broadcast")
        text = self.only(result.errors)
        self.assertIn("desync: rank 0/2 in all_reduce #1 of the default group, rank 1/2 in broadcast #1 of the "
                      "default group: the same call of the group, waited in to the limit: their calls differ", text)
        self.assertNotIn("ranks 0, 1/2 in all_reduce", text)  # (each rank named as itself in the section too)
        self.assertLess(elapsed, 15)

    def test_peer_failure_while_blocked_in_a_collective(self):
        result, elapsed = run(cases.Hangs, "test_peer_fails_while_blocked")
        text = self.only(result.errors)
        self.assertIn("rank 1/2: RuntimeError: rank 1 gives up", text)
        self.assertLess(elapsed, 8)


class HooksTest(OutcomeMixin, unittest.TestCase):
    def test_run_override_with_custom_init(self):
        result, _ = run(cases.UpstreamHooks, "test_collective_after_custom_init")
        self.assertPassed(result)

    def test_run_override_failure(self):
        result, _ = run(cases.UpstreamHooks, "test_failure_in_custom_run")
        self.assertIn("rank 0/2", self.only(result.failures))

    def test_special_return_code(self):
        self.assertPassed(run(cases.ReturnCodes, "test_exits_7")[0])

    def test_a_peer_s_expected_exit_does_not_stop_a_rank_before_its_own_verdict(self):
        # (rank 0 was stopped half a second after rank 1's expected exit, and
        # the test passed whatever rank 0 would have done)
        result, _ = run(cases.ReturnCodes, "test_rank_1_exits_7_rank_0_fails_later")
        self.assertIn("rank 0's own check, after its peer's expected exit", self.only(result.failures))

    def test_a_signal_the_test_expects_passes_once(self):
        # Upstream's watchdog tests: {fn: -signal.SIGABRT}, as Process.exitcode
        # says a signal. It was an error, and the fork server's copy first ran
        # the test again, taking the abort for the copy's crash.
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log")
            with mock.patch.dict(os.environ, {"ABORT_LOG": log}):
                result, _ = run(cases.ExpectedSignal, "test_aborts")
            self.assertPassed(result)
            with open(log) as f:
                self.assertEqual(sorted(f.read().split()), ["0", "1"])

    def test_skip_return_code_checks(self):
        self.assertPassed(run(cases.ReturnCodes, "test_any_code")[0])

    def test_a_test_whose_ranks_never_started_does_not_pass(self):
        result, _ = run(cases.NoSpawn, "test_forgot_to_spawn")
        self.assertIn("no ranks were started for 'test_forgot_to_spawn'", self.only(result.errors))

    def test_bad_world_size_and_timeout_are_named(self):
        result, _ = run(cases.BadWorldSize, "test_any")
        self.assertIn("Invalid world size -2 from BadWorldSize.world_size", self.only(result.errors))
        result, _ = run(cases.BadTimeout, "test_any")
        self.assertIn("Invalid timeout -3 from BadTimeout.timeout", self.only(result.errors))

    def test_bad_start_method_is_named(self):
        with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "teleport"}):
            result, _ = run(cases.StartMethods, "test_pass")
        self.assertIn(
            "Invalid start method 'teleport' from environment variable DISTTEST_START_METHOD",
            self.only(result.errors),
        )

    def test_processes_view(self):
        case = cases.StartMethods("test_pass")
        case.setUp()
        try:
            self.assertEqual([p.name for p in case.processes], ["process 0", "process 1"])
            case.test_pass()
            self.assertEqual([p.exitcode for p in case.processes], [0, 0])
            self.assertFalse(any(p.is_alive() for p in case.processes))
        finally:
            case.doCleanups()

    def test_distributed_test_base(self):
        before = os.environ.get("WORLD_SIZE")
        self.assertPassed(run(cases.Devices, "test_create_pg")[0])
        self.assertEqual(os.environ.get("WORLD_SIZE"), before)


class LooksLikeUpstreamTest(OutcomeMixin, unittest.TestCase):
    def test_a_threaded_group_of_one_rank_needs_no_threaded_world(self):
        # (upstream's creator makes it in a plain process; in a disttest rank
        # it raised "the threaded backend needs an installed world")
        self.assertPassed(run(cases.OneRankGroups, "test_threaded")[0])


class StartMethodTest(OutcomeMixin, unittest.TestCase):
    def test_each_start_method(self):
        for method in ("zygote", "fork", "spawn"):
            with self.subTest(method=method):
                with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": method}):
                    self.assertPassed(run(cases.StartMethods, "test_pass")[0])

    def test_a_spawned_ranks_start_up_does_not_count_against_the_tests_limit(self):
        # Each rank's interpreter takes its start-up and 2 s more before its
        # test begins; the test's own limit is 1 s.
        import slow_import_cases

        with mock.patch.dict(os.environ, {slow_import_cases.SLOW_SPAWN_ENV: "*=2"}):
            result, elapsed = run(slow_import_cases.SlowToSpawn, "test_init_and_all_reduce")
        self.assertPassed(result)
        self.assertGreater(elapsed, 2)

    def test_a_rank_that_does_not_start_is_named_by_the_start_ups_limit(self):
        # Rank 1 is still importing the test's module when the start-up's
        # limit runs out; rank 0, which started, waits for it in the
        # rendezvous and is stopped as a consequence.
        import slow_import_cases

        from disttest._runner.join import NOT_STARTED
        from disttest.runners import multiprocess

        with mock.patch.dict(os.environ, {slow_import_cases.SLOW_SPAWN_ENV: "process 1=60"}), \
                mock.patch.object(multiprocess, "START_UP_LIMIT", 12):
            # (12 s: rank 0's interpreter took over 6 s to import torch on a loaded machine)
            result, elapsed = run(slow_import_cases.SlowToSpawn, "test_init_and_all_reduce")
        text = self.only(result.errors)
        self.assertLess(elapsed, 35)
        limit = float(text.split("had not started 'test_init_and_all_reduce' ")[1].split("s after")[0])
        self.assertGreaterEqual(limit, 12)
        self.assertIn(NOT_STARTED.format(who="rank 1/2", test="test_init_and_all_reduce", limit=limit), text)
        self.assertIn("rank 0/2 stopped by disttest: rank 1/2 had not started the test", text)
        self.assertNotIn("within 1s", text)

    def test_a_spawned_rank_that_fails_before_it_connects_says_where_its_output_went(self):
        # (its ImportError went to the test process's stderr; the report said
        # only "exited with code 1")
        import slow_import_cases

        from disttest._runner.launcher import SPAWN_SILENT

        with mock.patch.dict(os.environ, {slow_import_cases.FAIL_SPAWN_ENV: "process 1"}):
            result, _ = run(slow_import_cases.SlowToSpawn, "test_init_and_all_reduce")
        text = self.only(result.errors)
        self.assertIn("rank 1/2 exited with code 1", text)
        self.assertIn(SPAWN_SILENT, text)

    def test_spawn_for_a_class_it_cannot_import_is_refused_before_any_rank_starts(self):
        # (each rank died in disttest's import of the class, and the report
        # said only "exited with code 1")
        from disttest._runner.cuda_fork import NOT_IMPORTABLE

        class Local(cases.Base):
            start_method = "spawn"

            def test_pass(self):
                pass

        result, elapsed = run(Local, "test_pass")
        text = self.only(result.errors)
        self.assertIn("ConfigError: Invalid start method 'spawn' from Local.start_method (disttest): "
                      + NOT_IMPORTABLE.format(cls=Local.__qualname__), text)
        self.assertNotIn("exited with code", text)
        self.assertLess(elapsed, 5)
        with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "spawn"}):
            text = self.only(run(Local, "test_pass")[0].errors)
        self.assertIn("Invalid start method 'spawn' from environment variable DISTTEST_START_METHOD", text)
        Local.start_method = "fork"  # what it can do
        self.assertPassed(run(Local, "test_pass")[0])

    def test_fork_after_parallel_work_in_the_parent(self):
        import torch

        torch.ones(512, 512) @ torch.ones(512, 512)  # the parent is now "poisoned"
        with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "fork"}):
            self.assertPassed(run(cases.StartMethods, "test_pass")[0])

    def test_a_fork_server_that_does_not_answer_is_killed_and_the_test_runs(self):
        # Its ranks, if it forked them at last, would start the test unasked
        # beside the ranks forked instead: the server goes, and they with it.
        import warnings

        import slow_import_cases

        from disttest._runner import zygote

        # A fresh server imports the test's module (a copy of this process has it).
        fresh = mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": "fresh"})
        server = zygote._client().proc  # started, within its own limit
        argv = [*sys.argv, slow_import_cases.SLOW_ARG, "30"]
        with mock.patch.object(zygote, "START_TIMEOUT", 2), mock.patch.object(sys, "argv", argv), \
                fresh, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result, elapsed = run(slow_import_cases.SlowToImport, "test_rank")
        self.assertPassed(result)  # forked from the test process instead
        self.assertLess(elapsed, 25)
        self.assertIsNotNone(server.poll(), "the server that did not answer is still running")
        client = zygote._clients.get((os.getpid(), False))
        self.assertTrue(client is None or client.proc is not server, "the next test would use it")
        self.assertTrue(any("did not answer within 2s" in str(w.message) for w in caught),
                        [str(w.message) for w in caught])

    def test_the_runs_of_an_abandoned_server_pump_nothing(self):
        # Another run still registered on a server that was killed reads
        # its closed pipe as "no message", not as an error.
        from multiprocessing import Pipe

        from disttest._runner import zygote

        client = object.__new__(zygote._Client)
        client.inbox, writer = Pipe(duplex=False)
        client.runs = {}
        writer.close()
        client.inbox.close()
        client.pump(0.1)  # no OSError

    def test_class_defined_in_a_function_falls_back_to_fork(self):
        class Local(cases.Base):
            def test_rank(self):
                self.assertIn(self.rank, (0, 1))

        self.assertPassed(run(Local, "test_rank")[0])


class HygieneTest(OutcomeMixin, unittest.TestCase):
    def test_run_directory_and_rendezvous_file_are_removed(self):
        # Each test's own directory (other tests may run beside this one).
        for cls, name in ((cases.Files, "test_rendezvous_file_is_fresh"), (cases.Hangs, "test_hang")):
            case = cls(name)
            case.run(unittest.TestResult())
            self.assertTrue(case.run_dir.startswith(os.path.join(tempfile.gettempdir(), "disttest-run-")))
            self.assertFalse(os.path.exists(case.run_dir), case.run_dir)
            self.assertFalse(os.path.exists(case.file_name))

    def test_a_rank_temp_file_goes_with_the_test_when_its_rank_dies(self):
        # It was made in the system's temp folder, and only rank 0's own
        # cleanup removed it: a rank that died in the body left it there.
        with tempfile.TemporaryDirectory() as tmp:
            told = os.path.join(tmp, "name")
            with mock.patch.dict(os.environ, {"TELL_NAME_IN": told}):
                os.environ.pop("TEMP_DIR", None)
                result, _ = run(cases.Files, "test_rank_0_dies_holding_a_rank_temp_file")
            self.assertEqual(len(result.errors), 1, result.failures)
            with open(told) as f:
                name = f.read()
            self.assertTrue(os.path.basename(name).startswith("disttest-rank-"), name)
            self.assertFalse(os.path.exists(name), f"{name} outlived its test")
            # TEMP_DIR naming no folder: the error names it and its source.
            with mock.patch.dict(os.environ, {"TELL_NAME_IN": told, "TEMP_DIR": os.path.join(tmp, "gone")}):
                result, _ = run(cases.Files, "test_rank_0_dies_holding_a_rank_temp_file")
            self.assertEqual(len(result.errors), 1, result.failures)
            self.assertIn(f"Invalid temp folder {os.path.join(tmp, 'gone')!r} from TEMP_DIR (the environment) "
                          "(disttest): it is not a folder", result.errors[0][1])

    def test_passing_ranks_leave_once_every_rank_has_answered(self):
        # The parent says Leave when all have answered; without it a passing
        # rank would stay LINGER_AFTER_PASS seconds (here 60: forked ranks
        # inherit the patch).
        from disttest._runner import rank as rank_mod

        with mock.patch.object(rank_mod, "LINGER_AFTER_PASS", 60), \
                mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "fork"}):
            result, elapsed = run(cases.Scheduled, "test_passes")
        self.assertPassed(result)
        self.assertLess(elapsed, 30)

    def test_a_rank_gets_the_test_process_environment_exactly(self):
        # What the fork server had but the test process no longer has is
        # gone; what differs takes the test process's value.
        from disttest._runner import rank as rank_mod

        want = {"KEEP": "1", "CHANGED": "new", "ADDED": "x"}
        with mock.patch.dict(os.environ, {"KEEP": "1", "CHANGED": "old", "GONE": "y"}, clear=True):
            rank_mod._set_environ(want)
            self.assertEqual(dict(os.environ), want)

    def test_report_types_are_public(self):
        self.assertTrue(issubclass(RankFailure, AssertionError))
        self.assertTrue(issubclass(RankFailure, RuntimeError))
        self.assertTrue(issubclass(RankError, RuntimeError))
        self.assertFalse(issubclass(RankError, AssertionError))
        self.assertIs(disttest.MultiProcessTestCase.MAIN_PROCESS_RANK, -1)
        self.assertEqual(disttest.MultiProcessTestCase.TEST_ERROR_EXIT_CODE, 10)


@unittest.skipUnless(hasattr(os, "SCHED_BATCH"), "SCHED_BATCH is Linux's")
class RankSchedulingTest(OutcomeMixin, unittest.TestCase):
    """``rank_scheduling`` / DISTTEST_RANK_SCHEDULING: the ranks' policy."""

    def test_batch_by_default(self):
        for method in ("zygote", "fork"):
            with self.subTest(method=method), mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": method}):
                self.assertPassed(run(cases.Scheduled, "test_batch")[0])
        # And the test process itself is left as it was.
        self.assertEqual(os.sched_getscheduler(0), self.policy)

    def setUp(self):
        self.policy = os.sched_getscheduler(0)
        if self.policy != os.SCHED_OTHER:
            self.skipTest("the run was started under another policy (chrt), which ranks keep")

    def test_normal(self):
        self.assertPassed(run(cases.Unbatched, "test_normal")[0])

    def test_the_variable_wins_over_the_class(self):
        with mock.patch.dict(os.environ, {"DISTTEST_RANK_SCHEDULING": "Normal"}):
            self.assertPassed(run(cases.Scheduled, "test_normal")[0])

    def test_in_a_pool(self):
        import pool_cases

        result = unittest.TestResult()
        unittest.TestSuite([pool_cases.Scheduled("test_batch")]).run(result)
        self.assertPassed(result)

    def test_bad_values_are_named_with_their_source(self):
        from disttest import ConfigError
        from disttest._runner import settings

        class Bad:
            rank_scheduling = "fifo"

        with self.assertRaisesRegex(ConfigError, r"'fifo'.*Bad\.rank_scheduling"):
            settings.rank_scheduling(Bad)
        with mock.patch.dict(os.environ, {"DISTTEST_RANK_SCHEDULING": "realtime"}), \
                self.assertRaisesRegex(ConfigError, r"'realtime'.*environment variable DISTTEST_RANK_SCHEDULING"):
            settings.rank_scheduling(Bad)
        with mock.patch.dict(os.environ, {"DISTTEST_RANK_SCHEDULING": "realtime"}):
            result = run(cases.Scheduled, "test_batch")[0]
        self.assertIn("DISTTEST_RANK_SCHEDULING", self.only(result.errors))


class RankThreadsTest(OutcomeMixin, unittest.TestCase):
    def test_values(self):
        from disttest import ConfigError
        from disttest._runner import settings

        for good in (None, 1, 3):
            self.assertEqual(settings.rank_threads(type("Good", (), {"rank_threads": good})), good)
        for bad in (0, -1, True, "2", 1.5):
            with self.subTest(bad=bad), self.assertRaises(ConfigError) as caught:
                settings.rank_threads(type("Bad", (), {"rank_threads": bad}))
            self.assertIn(f"{bad!r} from Bad.rank_threads", str(caught.exception))

    def test_numpy_integers_count_as_ints(self):
        # A world size of numpy's int64 was taken and a seed of it refused;
        # every integer setting now reads any integral type (bool excepted).
        import numpy as np

        from disttest._runner import settings

        self.assertEqual(settings.rank_threads(type("Np", (), {"rank_threads": np.int64(2)})), 2)
        self.assertEqual(settings.rebuild_cap(type("Np", (), {"max_pool_rebuilds": np.int32(0)})), 0)
        self.assertEqual(settings.seed(type("Np", (), {"seed": np.uint32(7)})), 7)
        self.assertIs(type(settings.seed(type("Np", (), {"seed": np.int64(7)}))), int)
        for bad in (np.int64(-1), np.bool_(True), np.float64(2.0)):
            with self.subTest(bad=bad), self.assertRaises(disttest.ConfigError):
                settings.seed(type("Np", (), {"seed": bad}))

    def test_a_bad_value_errors_the_test_before_any_rank_starts(self):
        import pool_cases

        fresh = type("ZeroThreads", (cases.Scheduled,), {"rank_threads": 0})
        pooled = type("TextThreads", (pool_cases.Scheduled,), {"rank_threads": "2"})
        for cls, name, value in ((fresh, "test_batch", "0"), (pooled, "test_batch", "'2'")):
            with self.subTest(cls=cls.__name__), mock.patch("os.fork", side_effect=AssertionError("a rank started")):
                result = unittest.TestResult()
                unittest.TestSuite([cls(name)]).run(result)
                self.assertIn(f"Invalid number of threads per rank {value} from {cls.__name__}.rank_threads",
                              self.only(result.errors))
