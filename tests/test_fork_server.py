"""Where MultiProcessTestCase's fork server comes from (DISTTEST_FORK_SERVER).

By default it is a copy of the test process (a fork, where that is safe),
else a fresh interpreter; see disttest/_runner/zygote.py.
"""

from __future__ import annotations

import _thread
import atexit
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import unittest
import warnings
from unittest import mock

import fork_server_cases as cases

from disttest import ConfigError
from disttest._runner import zygote
from disttest.runners import multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class NoServers:
    """Run a block as if this process had no fork server yet; close those
    it starts."""

    def __enter__(self) -> None:
        self._patch = mock.patch.dict(zygote._clients, clear=True)
        self._patch.__enter__()
        self._failed = list(zygote._copy_failed)
        zygote._copy_failed.clear()

    def __exit__(self, *exc: object) -> None:
        for client in list(zygote._clients.values()):
            client.close()
        self._patch.__exit__(*exc)
        zygote._copy_failed[:] = self._failed


class ForkServerTest(unittest.TestCase):
    def assertPassed(self, result: unittest.TestResult) -> None:
        self.assertEqual(result.errors + result.failures + result.skipped, [])
        self.assertEqual(result.testsRun, 1)

    def run_cases(self, server: str) -> None:
        # A new process, so that it has no fork server yet; both tests'
        # ranks come from one server.
        with tempfile.TemporaryDirectory() as tmp:
            servers = os.path.join(tmp, "servers")
            env = {**os.environ, cases.SERVERS_FILE_ENV: servers, cases.EXPECT_ENV: server}
            if server != "default":
                env["DISTTEST_FORK_SERVER"] = server
            else:
                env.pop("DISTTEST_FORK_SERVER", None)
                env[cases.EXPECT_ENV] = "copy"
            proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "fork_server_cases.CopyOrFresh"],
                                  cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
            self.assertIn("Ran 2 tests", proc.stderr)
            with open(servers) as f:
                lines = sorted(f.read().splitlines())
        self.assertEqual(len(lines), 4, lines)  # two tests, two ranks each
        self.assertEqual(len({line.split(": ")[1] for line in lines}), 1, lines)

    def test_by_default_a_copy_of_the_test_process_before_the_classs_set_up(self):
        # Its command line and modules are the test process's; what the
        # class's setUpClass does after super() is not in it.
        if not zygote.copy_safe(1):
            self.skipTest("this host or process cannot fork the test process safely (CUDA, a thread)")
        self.run_cases("default")

    def test_each_class_gets_a_copy_as_the_test_process_is_when_it_sets_up(self):
        # Not one copy for the whole process: what an earlier class set up
        # and undid (a patch it stopped) stays out of a later class's ranks.
        if not zygote.copy_safe(1):
            self.skipTest("this host or process cannot fork the test process safely (CUDA, a thread)")
        env = {k: v for k, v in os.environ.items() if k != "DISTTEST_FORK_SERVER"}
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "fork_server_cases.PatchedFirst",
                               "fork_server_cases.LaterClass"],
                              cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        self.assertIn("Ran 2 tests", proc.stderr)

    def test_a_test_whose_ranks_crash_only_in_a_copy_passes_on_a_fresh_server(self):
        # State a test left in the test process is copied into a later
        # class's copy (a gloo group the test process made breaks some c10d
        # calls in a forked copy); a fresh server has none of it.
        if not zygote.copy_safe(1):
            self.skipTest("this host or process cannot fork the test process safely (CUDA, a thread)")
        env = {k: v for k, v in os.environ.items() if k != "DISTTEST_FORK_SERVER"}
        proc = subprocess.run([sys.executable, "-W", "always", "-m", "unittest", "-v",
                               "fork_server_cases.DirtyTheProcess", "fork_server_cases.CrashesInACopy"],
                              cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        text = " ".join(proc.stderr.split())
        self.assertIn(multiprocess.COPY_CRASHED.format(
            test="CrashesInACopy.test_crashes_in_a_copy_only", who="rank 0/2", how="was killed by SIGSEGV"), text)
        # (at the test, not at disttest's frame that noticed it)
        self.assertRegex(proc.stderr, r"fork_server_cases\.py:\d+: UserWarning: CrashesInACopy\.test_crashes_in_a_copy_only:")
        self.assertIn("Ran 3 tests", text)

    def test_streamed_output_says_which_run_is_which(self):
        if not zygote.copy_safe(1):
            self.skipTest("this host or process cannot fork the test process safely (CUDA, a thread)")
        env = {k: v for k, v in os.environ.items() if k != "DISTTEST_FORK_SERVER"}
        proc = subprocess.run([sys.executable, "-m", "unittest", "fork_server_cases.DirtyTheProcess",
                               "fork_server_cases.CrashesInACopy.test_crashes_in_a_copy_only"],
                              cwd=HERE, env=dict(env, DISTTEST_OUTPUT="stream"), capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        note = multiprocess.AGAIN_IN_A_FRESH_SERVER.format(
            test="CrashesInACopy.test_crashes_in_a_copy_only", who="rank 0/2", how="was killed by SIGSEGV")
        first, _, second = proc.stdout.partition(note + "\n")
        self.assertTrue(second, proc.stdout)
        for run in (first, second):  # each run's lines on their side of the note
            self.assertEqual(sorted(line for line in run.splitlines() if "body of rank" in line),
                             ["[rank 0] body of rank 0", "[rank 1] body of rank 1"], proc.stdout)

    def test_a_crash_in_a_fresh_server_too_is_the_tests_and_copies_go_on(self):
        if not zygote.copy_safe(1):
            self.skipTest("this host or process cannot fork the test process safely (CUDA, a thread)")
        env = {k: v for k, v in os.environ.items() if k != "DISTTEST_FORK_SERVER"}
        proc = subprocess.run([sys.executable, "-W", "always", "-m", "unittest", "-v",
                               "fork_server_cases.CrashesAnywhere"],
                              cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("rank 1/2 was killed by SIGSEGV before finishing 'test_crashes'", proc.stderr)
        self.assertNotIn("ran again in ranks of a fresh fork server", proc.stderr)
        self.assertIn("test_later_the_copy_serves_again (fork_server_cases.CrashesAnywhere"
                      ".test_later_the_copy_serves_again) ... ok", proc.stderr)

    def test_fresh_is_a_new_interpreter_that_imports_the_module(self):
        self.run_cases("fresh")

    def test_a_copy_only_where_a_fork_is_safe(self):
        with mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": "copy"}):
            if not zygote.copy_safe(1):
                self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
            # Ranks of more OpenMP threads than one: the test process may
            # have run a parallel op (their first one would hang).
            self.assertFalse(zygote.copy_safe(None))
            self.assertFalse(zygote.copy_safe(4))
            stop = threading.Event()
            other = threading.Thread(target=stop.wait, args=(30,))
            other.start()
            try:  # a fork copies another thread's locks as they are
                self.assertFalse(zygote.copy_safe(1))
            finally:
                stop.set()
                other.join()
            with mock.patch("disttest._runner.cuda_fork.no_cuda_device", return_value=False):
                self.assertFalse(zygote.copy_safe(1))
        with mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": "fresh"}):
            self.assertFalse(zygote.copy_safe(1))

    def test_no_cuda_device_is_asked_without_the_driver(self):
        # cuInit (torch.cuda.device_count's fallback where NVML cannot count)
        # would poison fork in the test process: unsure means "maybe".
        import torch

        from disttest._runner import cuda_fork

        def answer(built, driver, nvml):
            with mock.patch.dict(cuda_fork._no_device, clear=True), \
                    mock.patch.object(torch.backends.cuda, "is_built", return_value=built), \
                    mock.patch.object(cuda_fork.os.path, "exists", return_value=driver), \
                    mock.patch.object(cuda_fork.glob, "glob", return_value=["/dev/nvidia0"] if driver else []), \
                    mock.patch("disttest._compat.nvml_device_count", return_value=nvml), \
                    mock.patch.object(torch._C, "_cuda_getDeviceCount", create=True,
                                      side_effect=AssertionError("asked the driver")):
                return cuda_fork.no_cuda_device()

        self.assertTrue(answer(built=False, driver=True, nvml=-1))
        self.assertTrue(answer(built=True, driver=False, nvml=-1))
        self.assertTrue(answer(built=True, driver=True, nvml=0))
        self.assertFalse(answer(built=True, driver=True, nvml=2))
        self.assertFalse(answer(built=True, driver=True, nvml=-1))

    def test_ranks_of_torchs_default_threads_get_a_fresh_server(self):
        self.assertPassed(run(cases.ManyThreads("test_server_is_fresh")))

    def test_ranks_of_one_thread_get_the_copy(self):
        if not zygote.copy_safe(1):
            self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
        self.assertPassed(run(cases.OneThread("test_server_is_a_copy")))

    def test_a_bad_value_names_itself_and_the_variable(self):
        with mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": "forked"}):
            result = run(cases.OneThread("test_server_is_a_copy"))
        self.assertEqual(len(result.errors), 1, result.errors)
        text = result.errors[0][1]
        self.assertIn(ConfigError.__name__, text)
        self.assertIn("'forked'", text)
        self.assertIn("environment variable DISTTEST_FORK_SERVER", text)

    def test_a_copy_that_does_not_start_gives_way(self):
        # The test runs (its ranks forked from the test process, with a
        # warning), and no copy is made again.
        if not zygote.copy_safe(1):
            self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
        with NoServers(), mock.patch.object(zygote, "main", lambda *args: os._exit(3)), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertPassed(run(cases.OneThread("test_runs")))
            self.assertFalse(zygote.copy_safe(1))
            self.assertIn((os.getpid(), False), zygote._clients)  # a fresh one ran it
            self.assertNotIn((os.getpid(), True), zygote._clients)
        self.assertTrue(any("a fresh fork server instead: the fork server (a fork of the test process) exited "
                            "with code 3 as it started" in str(w.message) for w in caught),
                        [str(w.message) for w in caught])

    def test_a_copy_holds_none_of_the_test_processs_pipes(self):
        # Else a reader would not see the end when the test process closes
        # its end (a retired fork server's input, pytest-xdist's channel).
        if not zygote.copy_safe(1):
            self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
        read, write = os.pipe()
        try:
            with NoServers():
                zygote._client(1).await_ready()
                os.close(write)
                write = -1
                ready, _, _ = select.select([read], [], [], 10)
                self.assertEqual(ready, [read], "the copy holds the pipe's write end")
                self.assertEqual(os.read(read, 1), b"")
        finally:
            os.close(read)
            if write != -1:
                os.close(write)

    def test_a_copy_that_fails_leaves_by_os_exit(self):
        # Whatever its server loop raises, the copy never returns into the
        # test process's code (which would go on running the tests).
        if not zygote.copy_safe(1):
            self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
        for error in (RuntimeError("broken"), SystemExit(0), KeyboardInterrupt()):
            with self.subTest(error=type(error).__name__), tempfile.TemporaryDirectory() as tmp:
                marker = os.path.join(tmp, "exit-handler-ran")
                handler = lambda m=marker: open(m, "w").close()  # noqa: E731
                atexit.register(handler)

                def fail(*args: object, e: BaseException = error) -> None:
                    raise e

                try:
                    with NoServers(), mock.patch.object(zygote, "main", fail):
                        client = zygote._client(1)
                        self.assertEqual(client.proc.wait(10), 1)
                    self.assertFalse(os.path.exists(marker), "the copy ran the test process's exit handlers")
                finally:
                    atexit.unregister(handler)

    def test_a_copy_never_runs_the_test_processs_exit(self):
        # It ends by os._exit: not through the test process's atexit
        # handlers (disttest's cleanups, the user's), whatever ends it.
        if not zygote.copy_safe(1):
            self.skipTest("this test process cannot be forked safely (a thread or CUDA)")
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "exit-handler-ran")
            handler = lambda: open(marker, "w").close()  # noqa: E731
            atexit.register(handler)
            try:
                with NoServers():
                    client = zygote._client(1)
                    client.await_ready()
                    pid = client.proc.pid
                    client.close()  # its input closes: it ends
                self.assertIsNotNone(client.proc.poll(), f"the copy {pid} still runs")
                self.assertEqual(client.proc.returncode, 0)
                self.assertFalse(os.path.exists(marker), "the copy ran the test process's exit handlers")
            finally:
                atexit.unregister(handler)



def named_native_thread(name: bytes) -> threading.Event:
    """Start a thread the threading module does not see (as torch's are),
    named ``name`` for the kernel; it ends when the returned event is set."""
    import ctypes

    stop, named = threading.Event(), threading.Event()

    def body() -> None:
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        named.set()
        stop.wait(30)

    _thread.start_new_thread(body, ())
    named.wait(10)
    return stop


class AutogradThreadsTest(unittest.TestCase):
    """Once torch's autograd engine has started its device threads in the
    test process, a process forked from it can run no backward pass ("Unable
    to handle autograd's threading in combination with fork-based
    multiprocessing"): ranks come from the fresh fork server instead."""

    def test_the_test_process_is_not_forked_once_autograd_started_its_threads(self):
        import cuda_fork_cases

        from disttest._runner import cuda_fork, fork_threads

        with mock.patch.object(fork_threads, "_autograd_seen", None):
            real = fork_threads.autograd_started()  # (an earlier test's FSDP2 backward, on torch 2.14)
            stop = threading.Event() if real else named_native_thread(b"pt_autograd_0")
            try:
                self.assertTrue(fork_threads.autograd_started())
                with mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": "copy"}):
                    self.assertFalse(zygote.copy_safe(1))
                # disttest's own fork (the pool's default) goes to the fork server
                with mock.patch("threading.active_count", return_value=1):
                    method, where, _ = cuda_fork_cases.Pooled._start_choice()
                self.assertEqual((method, where), ("zygote", "disttest's fork server in place of "
                                                             "Pooled.start_method 'fork'"))
                self.assertEqual(cuda_fork.choose("fork", cuda_fork_cases.Pooled, "t", "Pooled.start_method", True)[0],
                                 "zygote")
            finally:
                stop.set()
        if real:
            return
        # (a thread of another name is not autograd's)
        with mock.patch.object(fork_threads, "_autograd_seen", None):
            stop = named_native_thread(b"pt_other_0")
            try:
                self.assertFalse(fork_threads.autograd_started())
            finally:
                stop.set()

    def test_ranks_run_a_backward_pass_after_fsdp2_ran_one_in_the_test_process(self):
        # torch 2.14's FSDP2 starts autograd's device threads on CPU; 2.13's does not
        from disttest import _compat

        if not _compat.torch_at_least("2.14"):
            self.skipTest("this torch's FSDP2 starts no autograd device thread on CPU")
        env = {k: v for k, v in os.environ.items() if k not in ("DISTTEST_FORK_SERVER", "DISTTEST_START_METHOD")}
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "autograd_fork_cases"],
                              cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
        if "autograd device threads: 0" in proc.stderr:
            self.skipTest("this torch's FSDP2 started no autograd device thread on CPU")
        self.assertIn("autograd device threads:", proc.stderr)
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        self.assertIn("Ran 2 tests", proc.stderr)


class ThreadsAtImportTest(unittest.TestCase):
    """A fork server whose import of the test's module started OpenMP's pool
    does not fork ranks that keep OpenMP's threads: they would hang at their
    first parallel op (the test's limit, not a result)."""

    @staticmethod
    def run_modules(*names: str) -> subprocess.CompletedProcess[str]:
        # OMP_NUM_THREADS=2: a pool starts whatever the host's cores or the
        # caller's setting (one thread would start none).
        env = {**os.environ, "DISTTEST_FORK_SERVER": "fresh", "OMP_NUM_THREADS": "2"}
        return subprocess.run([sys.executable, "-W", "always", "-m", "unittest", "-v", *names],
                              cwd=HERE, env=env, capture_output=True, text=True, timeout=300)

    def test_ranks_that_keep_openmp_threads_are_spawned_the_others_forked(self):
        from disttest._runner import fork_threads

        # A clean module's test first: the server has forked once (numpy's
        # OpenBLAS pool ends at a fork); then numpy work at import (its pool
        # ends at every fork: no refusal); then a parallel op at import.
        proc = self.run_modules("omp_clean_cases", "np_import_cases", "omp_import_cases")
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        self.assertIn("Ran 5 tests", proc.stderr)
        text = " ".join(proc.stderr.split())
        first = fork_threads.FELL_BACK_THREADS.format(
            test="OmpRanks.test_a", method="zygote", source="OmpRanks.start_method", cls="OmpRanks", threads=None,
            reason=fork_threads.SERVER_THREADS.format(module="omp_import_cases", count="COUNT"))
        head, tail = first.split("COUNT")
        self.assertRegex(text, re.escape(head) + r"[1-9]\d*" + re.escape(tail))
        self.assertIn(fork_threads.FELL_BACK_THREADS.format(
            test="OmpRanks.test_b", method="zygote", source="OmpRanks.start_method", cls="OmpRanks", threads=None,
            reason=fork_threads.SERVER_THREADS_LEARNED.format(module="omp_import_cases")), text)
        for forked in ("CleanOmpRanks.test_forked", "NumpyAtImport.test_forked", "SerialRanks.test_forked"):
            self.assertNotIn(f"{forked}: its ranks start with 'spawn'", text)

    def test_a_pools_warning_names_who_chose_the_fork_server(self):
        # It said "instead of 'zygote' (from OmpPool.start_method)", which is 'fork'.
        from disttest._runner import fork_threads

        proc = self.run_modules("omp_pool_cases.OmpPool")
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        text = " ".join(proc.stderr.split())
        head = fork_threads.FELL_BACK_THREADS.format(
            test="the pool of OmpPool", method="zygote", source="disttest's fork server in place of "
            "OmpPool.start_method 'fork'", cls="OmpPool", threads=None, reason="REASON").split("REASON")[0]
        self.assertIn(head, text)

    def test_threads_an_earlier_module_started_send_the_test_to_a_fresh_server(self):
        # The server imports omp_import_cases for ranks of one thread (forked;
        # its pool starts), then the clean module: not that module's doing,
        # so a fresh server forks its ranks, and nothing is said.
        proc = self.run_modules("omp_import_cases.SerialRanks", "omp_clean_cases")
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        self.assertIn("Ran 2 tests", proc.stderr)
        self.assertNotIn("(disttest)", proc.stderr)

    def test_ranks_forked_from_a_test_process_that_ran_a_parallel_op(self):
        from disttest._runner import fork_threads

        proc = self.run_modules("omp_parent_cases")
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        self.assertIn("Ran 3 tests", proc.stderr)
        text = " ".join(proc.stderr.split())
        warning = fork_threads.FORKED_SERIAL.format(cls="ForkedRanks", threads=None,
                                                    reason=fork_threads.PARENT_THREADS.format(count="COUNT"))
        head, tail = warning.split("COUNT")
        self.assertRegex(text, re.escape(head) + r"[1-9]\d*" + re.escape(tail))
        # (at the class, not at disttest's frame that noticed it)
        self.assertRegex(proc.stderr, r"omp_parent_cases\.py:\d+: UserWarning: ForkedRanks")
        self.assertNotIn("PooledRanks: its ranks", text)  # the pool's own default: the fork server, silently

    def test_the_test_processs_threads(self):
        from disttest._runner import fork_threads

        self.assertIsNone(fork_threads.parent_refusal(1))  # serial ranks are safe: nothing asked

        def threads(ids, python=2):
            return mock.patch.multiple(fork_threads, thread_ids=mock.Mock(return_value=frozenset(ids)),
                                       _python_threads=mock.Mock(return_value=python))

        with mock.patch.object(fork_threads, "_surviving_a_fork") as probe:
            # Only threads that run Python (one started with _thread too): no probe.
            with threads({"1", "2"}):
                self.assertIsNone(fork_threads.parent_refusal(None))
            probe.assert_not_called()
            # A native thread that ends at a fork (numpy's OpenBLAS pool): safe.
            probe.return_value = frozenset({"1", "2"})
            with threads({"1", "2", "3"}):
                self.assertIsNone(fork_threads.parent_refusal(None))
            # One that survives it; asked again with the same threads: the answer kept.
            probe.return_value = frozenset({"1", "2", "4"})
            with threads({"1", "2", "4"}):
                self.assertEqual(fork_threads.parent_refusal(2), fork_threads.PARENT_THREADS.format(count=1))
                self.assertEqual(fork_threads.parent_refusal(None), fork_threads.PARENT_THREADS.format(count=1))
            self.assertEqual(probe.call_count, 2)
        # Really: this process's threads that run Python, a _thread one included.
        started, release = threading.Event(), threading.Event()
        _thread.start_new_thread(lambda: (started.set(), release.wait(10)), ())
        try:
            started.wait(10)
            self.assertGreaterEqual(fork_threads._python_threads(), threading.active_count() + 1)
        finally:
            release.set()

    def test_the_refusal_counts_threads_by_id(self):
        from disttest._runner import cuda_fork, fork_threads

        def now(*ids):
            # (the threads after the throwaway fork: the same here)
            return mock.patch.multiple(fork_threads, thread_ids=mock.Mock(return_value=frozenset(ids)),
                                       _surviving_a_fork=mock.Mock(return_value=frozenset(ids)))

        with now("1"):
            self.assertIsNone(fork_threads.refusal("m", own=frozenset({"1"}), before=frozenset({"1"})))
            self.assertIsNone(fork_threads.refusal("m", own=None, before=None))  # no /proc: unknown
        # Its own second thread (numpy's OpenBLAS pool) ended at a fork; the
        # import started another: the same count, a new id.
        with now("1", "3"):
            self.assertEqual(fork_threads.refusal("m", own=frozenset({"1", "2"}), before=frozenset({"1"})),
                             (fork_threads.SERVER_THREADS.format(module="m", count=1), "threads"))
            self.assertEqual(fork_threads.refusal("m", own=frozenset({"1"}), before=frozenset({"1", "3"})),
                             (fork_threads.SERVER_THREADS_EARLIER.format(module="m", count=1), "threads-earlier"))
        # Threads that end at a fork (numpy's OpenBLAS pool) are no refusal.
        with mock.patch.multiple(fork_threads, thread_ids=mock.Mock(return_value=frozenset({"1", "4"})),
                                 _surviving_a_fork=mock.Mock(return_value=frozenset({"1"}))):
            self.assertIsNone(fork_threads.refusal("m", own=frozenset({"1"}), before=frozenset({"1"})))
        saved = set(fork_threads._threads_at_import)
        self.addCleanup(lambda: (fork_threads._threads_at_import.clear(), fork_threads._threads_at_import.update(saved)))
        cuda_fork.learn_unsafe_import("m2", "threads-earlier")  # not this module's doing: not learned
        self.assertNotIn("m2", fork_threads._threads_at_import)


if __name__ == "__main__":
    unittest.main()
