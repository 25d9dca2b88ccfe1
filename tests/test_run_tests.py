"""``disttest.run_tests``: a test file run as ``python file.py``, its
classes on disttest's bases, with upstream's command-line flags."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from disttest.runners import main

#: A file as PyTorch's are after ``disttest.migrate``: disttest's runners
#: beside a plain unittest class, and upstream's ``__main__`` line.
FILE = textwrap.dedent('''
    import os
    import time
    import unittest

    import expecttest
    import torch
    import torch.distributed as dist

    from disttest import MultiThreadedTestCase, TestCase, run_tests


    class Threads(MultiThreadedTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_all_reduce(self):
            t = torch.ones(1)
            dist.all_reduce(t)
            self.assertEqual(t.item(), 2)


    class Plain(unittest.TestCase):
        def test_seeded_and_accept(self):
            # run_tests seeded the process before any test (upstream's SEED);
            # torch's default seed is otherwise random.
            print("SEEDED", torch.initial_seed() == 1234, "ACCEPT", expecttest.ACCEPT)

        def test_fails_when_asked(self):
            if os.environ.get("FAIL_ONE"):
                self.fail("asked to fail")

        def test_waits_when_asked(self):
            if os.environ.get("WAIT_IN"):  # (it says it has started, then sleeps)
                with open(os.environ["WAIT_IN"], "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(300)


    class Case(TestCase):
        def test_case(self):
            self.assertEqual(torch.tensor([1.0]), torch.tensor([1.0]))

    if __name__ == "__main__":
        run_tests()
''')


#: A file whose inline expectation is wrong: ``--accept`` rewrites it.
EXPECT_FILE = textwrap.dedent('''
    from disttest import TestCase, run_tests


    class Expect(TestCase):
        def test_inline(self):
            self.assertExpectedInline(str(1 + 1), """3""")

    if __name__ == "__main__":
        run_tests()
''')


def environ(fail: bool = False) -> dict[str, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("EXPECTTEST_ACCEPT", None)
    if fail:
        env["FAIL_ONE"] = "1"
    return env


def run_file(*args: str, fail: bool = False, timeout: float = 240,
             file: str = "test_file.py") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, file, *args], cwd=run_file.dir, capture_output=True,
                          text=True, timeout=timeout, env=environ(fail))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class RunTestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        run_file.dir = cls._tmp.name  # type: ignore[attr-defined]
        with open(os.path.join(cls._tmp.name, "test_file.py"), "w") as f:
            f.write(FILE)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_a_file_on_disttest_s_bases_runs_as_a_script(self):
        # Upstream's run_tests exits 1 before running it: its classes do not
        # derive from upstream's TestCase.
        result = run_file("-v")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("Ran 5 tests", result.stderr)
        self.assertIn("SEEDED True ACCEPT False", result.stdout)
        self.assertNotIn("should extend from", result.stdout + result.stderr)

    def test_a_failure_and_unittest_s_own_arguments(self):
        result = run_file("Plain", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertIn("asked to fail", result.stderr)
        self.assertIn("Ran 3 tests", result.stderr)
        self.assertIn("FAILED (failures=1)", result.stderr)

    def test_accept_repeat_and_discover(self):
        # (--run-parallel 1: upstream's default, which does nothing, is taken)
        result = run_file("--accept", "--repeat", "2", "--run-parallel", "1", "Plain.test_seeded_and_accept")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("SEEDED True ACCEPT True"), 2)
        self.assertEqual(result.stderr.count("Ran 1 test"), 2)
        # A failure ends the repeats at once, with status 1.
        result = run_file("--repeat", "3", "Plain", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.count("Ran 3 tests"), 1)
        result = run_file("--discover-tests")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(result.stdout.split()), [
            "Case.test_case", "Plain.test_fails_when_asked", "Plain.test_seeded_and_accept",
            "Plain.test_waits_when_asked", "Threads.test_all_reduce"])

    def test_with_pytest(self):
        result = run_file("--use-pytest", "-q", "-p", "no:cacheprovider", "-k", "Threads or Case")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("2 passed, 3 deselected", result.stdout)
        # No test selected: a pass, as upstream's (a file may hold none for a configuration).
        result = run_file("--use-pytest", "-q", "-p", "no:cacheprovider", "-k", "nothing_is_called_this")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_flag_it_does_not_act_on_is_refused_by_name(self):
        # (refused before anything runs, so in this process)
        for args, flag in [(["--run-parallel", "2"], "--run-parallel"),
                           (["--run-parallel", "0"], "--run-parallel"),
                           (["--import-disabled-tests"], "--import-disabled-tests"),
                           (["--jit-executor", "legacy"], "--jit-executor"),
                           (["--repeat", "0"], "--repeat 0"),
                           (["--use-pytest", "--repeat", "2"], "--repeat 2 with --use-pytest"),
                           (["--subprocess", "--use-pytest", "--repeat", "2"], "--repeat 2 with --use-pytest")]:
            with self.subTest(flag=flag), contextlib.redirect_stderr(io.StringIO()) as stderr, \
                    self.assertRaises(SystemExit) as exited:
                main.run_tests(["test_file.py", *args])
            self.assertEqual(exited.exception.code, 2)
            self.assertIn(f"{flag} (from the command line) is not taken by disttest's run_tests", stderr.getvalue())

    def test_accept_rewrites_an_inline_expectation(self):
        # expecttest's assertExpectedInline reads EXPECTTEST_ACCEPT, not the
        # flag upstream's run_tests sets: upstream's --accept failed here.
        with open(os.path.join(run_file.dir, "test_expect.py"), "w") as f:
            f.write(EXPECT_FILE)
        result = run_file("--accept", file="test_expect.py")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(run_file.dir, "test_expect.py")) as f:
            self.assertIn('self.assertExpectedInline(str(1 + 1), """2""")', f.read())
        self.assertEqual(run_file(file="test_expect.py").returncode, 0)

    def test_each_test_in_its_own_process_with_the_flags_it_was_run_with(self):
        result = run_file("--subprocess", "--accept", "--showlocals", "--repeat", "2", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertIn(main.SUBPROCESS_FAILED.format(n=1, names="Plain.test_fails_when_asked"), result.stderr)
        self.assertIn("Command to reproduce: ", result.stdout)
        # Upstream's children lost --accept, --showlocals and --repeat.
        self.assertEqual(result.stdout.count("SEEDED True ACCEPT True"), 2)
        self.assertEqual(result.stderr.count("Ran 1 test"), 9)  # (the failing one is not repeated)
        self.assertIn("test_file.py --accept --showlocals --repeat 2 Plain.test_fails_when_asked", result.stdout)
        self.assertIn("self = <__main__.Plain testMethod=test_fails_when_asked>", result.stderr)  # (--locals)

    def test_subprocess_runs_what_the_arguments_select_each_once(self):
        # The selection was ignored (every test ran), and a named test ran
        # in every child, once per test of the file.
        for args, ran in ((["Plain.test_seeded_and_accept"], 1), (["-k", "test_seeded"], 1),
                          (["-k", "Plain", "-k", "test_case"], 4), (["-k", "matches_nothing"], 0)):
            with self.subTest(args=args):
                result = run_file("--subprocess", *args)
                self.assertEqual(result.returncode, 0, result.stderr[-2000:])
                self.assertEqual(result.stderr.count("Ran 1 test"), ran, result.stderr[-2000:])
                self.assertEqual(result.stdout.count("SEEDED True"), 1 if "Plain" in str(args) or "seeded" in str(
                    args) else 0)

    def test_the_selection_reads_unittest_s_arguments(self):
        import types

        class A(unittest.TestCase):
            def test_one(self):
                pass

            def test_two(self):
                pass

        A.__module__, A.__qualname__ = "m", "A"
        module = types.ModuleType("m")
        module.A = A
        self.assertEqual(main._selected(module, ["-vk", "one"]), (["A.test_one"], ["-v"]))
        self.assertEqual(main._selected(module, ["--durations", "5", "-ktwo", "-f"]),
                         (["A.test_two"], ["--durations", "5", "-f"]))
        self.assertEqual(main._selected(module, ["A.test_one", "-b"]), (["A.test_one"], ["-b"]))
        with contextlib.redirect_stderr(io.StringIO()) as stderr, self.assertRaises(SystemExit) as exited:
            main._selected(module, ["A.test_three"])
        self.assertEqual(exited.exception.code, 2)
        self.assertIn(main.NO_SUCH_TEST.format(names="A.test_three"), stderr.getvalue())

    def test_a_child_of_subprocess_ends_with_its_parent(self):
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
            with self.subTest(signal=sig.name), tempfile.TemporaryDirectory() as tmp:
                started = os.path.join(tmp, "pid")
                parent = subprocess.Popen([sys.executable, "test_file.py", "--subprocess", "Plain.test_waits_when_asked"],
                                          cwd=run_file.dir, env={**environ(), "WAIT_IN": started},
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    deadline = time.monotonic() + 120
                    while not (os.path.exists(started) and os.path.getsize(started)):
                        self.assertIsNone(parent.poll(), "the parent ended before its child started")
                        self.assertLess(time.monotonic(), deadline, "the child did not start")
                        time.sleep(0.05)
                    with open(started) as f:
                        child = int(f.read())
                    parent.send_signal(sig)
                    self.assertNotEqual(parent.wait(timeout=30), 0)
                    deadline = time.monotonic() + 15
                    while alive(child) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    # (its own session: the signal to the parent did not reach it)
                    self.assertFalse(alive(child), f"the test's process outlived its parent ended by {sig.name}")
                finally:
                    parent.kill()
                    parent.wait()

    def test_save_xml_with_pytest(self):
        result = run_file("--use-pytest", "--save-xml", "reports", "-q", "-p", "no:cacheprovider", "-k", "Case")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        line = next(out for out in result.stdout.splitlines() if out.startswith("Test results will be stored in "))
        path = os.path.join(run_file.dir, line.split(" in ", 1)[1])
        self.assertTrue(path.startswith(os.path.join(run_file.dir, "reports", "test_file", "test_file-")), path)
        with open(path) as f:
            self.assertIn('name="test_case"', f.read())

    def test_save_xml_without_its_package_is_refused(self):
        try:
            import xmlrunner  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            pass
        else:
            self.skipTest("unittest-xml-reporting is installed here")
        result = run_file("--save-xml", "reports")
        self.assertEqual(result.returncode, 2)
        self.assertIn(main.NO_XMLRUNNER, result.stderr)


if __name__ == "__main__":
    unittest.main()


LOCALS_FILE = textwrap.dedent('''
    from disttest import MultiProcContinousTest, MultiProcessTestCase, MultiThreadedTestCase, run_tests


    class Pool(MultiProcContinousTest):
        world_size = 2

        def test_locals(self):
            kept_here = 40 + self.rank
            self.assertEqual(kept_here, 43)


    class Threads(MultiThreadedTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_locals(self):
            kept_here = 40 + self.rank
            self.assertEqual(kept_here, 43)


    class Processes(MultiProcessTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_locals(self):
            kept_here = 40 + self.rank
            self.assertEqual(kept_here, 43)


    if __name__ == "__main__":
        run_tests()
''')


class ShowLocalsTest(unittest.TestCase):
    """--showlocals (run_tests) and -l (pytest) show a rank's locals: the
    test process has none of its frames, and showed the stub frames'
    globals (__builtins__, 3 KB of Python's copyright) instead."""

    def run_it(self, *args: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_locals.py"), "w") as f:
                f.write(LOCALS_FILE)
            env = {k: v for k, v in os.environ.items() if k != "DISTTEST_TB_LOCALS"}
            proc = subprocess.run([sys.executable, *args], cwd=tmp, capture_output=True, text=True,
                                  timeout=240, env=env)
        self.assertNotEqual(proc.returncode, 0)
        return proc.stdout + proc.stderr

    def test_showlocals(self):
        # (unittest's own --locals too: it sets the result's tb_locals, which
        # disttest's ranks were not told of)
        for args in (("test_locals.py", "--showlocals"), ("-m", "pytest", "-p", "no:cacheprovider", "-l",
                                                          "test_locals.py"), ("-m", "unittest", "--locals",
                                                                              "test_locals")):
            with self.subTest(args=args):
                out = self.run_it(*args)
                for rank in (0, 1):  # (in each class's report: threads, processes, a pool)
                    self.assertGreaterEqual(out.count(f"kept_here = {40 + rank}"), 3, out)
                self.assertNotIn("__builtins__ =", out)
        self.assertNotIn("kept_here = 40", self.run_it("test_locals.py"))
        self.assertNotIn("kept_here = 40", self.run_it("-m", "unittest", "test_locals"))
