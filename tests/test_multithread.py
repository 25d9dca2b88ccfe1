"""What only the thread runner does: per-thread hooks, rank-local asserts,
the decorator's skip and failure types, upstream's hook names."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from datetime import timedelta
from unittest import mock

import runner_cases as cases
import torch
import torch.distributed as dist

import disttest
from disttest import RankFailure, _compat, spawn_threads_and_init_comms
from disttest.pg import _baton
from disttest.pg.threaded import install_threaded_pg
from disttest.support import janitor


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class MultiThreadedTestCaseTest(unittest.TestCase):
    def test_per_thread_hooks_and_group(self):
        seen = []
        lock = threading.Lock()

        class Case(disttest.MultiThreadedTestCase):
            @property
            def world_size(self):
                return 3

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def perThreadSetUp(self):
                with lock:
                    seen.append(("setup", self.rank, dist.is_initialized()))

            def perThreadTearDown(self):
                with lock:
                    seen.append(("teardown", self.rank))

            def test_body(self):
                with lock:
                    seen.append(("body", self.rank, dist.get_rank(), dist.get_world_size(),
                                 self._current_test_name))

        result = run(Case("test_body"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(sorted(e for e in seen if e[0] == "setup"), [("setup", r, True) for r in range(3)])
        self.assertEqual(sorted(e for e in seen if e[0] == "body"),
                         [("body", r, r, 3, "test_body") for r in range(3)])
        self.assertEqual(sorted(e for e in seen if e[0] == "teardown"), [("teardown", r) for r in range(3)])
        self.assertFalse(dist.is_initialized())  # no group leaks into the main thread

    def test_a_message_no_rank_received_fails_a_test_that_passed(self):
        # On gloo the send would wait for its receiver: the test would hang.
        class Case(disttest.MultiThreadedTestCase):
            world_size = 3

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_unreceived(self):
                if self.rank == 1:
                    dist.send(torch.ones(1), 0, tag=7)

            def test_received(self):
                if self.rank == 1:
                    dist.send(torch.ones(1), 0, tag=7)
                elif self.rank == 0:
                    dist.recv(torch.zeros(1), 1, tag=7)

            def test_isend_never_waited_for(self):
                if self.rank == 1:  # gloo's sender goes on too
                    dist.isend(torch.ones(1), 0, tag=7)

            @disttest.inject_fault(rank=1, action="kill", at="all_gather")
            def test_unreceived_and_a_fault_that_never_fired(self):
                if self.rank == 1:
                    dist.send(torch.ones(1), 0, tag=7)

        from disttest.runners.multithread import UNDELIVERED

        result = run(Case("test_unreceived"))
        self.assertEqual(len(result.errors), 1, result.errors + result.failures)
        self.assertIn(UNDELIVERED.format(test="test_unreceived", sends="rank 1 sent to rank 0 (tag 7, group 0)"),
                      result.errors[0][1])
        result = run(Case("test_unreceived_and_a_fault_that_never_fired"))  # the fault is the report
        self.assertIn("injected fault never fired", "".join(t for _, t in result.errors + result.failures))
        self.assertNotIn("no rank received", "".join(t for _, t in result.errors + result.failures))
        for name in ("test_received", "test_isend_never_waited_for"):
            result = run(Case(name))
            self.assertTrue(result.wasSuccessful(), (name, result.errors + result.failures))

    def test_what_a_rank_changes_for_the_process_ends_with_the_test(self):
        # Ranks as processes would take it with them; thread ranks share the
        # test process, and the next test (or the test process) must not see it.
        def state():
            return (torch.get_default_dtype(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                    torch.is_anomaly_enabled(), os.environ.get("DISTTEST_RANK_SET"), list(warnings.filters),
                    os.getcwd(), torch.get_float32_matmul_precision(), sys.getrecursionlimit(),
                    torch.get_rng_state(), random.getstate())

        before = state()
        folder = tempfile.mkdtemp(prefix="disttest-chdir-")
        self.addCleanup(os.rmdir, folder)

        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_changes(self):
                if self.rank == 1:
                    os.chdir(folder)
                    torch.set_float32_matmul_precision("medium")
                    sys.setrecursionlimit(sys.getrecursionlimit() + 100)
                    torch.manual_seed(1234)
                    random.seed(1234)
                    torch.set_default_dtype(torch.float64)
                    torch.set_num_threads(1)
                    torch.use_deterministic_algorithms(True)
                    torch.autograd.set_detect_anomaly(True)
                    os.environ["DISTTEST_RANK_SET"] = "1"
                    os.environ["DISTTEST_RANK_CHANGED"] = "changed"
                    del os.environ["DISTTEST_RANK_GONE"]
                    warnings.simplefilter("error")

        kept = {"DISTTEST_RANK_CHANGED": "as before", "DISTTEST_RANK_GONE": "here"}
        # (from torch 2.14 on, the matmul precision it sets is also a failure of
        # the test, as upstream's TestCase says: here, what is put back counts)
        with mock.patch.dict(os.environ, {**kept, "PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK": "1"}):
            result = run(Case("test_changes"))
            self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
            self.assertEqual({name: os.environ.get(name) for name in kept}, kept)
        after = state()
        self.assertEqual(after[:-2], before[:-2])
        self.assertTrue(torch.equal(after[-2], before[-2]))  # (the random states: a seed in a rank stays there)
        self.assertEqual(after[-1], before[-1])

    def test_what_setup_changed_and_undid_around_the_ranks_stays_undone(self):
        # The ranks' changes are put back to the state before setUp, not to
        # the state setUp was in when it started them.
        filters = list(warnings.filters)

        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            @mock.patch.dict(os.environ, {"DISTTEST_ONLY_IN_SETUP": "1"})
            def setUp(self):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    super().setUp()
                    self._spawn_threads()

            def test_nothing(self):
                pass

        self.assertTrue(run(Case("test_nothing")).wasSuccessful())
        self.assertNotIn("DISTTEST_ONLY_IN_SETUP", os.environ)
        self.assertEqual(list(warnings.filters), filters)

    def test_a_failure_names_the_hook_it_came_from(self):
        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def perThreadSetUp(self):
                if self._testMethodName == "test_setup" and self.rank == 1:
                    raise ValueError("setup broke")

            def perThreadTearDown(self):
                if self._testMethodName == "test_teardown" and self.rank == 0:
                    raise KeyError("teardown broke")

            def test_setup(self):
                pass

            def test_teardown(self):
                pass

        self.assertIn("rank 1/2 raised ValueError in perThreadSetUp", run(Case("test_setup")).errors[0][1])
        self.assertIn("rank 0/2 raised KeyError in perThreadTearDown", run(Case("test_teardown")).errors[0][1])

    def test_assert_on_rank(self):
        class Case(disttest.MultiThreadedTestCase):
            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_only_rank_0_checks(self):
                self.assertEqualOnRank(self.rank, 0)          # true on rank 0
                self.assertEqualOnRank(self.rank, 2, rank=2)
                self.assertNotEqualOnRank(self.rank, 1)       # rank 0: 0 != 1

            def test_rank_1_fails(self):
                self.assertEqualOnRank(self.rank, 5, rank=1)

        self.assertTrue(run(Case("test_only_rank_0_checks")).wasSuccessful())
        result = run(Case("test_rank_1_fails"))
        self.assertEqual(len(result.failures), 1)
        self.assertIn("rank 1/4 raised AssertionError", result.failures[0][1])

    def test_forgetting_to_spawn_is_an_error(self):
        class Case(disttest.MultiThreadedTestCase):
            def test_body(self):
                pass

        result = run(Case("test_body"))
        self.assertIn("call self._spawn_threads() in setUp", result.errors[0][1])

    def test_upstream_hook_names(self):
        from disttest.pg import threaded as threaded_pg

        self.assertIs(disttest._install_threaded_pg, threaded_pg._install_threaded_pg)
        self.assertIs(disttest._uninstall_threaded_pg, threaded_pg.uninstall_threaded_pg)
        self.assertTrue(issubclass(disttest.ProcessLocalGroup, dist.ProcessGroup))
        self.assertEqual(disttest.MultiThreadedTestCase.MAIN_THREAD_RANK, -1)


class DeviceTypeTestsTest(unittest.TestCase):
    def test_precision_of_upstreams_device_type_tests_in_rank_threads(self):
        # (DeviceTypeTestBase keeps precision per thread, set in the test
        # process's thread only: every @ops test failed in rank threads with
        # "'_thread._local' object has no attribute 'precision'")
        from torch.testing._internal.common_device_type import (
            dtypes,
            instantiate_device_type_tests,
            precisionOverride,
        )

        class Precise(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            @dtypes(torch.float)
            def test_default(self, device, dtype):
                self.assertEqual(self.precision, 0)
                self.assertEqual(torch.ones(2), torch.ones(2))

            @precisionOverride({torch.float: 0.5})
            @dtypes(torch.float)
            def test_override(self, device, dtype):
                self.assertEqual(self.precision, 0.5)
                self.assertEqual(torch.ones(2), torch.ones(2) + 0.4)

        scope: dict = {"Precise": Precise}  # (it removes the generic class from the scope)
        instantiate_device_type_tests(Precise, scope, only_for=("cpu",))
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(scope["PreciseCPU"]).run(result)
        self.assertEqual(result.testsRun, 2)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)


class TearDownSkipTest(unittest.TestCase):
    def test_a_skip_in_per_thread_tear_down_does_not_hide_a_failure(self):
        # (perThreadTearDown ran in a finally: its SkipTest replaced the
        # test's failure, and the test was reported skipped)
        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def perThreadTearDown(self):
                self.skipTest(f"tear-down skip on rank {self.rank}")

            def test_fails(self):
                self.assertEqual(1, 2, "the real failure")

            def test_errors(self):
                raise RuntimeError("the real error")

            def test_passes(self):
                pass

        failed, errored, passed = (run(Case(n)) for n in ("test_fails", "test_errors", "test_passes"))
        self.assertEqual((len(failed.failures), len(failed.skipped)), (1, 0))
        self.assertIn("the real failure", failed.failures[0][1])
        self.assertEqual((len(errored.errors), len(errored.skipped)), (1, 0))
        self.assertIn("the real error", errored.errors[0][1])
        self.assertEqual(len(passed.skipped), 1)  # (after a pass, the skip is the outcome)
        self.assertIn("tear-down skip on rank", passed.skipped[0][1])


class RankStartedThreadsTest(unittest.TestCase):
    def test_a_thread_a_rank_starts_is_of_that_rank(self):
        # As in a rank process: its default group, its groups, functional
        # collectives; it saw none ("Default process group has not been
        # initialized"), in the code under test's ThreadPoolExecutor too.
        from concurrent.futures import ThreadPoolExecutor

        import torch.distributed._functional_collectives as funcol

        start = threading.Thread.start

        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_children(self):
                got = {}

                def child():
                    t = torch.ones(1) * (dist.get_rank() + 1)
                    dist.all_reduce(t)
                    got["all_reduce"] = (dist.get_rank(), t.item())
                    got["funcol"] = funcol.all_reduce(torch.ones(1), "sum", group=dist.group.WORLD).item()

                thread = threading.Thread(target=child)
                thread.start()
                thread.join(10)
                self.assertEqual(got, {"all_reduce": (self.rank, 3.0), "funcol": 2.0})
                self.assertNotIn("run", vars(thread))  # (a finished thread holds no rank's groups)
                with ThreadPoolExecutor(1) as pool:
                    self.assertEqual(pool.submit(dist.get_world_size).result(10), 2)
                # A pool the ranks share runs each rank's task in that rank's
                # world (its thread, started by the first rank to submit,
                # ran the other's tasks as that rank).
                for _ in range(3):
                    self.assertEqual(shared.submit(dist.get_rank).result(10), self.rank)

        shared = ThreadPoolExecutor(1)
        self.addCleanup(shared.shutdown)
        shared.submit(lambda: None).result(10)  # (its thread, the test's process's, made before the test)
        result = run(Case("test_children"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertIs(threading.Thread.start, start)  # (put back after the test)
        self.assertFalse(dist.is_initialized())  # (the pool's thread kept no rank's world)
        self.assertEqual(shared.submit(dist.is_initialized).result(10), False)

    def test_a_wrapper_made_over_ours_still_starts_threads_after_the_uninstall(self):
        from disttest.pg.threaded import uninstall_threaded_pg

        start = threading.Thread.start
        install_threaded_pg()
        ours = threading.Thread.start

        def foreign(thread):
            ours(thread)

        threading.Thread.start = foreign
        try:
            uninstall_threaded_pg()
            ran = []
            thread = threading.Thread(target=lambda: ran.append(1))
            thread.start()  # (an IndexError: the original was cleared)
            thread.join(10)
            self.assertEqual(ran, [1])
        finally:
            threading.Thread.start = start


class HugeErrorTest(unittest.TestCase):
    def test_a_huge_error_is_capped_and_not_written_whole_to_the_terminal(self):
        # A rank process writes it whole to its log (DISTTEST_KEEP_LOGS); a
        # rank thread's stderr is the test process's: a megabyte there.
        class Huge(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_it(self):
                if self.rank == 1:
                    raise ValueError("Z" * 1_000_000)

        import io

        stderr = io.StringIO()
        with mock.patch.object(sys, "__stderr__", stderr):
            result = run(Huge("test_it"))
        [(_, text)] = result.errors
        self.assertIn("characters cut by disttest", text)
        self.assertLess(len(text), 100_000)
        self.assertNotIn("Z" * 30_000, stderr.getvalue())


class OutputTest(unittest.TestCase):
    """DISTTEST_OUTPUT and DISTTEST_KEEP_LOGS act on rank threads as on rank
    processes (a thread rank's output went through unprefixed, and only
    its last 4000 characters were kept)."""

    class Notes(disttest.MultiThreadedTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_notes(self):
            print(f"note {self.rank}")
            if self.rank == 1:
                print("unfinished", end="")

        def test_long_failure(self):
            print("x" * 9000 + "end of rank 1's output" if self.rank == 1 else "")
            self.assertEqual(self.rank, 0)

    def run_with(self, name: str, env: dict[str, str]) -> tuple[unittest.TestResult, str]:
        import io

        from disttest._runner import settings

        out = io.StringIO()
        # (as outside pytest: no test streams noted, so the mode acts on this one)
        with mock.patch.dict(os.environ, env), mock.patch.object(sys, "stdout", out), \
                mock.patch.object(settings, "_test_streams", [None, None]):
            result = run(self.Notes(name))
        return result, out.getvalue()

    def test_a_stream_the_test_reads_itself_gets_the_lines_as_written(self):
        # (pytest's capsys: noted streams are the test's own, and this one is not)
        import io

        from disttest._runner import settings

        out = io.StringIO()
        with mock.patch.dict(os.environ, {"DISTTEST_OUTPUT": "stream"}), mock.patch.object(sys, "stdout", out), \
                mock.patch.object(settings, "_test_streams", [object(), object()]):
            result = run(self.Notes("test_notes"))
        self.assertTrue(result.wasSuccessful(), result.errors)
        self.assertEqual(out.getvalue().splitlines(), ["note 0", "note 1", "unfinished"])

    def test_stream_prefixes_each_line(self):
        result, out = self.run_with("test_notes", {"DISTTEST_OUTPUT": "stream"})
        self.assertTrue(result.wasSuccessful(), result.errors)
        self.assertEqual(sorted(out.splitlines()), ["[rank 0] note 0", "[rank 1] note 1", "[rank 1] unfinished"])

    def test_tail_keeps_it_for_a_failing_rank_s_report(self):
        result, out = self.run_with("test_notes", {"DISTTEST_OUTPUT": "tail"})
        self.assertTrue(result.wasSuccessful(), result.errors)
        self.assertEqual(out, "")
        result, out = self.run_with("test_long_failure", {"DISTTEST_OUTPUT": "tail"})
        self.assertEqual(out, "")
        self.assertIn("end of rank 1's output", result.failures[0][1])

    def test_keep_logs_keeps_the_whole_output(self):
        import re
        import shutil

        result, _ = self.run_with("test_long_failure", {"DISTTEST_OUTPUT": "tail", "DISTTEST_KEEP_LOGS": "1"})
        found = re.search(r"kept in (\S+) \(disttest", result.failures[0][1])
        self.assertIsNotNone(found, result.failures)
        folder = found.group(1)
        self.addCleanup(shutil.rmtree, folder, True)
        with open(os.path.join(folder, "rank1.log")) as f:
            self.assertEqual(f.read(), "x" * 9000 + "end of rank 1's output\n")


class StartTest(unittest.TestCase):
    """Starting the ranks: held to the test's limit, and undone when it fails."""

    class Case(disttest.MultiThreadedTestCase):
        world_size = 40
        timeout = 0.5

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_body(self):
            pass

    def process_state(self):
        from disttest.pg import threaded

        return (os.environ.get("TORCH_SHOW_CPP_STACKTRACES"), torch.autograd.is_multithreading_enabled(),
                sys.excepthook, threading.excepthook, dict(getattr(dist.Backend, "_plugins", {})),
                len(threaded._installed))

    def test_starting_the_ranks_is_held_to_the_tests_limit(self):
        from disttest._runner import thread_pool

        real_thread = thread_pool.RankThread

        def slow_thread(pool):
            time.sleep(0.05)  # a machine that starts a thread in 50 ms
            return real_thread(pool)

        thread_pool.release_idle(wait=1.0)
        before = self.process_state()
        began = time.monotonic()
        with mock.patch.object(thread_pool, "RankThread", side_effect=slow_thread):
            result = run(self.Case("test_body"))
        took = time.monotonic() - began
        self.assertEqual((len(result.errors), result.failures), (1, []), result.errors)
        error = result.errors[0][1]
        self.assertIn("TimeoutError: started ", error)
        self.assertIn(" of the 40 rank threads within the test's limit of 0.5s, and ran none (disttest)", error)
        self.assertLess(took, 1.5, "starting the ranks ran past the test's limit")
        self.assertEqual(self.process_state(), before)

    def test_a_failed_start_leaves_the_process_as_it_was(self):
        from disttest._runner import thread_pool
        from disttest.faults import judge

        before = self.process_state()
        for target, error in ((thread_pool, RuntimeError("can't start new thread")),
                              (judge.Injection, disttest.ConfigError("fault", "x", "here", "expected y"))):
            name = "take" if target is thread_pool else "for_test"
            with self.subTest(failing=name), mock.patch.object(target, name, side_effect=error):
                result = run(self.Case("test_body"))
                self.assertEqual(len(result.errors), 1, result.errors)
                self.assertIn(str(error), result.errors[0][1])
                self.assertEqual(self.process_state(), before)
        self.assertTrue(run(self.Case("test_body")).wasSuccessful())


