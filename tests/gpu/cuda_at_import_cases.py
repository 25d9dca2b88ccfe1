"""A test module that touches CUDA at import, as many suites do, then runs
fresh-process and pooled tests. tests/gpu/test_gpu_start_methods.py runs it
in an interpreter of its own (``python -m unittest``), so that its CUDA
stays out of the pytest process.

Every process that imports it initialises CUDA: the test process, the fork
server (which must then refuse to fork), and each spawned rank.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gpu_cases import init_gloo, init_nccl, spawned, total

import disttest
from disttest._runner import cuda_fork

TEST_CUDA = torch.cuda.is_available()
DEVICE_COUNT = torch.cuda.device_count()
ON_GPU = torch.ones(1, device="cuda")  # a CUDA tensor at module level: CUDA is initialised


class Ranks(disttest.MultiProcessTestCase):
    timeout = 120
    ranks = 1

    @property
    def world_size(self) -> int:
        return self.ranks

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class Fresh(Ranks):
    """The default start method (the fork server), NCCL at world size 1."""

    def test_nccl(self) -> None:
        init_nccl(self)
        t = torch.full((4,), float(self.rank + 1), device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))
        self.assertTrue(spawned())


class Forked(Ranks):
    """``fork`` chosen by the class, gloo with CUDA tensors at world size 2."""

    start_method = "fork"
    ranks = 2

    def test_gloo_cuda(self) -> None:
        init_gloo(self)
        t = torch.full((4,), float(self.rank + 1), device="cuda:0")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))
        self.assertTrue(spawned())


class Pooled(disttest.MultiProcContinousTest):
    """The pool's default start method, NCCL at world size 1."""

    world_size = 1
    timeout = 120

    @classmethod
    def backend_str(cls) -> str:
        return "nccl"

    def test_nccl(self) -> None:
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), torch.ones(4))
        self.assertTrue(spawned())


def tearDownModule() -> None:  # noqa: N802 (unittest's name)
    print("learned:", sorted(cuda_fork._cuda_at_import), file=sys.stderr)
