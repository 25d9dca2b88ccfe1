"""Example: a tensor-parallel MLP checked against the plain MLP, on CPU.

DTensorTestBase starts 4 fresh rank processes per test (gloo on CPU);
@with_comms makes the process group in each rank before the test and
destroys it after. The first linear is split by columns, the second by rows
(Megatron style): forward outputs and gradients must match the unsharded
model's. A failing rank is reported by disttest with its traceback.
Run: python -m unittest -v examples/test_tensor_parallel_mlp.py
"""

import copy
import unittest

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from disttest.bases.dtensor import DTensorTestBase, with_comms


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class TensorParallelMLP(DTensorTestBase):
    timeout = 120

    @with_comms
    def test_forward_and_backward_match(self):
        torch.manual_seed(0)  # the same weights in every rank
        model = MLP()
        reference = copy.deepcopy(model)
        mesh = self.build_device_mesh()
        parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        self.assertIsInstance(model.up.weight, DTensor)
        self.assertEqual(model.up.weight.to_local().shape, (32 // self.world_size, 8))

        x = torch.randn(5, 8)  # the same input in every rank (same seed)
        out = model(x)
        expected = reference(x)
        self.assertEqual(out, expected, atol=1e-5, rtol=1e-5)

        out.sum().backward()
        expected.sum().backward()
        self.assertEqual(model.up.weight.grad.full_tensor(), reference.up.weight.grad, atol=1e-5, rtol=1e-5)
        self.assertEqual(model.down.weight.grad.full_tensor(), reference.down.weight.grad,
                         atol=1e-5, rtol=1e-5)

    @with_comms(backend="gloo")
    def test_each_rank_holds_one_column_block(self):
        torch.manual_seed(0)
        model = MLP()
        full = model.up.weight.detach().clone()
        parallelize_module(model, self.build_device_mesh(), {"up": ColwiseParallel()})
        rows = 32 // self.world_size
        self.assertEqual(model.up.weight.to_local(), full[self.rank * rows:(self.rank + 1) * rows])


if __name__ == "__main__":
    unittest.main()
