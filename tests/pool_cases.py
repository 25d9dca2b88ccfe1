"""MultiProcContinousTest classes that tests/test_continuous.py runs.
At module level so that every start method can import them by name."""

from __future__ import annotations

import os
import signal
import sys
import time
import unittest

import torch
import torch.distributed as dist

import disttest


def stuck_in_pool_helper():
    time.sleep(60)


class Mixed(disttest.MultiProcContinousTest):
    """Bad tests of every kind among passing ones (run in name order)."""

    timeout = 3

    @classmethod
    def backend_str(cls):
        return "gloo"

    def setUp(self):
        super().setUp()
        # Runs in the ranks, not in the parent (rank -1 would fail here).
        assert self.rank in (0, 1), self.rank
        self.t = torch.ones(2) * (self.rank + 1)

    def tearDown(self):
        with open(os.environ["POOL_LOG"], "a") as f:
            f.write(f"teardown {self._testMethodName} {self.rank} {os.getpid()}\n")
        super().tearDown()

    def test_01_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))

    def test_02_assertion(self):
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_03_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))

    def test_04_os_exit(self):
        if self.rank == 1:
            os._exit(3)
        dist.barrier()

    def test_05_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(type(self).pg.size(), 2)

    def test_06_signal(self):
        if self.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    def test_07_pass(self):
        dist.all_reduce(self.t)

    def test_08_hang(self):
        if self.rank == 1:
            stuck_in_pool_helper()
        dist.barrier()

    def test_09_pass(self):
        dist.all_reduce(self.t)

    def test_10_early_return(self):
        dist.all_reduce(self.t)
        if self.rank == 1:
            return
        dist.all_reduce(self.t)

    def test_11_pass(self):
        dist.all_reduce(self.t)

    def test_12_skip(self):
        raise unittest.SkipTest("not in this rank's mood")

    def test_13_exit_code_skip(self):
        if self.rank == 0:
            sys.exit(disttest.TEST_SKIPS["nccl"].exit_code)

    def test_14_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))


class NoBackend(disttest.MultiProcContinuousTest):
    @classmethod
    def backend_str(cls):
        return "nccl"

    def test_never_runs(self):
        raise AssertionError("the class must skip")


class InitFails(disttest.MultiProcContinousTest):
    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        if rank == 1:
            raise RuntimeError("no group for rank 1")
        super()._init_pg(rank, world_size, rdvz_file)

    def test_any(self):
        pass


class Wide(disttest.MultiProcContinousTest):
    @property
    def world_size(self):
        return 3

    def test_three_ranks(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3.0)
        self.assertIn("gloo", dist.get_backend_config())  # chosen by device


class Launched(disttest.MultiProcContinousTest):
    """Run by an external launcher (run_rank)."""

    def test_sum(self):
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        n = self.world_size
        self.assertEqual(t.item(), n * (n + 1) / 2)

    def test_rank_in_range(self):
        self.assertTrue(0 <= self.rank < self.world_size)


if __name__ == "__main__":
    # python pool_cases.py RANK WORLD_SIZE [RDVZ_FILE]; without arguments,
    # the launcher's environment (torchrun, Slurm, Open MPI) and env://.
    if len(sys.argv) > 1:
        rank, world = int(sys.argv[1]), int(sys.argv[2])
        rdvz = sys.argv[3] if len(sys.argv) > 3 else None
    else:
        rank, world, rdvz = None, None, None
    result = Launched.run_rank(rank, world, rdvz)
    sys.exit(0 if result.wasSuccessful() else 1)
