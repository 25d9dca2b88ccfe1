"""A module that does numpy linear algebra at import, which starts numpy's
OpenBLAS pool in the process that imports it, the fork server included.
That pool ends itself at every fork, so the fork server still forks ranks
that keep OpenMP's threads. tests/test_fork_server.py runs it after
tests/omp_clean_cases.py (the server has forked once: the pool's threads
are new ones) and before tests/omp_import_cases.py, in a new process."""

from __future__ import annotations

import unittest

import numpy as np
from omp_clean_cases import OneRank

_ = np.random.rand(400, 400) @ np.random.rand(400, 400)  # numpy's BLAS at import


class NumpyAtImport(OneRank):
    def test_forked(self) -> None:
        self.check(forked=True)


if __name__ == "__main__":
    unittest.main()
