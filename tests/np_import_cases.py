"""A module that does numpy linear algebra at import, which starts numpy's
OpenBLAS pool in the process that imports it, the fork server included.
That pool ends itself at every fork, so the fork server still forks ranks
that keep OpenMP's threads. tests/test_fork_server.py runs it after
tests/omp_clean_cases.py (the server has forked once: the pool's threads
are new ones) and before tests/omp_import_cases.py, in a new process."""

from __future__ import annotations

import multiprocessing
import unittest

import numpy as np
from omp_clean_cases import parallel_op

import disttest

_ = np.random.rand(400, 400) @ np.random.rand(400, 400)  # numpy's BLAS at import


class NumpyAtImport(disttest.MultiProcessTestCase):
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
