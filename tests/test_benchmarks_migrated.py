"""benchmarks/migrated_suites.py: its JUnit reading, table, ratio, lost
passes and bad input (no upstream runs here: those are the benchmark)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("migrated_suites",
                                               os.path.join(ROOT, "benchmarks", "migrated_suites.py"))
assert _spec is not None and _spec.loader is not None
ms = importlib.util.module_from_spec(_spec)
sys.modules["migrated_suites"] = ms  # dataclasses look their module up
_spec.loader.exec_module(ms)

JUNIT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="test_x.A" name="test_pass" time="0.1"/>
<testcase classname="test_x.A" name="test_fail" time="0.1">
  <failure message="AssertionError: 1 != 2">Traceback ...
AssertionError: 1 != 2</failure></testcase>
<testcase classname="test_x.A" name="test_error" time="0.1">
  <error message="RuntimeError: boom">Traceback ...</error></testcase>
<testcase classname="test_x.B" name="test_skip" time="0.0">
  <skipped type="pytest.skip" message="Need at least 2 CUDA devices">skip</skipped></testcase>
<testcase classname="test_x.B" name="test_teardown" time="0.1"/>
<testcase classname="test_x.B" name="test_teardown" time="0.1">
  <error message="failed on teardown">Traceback ...</error></testcase>
</testsuite></testsuites>
"""


def run(tests: dict[str, str], seconds: float, status: str = "ok") -> ms.FileRun:
    return ms.FileRun(seconds, status, {k: ms.CaseResult(v, f"{v} because\nmore") for k, v in tests.items()})


class JunitTest(unittest.TestCase):
    def test_each_outcome_and_the_worst_of_a_test_reported_twice(self):
        tests = ms.parse_junit(JUNIT)
        self.assertEqual({k: v.outcome for k, v in tests.items()}, {
            "test_x.A::test_pass": "passed", "test_x.A::test_fail": "failed",
            "test_x.A::test_error": "error", "test_x.B::test_skip": "skipped",
            "test_x.B::test_teardown": "error"})
        self.assertTrue(tests["test_x.A::test_fail"].detail.startswith("AssertionError: 1 != 2\n"))
        self.assertEqual(tests["test_x.B::test_skip"].detail, "Need at least 2 CUDA devices\nskip")

    def test_a_long_report_keeps_its_message_and_its_end(self):
        body = "Traceback\n" + "frame\n" * 2000 + "the end"
        xml = ('<testsuites><testsuite><testcase classname="t.A" name="test_long">'
               f'<failure message="RuntimeError: boom">{body}</failure></testcase></testsuite></testsuites>')
        detail = ms.parse_junit(xml)["t.A::test_long"].detail
        self.assertTrue(detail.startswith("RuntimeError: boom\n"))
        self.assertTrue(detail.endswith("the end"))
        self.assertLessEqual(len(detail), 2 * ms.DETAIL_CHARS + 1)


class TableTest(unittest.TestCase):
    def test_counts_ratio_and_totals(self):
        report = {"test_a.py": {"upstream": run({"A::t1": "passed", "A::t2": "skipped"}, 40.0),
                                "disttest": run({"A::t1": "passed", "A::t2": "skipped"}, 4.0)},
                  "test_b.py": {"upstream": run({"B::t1": "failed", "B::t2": "error"}, 20.0),
                                "disttest": run({"B::t1": "failed", "B::t2": "passed"}, 6.0)}}
        lines, lost = ms.render(report)
        self.assertEqual(lost, [])
        row = {line.split()[0]: line for line in lines if line.startswith("test_")}
        self.assertEqual(row["test_a.py"].split(), "test_a.py 1 0 0 1 40.0 | 1 0 0 1 4.0 | 10.0x".split())
        self.assertEqual(row["test_b.py"].split(), "test_b.py 0 1 1 0 20.0 | 1 1 0 0 6.0 | 3.3x".split())
        total = next(line for line in lines if line.startswith("total (2 files)"))
        self.assertEqual(total.split()[3:], "1 1 1 1 60.0 | 2 1 0 1 10.0 | 6.0x".split())
        self.assertIn("passes on disttest only: 1", lines)
        self.assertIn("  test_b.py::B::t2", lines)

    def test_ratio(self):
        self.assertEqual(ms.ratio(13.0, 2.0), "6.5x")
        self.assertEqual(ms.ratio(13.0, 0.0), "-")


