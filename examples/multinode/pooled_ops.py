"""A pooled class meant for an external launcher: each process the launcher
starts runs the class's tests as its rank (env:// rendezvous). run_rank()
reads rank, world size and master from torchrun, Slurm or Open MPI:

    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=0 \\
             --master-addr=HOST0 --master-port=29500 pooled_ops.py
    (and --node-rank=1 on the second node)

    srun --nodes=2 --ntasks-per-node=1 python pooled_ops.py     (see srun.sbatch)

    mpirun -np 2 -x MASTER_ADDR=HOST0 python pooled_ops.py
"""

import os
import sys

import torch
import torch.distributed as dist

import disttest


class PooledOps(disttest.MultiProcContinousTest):
    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_sum_over_nodes(self):
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        n = self.world_size
        self.assertEqual(t.item(), n * (n + 1) / 2)

    def test_every_rank_knows_the_world(self):
        self.assertEqual(dist.get_world_size(), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    result = PooledOps.run_rank()
    sys.exit(0 if result.wasSuccessful() else 1)
