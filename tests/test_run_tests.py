"""``disttest.run_tests``: a test file run as ``python file.py``, its
classes on disttest's bases, with upstream's command-line flags."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from disttest.runners import main

#: A file as PyTorch's are after ``disttest.migrate``: disttest's runners
#: beside a plain unittest class, and upstream's ``__main__`` line.
FILE = textwrap.dedent('''
    import os
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


    class Case(TestCase):
        def test_case(self):
            self.assertEqual(torch.tensor([1.0]), torch.tensor([1.0]))

    if __name__ == "__main__":
        run_tests()
''')


def run_file(*args: str, fail: bool = False, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("EXPECTTEST_ACCEPT", None)
    if fail:
        env["FAIL_ONE"] = "1"
    return subprocess.run([sys.executable, "test_file.py", *args], cwd=run_file.dir, capture_output=True,
                          text=True, timeout=timeout, env=env)


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
        self.assertIn("Ran 4 tests", result.stderr)
        self.assertIn("SEEDED True ACCEPT False", result.stdout)
        self.assertNotIn("should extend from", result.stdout + result.stderr)

    def test_a_failure_and_unittest_s_own_arguments(self):
        result = run_file("Plain", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertIn("asked to fail", result.stderr)
        self.assertIn("Ran 2 tests", result.stderr)
        self.assertIn("FAILED (failures=1)", result.stderr)

    def test_accept_repeat_and_discover(self):
        result = run_file("--accept", "--repeat", "2", "Plain.test_seeded_and_accept")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("SEEDED True ACCEPT True"), 2)
        self.assertEqual(result.stderr.count("Ran 1 test"), 2)
        # A failure ends the repeats at once, with status 1.
        result = run_file("--repeat", "3", "Plain", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.count("Ran 2 tests"), 1)
        result = run_file("--discover-tests")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(result.stdout.split()), [
            "Case.test_case", "Plain.test_fails_when_asked", "Plain.test_seeded_and_accept",
            "Threads.test_all_reduce"])

    def test_each_test_in_its_own_process(self):
        result = run_file("--subprocess", fail=True)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.count("Ran 1 test"), 4)
        self.assertIn(main.SUBPROCESS_FAILED.format(n=1, names="Plain.test_fails_when_asked"), result.stderr)
        self.assertIn("Command to reproduce: ", result.stdout)
        self.assertIn("test_file.py Plain.test_fails_when_asked", result.stdout)

    def test_with_pytest(self):
        result = run_file("--use-pytest", "-q", "-p", "no:cacheprovider", "-k", "Threads or Case")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("2 passed, 2 deselected", result.stdout)
        # No test selected: a pass, as upstream's (a file may hold none for a configuration).
        result = run_file("--use-pytest", "-q", "-p", "no:cacheprovider", "-k", "nothing_is_called_this")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_flag_it_does_not_act_on_is_refused_by_name(self):
        for args, flag in [(["--run-parallel", "2"], "--run-parallel"),
                           (["--import-disabled-tests"], "--import-disabled-tests"),
                           (["--jit-executor", "legacy"], "--jit-executor"),
                           (["--repeat", "0"], "--repeat 0")]:
            with self.subTest(flag=flag):
                result = run_file(*args)
                self.assertEqual(result.returncode, 2)
                self.assertIn(f"{flag} (from the command line) is not taken by disttest's run_tests", result.stderr)
                self.assertNotIn("Ran ", result.stderr)
        # Upstream's default, which does nothing, is taken.
        result = run_file("--run-parallel", "1", "Plain.test_seeded_and_accept")
        self.assertEqual(result.returncode, 0, result.stderr)

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
