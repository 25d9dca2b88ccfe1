"""Classes that tests/test_cuda_fork.py runs into a recording result. At
module level (not in test_*.py, so pytest does not collect them) so that
``spawn`` and the fork server can import them by name. Each test asserts
how its rank was started."""

from __future__ import annotations

import multiprocessing

import torch
import torch.distributed as dist

import disttest


def spawned() -> bool:
    """In a rank: whether multiprocessing's ``spawn`` started it (a forked
    rank, of the test process or of the fork server, has no parent process
    in multiprocessing's sense)."""
    return multiprocessing.parent_process() is not None


class Fresh(disttest.MultiProcessTestCase):
    timeout = 60
    start_method = "fork"  # the user's choice

    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_spawned(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0))
        self.assertTrue(spawned(), "the rank was forked")

    def test_forked(self) -> None:
        self.assertFalse(spawned(), "the rank was spawned")


class Pooled(disttest.MultiProcContinousTest):
    """The pool's start method is disttest's default (fork)."""

    timeout = 60

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_spawned(self) -> None:
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0))
        self.assertTrue(spawned(), "the worker was forked")