class LostTest(unittest.TestCase):
    def test_a_pass_lost_names_the_test_its_outcome_and_message(self):
        report = {"test_a.py": {"upstream": run({"A::t1": "passed", "A::t2": "passed"}, 9.0),
                                "disttest": run({"A::t1": "passed", "A::t2": "failed"}, 1.0)}}
        lines, lost = ms.render(report)
        self.assertEqual(lost, ["test_a.py::A::t2: failed on disttest: failed because"])
        self.assertIn("passes lost on disttest: 1", lines)

    def test_a_timed_out_or_missing_file_loses_every_pass(self):
        up = run({"A::t1": "passed", "A::t2": "passed", "A::t3": "skipped"}, 9.0)
        _, lost = ms.render({"test_a.py": {"upstream": up, "disttest": run({}, 900.0, "timed out")}})
        self.assertEqual(lost, ["test_a.py::A::t1: timed out on disttest",
                                "test_a.py::A::t2: timed out on disttest"])
        _, lost = ms.render({"test_a.py": {"upstream": up, "disttest": run({"A::t1": "passed"}, 1.0)}})
        self.assertEqual(lost, ["test_a.py::A::t2: not reported on disttest"])

    def test_a_timed_out_row_is_marked(self):
        lines, _ = ms.render({"test_a.py": {"upstream": run({}, 900.0, "timed out"),
                                            "disttest": run({}, 1.0, "no report (exit 4)")}})
        row = next(line for line in lines if line.startswith("test_a.py"))
        self.assertIn("900.0T", row)
        self.assertIn("1.0!", row)
        self.assertIn("  test_a.py (upstream): timed out", lines)
        self.assertIn("  test_a.py (disttest): no report (exit 4)", lines)


class InputTest(unittest.TestCase):
    def main(self, *argv: str) -> str:
        err = io.StringIO()
        with mock.patch.object(sys, "argv", ["migrated_suites.py", *argv]), \
                contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as exit_:
            ms.main()
        self.assertEqual(exit_.exception.code, 2)
        return err.getvalue()

    def test_a_missing_dir_is_named(self):
        self.assertIn("DIR '/no/such/dir' is not a directory", self.main("/no/such/dir"))

    def test_a_dir_without_test_files_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIn(f"no test_*.py files in DIR {tmp!r}", self.main(tmp))

    def test_a_bad_timeout_is_named(self):
        for value in ("abc", "0", "-5", "nan", "inf"):
            with self.subTest(value=value):
                self.assertIn(f"invalid timeout {value!r} from --timeout", self.main(".", "--timeout", value))
        with self.assertRaises(argparse.ArgumentTypeError):
            ms._timeout("0")
        self.assertEqual(ms._timeout("2.5"), 2.5)


class TimeoutTest(unittest.TestCase):
    def test_a_command_past_its_limit_is_killed_with_its_children(self):
        script = textwrap.dedent("""\
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print(child.pid, flush=True)
            time.sleep(60)
        """)
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log")
            start = time.monotonic()
            status, code = ms.run_command([sys.executable, "-c", script], tmp, log, 0.5)
            self.assertLess(time.monotonic() - start, 5)
            self.assertEqual(status, "timed out")
            self.assertEqual(code, -9)
            with open(log) as f:
                child = int(f.read())
        self.assertFalse(psutil.pid_exists(child) and psutil.Process(child).status() != "zombie")

    def test_a_command_within_its_limit_gives_its_exit_status(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log")
            self.assertEqual(ms.run_command([sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                                            tmp, log, 30), ("ok", 3))
            with open(log) as f:
                self.assertEqual(f.read(), "hi\n")


if __name__ == "__main__":
    unittest.main()
