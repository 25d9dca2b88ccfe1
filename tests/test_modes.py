"""One test body, three modes, and the variable that forces one."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from unittest import mock

import modes_cases as cases

import disttest
import disttest.runners.modes

HERE = os.path.dirname(os.path.abspath(__file__))


class ModesTest(unittest.TestCase):
    def test_one_class_per_mode(self):
        for mode in disttest.MODES:
            cls = getattr(cases, f"Collectives_{mode}")
            with self.subTest(mode=mode):
                result = unittest.TestResult()
                unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
                self.assertEqual(result.testsRun, 2)
                self.assertEqual(result.errors, [])
                self.assertEqual(len(result.failures), 1)
                self.assertIn("rank 1/3 raised AssertionError", result.failures[0][1])
                self.assertIn("rank 1 disagrees", result.failures[0][1])

    def test_the_body_is_not_a_test(self):
        self.assertFalse(issubclass(cases.Collectives, unittest.TestCase))

    def test_environment_forces_one_mode(self):
        env = dict(os.environ, DISTTEST_MODE="threads")
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "modes_cases"], cwd=HERE,
                              capture_output=True, text=True, timeout=300, env=env)
        self.assertIn("skipped 'DISTTEST_MODE=threads runs the threads mode only'", proc.stderr)
        self.assertIn("test_all_reduce (modes_cases.Collectives_threads.test_all_reduce) ... ok", proc.stderr)

    def test_simulated_forced_skips_every_run_in_class_under_pytest(self):
        # The plugin's option takes the mode of run_simulated's classes too;
        # case does not count, as in DISTTEST_MODE (it was a usage error).
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                               "--disttest-mode=Simulated", "modes_cases.py"], cwd=HERE,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("6 skipped", proc.stdout)
        self.assertIn("DISTTEST_MODE=simulated runs the simulated mode only", proc.stdout)

    def test_forcing_leaves_the_forced_mode_alone(self):
        class Body:
            def test_it(self):
                pass

        for forced in disttest.MODES:
            with self.subTest(forced=forced), mock.patch.dict(os.environ, {disttest.MODE_ENV: forced}):
                disttest.run_in()(Body)
                made = {mode: globals().pop(f"Body_{mode}") for mode in disttest.MODES}
                for mode, cls in made.items():
                    skipped = getattr(cls, "__unittest_skip__", False)
                    self.assertEqual(skipped, mode != forced, mode)

    def test_bad_mode_is_named(self):
        with self.assertRaisesRegex(disttest.ConfigError, r"Invalid mode 'gpu' from run_in"):
            disttest.run_in("gpu")
        with self.assertRaisesRegex(disttest.ConfigError, r"Invalid mode 'simulated' from run_in.*run_simulated"):
            disttest.run_in("simulated")
        with mock.patch.dict(os.environ, {disttest.MODE_ENV: "thread"}), \
                self.assertRaisesRegex(disttest.ConfigError,
                                       r"Invalid mode 'thread' from environment variable DISTTEST_MODE"):
            disttest.run_in("threads")(type("Body", (), {}))
        with self.assertRaisesRegex(disttest.ConfigError, r"Invalid backend 'glo' from Body.backend"):
            disttest.run_in("threads")(type("Body", (), {"backend": "glo"}))  # the threads would pass

    def test_an_inherited_world_size_counts_as_run_simulated_reads_it(self):
        class Sized:
            world_size = 3

        class Body(Sized):
            def test_it(self):
                pass

        disttest.run_in("threads")(Body)
        self.assertEqual(globals().pop("Body_threads").world_size, 3)

    def test_a_forced_mode_is_read_as_every_choice(self):
        with mock.patch.dict(os.environ, {disttest.MODE_ENV: " Threads"}):
            self.assertEqual(disttest.runners.modes.forced_mode(), "threads")
        with mock.patch.dict(os.environ, {disttest.MODE_ENV: " "}):
            self.assertIsNone(disttest.runners.modes.forced_mode())

    def test_not_a_plain_class(self):
        with self.assertRaisesRegex(TypeError, "must be a plain class"):
            disttest.run_in("threads")(type("T", (unittest.TestCase,), {}))
