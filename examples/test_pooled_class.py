"""Example: many small tests sharing one pool of rank processes.

The class's first test starts two gloo ranks and their process group; every
other test reuses them. setUp runs in each rank. A failing test would fail
alone; a crashing or hanging one would be reported and the pool rebuilt.
Run: python -m unittest -v examples/test_pooled_class.py
"""

import unittest

import torch
import torch.distributed as dist

import disttest


class ShardMath(disttest.MultiProcContinousTest):
    world_size = 2
    timeout = 60

    @classmethod
    def backend_str(cls):
        return "gloo"

    def setUp(self):
        super().setUp()
        self.local = torch.arange(4.0) + 4 * self.rank  # this rank's shard

    def test_sum_of_shards(self):
        total = self.local.sum()
        dist.all_reduce(total)
        self.assertEqual(total.item(), sum(range(8)))

    def test_max_of_shards(self):
        top = self.local.max()
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        self.assertEqual(top.item(), 7.0)

    def test_gather_rebuilds_the_tensor(self):
        parts = [torch.zeros(4) for _ in range(self.world_size)]
        dist.all_gather(parts, self.local)
        self.assertEqual(torch.cat(parts), torch.arange(8.0))

    def test_same_group_for_the_class(self):
        self.assertEqual(type(self).pg.size(), self.world_size)


if __name__ == "__main__":
    unittest.main()
