"""Example: FSDP2 (fully_shard) against a replicated model, on CPU with gloo.

FSDPTest starts 2 fresh rank processes per test with the default group
already made (gloo on a host without accelerators; upstream's FSDPTest skips
there). Each rank trains the sharded model and a replicated copy on its own
batch for a few steps, averaging the copy's gradients by hand;
check_sharded_parity then compares every parameter and gradient shard.
run_subtests runs the check once per configuration, as subTests.
Run: python -m unittest -v examples/test_fsdp2_parity.py
"""

import copy
import unittest

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from disttest.bases.fsdp import FSDPTest, MLPStack, check_sharded_parity

# NB: in torch 2.8 gloo's reduce_scatter with ReduceOp.AVG (what fully_shard
# uses on CPU) returns the sum; 2.13 gets it right.
_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


@unittest.skipIf(_TORCH < (2, 13), "needs torch >= 2.13: gloo's reduce_scatter with AVG returns "
                                   f"the sum in torch {torch.__version__}")
class FullyShardParity(FSDPTest):
    timeout = 120

    def test_training_matches_replicated(self):
        self.run_subtests({"reshard_after_forward": [True, False]}, self._train_and_compare)

    def _train_and_compare(self, reshard_after_forward):
        torch.manual_seed(0)
        model = MLPStack(8)
        replicated = copy.deepcopy(model)
        for layer in model:
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_optim = torch.optim.SGD(replicated.parameters(), lr=0.1)
        torch.manual_seed(1 + self.rank)  # each rank its own batches
        for _ in range(3):
            x = torch.randn(4, 8)
            model(x).sum().backward()
            replicated(x).sum().backward()
            for p in replicated.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            check_sharded_parity(self, replicated, model)
            for opt in (optim, ref_optim):
                opt.step()
                opt.zero_grad()
        check_sharded_parity(self, replicated, model)


if __name__ == "__main__":
    unittest.main()