class UnstoppableTest(unittest.TestCase):
    def run_blocked(self, timeout: float | None = None) -> tuple[str, float]:
        """Run a test whose rank 1 blocks in C (a lock's acquire, which
        disttest's RankStopped cannot reach); its report and how long it took."""
        gate = threading.Event()
        self.addCleanup(gate.set)

        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_blocked(self):
                if self.rank == 1:
                    gate.wait()

        if timeout is not None:
            Case.timeout = timeout
        start = time.monotonic()
        result = run(Case("test_blocked"))
        elapsed = time.monotonic() - start
        gate.set()
        (_, text), = result.failures + result.errors
        self.assertIn("the threads of rank 1/2 could not be stopped", text)
        return text, elapsed

    def test_a_thread_that_cannot_be_stopped_is_waited_for_once(self):
        # The join loop's stop waits STOP_WAIT for it; the test's undo
        # stopped again and waited as long again (a 1 s test took 5 s).
        from disttest._runner import threads

        with mock.patch.object(threads, "STOP_WAIT", 3.0):
            text, elapsed = self.run_blocked(timeout=0.5)
        self.assertIn("rank 1/2 did not finish 'test_blocked' within 0.5s", text)
        self.assertGreater(elapsed, 3.0)
        self.assertLess(elapsed, 5.5)  # 0.5 + one STOP_WAIT, not two

    def test_under_an_outer_limit_the_stop_ends_in_time_for_the_report(self):
        # pytest-timeout's 3 s: disttest's limit is 1.05 s and the stop waited
        # 2 s more for a rank blocked in C, so pytest-timeout's report (no rank
        # named) came first.
        from disttest._runner import settings, threads

        with settings.outer_limit(3.0):
            text, elapsed = self.run_blocked()
        self.assertIn("rank 1/2 did not finish 'test_blocked' within 1.05s", text)
        self.assertLess(elapsed, 3.0 - threads.STOP_REPORT_RESERVE + 0.3)

    def run_stuck(self, body, world_size=2, timeout=0.5, stop_wait=None):
        """Run a test whose last rank runs ``body``, which does not end by
        itself; return the result and an event set when ``body`` ended."""
        from disttest._runner import threads

        ended = threading.Event()

        class Case(disttest.MultiThreadedTestCase):
            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_stuck(self):
                if self.rank == self.world_size - 1:
                    try:
                        body()
                    finally:
                        ended.set()

        Case.world_size, Case.timeout = world_size, timeout
        with mock.patch.object(threads, "STOP_WAIT", stop_wait or threads.STOP_WAIT):
            result = run(Case("test_stuck"))
        self.assertFalse(result.wasSuccessful())
        return result, ended

    def test_a_thread_that_could_not_be_stopped_in_time_is_stopped_later(self):
        # A rank that spins where disttest may not raise (here code that
        # counts as logging's, whose handlers hold locks across calls) for
        # longer than the stop waits, then in plain code: it used to spin on
        # into every later test of the process (a loop that logs was left
        # running in 1 of 4 timed-out tests, and every later test too).
        import logging

        spin = {}
        exec(compile("def spin(seconds):\n"
                     "    import time\n"
                     "    end = time.monotonic() + seconds\n"
                     "    while time.monotonic() < end:\n"
                     "        pass\n", logging.__file__, "exec"), spin)

        def body():
            spin["spin"](1.5)
            while True:
                pass

        result, ended = self.run_stuck(body, stop_wait=0.3)
        (_, text), = result.failures + result.errors
        self.assertIn("the threads of rank 1/2 could not be stopped", text)
        self.assertFalse(ended.is_set())
        self.assertTrue(ended.wait(10), "the rank thread spins on after its test")
        deadline = time.monotonic() + 5
        while any(t.name == "disttest-stopper" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse([t for t in threading.enumerate() if t.name == "disttest-stopper"])

    def test_a_thread_is_not_stopped_inside_a_context_manager_s_exit(self):
        # Its __exit__ puts back what __enter__ changed for the process
        # (mock.patch's attribute, a default dtype): stopped half way, the
        # change stayed for every later test.
        state = {"changed": False}

        class Change:
            def __enter__(self):
                state["changed"] = True

            def __exit__(self, *exc):
                end = time.monotonic() + 0.9
                while time.monotonic() < end:
                    pass
                state["changed"] = False

        def body():
            with Change():
                pass
            while True:
                pass

        _, ended = self.run_stuck(body, stop_wait=0.3)
        self.assertTrue(ended.wait(10), "the rank thread spins on after its test")
        self.assertFalse(state["changed"], "stopped inside __exit__")

    def test_a_thread_that_polls_in_a_context_manager_s_enter_is_stopped(self):
        # A context manager that waits for its peers before it yields: not
        # raised into there at first, but not for ever either (hostile pass:
        # both ranks ran on after the test).
        import contextlib

        @contextlib.contextmanager
        def joined():
            while True:
                time.sleep(0.01)
            yield

        def body():
            with joined():
                pass

        result, ended = self.run_stuck(body)
        (_, text), = result.failures + result.errors
        self.assertIn("rank 1/2 did not finish 'test_stuck' within 0.5s", text)
        self.assertTrue(ended.wait(5), "the rank thread polls on after its test")

    def test_a_thread_that_logs_in_a_loop_is_stopped_later(self):
        # It holds the GIL but in its handler's write: each look of the
        # watcher found it inside logging, where it may not be raised into
        # (hostile pass: 15 of 15 such ranks ran on). It is stopped in its
        # next log call instead, before logging takes a lock.
        import logging

        log = logging.getLogger("disttest-test-spinning")
        handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 (closed below)
        self.addCleanup(handler.stream.close)
        log.addHandler(handler)
        self.addCleanup(log.removeHandler, handler)
        log.setLevel(logging.INFO)
        log.propagate = False
        factory = logging.getLogRecordFactory()

        def body():
            while True:
                log.info("tick")
                total = 0
                for k in range(30):
                    total += k

        _, ended = self.run_stuck(body, world_size=1, timeout=0.3, stop_wait=0.3)
        self.assertTrue(ended.wait(5), "the rank thread logs on after its test")
        deadline = time.monotonic() + 5
        while logging.getLogRecordFactory() is not factory and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertIs(logging.getLogRecordFactory(), factory)
        self.assertTrue(handler.lock.acquire(timeout=1))
        handler.lock.release()


class RankThreadReuseTest(unittest.TestCase):
    """Rank threads are kept between tests (disttest._runner.thread_pool),
    unless a test left them unlike a fresh thread."""

    # NB: threads, not idents: the system reuses the ident of a thread that ended.
    def make_case(self, seen: dict[str, set[threading.Thread]], lock: threading.Lock) -> type:
        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def record(self) -> None:
                with lock:
                    seen.setdefault(self._testMethodName, set()).add(threading.current_thread())

            def test_first(self):
                self.record()

            def test_second(self):
                self.record()

            def test_leaves_grad_off(self):
                self.record()
                torch.set_grad_enabled(False)

            def test_needs_grad(self):
                self.record()
                self.assertTrue(torch.is_grad_enabled())

            def test_hangs(self):
                self.record()
                if self.rank == 1:
                    while True:  # Python-level: disttest stops it by raising into it
                        time.sleep(0.01)
                dist.barrier()

        Case.timeout = 1
        return Case

    def test_threads_are_reused(self):
        seen: dict[str, set[threading.Thread]] = {}
        Case = self.make_case(seen, threading.Lock())
        for name in ("test_first", "test_second"):
            result = run(Case(name))
            self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(len(seen["test_first"]), 2)
        self.assertEqual(seen["test_second"], seen["test_first"])
        idle = [t for t in seen["test_first"] if t.is_alive()]
        self.assertEqual(len(idle), 2)
        self.assertFalse(any(" rank " in t.name for t in idle), [t.name for t in idle])

    def test_a_thread_left_with_grad_off_is_not_reused(self):
        seen: dict[str, set[threading.Thread]] = {}
        Case = self.make_case(seen, threading.Lock())
        self.assertTrue(run(Case("test_leaves_grad_off")).wasSuccessful())
        result = run(Case("test_needs_grad"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertFalse(seen["test_needs_grad"] & seen["test_leaves_grad_off"])
        self.assertTrue(torch.is_grad_enabled())  # the main thread's own is untouched

    def test_a_thread_disttest_raised_into_is_not_reused(self):
        seen: dict[str, set[threading.Thread]] = {}
        Case = self.make_case(seen, threading.Lock())
        result = run(Case("test_hangs"))
        self.assertEqual(len(result.errors), 1, result.errors + result.failures)
        self.assertIn("did not finish", result.errors[0][1])
        result = run(Case("test_first"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(len(seen["test_first"] & seen["test_hangs"]), 1)  # rank 0's ended its test: kept

    def test_idle_threads_end_with_the_class(self):
        seen: dict[str, set[threading.Thread]] = {}
        Case = self.make_case(seen, threading.Lock())
        suite = unittest.TestSuite([Case("test_first"), Case("test_second")])
        result = unittest.TestResult()
        suite.run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        deadline = time.monotonic() + 2  # less than thread_pool.IDLE_EXIT
        while time.monotonic() < deadline and any(t.is_alive() for t in seen["test_first"]):
            time.sleep(0.01)
        self.assertFalse([t.name for t in seen["test_first"] if t.is_alive()])


    def test_idle_threads_can_be_ended_at_once(self):
        from disttest._runner import thread_pool

        seen: dict[str, set[threading.Thread]] = {}
        Case = self.make_case(seen, threading.Lock())
        self.assertTrue(run(Case("test_first")).wasSuccessful())
        self.assertTrue(all(t.is_alive() for t in seen["test_first"]))
        thread_pool.release_idle(wait=2)
        self.assertFalse([t.name for t in seen["test_first"] if t.is_alive()])


class ThreadSchedulingTest(unittest.TestCase):
    """``thread_scheduling`` / DISTTEST_THREAD_SCHEDULING: rank threads take
    turns (disttest.pg._baton) unless set free."""

    def make_case(self, scheduling: str | None, body) -> type:
        attrs = {} if scheduling is None else {"thread_scheduling": scheduling}

        class Case(disttest.MultiThreadedTestCase):
            world_size = 4
            timeout = 30
            locals().update(attrs)

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_body(self):
                body(self)

        return Case

    def ranks_meet_outside_disttest(self, barrier: threading.Barrier):
        def body(case):
            barrier.wait()  # every rank thread must be running at once
            dist.all_reduce(torch.ones(1))
        return body

    def test_with_turns_one_rank_thread_runs_between_collectives(self):
        lock = threading.Lock()
        running, most = [0], [0]

        def body(case):
            for _ in range(3):
                with lock:
                    running[0] += 1
                    most[0] = max(most[0], running[0])
                for _ in range(5):
                    torch.ones(4).add_(1)  # releases the GIL: a free peer would run now
                    time.sleep(0.001)
                with lock:
                    running[0] -= 1
                dist.all_reduce(torch.ones(1))

        with mock.patch.object(_baton, "HOLD_LIMIT", 60.0):  # never set free here
            result = run(self.make_case(None, body)("test_body"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(most[0], 1)

    @unittest.skipUnless(hasattr(os, "sched_getaffinity"), "needs CPU affinity (Linux)")
    def test_threads_woken_on_their_wakers_cpu_get_their_cpus_back(self):
        # A hand-off moves the woken thread (a rank, or the joining thread)
        # to the waker's CPU for the wake-up only: whatever a rank starts
        # after it, and the test process after the test, may use every CPU.
        cpus = os.sched_getaffinity(0)
        seen = []
        lock = threading.Lock()

        def body(case):
            for _ in range(3):
                with lock:
                    seen.append(os.sched_getaffinity(0))
                dist.all_reduce(torch.ones(1))
            with lock:
                seen.append(os.sched_getaffinity(0))

        case = self.make_case(None, body)
        for _ in range(3):
            result = run(case("test_body"))
            self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
            self.assertEqual(os.sched_getaffinity(0), cpus)
        self.assertEqual(len(seen), 3 * 4 * 4)
        self.assertTrue(all(s == cpus for s in seen), [s for s in seen if s != cpus][:3])

    def test_a_collective_done_within_its_timeout_does_not_time_out_waiting_for_the_turn(self):
        def body(case):
            if case.rank > 1:
                return
            group = dist.new_group([0, 1], timeout=timedelta(seconds=0.3))
            if case.rank == 1:
                time.sleep(0.1)
            dist.all_reduce(torch.ones(1), group=group)  # rank 1 completes rank 0's at 0.1 s of 0.3
            if case.rank == 1:
                time.sleep(0.4)  # and keeps the turn past rank 0's limit (as until a watch frees it)

        with mock.patch.object(_baton, "HOLD_LIMIT", 60.0):  # the watch comes too late
            result = run(self.make_case(None, body)("test_body"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    @unittest.skipUnless(hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1,
                         "needs CPU affinity (Linux) and two CPUs")
    def test_the_test_thread_is_moved_only_while_it_waits_for_the_ranks(self):
        # Ranks that end (or fail) before the join waits must not leave the
        # test's thread on one CPU: what setUp starts next would inherit it.
        cpus = os.sched_getaffinity(0)
        seen: dict[str, list] = {}

        def body(case):
            if case.rank == 0 and case.how == "fail":
                raise ValueError("fails at once")
            if case.rank == 1 and case.how == "timeout":
                time.sleep(0.6)
            dist.all_reduce(torch.ones(1))

        for how in ("pass", "fail", "timeout"):
            case = self.make_case(None, body)
            case.how = how

            def setUp(self, how=how):
                disttest.MultiThreadedTestCase.setUp(self)
                self._spawn_threads()
                if how != "timeout":
                    self._run_state.launcher._ended.wait(10)  # every rank ended (the first failed)
                started = []
                t = threading.Thread(target=lambda: started.append(os.sched_getaffinity(0)))
                t.start()
                t.join()
                seen[how] = [os.sched_getaffinity(0), *started]

            case.setUp = setUp
            if how == "timeout":
                case.timeout = 0.3
            with self.subTest(how=how):
                result = run(case("test_body"))
                self.assertEqual(len(result.errors), how != "pass")
                self.assertEqual(seen[how], [cpus, cpus])
                self.assertEqual(os.sched_getaffinity(0), cpus)

    def test_a_rank_that_sleeps_loses_its_turn_and_the_others_keep_theirs(self):
        # The world went free: with a thousand ranks, all contended for the
        # GIL for the rest of the test (2.4x the time at 1024 ranks).
        from disttest.pg.threaded import _current_world

        seen = []

        def body(case):
            if case.rank == 0:
                time.sleep(0.1)
            dist.all_reduce(torch.ones(1))
            seen.append(_current_world().baton.free)
            dist.barrier()

        result = run(self.make_case(None, body)("test_body"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(seen, [False] * 4)

    def test_a_rank_blocked_outside_disttest_sets_the_threads_free(self):
        barrier = threading.Barrier(4, timeout=20)
        start = time.monotonic()
        result = run(self.make_case(None, self.ranks_meet_outside_disttest(barrier))("test_body"))
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertLess(time.monotonic() - start, 5)

    def test_free_threads_run_at_once_from_the_start(self):
        for how in ("class", "env"):
            with self.subTest(how=how):
                barrier = threading.Barrier(4, timeout=5)
                case = self.make_case("free" if how == "class" else "turns",
                                      self.ranks_meet_outside_disttest(barrier))
                env = {"DISTTEST_THREAD_SCHEDULING": " Free"} if how == "env" else {}
                with mock.patch.object(_baton, "HOLD_LIMIT", 60.0), mock.patch.dict(os.environ, env):
                    result = run(case("test_body"))
                self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    def test_the_decorator_reads_the_variable(self):
        barrier = threading.Barrier(2, timeout=5)

        class Case(unittest.TestCase):
            @spawn_threads_and_init_comms(world_size=2, timeout=30)
            def test_meet(self):
                barrier.wait()

        with mock.patch.object(_baton, "HOLD_LIMIT", 60.0), \
                mock.patch.dict(os.environ, {"DISTTEST_THREAD_SCHEDULING": "free"}):
            Case("test_meet").test_meet()

    def test_a_bad_value_is_named_with_its_source(self):
        result = run(self.make_case("parallel", lambda case: None)("test_body"))
        self.assertEqual(len(result.errors), 1)
        self.assertRegex(result.errors[0][1], r"'parallel'.*Case\.thread_scheduling")
        with mock.patch.dict(os.environ, {"DISTTEST_THREAD_SCHEDULING": "gil"}):
            result = run(self.make_case(None, lambda case: None)("test_body"))
        self.assertRegex(result.errors[0][1], r"'gil'.*environment variable DISTTEST_THREAD_SCHEDULING")
        self.assertFalse(dist.is_initialized())


class DecoratorTest(unittest.TestCase):
    def test_what_a_rank_changes_for_the_process_ends_with_the_function(self):
        @spawn_threads_and_init_comms(world_size=2)
        def body(self):
            if dist.get_rank() == 1:
                torch.set_default_dtype(torch.float64)
                os.environ["DISTTEST_RANK_SET"] = "1"

        body(self)
        self.assertEqual((torch.get_default_dtype(), os.environ.get("DISTTEST_RANK_SET")), (torch.float32, None))

    @spawn_threads_and_init_comms(world_size=3)
    def test_each_rank_runs_with_a_group(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3.0)

    @spawn_threads_and_init_comms
    def test_bare_decorator_uses_four_ranks(self):
        self.assertEqual(dist.get_world_size(), 4)

    def test_skip_propagates_as_skip(self):
        class Case(unittest.TestCase):
            @spawn_threads_and_init_comms(world_size=2)
            def test_skip(self):
                raise unittest.SkipTest("no accelerator here")

        result = run(Case("test_skip"))
        self.assertEqual([r for _, r in result.skipped], ["no accelerator here"])

    def test_failure_is_assertion_and_runtime_error(self):
        class Case(unittest.TestCase):
            @spawn_threads_and_init_comms(world_size=2, timeout=10)
            def test_fail(self):
                if dist.get_rank() == 1:
                    raise ValueError("bad rank")
                dist.barrier()

        with self.assertRaises(RuntimeError) as ctx:
            Case("test_fail").test_fail()
        self.assertIsInstance(ctx.exception, AssertionError)
        self.assertIsInstance(ctx.exception, RankFailure)
        self.assertIn("rank 1/2: ValueError: bad rank", str(ctx.exception))

    def test_processes_a_rank_leaves_running_are_killed_and_named(self):
        # They outlived the function (only MultiThreadedTestCase killed them);
        # and they carry the janitor's token, so that its reaper kills them
        # if the test process is killed outright (test_hostile).
        seen_token = []

        @spawn_threads_and_init_comms(world_size=2)
        def body(self):
            if dist.get_rank() == 1:
                seen_token.append(os.environ.get(janitor.TOKEN_ENV))
                cases.started(subprocess.Popen(["sleep", cases.LEFT_SLEEP], start_new_session=True))

        before = os.environ.get(janitor.TOKEN_ENV)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            body(self)
        self.assertEqual(cases.sleeps_left(), [])
        self.assertTrue(any(f"sleep {cases.LEFT_SLEEP}" in str(w.message) and "left processes running" in
                            str(w.message) for w in seen), [str(w.message) for w in seen])
        self.assertIsNotNone(seen_token[0])
        self.assertEqual(os.environ.get(janitor.TOKEN_ENV), before)

    def test_processes_from_before_the_test_are_kept_and_found_without_a_scan(self):
        # Each thread test notes the test process's descendants at its start
        # (they are not the test's to kill). psutil finds them by reading
        # every process of the machine: 3 ms a test on a busy one (a 4-rank
        # thread test took 11 ms there against upstream's 6.5).
        import psutil

        from disttest._runner import proctree

        tree = subprocess.Popen(["sh", "-c", f"sleep {cases.LEFT_SLEEP} & wait"])
        self.addCleanup(tree.wait)
        self.addCleanup(lambda: [p.kill() for p in psutil.Process(tree.pid).children(recursive=True) + [
            psutil.Process(tree.pid)]])
        deadline = time.monotonic() + 10
        while not psutil.Process(tree.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        grandchild, = psutil.Process(tree.pid).children()
        with mock.patch("psutil._ppid_map", side_effect=AssertionError("scanned every process")):
            found = proctree.descendants()
        self.assertLessEqual({tree.pid, grandchild.pid}, found)

        @spawn_threads_and_init_comms(world_size=2)
        def body(self):
            dist.barrier()

        body(self)
        self.assertTrue(grandchild.is_running() and grandchild.status() != psutil.STATUS_ZOMBIE)

        # A thread of a child that ends between /proc's listing and its read
        # (a helper whose threads come and go): its other children were
        # missed, then killed as the test's (1 call in 14 in a hostile pass).
        listdir, listed = os.listdir, []

        def with_a_thread_gone(path):
            names = listdir(path)
            if path == f"/proc/{tree.pid}/task" and not listed:
                listed.append(path)
                return ["999999999", *names]
            return names

        with mock.patch("os.listdir", side_effect=with_a_thread_gone):
            self.assertLessEqual({tree.pid, grandchild.pid}, proctree.descendants())
        self.assertEqual(listed, [f"/proc/{tree.pid}/task"])

    def test_kept_below_an_outer_limit(self):
        # pytest-timeout's limit (the plugin sets it for every test): a hang
        # in a decorated function went on to it (its kill, no stacks), as
        # its limit was the default one.
        from disttest._runner import settings

        @spawn_threads_and_init_comms(world_size=2)
        def body(self):
            if dist.get_rank() == 1:
                for _ in range(60):
                    time.sleep(0.1)

        start = time.monotonic()
        with settings.outer_limit(4), mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "300"}), \
                self.assertRaisesRegex(AssertionError, r"rank 1/2 timed out after 1.4s"):
            body(self)
        self.assertLess(time.monotonic() - start, 4)

    def test_bad_arguments_are_named(self):
        with self.assertRaisesRegex(disttest.ConfigError, r"spawn_threads_and_init_comms\(world_size=...\)"):
            spawn_threads_and_init_comms(world_size=0)
        with self.assertRaisesRegex(disttest.ConfigError, r"spawn_threads_and_init_comms\(timeout=...\)"):
            spawn_threads_and_init_comms(timeout="soon")


class CoexistenceTest(unittest.TestCase):
    # NB: before 2.7 c10d refuses to register a backend name twice, so
    # upstream's import (which registers "threaded") fails after disttest's.
    @unittest.skipUnless(_compat.torch_at_least("2.7"),
                         "needs torch >= 2.7 (c10d re-registering a backend name)")
    def test_upstream_import_does_not_take_over_the_threaded_backend(self):
        import subprocess
        import sys

        code = (
            "import disttest, torch, torch.distributed as dist\n"
            "import torch.testing._internal.common_distributed\n"
            "import unittest\n"
            "class T(disttest.MultiThreadedTestCase):\n"
            "    def setUp(self):\n"
            "        super().setUp(); self._spawn_threads()\n"
            "    def test_ours(self):\n"
            "        assert type(dist.group.WORLD).__module__ == 'disttest.pg.threaded'\n"
            "        t = torch.ones(1); dist.all_reduce(t); assert t.item() == 4\n"
            "unittest.main()\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertIn("OK", proc.stderr, proc.stderr[-3000:])


RELEASED_SUITE = """
import torch, torch.distributed as dist
import disttest

class T(disttest.MultiThreadedTestCase):
    world_size = 8

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_one_fails(self):
        if self.rank == 0:
            raise ValueError("rank 0 fails")
        dist.all_reduce(torch.ones(1))
"""


class CapturedLogTest(unittest.TestCase):
    def test_ranks_released_by_disttest_log_nothing_into_pytests_capture(self):
        # c10d logs each collective's exception (DEBUG): one record per rank
        # disttest released, 1023 lines a test at 1024 ranks under pytest.
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_released.py"), "w") as f:
                f.write(RELEASED_SUITE)
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "test_released.py"], cwd=tmp, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("rank 0 fails", out)
        self.assertNotIn("released by disttest", out)
