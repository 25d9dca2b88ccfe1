"""Reports free of the harness: under pytest and under plain unittest, a
failure, an error, a timeout, a crash and a desync show the user's frames and
disttest's per-rank report once, and no traceback entry inside disttest's own
files; for every runner (and pytest's functions marked ``world_size``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import Any

import disttest

PACKAGE = os.path.dirname(os.path.abspath(disttest.__file__))

SUITE = textwrap.dedent('''
    import os
    import time
    import unittest

    import pytest
    import torch.distributed as dist

    import disttest


    class Kinds:
        timeout = 3

        def group(self):
            pass  # threads and the pool have their group

        def test_fail(self):
            self.group()
            self.assertEqual(self.rank, 0)  # LINE fail

        def test_error(self):
            self.group()
            if self.rank == 1:
                raise ValueError("boom")  # LINE error

        def test_timeout(self):
            self.group()
            if self.rank == 1:
                time.sleep(8)  # LINE timeout

        def test_crash(self):  # LINE crash
            self.group()
            if self.rank == 1:
                os._exit(3)

        def test_desync(self):
            self.group()
            if self.rank == 0:
                dist.barrier()  # LINE desync


    class TestProcesses(Kinds, disttest.MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def group(self):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)


    class TestThreads(Kinds, disttest.MultiThreadedTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        test_crash = None  # a thread rank's os._exit ends the test process


    class TestPool(Kinds, disttest.MultiProcContinousTest):
        world_size = 2

        @classmethod
        def backend_str(cls):
            return "gloo"


    class TestForgot(disttest.MultiProcessTestCase):
        def test_forgot_to_spawn(self):  # LINE forgot
            pass


    @pytest.mark.world_size(2, mode="processes")
    def test_function_error(rank):
        if rank == 1:
            raise ValueError("boom")  # LINE function_error


    @pytest.mark.world_size(2, mode="processes")  # LINE function_crash
    def test_function_crash(rank):
        if rank == 1:
            os._exit(3)


    @pytest.mark.world_size(2, mode="threads")
    def test_function_thread_fail(rank):
        assert rank == 0  # LINE function_thread_fail
''')

LINES = {m.group(2): i + 1 for i, line in enumerate(SUITE.splitlines())
         for m in [re.search(r"(# LINE (\w+))$", line)] if m}

# What identifies each kind's per-rank section, and the user line it shows.
KINDS = {
    "fail": "rank 1/2: AssertionError:",
    "error": "rank 1/2: ValueError: boom",
    "timeout": "rank 1/2 did not finish 'test_timeout' within 3s",
    "crash": "rank 1/2 exited with code 3 before finishing 'test_crash'",
    "desync": "a collective its peer never entered",
}
CLASSES = {"TestProcesses": KINDS, "TestPool": KINDS,
           "TestThreads": {k: v for k, v in KINDS.items() if k != "crash"}}
FUNCTIONS = {
    "test_function_error": ("function_error", "rank 1/2: ValueError: boom"),
    "test_function_crash": ("function_crash", "rank 1/2 exited with code 3 before finishing"),
    "test_function_thread_fail": ("function_thread_fail", "rank 1/2: AssertionError: assert 1 == 0"),
}


def run(*command: str, junit: list[str] | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_kinds_suite.py"), "w") as f:
            f.write(SUITE)
        xml = os.path.join(tmp, "junit.xml")
        extra = ["--junitxml", xml] if junit is not None else []
        proc = subprocess.run([sys.executable, "-m", *command, *extra], cwd=tmp, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "DISTTEST_TIMEOUT": "3"})
        if junit is not None:
            with open(xml) as f:
                junit.append(f.read())
    return proc.stdout + proc.stderr


def pytest_blocks(out: str) -> dict[str, str]:
    """Each failing test's part of pytest's FAILURES, by ``Class.test`` or function name."""
    parts = re.split(r"^_{3,} (\S+) _{3,}$", out, flags=re.M)
    return {name: body.split("short test summary info")[0] for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def unittest_blocks(out: str) -> dict[str, str]:
    """Each failing test's part of unittest's output, by ``Class.test``."""
    parts = re.split(r"^(?:ERROR|FAIL): (\S+) \(\S+?\.(\w+)\.\w+\)$", out, flags=re.M)
    return {f"{cls}.{name}": body.split("=" * 70)[0].split("-" * 70, 1)[-1]
            for name, cls, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)}


class FreeOfTheHarness:
    """The checks of one front end's output, each test's block apart."""

    #: How often the user's failing line shows as a traceback or stack entry:
    #: pytest shows it at its ``>`` marker and in the rank's section; unittest
    #: as the traceback's entry and in the report (the message).
    entries = 0
    #: What the run's last lines say.
    ran = ""
    out = ""
    blocks: dict[str, str] = {}

    def test_every_kind_of_every_runner(self: Any) -> None:
        self.assertIn(self.ran, self.out, self.out[-3000:])
        for cls, kinds in CLASSES.items():
            for kind, section in kinds.items():
                with self.subTest(cls=cls, kind=kind):
                    self.check(self.blocks[f"{cls}.test_{kind}"], kind, section)

    def check(self: Any, block: str, key: str, section: str) -> None:
        # No traceback entry (nor anything else) inside disttest's files.
        self.assertNotIn(PACKAGE + os.sep, block)
        self.assertNotIn("disttest/runners", block)
        self.assertNotIn("disttest/_runner", block)
        # The user's frame: the line of the test where it went wrong.
        self.assertRegex(block, rf'test_kinds_suite\.py(", line |:){LINES[key]}\b')
        # The per-rank report, once: its first line, and the user's frame in
        # its traceback or stack (as pytest's "E" lines would repeat it).
        plain = re.sub(r"^E {1,3}", "", block, flags=re.M)
        self.assertEqual(plain.count(section), 1, block)
        if key not in ("crash", "function_crash"):  # a crash has no frame to show
            entries = re.findall(rf'test_kinds_suite\.py", line {LINES[key]},? in \w+', plain)
            self.assertEqual(len(entries), self.entries, block)


class PytestTest(FreeOfTheHarness, unittest.TestCase):
    entries = 1  # the section's (the ">" line names no file)
    ran = "18 failed"

    @classmethod
    def setUpClass(cls) -> None:
        # --show-capture=no: the ranks' sections are the failure's, not
        # captured output that it hides.
        cls.junit: list[str] = []
        cls.out = run("pytest", "-p", "no:cacheprovider", "-rN", "--show-capture=no", "test_kinds_suite.py",
                      junit=cls.junit)
        cls.blocks = pytest_blocks(cls.out)

    def test_junit_xml_holds_the_ranks_sections(self) -> None:
        import xml.etree.ElementTree as ET

        cases = {c.get("name"): c for c in ET.fromstring(self.junit[0]).iter("testcase")}
        failure = cases["test_error"].find("error")
        if failure is None:
            failure = cases["test_error"].find("failure")
        self.assertIsNotNone(failure)
        self.assertIn("rank 1/2: ValueError: boom", failure.text or "")

    def test_functions_marked_world_size(self) -> None:
        for name, (line_key, section) in FUNCTIONS.items():
            with self.subTest(name=name):
                self.check(self.blocks[name], line_key, section)

    def test_a_report_raised_in_the_test_process_points_at_the_test(self) -> None:
        block = self.blocks["TestForgot.test_forgot_to_spawn"]
        self.assertNotIn(PACKAGE + os.sep, block)
        self.assertRegex(block, rf"test_kinds_suite\.py:{LINES['forgot']}: RankError")
        self.assertIn("no ranks were started for 'test_forgot_to_spawn'", block)

    def test_the_header_is_the_message_and_each_rank_a_section(self) -> None:
        block = self.blocks["TestProcesses.test_error"]
        self.assertIn("E   disttest.RankError: 'test_error' errored (disttest): rank 1/2 raised ValueError", block)
        self.assertRegex(block, r"-+ disttest rank 1/2 \(errored\) -+")
        # pytest shows the user's line as the failing one.
        self.assertRegex(block, r'\n>\s+raise ValueError\("boom"\)  # LINE error\n')


class UnittestTest(FreeOfTheHarness, unittest.TestCase):
    entries = 2  # the traceback's, the report's
    ran = "FAILED (failures=3, errors=12)"

    @classmethod
    def setUpClass(cls) -> None:
        cls.out = run("unittest", "test_kinds_suite")
        cls.blocks = unittest_blocks(cls.out)

    def test_a_traceback_of_the_user_s_frames_only(self) -> None:
        block = self.blocks["TestThreads.test_timeout"]
        entries = re.findall(r'^  File "([^"]+)", line \d+, in (\w+)$', block, flags=re.M)
        self.assertEqual(entries, [(entries[0][0], "test_timeout")], block)
        self.assertTrue(entries[0][0].endswith("test_kinds_suite.py"))


class ThreadStackTest(unittest.TestCase):
    def test_a_stack_with_no_frame_of_the_test_says_so(self):
        # A rank thread waiting for its first turn is in disttest's and
        # threading's code only: its section must not be an empty stack.
        import threading

        from disttest._runner.threads import NO_TEST_FRAME, format_thread_stack

        gate = threading.Event()
        thread = threading.Thread(target=gate.wait, daemon=True)
        thread.start()
        try:
            frame = sys._current_frames()[thread.ident]
            self.assertEqual(format_thread_stack(frame), "Stack (most recent call first):\n" + NO_TEST_FRAME)
        finally:
            gate.set()
            thread.join(5)

        def own():
            return format_thread_stack(sys._getframe())

        self.assertIn(" in own", own())
        self.assertNotIn(NO_TEST_FRAME, own())


if __name__ == "__main__":
    unittest.main()
