"""A pool whose ranks keep OpenMP's threads, in a module whose import runs a
parallel op (that of :mod:`omp_import_cases`, imported here). Its default
start method, fork, goes to the fork server, which spawns its ranks instead
(tests/test_fork_server.py; never imported by pytest's process)."""

from __future__ import annotations

import unittest

import omp_import_cases  # noqa: F401 (its parallel op at import)
import torch

import disttest


class OmpPool(disttest.MultiProcContinousTest):
    world_size = 1
    rank_threads = None

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_parallel_op(self) -> None:
        self.assertEqual((torch.randn(300, 300) @ torch.randn(300, 300)).shape, (300, 300))


if __name__ == "__main__":
    unittest.main()
