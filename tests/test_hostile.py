"""Hostile tests and users (issue 12): interrupted test processes, ranks that
start processes, kill the fork server, crash, start their ranks twice."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock

import psutil

TESTS = os.path.dirname(os.path.abspath(__file__))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def _deliverable(sig: int | None):
    """``sig`` at its default in children started inside, if this process
    ignores it: a shell's background job ignores SIGINT and ``nohup``
    SIGHUP, and a child inherits that (Python then installs no handler), so
    the signal the test sends would do nothing."""
    ignored = sig is not None and signal.getsignal(sig) == signal.SIG_IGN
    if ignored:
        signal.signal(sig, signal.SIG_DFL)
    try:
        yield
    finally:
        if ignored:
            signal.signal(sig, signal.SIG_IGN)


class InterruptTest(unittest.TestCase):
    """Ctrl-C or SIGTERM of the test process while its ranks wait: it exits
    at once, and leaves no file in TMPDIR and no process behind."""

    def interrupt(self, cls: str, sig: int | None, pytest: bool = False, args: tuple[str, ...] = (),
                  test: str = "test_wait", within: float = 10, group: bool = False) -> None:
        """``sig`` None: nothing is sent; the test process ends by itself,
        ``within`` seconds of its ranks' start. ``group``: ``sig`` goes to the
        test process's whole process group, as a terminal's Ctrl-C does."""
        root = tempfile.mkdtemp(prefix="disttest-hostile-")
        self.addCleanup(shutil.rmtree, root, True)
        tmp, pids_dir = os.path.join(root, "tmp"), os.path.join(root, "pids")
        os.mkdir(tmp)
        os.mkdir(pids_dir)
        env = dict(os.environ, TMPDIR=tmp, DISTTEST_PIDS_DIR=pids_dir, PYTHONPATH=TESTS)
        if pytest:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"hostile_cases.py::{cls}::{test}", *args]
        else:
            cmd = [sys.executable, "-m", "unittest", f"hostile_cases.{cls}.{test}"]
        with open(os.path.join(root, "out"), "w+") as out:
            with _deliverable(sig):
                proc = subprocess.Popen(cmd, cwd=TESTS, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=group)
            try:
                deadline = time.monotonic() + 60
                while len(os.listdir(pids_dir)) < 2 and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if sig is not None:
                    self.assertIsNone(proc.poll(), "the test process ended before being interrupted")
                self.assertGreaterEqual(len(os.listdir(pids_dir)), 2, "the ranks did not start")
                time.sleep(0.2)  # the ranks wait in the all_reduce
                if sig is not None and group:
                    os.killpg(proc.pid, sig)
                elif sig is not None:
                    proc.send_signal(sig)
                start = time.monotonic()
                proc.wait(timeout=within + 10)
                elapsed = time.monotonic() - start
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if group:  # (what the test leaves in its group, should it fail)
                    with contextlib.suppress(OSError):
                        os.killpg(proc.pid, signal.SIGKILL)
            out.seek(0)
            output = out.read()
        self.assertLess(elapsed, within, output)
        pids = [int(p) for name in os.listdir(pids_dir)
                for p in open(os.path.join(pids_dir, name)).read().split()]
        deadline = time.monotonic() + 5
        while any(_running(p) for p in pids if p != proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in pids if p != proc.pid and _running(p)], [], output)
        # After SIGKILL the reaper removes the run folders once it reads the
        # end of its input, at its own pace (seconds on a loaded machine).
        deadline = time.monotonic() + 10
        while os.listdir(tmp) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [os.path.join(d, f) for d, dirs, files in os.walk(tmp) for f in dirs + files]
        self.assertEqual(left, [], output)

    def test_sigint_process_runner(self):
        self.interrupt("ProcessWaits", signal.SIGINT)

    def test_sigterm_process_runner(self):
        self.interrupt("ProcessWaits", signal.SIGTERM)

    def test_sighup_process_runner(self):
        self.interrupt("ProcessWaits", signal.SIGHUP)

    def test_sigint_pool(self):
        self.interrupt("PoolWaits", signal.SIGINT)

    def test_sigterm_pool(self):
        self.interrupt("PoolWaits", signal.SIGTERM)

    def test_sigterm_threads(self):
        self.interrupt("ThreadWaits", signal.SIGTERM)

    def test_sigkill_process_runner(self):
        # No cleanup of the test process runs: the reaper removes the run
        # directory, the ranks end with their parent (issue 24).
        self.interrupt("ProcessWaits", signal.SIGKILL)

    def test_sigkill_pool(self):
        self.interrupt("PoolWaits", signal.SIGKILL)

    def test_sigkill_with_a_child_of_its_own_environment(self):
        # Popen(env=...) in a pool's rank: no janitor token, and the rank (a
        # child of the killed test process) died by its parent-death signal,
        # leaving the child to init. The reaper now kills the rank's group.
        # (Fresh processes: the fork server, their subreaper, kills it.)
        self.interrupt("PoolWaits", signal.SIGKILL, test="test_wait_own_environment")

    def test_ctrl_c_of_the_terminal_with_a_child_of_its_own_environment(self):
        # SIGINT to the whole group reached the fork server too, which ended at
        # once; its ranks died by their parent-death signal and the child a
        # rank started with an environment of its own went to init for good.
        # The server now has a group of its own and cleans up after the test.
        self.interrupt("ProcessWaits", signal.SIGINT, test="test_wait_own_environment", group=True)

    def test_sigkill_of_the_whole_group_with_a_child_of_its_own_environment(self):
        # (a CI job cancelled: its process group killed)
        self.interrupt("ProcessWaits", signal.SIGKILL, test="test_wait_own_environment", group=True)

    def test_sigkill_threads(self):
        # What a rank thread started (in a session of its own) was left to
        # init: the ranks' environment, the test process's, lacked the token
        # by which the reaper finds it.
        self.interrupt("ThreadWaits", signal.SIGKILL)

    def test_pytest_timeout_thread_method(self):
        # pytest-timeout's thread method ends the test process with os._exit:
        # no atexit, no cleanups.
        # Here it ends the repeats (pytest-timeout's limit is for all of them),
        # whatever run is under way. NB: the limit also covers starting the
        # fork server (seconds under load): the ranks must have started first.
        self.interrupt("ProcessWaits", None, pytest=True, test="test_brief", within=20,
                       args=("--timeout", "12", "--timeout-method", "thread", "--disttest-repeat", "100"))

    def test_sigint_under_pytest(self):
        self.interrupt("ProcessWaits", signal.SIGINT, pytest=True)

    def test_sigterm_under_pytest(self):
        self.interrupt("PoolWaits", signal.SIGTERM, pytest=True)


def run_alone(test: str, environ: dict[str, str]) -> str:
    """``python -m unittest hostile_cases.TEST`` in a process of its own; its output."""
    env = dict(os.environ, PYTHONPATH=TESTS, **environ)
    proc = subprocess.run([sys.executable, "-m", "unittest", f"hostile_cases.{test}"], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


class LeftBehindTest(unittest.TestCase):
    """What a rank leaves (a process, a file) goes with its test."""

    def test_a_killed_fork_server_leaves_no_process_of_its_ranks(self):
        # The ranks died with the server, and what rank 0 had started (an
        # environment and a session of its own) went to init, for good.
        import hostile_cases

        pids_dir = tempfile.mkdtemp(prefix="disttest-pids-")
        self.addCleanup(shutil.rmtree, pids_dir, True)
        with unittest.mock.patch.dict(os.environ, {"DISTTEST_PIDS_DIR": pids_dir, "DISTTEST_START_METHOD": "zygote"}):
            result = run(hostile_cases.KillsItsServer, "test_kill_the_server")
        self.assertEqual(len(result.errors), 1, result.failures)
        self.assertIn("died with the fork server", result.errors[0][1])
        with open(os.path.join(pids_dir, "child")) as f:
            child = int(f.read())
        self.assertFalse(_running(child), "the child of a rank of the killed server outlived the test")

    def test_a_ranks_shared_memory_and_semaphores_go_with_it(self):
        # disttest killed the ranks' resource trackers with them (SIGKILL),
        # which left in /dev/shm what they would have removed.
        if not os.path.isdir("/dev/shm"):
            self.skipTest("no /dev/shm on this system")
        prefix = f"disttest-shm-{os.getpid()}-"
        pids_dir = tempfile.mkdtemp(prefix="disttest-pids-")
        self.addCleanup(shutil.rmtree, pids_dir, True)
        before = set(os.listdir("/dev/shm"))
        output = run_alone("HangsWithSharedFiles.test_hang", {"DISTTEST_SHM_PREFIX": prefix,
                                                              "DISTTEST_PIDS_DIR": pids_dir})
        self.assertIn("timed out after 2s", output)
        self.assertEqual(len(os.listdir(pids_dir)), 2, output)  # (both ranks made theirs)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = sorted(set(os.listdir("/dev/shm")) - before)
            if not left:
                break
            time.sleep(0.1)
        for name in left:  # (this test's own, should it fail)
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))
        self.assertEqual([n for n in left if n.startswith(prefix) or n.startswith("sem.mp-")], [], output)

    def test_a_rank_file_of_thread_ranks_goes_with_the_test_process(self):
        # A thread rank that hung in its body never reached the removal:
        # the file stayed in the system's temp folder for good.
        tmp = tempfile.mkdtemp(prefix="disttest-hostile-")
        self.addCleanup(shutil.rmtree, tmp, True)
        output = run_alone("HangsInARankFile.test_hang", {"TMPDIR": tmp})
        self.assertIn("timed out after 1s", output)
        self.assertEqual(os.listdir(tmp), [], output)


def run(cls: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    cls(name).run(result)
    return result


class HostileTest(unittest.TestCase):
    def test_starting_the_ranks_twice_is_an_error_naming_both_calls(self):
        import hostile_cases as cases
        from runner_cases import live_ranks

        for cls, call in ((cases.ProcessSpawnsTwice, "_spawn_processes()"),
                          (cases.ThreadSpawnsTwice, "_spawn_threads()")):
            with self.subTest(cls=cls.__name__):
                result = run(cls, "test_pass")
                self.assertEqual(len(result.errors), 1, result.failures)
                text = result.errors[0][1]
                self.assertIn(f"RuntimeError: {call} was called a second time for 'test_pass' (disttest)", text)
                self.assertRegex(text, r'started by the first call \(File ".*hostile_cases.py", line \d+, in setUp\)')
                self.assertEqual(live_ranks(), [])  # the first set was stopped, not left running

    def test_a_tiny_timeout_is_a_plain_timeout(self):
        # A stack asked of a rank that has not yet made its stack file.
        from unittest import mock

        from disttest._runner import launcher as launcher_mod
        from disttest._runner import rank as rank_mod

        run_dir = tempfile.mkdtemp(prefix="disttest-hostile-")
        self.addCleanup(shutil.rmtree, run_dir, True)
        spec = rank_mod.RankSpec(module="m", qualname="C", module_file=None, test_name="t", world_size=1,
                                 run_dir=run_dir, file_name=os.path.join(run_dir, "rendezvous"))
        launcher = launcher_mod.ForkLauncher(spec)
        sleeper = subprocess.Popen(["sleep", "30"])
        self.addCleanup(sleeper.wait)
        self.addCleanup(sleeper.kill)
        launcher.pids[0] = sleeper.pid
        with mock.patch.object(launcher_mod, "STACK_WAIT", 0.1):
            self.assertEqual(launcher.dump_stacks([0]), {0: launcher_mod.NO_STACK})

    def test_a_tiny_timeout_end_to_end(self):
        import hostile_cases as cases

        result = run(cases.TinyTimeout, "test_sleep")
        self.assertEqual(len(result.errors), 1)
        text = result.errors[0][1]
        self.assertIn("did not finish 'test_sleep' within 1e-09s", text)
        self.assertNotIn("FileNotFoundError", text)

    def test_threaded_tests_restore_the_excepthooks(self):
        import threading

        import hostile_cases as cases

        hooks = (sys.excepthook, threading.excepthook)
        for _ in range(3):
            result = run(cases.ThreadCases, "test_pass")
            self.assertTrue(result.wasSuccessful(), result.errors)
        self.assertEqual((sys.excepthook, threading.excepthook), hooks)

    def test_many_threaded_tests_keep_working(self):
        import hostile_cases as cases

        hook = sys.excepthook
        suite = unittest.TestSuite(cases.ThreadCases("test_pass") for _ in range(300))
        result = unittest.TestResult()
        suite.run(result)
        self.assertEqual((result.testsRun, result.errors, result.failures), (300, [], []))
        self.assertIs(sys.excepthook, hook)  # not 600 wrappers deep

    def test_a_non_daemon_thread_left_running_is_an_error_naming_it(self):
        import threading

        import hostile_cases as cases

        try:
            result = run(cases.ThreadCases, "test_leaves_a_thread")
            self.assertEqual(len(result.errors), 1, result.failures)
            self.assertIn("'test_leaves_a_thread' (disttest): the test left a thread running after its ranks "
                          "ended: 'left behind'", result.errors[0][1])
            left = [t for t in threading.enumerate() if t.name == "left behind"]
            self.assertEqual(len(left), 1)
            self.assertTrue(left[0].daemon)  # it no longer holds the process at exit
            # One a rank starts without saying is no daemon, as in a rank process.
            result = run(cases.ThreadCases, "test_leaves_a_thread_of_default_kind")
            self.assertEqual(len(result.errors), 1, result.failures)
            self.assertIn("the test left a thread running after its ranks ended: 'left by default'",
                          result.errors[0][1])
            self.assertNotIn("a daemon by choice", result.errors[0][1])
        finally:
            for stop in cases.LEFT:
                stop.set()

    def test_a_process_with_a_left_thread_exits(self):
        code = ("import unittest, hostile_cases as c; r = unittest.TestResult(); "
                "c.ThreadCases('test_leaves_a_thread').run(r); print(len(r.errors))")
        out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, PYTHONPATH=TESTS))
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "1"), out.stderr)


if __name__ == "__main__":
    unittest.main()
