"""A rank's traceback rebuilt in the parent (disttest._runner.tb_data): the
user's lines with the columns Python itself shows, or none; never the
rebuilding stub's own."""

from __future__ import annotations

import os
import sys
import traceback
import unittest
from unittest import mock

from disttest._runner import tb_data
from disttest._runner.outcome import outcome_from_exception
from disttest._runner.report import _stack_tb_data, user_traceback


def bad(value: int) -> int:
    raise ValueError(f"bad {value}")


def caught() -> BaseException:
    try:
        total = abs(-1) + bad(2)  # carets under bad(2) only
        return RuntimeError(str(total))
    except ValueError as e:
        return e


def lines(tb) -> list[str]:
    return "".join(traceback.format_list(traceback.extract_tb(tb))).splitlines()


class RebuiltTest(unittest.TestCase):
    def test_the_rebuilt_traceback_reads_as_the_original(self):
        exc = caught()
        rebuilt = user_traceback([outcome_from_exception(0, exc)])  # what the report is raised with
        original = lines(exc.__traceback__)
        self.assertEqual(lines(rebuilt), original)
        if sys.version_info >= (3, 11):  # (carets: 3.11 and later)
            at = next(i for i, line in enumerate(original) if "abs(-1) + bad(2)" in line)
            code, carets = original[at], original[at + 1]
            self.assertEqual(carets.strip(), "^" * len("bad(2)"))
            self.assertEqual(carets.index("^"), code.index("bad(2)"))

    def test_frames_without_columns_show_no_carets(self):
        # A frame read from a stack dump (faulthandler gives lines, not
        # columns), and a frame whose columns are not of its line.
        line = caught.__code__.co_firstlineno + 2
        stack = f'Current thread 0x1 (most recent call first):\n  File "{__file__}", line {line} in caught\n'
        data = _stack_tb_data(stack)
        self.assertIsNotNone(data)
        self.assertEqual(lines(tb_data.as_traceback(data)),
                         [f'  File "{__file__}", line {line}, in caught', "    total = abs(-1) + bad(2)  # carets under bad(2) only"])
        moved = outcome_from_exception(0, caught()).tb_data
        assert moved is not None
        moved["tb_lineno"] += 1  # (the file changed under it: the columns are another line's)
        text = lines(tb_data.as_traceback(moved))
        self.assertFalse(any(line.strip().startswith("^") for line in text), text)

    def test_positions_of_a_traceback(self):
        exc = caught()
        tb = exc.__traceback__
        assert tb is not None
        where = tb_data.positions(tb)
        if sys.version_info < (3, 11):
            self.assertIsNone(where)
            return
        assert where is not None
        line = traceback.extract_tb(tb)[0]
        self.assertEqual(where, (line.lineno, line.end_lineno, line.colno, line.end_colno))

    def test_long_and_far_columns_are_kept(self):
        # Columns above 63 take more than one varint byte; a call over two
        # lines ends on the next.
        for where in [(10, 10, 70, 300), (10, 11, 4, 9), (10, 10, 0, 1)]:
            with self.subTest(where=where):
                node = {"tb_frame": {"f_code": {"co_filename": "x.py", "co_name": "f"}, "f_globals": {}},
                        "tb_lineno": 10, "tb_next": None, tb_data.POSITIONS: where}
                tb = tb_data.as_traceback(node)
                assert tb is not None
                self.assertEqual(tb.tb_lineno, 10)
                if sys.version_info >= (3, 11):
                    self.assertEqual(tb_data.positions(tb), where)


if __name__ == "__main__":
    unittest.main()


def recurse(n: int) -> int:
    return recurse(n + 1) + 1


class LongAndExitTest(unittest.TestCase):
    def test_a_recursion_error_keeps_its_frames(self):
        # (tblib's data recursed a level a frame: the report pointed at the test's def line)
        from disttest._runner.outcome import MAX_TB_FRAMES

        try:
            recurse(0)
        except RecursionError as e:
            o = outcome_from_exception(0, e)
        frames = traceback.extract_tb(user_traceback([o]))
        self.assertEqual(frames[-1].name, "recurse")
        self.assertEqual(frames[0].name, "test_a_recursion_error_keeps_its_frames")  # the first half is kept too
        self.assertLessEqual(len(frames), MAX_TB_FRAMES)

    def test_sys_exit_in_a_rank_points_at_its_line(self):
        try:
            sys.exit(5)
        except SystemExit as e:
            o = outcome_from_exception(0, e)
        self.assertIn("sys.exit(5)", lines(user_traceback([o]))[-1])


class LocalsTest(unittest.TestCase):
    """A rank's locals, when asked for (outcome.ask_locals, DISTTEST_TB_LOCALS)."""

    def test_a_large_local_is_shown_short_without_its_whole_repr(self):
        from disttest._runner import outcome

        read = [0]  # (how many items a repr read)

        class Item:
            def __repr__(self) -> str:
                read[0] += 1
                return "i"

        def fails() -> None:
            huge = [Item() for _ in range(100_000)]  # noqa: F841 (shown as a local)
            text = "x" * 10_000  # noqa: F841
            raise ValueError("boom")

        undo = outcome.ask_locals(True)
        try:
            try:
                fails()
            except ValueError as e:
                got = outcome.outcome_from_exception(0, e)
        finally:
            undo()
        self.assertIn("text = 'xxxx", got.traceback)
        self.assertIn("huge = [i, i, i", got.traceback)
        self.assertLess(read[0], 1_000)  # (the whole repr read all 100,000, for each of two uses)
        self.assertLess(len(got.traceback), 5_000)
        self.assertEqual(outcome._asked, [False])  # (put back)

    def test_the_variable_is_read_as_a_flag(self):
        # "false", "no" and "off" turned locals on (anything but "0" did).
        from disttest._runner import outcome

        for raw, shown in (("false", False), ("off", False), ("no", False), ("0", False), ("", False),
                           ("1", True), ("yes", True), ("bogus", False)):  # (a bad one is refused as a run starts)
            with self.subTest(raw=raw), mock.patch.dict(os.environ, {"DISTTEST_TB_LOCALS": raw}):
                self.assertIs(outcome.showing_locals(), shown)
