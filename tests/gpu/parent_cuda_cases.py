"""The test process initialises CUDA after importing this module (in
``setUpModule``; the fork server's import of it does not).
tests/gpu/test_gpu_start_methods.py runs it in an interpreter of its own.

The fork server, a fresh interpreter, is unaffected: its ranks are forked
and use CUDA. ``fork`` from the test process is not: those ranks are spawned.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gpu_cases import init_nccl, spawned

import disttest


def setUpModule() -> None:  # noqa: N802 (unittest's name)
    torch.ones(1, device="cuda")
    assert torch.cuda.is_initialized()


class Ranks(disttest.MultiProcessTestCase):
    timeout = 120

    @property
    def world_size(self) -> int:
        return 1

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class Zygote(Ranks):
    """The default start method: the fork server."""

    def test_forked_by_the_fork_server(self) -> None:
        init_nccl(self)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), torch.ones(4))
        self.assertFalse(spawned(), "spawned: the fork server was not used")


class Forked(Ranks):
    """``fork`` chosen by the class: from a process that initialised CUDA."""

    start_method = "fork"

    def test_spawned_instead(self) -> None:
        init_nccl(self)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), torch.ones(4))
        self.assertTrue(spawned(), "forked from a process that initialised CUDA")
