"""A TestDistBackend class for tests/test_backend.py (not collected by pytest)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import disttest


class Backend(disttest.TestDistBackend):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_collective_between_barriers(self):
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), sum(range(1, self.world_size + 1)))
        self._barrier()
        self.assertTrue(os.path.isdir(os.environ["TEMP_DIR"]))

    @disttest.require_backend_is_available(["nccl"])
    def test_needs_nccl(self):
        raise AssertionError("must skip")

    @disttest.require_world_size(4)
    def test_needs_four(self):
        raise AssertionError("must skip")

    @disttest.require_exact_world_size(2)
    def test_exactly_two(self):
        self.assertEqual(self.world_size, 2)
