"""Ranks that run a backward pass after the test process started torch's
autograd device threads (torch 2.14's FSDP2 does so on CPU), from which a
forked process can run no backward pass.

tests/test_fork_server.py runs this module with ``python -m unittest`` in a
new process. ``setUpModule`` starts the threads in the test process, as an
earlier test's FSDP2 rank threads did in a suite, and says how many run
(``autograd device threads: N`` on stderr); where the installed torch starts
none this way, the outer test skips.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist

import disttest
from disttest._runner import fork_threads


def setUpModule() -> None:
    from torch.distributed.fsdp import fully_shard

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            model = torch.nn.Linear(2, 2)
            fully_shard(model)
            model(torch.ones(1, 2)).sum().backward()
        finally:
            dist.destroy_process_group()
    started = sum(fork_threads._thread_name(tid).startswith(fork_threads.AUTOGRAD_THREAD)
                  for tid in fork_threads.thread_ids() or ())
    print(f"autograd device threads: {started}", file=sys.stderr)


def backward() -> None:
    x = torch.ones(2, requires_grad=True)
    (x * 3).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [3.0, 3.0]


class FreshRanks(disttest.MultiProcessTestCase):
    world_size = 2
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_backward(self) -> None:
        backward()


class PooledRanks(disttest.MultiProcContinousTest):
    world_size = 2
    timeout = 60

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_backward(self) -> None:
        backward()
