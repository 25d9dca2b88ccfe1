"""Ranks that keep OpenMP's threads, started after the test process ran a
parallel op (its OpenMP pool runs): forked from it they would hang at their
first parallel op. tests/test_fork_server.py runs this module in a new
process with OMP_NUM_THREADS=2; the classes run in name order, so
``AParallelOpFirst`` starts the test process's pool before the others."""

from __future__ import annotations

import unittest

import torch
from omp_clean_cases import OneRank, parallel_op

import disttest


class AParallelOpFirst(unittest.TestCase):
    def test_in_the_test_process(self) -> None:
        parallel_op()


class ForkedRanks(OneRank):
    """The user's own ``fork``: forked, with one OpenMP thread each."""

    start_method = "fork"
    timeout = 20

    def test_forked_serial(self) -> None:
        self.check(forked=True)  # not spawned
        self.assertEqual(torch.get_num_threads(), 1)


class PooledRanks(disttest.MultiProcContinousTest):
    """The pool's default ``fork``: the fork server starts the workers, which
    keep OpenMP's threads."""

    world_size = 1
    rank_threads = None
    timeout = 20

    def test_keeps_openmp_threads(self) -> None:
        parallel_op()
        self.assertEqual(torch.get_num_threads(), 2)


if __name__ == "__main__":
    unittest.main()
