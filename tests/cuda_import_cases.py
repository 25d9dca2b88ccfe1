"""A test module that "initialises CUDA at import", run by
tests/test_cuda_fork.py in an interpreter of its own (``python -m unittest``).

This host may have no GPU, so the import fakes it: ``torch.cuda.is_initialized``
answers True in every process that imports this module (the test process,
the fork server, each spawned rank), as a module with a CUDA tensor at module
level makes it answer on a GPU host. tests/gpu/cuda_at_import_cases.py is the
real thing.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import disttest
from disttest._runner import cuda_fork, zygote

torch.cuda.is_initialized = lambda: True  # type: ignore[assignment]  # what a CUDA tensor here would do


def spawned() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


class Fresh(disttest.MultiProcessTestCase):
    """The default start method: the fork server."""

    timeout = 60

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


class Pooled(disttest.MultiProcContinousTest):
    """The default start method: fork from the test process."""

    timeout = 60

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_spawned(self) -> None:
        self.assertTrue(spawned(), "the worker was forked")


def tearDownModule() -> None:  # noqa: N802 (unittest's name)
    # What the test process learned, and that the refusing server is gone.
    print("learned:", sorted(cuda_fork._cuda_at_import), file=sys.stderr)
    print("servers:", len(zygote._clients), "retired:", len(zygote._retired), file=sys.stderr)
