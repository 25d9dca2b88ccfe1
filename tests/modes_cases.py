"""One body run in every mode (tests/test_modes.py)."""

import torch
import torch.distributed as dist

import disttest


@disttest.run_in("threads", "processes", "pool")
class Collectives:
    world_size = 3
    timeout = 60

    def test_all_reduce(self):
        t = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 6.0))
        self.assertEqual(dist.get_world_size(), 3)

    def test_rank_one_is_wrong(self):
        self.assertNotEqual(self.rank, 1, "rank 1 disagrees")
