"""A module that does no tensor work at import, with fresh-process tests
whose ranks keep OpenMP's threads: a fork server forks them, whatever an
earlier test's module started in it (it asks a fresh server then).
tests/test_fork_server.py runs it with tests/omp_import_cases.py and
tests/np_import_cases.py, in a new process, in both orders. Their classes
derive from :class:`OneRank`."""

from __future__ import annotations

import multiprocessing
import unittest

import torch

import disttest


def parallel_op() -> float:
    a = torch.randn(1500, 1500)
    return float((a @ a).sum().item())


class OneRank(disttest.MultiProcessTestCase):
    """One fresh rank that keeps OpenMP's threads (``rank_threads = None``)."""

    world_size = 1
    rank_threads: int | None = None
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def check(self, forked: bool) -> None:
        """In the rank: run a parallel op; the rank was forked (by the fork
        server), or spawned."""
        parallel_op()
        if forked:
            self.assertIsNone(multiprocessing.parent_process(), "spawned, not forked by the fork server")
        else:
            self.assertIsNotNone(multiprocessing.parent_process(), "forked, not spawned")


class CleanOmpRanks(OneRank):
    def test_forked(self) -> None:
        self.check(forked=True)


if __name__ == "__main__":
    unittest.main()
