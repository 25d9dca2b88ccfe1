"""Helpers and test classes of the GPU tests (tests/gpu/test_*.py) that are
run into a recording result. At module level (not in test_*.py, so pytest
does not collect them) so that the fork server and ``spawn`` can import them
by name."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import unittest

import torch
import torch.distributed as dist

import disttest
from disttest import _compat

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.append(TESTS)  # runner_cases, when only tests/gpu/ is collected

from runner_cases import live_ranks  # noqa: E402

__all__ = ["live_ranks"]

#: A rank writes its pid to a file in this folder when the variable is set.
PIDS_ENV = "DISTTEST_GPU_PIDS"


def spawned() -> bool:
    """In a rank: whether multiprocessing's ``spawn`` started it (forked
    ranks, of the fork server or of the test process, have no parent in
    multiprocessing's sense)."""
    return multiprocessing.parent_process() is not None


def note_pid(rank: int) -> None:
    folder = os.environ.get(PIDS_ENV)
    if folder:
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write(str(os.getpid()))


def gpu_pids() -> set[int]:
    """The processes that hold GPU memory now (nvidia-smi's compute apps)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(p) for p in out.split() if p.strip().isdigit()}


def init_nccl(case: unittest.TestCase) -> None:
    """In a rank: the default group over NCCL, one GPU per rank."""
    rank, world = case.rank, case.world_size  # type: ignore[attr-defined]
    torch.cuda.set_device(rank)
    store = dist.FileStore(case.file_name, world)  # type: ignore[attr-defined]
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=torch.device("cuda", rank))


def init_gloo(case: unittest.TestCase) -> None:
    """In a rank: the default group over gloo (its tensors may live on CUDA)."""
    rank, world = case.rank, case.world_size  # type: ignore[attr-defined]
    store = dist.FileStore(case.file_name, world)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def total(world_size: int, n: int = 4) -> torch.Tensor:
    """What an all_reduce(SUM) of ``rank + 1`` in every rank gives."""
    return torch.full((n,), float(sum(range(1, world_size + 1))))


class Base(disttest.MultiProcessTestCase):
    timeout = 120

    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class SpinKernel(Base):
    """Rank 1 waits for a CUDA spin kernel far longer than the timeout."""

    timeout = 10

    def test_spin(self) -> None:
        note_pid(self.rank)
        init_gloo(self)
        torch.cuda.set_device(0)
        torch.ones(1, device="cuda")  # both ranks hold GPU memory
        if self.rank == 1:
            _compat.cuda_sleep(1 << 40)  # minutes of spinning on any GPU
            torch.cuda.synchronize()
        dist.barrier()


class NcclPeerDies(Base):
    """Rank 1 dies while rank 0 waits in an NCCL all_reduce that needs it."""

    timeout = 60

    @disttest.skip_if_lt_x_gpu(2)
    def test_peer_dies(self) -> None:
        note_pid(self.rank)
        init_nccl(self)
        if self.rank == 1:
            os._exit(7)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()


class NcclPeerDiesBeforeInit(Base):
    """One GPU is enough: rank 1 dies at once, rank 0 waits for it while it
    makes an NCCL group on cuda:0 (eager init: the communicator needs rank 1)."""

    timeout = 60

    def test_peer_dies(self) -> None:
        note_pid(self.rank)
        if self.rank == 1:
            os._exit(7)
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("nccl", store=store, rank=0, world_size=2, device_id=torch.device("cuda", 0))
        dist.all_reduce(torch.ones(4, device="cuda"))
        torch.cuda.synchronize()


class TooFewGpus(Base):
    """Skipped in the parent, before any rank starts, on a host with fewer GPUs."""

    def test_needs_more(self) -> None:
        raise AssertionError("ran")


# One more GPU than this process sees: decided at class creation, as a suite would.
TooFewGpus.test_needs_more = disttest.skip_if_lt_x_gpu(  # type: ignore[method-assign]
    torch.cuda.device_count() + 1)(TooFewGpus.test_needs_more)
