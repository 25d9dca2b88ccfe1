"""The three runners with CUDA tensors: NCCL at world size 1, gloo with CUDA
tensors at world size 2 on one GPU, NCCL at world size 2 where two GPUs
exist (skipped, saying why, on one). Run by ``make gpu-check``; skipped
where CUDA is absent."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from gpu_cases import init_gloo, init_nccl, spawned, total

import disttest

pytestmark = pytest.mark.gpu


class Ranks(disttest.MultiProcessTestCase):
    timeout = 120
    ranks = 1

    @property
    def world_size(self) -> int:
        return self.ranks

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class NcclFresh(Ranks):
    """Fresh processes from the fork server (the default): NCCL, one rank."""

    def test_all_reduce(self) -> None:
        self.assertFalse(spawned(), "spawned: the fork server's ranks could not use CUDA")
        init_nccl(self)
        self.assertEqual(dist.get_backend(), "nccl")
        t = torch.full((4,), float(self.rank + 1), device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))


class NcclTwoGpus(Ranks):
    ranks = 2

    @disttest.skip_if_lt_x_gpu(2)
    def test_all_reduce(self) -> None:
        init_nccl(self)
        self.assertEqual(torch.cuda.current_device(), self.rank)
        t = torch.full((4,), float(self.rank + 1), device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))


class GlooCudaFresh(Ranks):
    """Two ranks on one GPU over gloo, which takes CUDA tensors."""

    ranks = 2

    def test_collectives(self) -> None:
        init_gloo(self)
        t = torch.full((4,), float(self.rank + 1), device="cuda:0")
        dist.all_reduce(t)
        self.assertEqual(t.device.type, "cuda")
        self.assertEqual(t.cpu(), total(self.world_size))
        b = torch.full((3,), float(self.rank), device="cuda:0")
        dist.broadcast(b, src=1)
        self.assertEqual(b.cpu(), torch.ones(3))


class NcclPool(disttest.MultiProcContinousTest):
    """The pool (on a CUDA host its default start method is the fork server)."""

    world_size = 1
    timeout = 120
    first_pid = 0

    @classmethod
    def backend_str(cls) -> str:
        return "nccl"

    def test_1_all_reduce(self) -> None:
        type(self).first_pid = os.getpid()
        self.assertEqual(type(self).device_type(), "cuda")
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), torch.ones(4))

    def test_2_same_worker(self) -> None:
        self.assertEqual(os.getpid(), type(self).first_pid, "the pool's worker was replaced")
        self.assertEqual(dist.get_backend(), "nccl")


class GlooCudaPool(disttest.MultiProcContinousTest):
    world_size = 2
    timeout = 120

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_all_reduce(self) -> None:
        t = torch.full((4,), float(self.rank + 1), device="cuda:0")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))


class NcclPoolTwoGpus(disttest.MultiProcContinousTest):
    world_size = 2
    timeout = 120

    @classmethod
    def backend_str(cls) -> str:
        return "nccl"

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        torch.cuda.set_device(rank)
        super()._init_pg(rank, world_size, rdvz_file)

    @disttest.skip_if_lt_x_gpu(2)
    def test_all_reduce(self) -> None:
        t = torch.full((4,), float(self.rank + 1), device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.cpu(), total(self.world_size))


class CudaThreads(disttest.MultiThreadedTestCase):
    """Ranks as threads over the threaded group, with CUDA tensors."""

    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_collectives(self) -> None:
        t = torch.full((4,), float(self.rank + 1), device="cuda:0")
        dist.all_reduce(t)
        self.assertEqual(t.device.type, "cuda")
        self.assertEqual(t.cpu(), total(self.world_size))
        out = [torch.empty(2, device="cuda:0") for _ in range(self.world_size)]
        dist.all_gather(out, torch.full((2,), float(self.rank), device="cuda:0"))
        self.assertEqual(torch.stack(out).cpu(), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
