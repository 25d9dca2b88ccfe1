"""disttest._runner.deadline: a limit on code in one thread, raised into it
where that leaves no lock held (simulated tests, stopped rank threads)."""

from __future__ import annotations

import logging
import os
import threading
import time
import unittest

from disttest._runner.deadline import Deadline, DeadlinePassed


def spin(seconds: float | None = None) -> None:
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        pass


def in_logging(seconds: float) -> None:
    """Spin ``seconds`` in a function whose code claims to be logging's."""
    namespace: dict = {"spin": spin}
    path = os.path.join(os.path.dirname(logging.__file__), "handlers.py")
    exec(compile("def emit(seconds):\n    spin(seconds)\n", path, "exec"), namespace)
    namespace["emit"](seconds)


class DeadlineTest(unittest.TestCase):
    def test_raised_into_the_block_with_its_stack(self):
        start = time.monotonic()
        watch = Deadline(0.2)
        with self.assertRaises(DeadlinePassed), watch:
            spin()
        self.assertLess(time.monotonic() - start, 2)
        self.assertEqual([f.name for f in watch.frames][-2:], ["test_raised_into_the_block_with_its_stack", "spin"])

    def test_not_while_the_thread_is_in_code_that_takes_locks(self):
        start = time.monotonic()
        with self.assertRaises(DeadlinePassed), Deadline(0.05):
            in_logging(0.5)
            spin()
        self.assertGreaterEqual(time.monotonic() - start, 0.5)

    def test_nothing_lands_after_a_block_that_ended_in_time(self):
        for _ in range(20):
            with Deadline(0.01):
                pass
        spin(0.1)
        self.assertFalse(any(t.name == "disttest-deadline" for t in threading.enumerate()))

    def test_an_exception_of_the_body_is_its_own(self):
        with self.assertRaises(KeyError), Deadline(5):
            raise KeyError("mine")


if __name__ == "__main__":
    unittest.main()
