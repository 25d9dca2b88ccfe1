"""Fault injection with CUDA tensors: on NCCL at world size 1 and on gloo
at world size 2 (two ranks on one GPU). Run by ``make gpu-check``; skipped
where CUDA is absent."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from gpu_cases import init_gloo, init_nccl

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


class NcclFaults(Ranks):
    @disttest.inject_fault(rank=0, action="raise", at="all_reduce")
    def test_raise_then_retry(self) -> None:
        init_nccl(self)
        t = torch.ones(4, device="cuda")
        with self.assertRaises(disttest.InjectedFault):
            dist.all_reduce(t)
        dist.all_reduce(t)  # a fresh call communicates
        self.assertEqual(t.cpu(), torch.ones(4))

    @disttest.inject_fault(rank=0, action="corrupt", at="all_reduce")
    def test_corrupt(self) -> None:
        init_nccl(self)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        self.assertEqual(t.device.type, "cuda")
        self.assertFalse(torch.equal(t.cpu(), torch.ones(4)), "the received values were not corrupted")

    @disttest.inject_fault(rank=0, action="delay", at="all_reduce", seconds=0.5)
    def test_delay(self) -> None:
        init_nccl(self)
        t = torch.ones(4, device="cuda")
        start = time.monotonic()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        self.assertGreaterEqual(time.monotonic() - start, 0.5)


class GlooCudaFaults(Ranks):
    ranks = 2

    @disttest.inject_fault(rank=1, action="kill", at="all_reduce", nth=2)
    def test_survivor_sees_the_peer_die(self) -> None:
        init_gloo(self)
        t = torch.ones(4, device="cuda:0")
        dist.all_reduce(t)
        try:
            dist.all_reduce(t)  # rank 1 dies as it enters it
        except RuntimeError:
            return  # rank 0: the peer is gone
        self.fail("the second all_reduce completed")

    @disttest.inject_fault(rank=1, action="corrupt", at="broadcast")
    def test_corrupt_broadcast(self) -> None:
        init_gloo(self)
        t = torch.full((4,), float(self.rank == 0), device="cuda:0")
        dist.broadcast(t, src=0)
        if self.rank == 0:
            self.assertEqual(t.cpu(), torch.ones(4))
        else:
            self.assertFalse(torch.equal(t.cpu(), torch.ones(4)), "rank 1's values were not corrupted")
