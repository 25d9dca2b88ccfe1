"""A module that does no tensor work at import, with fresh-process tests
whose ranks keep OpenMP's threads: a fork server forks them, whatever an
earlier test's module started in it (it asks a fresh server then).
tests/test_fork_server.py runs it with tests/omp_import_cases.py, in a new
process, in both orders."""

from __future__ import annotations

import multiprocessing
import unittest

import torch

import disttest


def parallel_op() -> float:
    a = torch.randn(1500, 1500)
    return float((a @ a).sum().item())


class CleanOmpRanks(disttest.MultiProcessTestCase):
    world_size = 1
    rank_threads = None
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_forked(self) -> None:
        parallel_op()
        self.assertIsNone(multiprocessing.parent_process(), "spawned, not forked by the fork server")


if __name__ == "__main__":
    unittest.main()
