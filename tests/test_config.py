"""Timeouts and world sizes from the environment: defaults and bad values."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from unittest import mock

import disttest
from disttest.config import (
    MAX_WORLD_SIZE,
    ConfigError,
    default_timeout,
    get_timeout,
    parse_flag,
    parse_timeout,
    parse_world_size,
)


class TimeoutTest(unittest.TestCase):
    def test_default_is_300(self):
        self.assertEqual(default_timeout({}), 300)

    def test_disttest_variable_wins_over_upstream_one(self):
        env = {"DISTTEST_TIMEOUT": "12", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "40"}
        self.assertEqual(default_timeout(env), 12)
        # ... but a bad one under it is still named (it went unnoticed).
        with self.assertRaisesRegex(ConfigError, "'abc' from environment variable DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"):
            default_timeout({"DISTTEST_TIMEOUT": "12", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "abc"})
        self.assertEqual(default_timeout({"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "40"}), 40)
        self.assertEqual(default_timeout({"DISTTEST_TIMEOUT": "2.5"}), 2.5)

    def test_override_by_method_name(self):
        self.assertEqual(get_timeout("pkg.mod.Cls.test_ddp_uneven_inputs", {}), 400)
        self.assertEqual(get_timeout("pkg.mod.Cls.test_other", {"DISTTEST_TIMEOUT": "9"}), 9)
        # As upstream's: it wins over upstream's variable ...
        self.assertEqual(get_timeout("Cls.test_ddp_uneven_inputs", {"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "9"}), 400)
        # ... but a limit asked of every test (DISTTEST_TIMEOUT, --disttest-timeout)
        # is not lifted to 400 s for two names without a word.
        self.assertEqual(get_timeout("Cls.test_ddp_uneven_inputs", {"DISTTEST_TIMEOUT": "1"}), 1)
        self.assertEqual(get_timeout("Cls.test_DistributedDataParallel", {"DISTTEST_TIMEOUT": "2.5"}), 2.5)

    def test_numbers_from_text_are_ascii_without_underscores(self):
        # float() and int() read "1_0" as 10 and other scripts' digits: a
        # world size refused them, a timeout and a chaos seed did not.
        from disttest.faults import parse_seed

        for bad in ("1_0", "٣", "١٠"):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(ConfigError, "from environment variable DISTTEST_TIMEOUT"):
                    default_timeout({"DISTTEST_TIMEOUT": bad})
                with self.assertRaisesRegex(ConfigError, "from --disttest-chaos"):
                    parse_seed(bad, "--disttest-chaos")
        self.assertEqual(default_timeout({"DISTTEST_TIMEOUT": " 1e1 "}), 10)
        self.assertEqual(parse_seed("+3", "--disttest-chaos"), 3)

    def test_flags(self):
        for raw, value in (("", False), (None, False), (" OFF ", False), ("no", False), ("0", False),
                           ("false", False), ("1", True), ("Yes", True), ("on", True), ("TRUE", True)):
            with self.subTest(raw=raw):
                self.assertIs(parse_flag(raw, "environment variable X"), value)
        for bad in ("2", "y", "enabled"):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(ConfigError, f"Invalid flag '{bad}' from environment variable X"):
                    parse_flag(bad, "environment variable X")

    def test_bad_values_name_variable_and_value(self):
        for name in ("DISTTEST_TIMEOUT", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"):
            for bad in ("abc", "-1", "0", "nan", "inf"):
                with self.subTest(name=name, bad=bad):
                    with self.assertRaises(ConfigError) as ctx:
                        default_timeout({name: bad})
                    self.assertIn(f"environment variable {name}", str(ctx.exception))
                    self.assertIn(repr(bad), str(ctx.exception))
                    self.assertEqual(ctx.exception.value, bad)

    def test_lazy_module_attribute_reads_environment(self):
        with mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "17"}):
            self.assertEqual(disttest.TIMEOUT_DEFAULT, 17)
        with mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "soon"}):
            with self.assertRaisesRegex(ConfigError, "DISTTEST_TIMEOUT"):
                disttest.TIMEOUT_DEFAULT  # noqa: B018

    def test_bad_variable_does_not_break_import(self):
        env = dict(os.environ, DISTTEST_TIMEOUT="soon")
        out = subprocess.run(
            [sys.executable, "-c", "import disttest; print('imported')"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(out.stdout.strip(), "imported", out.stderr)

    def test_a_blank_variable_is_unset(self):
        # (the settings reference says so: a CI file that fills it in only sometimes)
        from disttest._runner import settings

        self.assertEqual(default_timeout({"DISTTEST_TIMEOUT": " \t"}), 300)
        self.assertEqual(default_timeout({"DISTTEST_TIMEOUT": "", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "40"}), 40)
        for raw, mode in (("  ", "tail"), (" Stream ", "stream")):
            with self.subTest(raw=raw), mock.patch.dict(os.environ, {"DISTTEST_OUTPUT": raw}):
                self.assertEqual(settings.output_mode(), mode)
        with mock.patch.dict(os.environ, {"DISTTEST_KEEP_LOGS": " "}):
            self.assertFalse(settings.keep_logs())

    def test_kept_below_an_outer_limit(self):
        # pytest-timeout's limit (outer): disttest's stays below it, 70% and
        # 5 s less where there is room, 35% of a short one. A limit of 5 s
        # or less left disttest's at 300 s: pytest-timeout fired first.
        from disttest._runner import settings

        cls = type("Case", (), {"timeout": None})
        for outer, inner in ((100, 70), (15, 10), (10, 5), (7, 2.45), (6, 2.1), (4, 1.4), (1, 0.35)):
            with self.subTest(outer=outer), settings.outer_limit(outer), \
                    mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "300"}):
                self.assertEqual(settings.test_timeout(cls, "m.Case.test_x"), inner)
        with settings.outer_limit(100):  # a shorter limit of the class's own stays
            self.assertEqual(settings.test_timeout(type("Short", (), {"timeout": 20}), "m.Short.test_x"), 20)

    def test_kept_below_what_is_left_of_an_outer_limit(self):
        # A pool's start in the test's first call took part of pytest-timeout's
        # limit: the test's join took the whole share again, and pytest-timeout
        # ended the test with no report of disttest's.
        from disttest._runner import settings

        cls = type("Case", (), {"timeout": None})
        clock = [1000.0]
        with mock.patch.object(settings.time, "monotonic", lambda: clock[0]), \
                mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "300"}):
            with settings.outer_limit(100):
                clock[0] += 85  # 15 s left
                self.assertEqual(settings.test_timeout(cls, "m.Case.test_x"), 10)
                clock[0] += 15  # none left: disttest reports at once
                self.assertEqual(settings.outer_cap(), settings.OUTER_LEFT_FLOOR)
            with settings.outer_limit(0):  # (pytest-timeout's 0: no limit)
                self.assertIsNone(settings.outer_cap())


class TimeoutTextTest(unittest.TestCase):
    def test_a_string_is_a_number_only_from_text(self):
        self.assertEqual(parse_timeout("2.5", "environment variable DISTTEST_TIMEOUT", text=True), 2.5)
        with self.assertRaises(ConfigError) as ctx:
            parse_timeout("3", "Suite.timeout")
        self.assertEqual((ctx.exception.value, ctx.exception.where), ("3", "Suite.timeout"))
        self.assertEqual(parse_timeout(3, "Suite.timeout"), 3)


class WorldSizeTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_world_size("3", "WORLD_SIZE", text=True), 3)
        self.assertEqual(parse_world_size(2, "x"), 2)
        import numpy as np

        self.assertEqual(parse_world_size(np.int64(2), "x"), 2)  # an integer type's, as range() takes it
        self.assertIs(type(parse_world_size(np.int64(2), "x")), int)
        for bad in ("0", "two", -1, True, 2.5, None, "1_0", "٣", "+2"):
            with self.subTest(bad=bad), self.assertRaises(ConfigError) as ctx:
                parse_world_size(bad, "environment variable WORLD_SIZE", text=True)
            self.assertIn("environment variable WORLD_SIZE", str(ctx.exception))

    def test_a_world_too_large_is_named_not_an_overflow(self):
        # (10**30 ranks overflowed a socket's backlog, or the progress board's index.)
        self.assertEqual(parse_world_size(MAX_WORLD_SIZE, "x"), MAX_WORLD_SIZE)
        for bad in (MAX_WORLD_SIZE + 1, 10**30):
            with self.subTest(bad=bad), self.assertRaisesRegex(
                    ConfigError, rf"^Invalid world size {bad} from Suite.world_size \(disttest\): "
                                 rf"expected an integer from 1 to {MAX_WORLD_SIZE}"):
                parse_world_size(bad, "Suite.world_size")

    def test_each_runner_refuses_a_world_too_large_before_starting(self):
        for base in (disttest.MultiProcessTestCase, disttest.MultiThreadedTestCase, disttest.MultiProcContinousTest):
            class Huge(base):
                world_size = 10**30

                def setUp(self):
                    super().setUp()
                    if hasattr(self, "_spawn_processes"):
                        self._spawn_processes()
                    elif hasattr(self, "_spawn_threads"):
                        self._spawn_threads()

                def test_it(self):
                    raise AssertionError("ran")

            result = unittest.TestResult()
            Huge("test_it").run(result)
            with self.subTest(base=base.__name__):
                self.assertEqual(len(result.errors), 1, result.failures)
                self.assertIn("Invalid world size 1000000000000000000000000000000 from Huge.world_size",
                              result.errors[0][1])

    def test_a_string_outside_text_settings_is_an_error(self):
        with self.assertRaises(ConfigError) as ctx:
            parse_world_size("2", "Suite.world_size")
        self.assertEqual((ctx.exception.value, ctx.exception.where), ("2", "Suite.world_size"))
