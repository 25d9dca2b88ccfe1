"""disttest._runner.rank: the rank loop's helpers (the loop itself runs in
every runner's tests)."""

from __future__ import annotations

import os
import tempfile
import unittest
from unittest import mock

from disttest._runner import rank


class TailTest(unittest.TestCase):
    def log(self, data: bytes) -> str:
        fd, path = tempfile.mkstemp(prefix="disttest-tail-")
        self.addCleanup(os.remove, path)
        os.write(fd, data)
        os.close(fd)
        return path

    def test_the_end_after_the_start(self):
        path = self.log(b"earlier test\nthis test\n")
        self.assertEqual(rank.tail(path, start=13), "this test\n")
        self.assertEqual(rank.tail(path, limit=5, start=13), "test\n")
        self.assertEqual(rank.tail(path), "earlier test\nthis test\n")
        self.assertEqual(rank.tail(self.log(b"\xff ok")), "\ufffd ok")

    def test_a_log_that_did_not_grow_is_not_read(self):
        # A pool worker asks after every test.
        path = self.log(b"earlier test\n")
        with mock.patch("os.pread", side_effect=AssertionError("read")):
            self.assertEqual(rank.tail(path, start=13), "")

    def test_an_unreadable_log_is_empty(self):
        self.assertEqual(rank.tail("/nonexistent/disttest/log"), "")


if __name__ == "__main__":
    unittest.main()
