"""A module that runs a parallel op at import (as suites that build a
tensor constant with a matmul do), then fresh-process tests whose ranks keep
OpenMP's threads (``rank_threads = None``) and ranks that do not.

tests/test_fork_server.py runs it with ``python -m unittest`` in a new
process, under ``DISTTEST_FORK_SERVER=fresh``: the fork server imports it,
and its OpenMP pool starts there. A rank forked after that hangs at its
first parallel op (libgomp is not fork-safe), so the server refuses to fork
the first class's ranks, which start with ``spawn`` instead; the second
class's ranks go serial before any op and are forked. Never imported by
pytest's process (a parallel op there would start its pool).
"""

from __future__ import annotations

import multiprocessing
import unittest

import torch
from omp_clean_cases import parallel_op

import disttest

_ = torch.randn(1500, 1500) @ torch.randn(1500, 1500)  # a parallel op at import


class OmpRanks(disttest.MultiProcessTestCase):
    """Ranks that keep OpenMP's threads: spawned, and their parallel ops run."""

    world_size = 1
    rank_threads = None
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_a(self) -> None:
        parallel_op()
        self.assertIsNotNone(multiprocessing.parent_process(), "forked, not spawned")

    def test_b(self) -> None:  # the module is known by now: no fork server is asked
        parallel_op()
        self.assertIsNotNone(multiprocessing.parent_process(), "forked, not spawned")


class SerialRanks(disttest.MultiProcessTestCase):
    """Ranks of one OpenMP thread (the default) are forked by the fork server."""

    world_size = 1
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_forked(self) -> None:
        parallel_op()
        self.assertIsNone(multiprocessing.parent_process(), "spawned, not forked by the fork server")


if __name__ == "__main__":
    unittest.main()
