"""Example: sharding logic for a world of 64, tested in one process.

with_fake_comms makes this process one rank of a fake world: no peers, no
processes, collectives complete at once (as if every rank passed this
rank's tensors). Enough to test who owns which rows, and that the shapes of
a sharded all_gather line up.
Run: python -m unittest -v examples/test_fake_world_sharding.py
"""

import unittest

import torch
import torch.distributed as dist

import disttest


def shard_rows(num_rows: int) -> range:
    """The rows this rank owns: contiguous, sizes differing by at most one."""
    rank, world = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(num_rows, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


class ShardingInAWorldOf64(unittest.TestCase):
    def test_every_row_has_one_owner(self):
        owners = []
        for rank in range(64):
            with disttest.with_dist(rank=rank, world_size=64):
                owners.extend(shard_rows(1000))
        self.assertEqual(owners, list(range(1000)))

    @disttest.with_fake_comms(rank=63, world_size=64)
    def test_last_rank_shard(self):
        rows = shard_rows(1000)
        self.assertEqual((rows.start, len(rows)), (985, 15))

    # all_gather_single is new in torch 2.13: on older torch this test skips,
    # saying so ("needs torch >= 2.13 ...").
    @disttest.requires_torch_feature("dist.all_gather_single")
    @disttest.with_fake_comms(rank=63, world_size=64)
    def test_gather_shapes(self):
        local = torch.zeros(16, 8)  # padded to the largest shard
        gathered = torch.empty(64 * 16, 8)
        dist.all_gather_single(gathered, local)
        self.assertEqual(gathered.shape, (1024, 8))


if __name__ == "__main__":
    unittest.main()
