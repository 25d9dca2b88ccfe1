"""Example: a DDP training step on gloo, one fresh process per rank.

Every rank builds the same model (seeded), trains one step on its own shard
of the batch, and checks that DDP left identical, averaged parameters.
Run: python -m unittest -v examples/test_ddp_processes.py
"""

import unittest

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import disttest


class DDPStep(disttest.MultiProcessTestCase):
    timeout = 60

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_one_step_keeps_replicas_in_sync(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        model = disttest.Net()
        ddp = DDP(model)
        batch = torch.randn(8, 2)  # the same batch everywhere (seeded)
        shard = batch.chunk(self.world_size)[self.rank]
        ddp(shard).sum().backward()
        torch.optim.SGD(ddp.parameters(), lr=0.1).step()

        # Gather every rank's parameters and check they are equal.
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
        gathered = [torch.zeros_like(flat) for _ in range(self.world_size)]
        dist.all_gather(gathered, flat)
        for other in gathered:
            self.assertEqual(other, flat)


if __name__ == "__main__":
    unittest.main()
