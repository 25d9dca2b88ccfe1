"""Example: disttest.TestCase on an ordinary (single-process) test.

Tensor-aware assertEqual with tolerances, seeded RNGs, and upstream skip
decorators that skip with their message. Run: python -m unittest -v examples/test_tensor_asserts.py
"""

import unittest

import torch

import disttest


class ShardingMath(disttest.TestCase):
    def test_chunks_reassemble(self):
        full = torch.randn(8, 4)
        shards = list(full.chunk(4))
        self.assertEqual(torch.cat(shards), full)
        self.assertEqual([s.shape[0] for s in shards], [2, 2, 2, 2])

    def test_mean_of_shards_within_tolerance(self):
        full = torch.randn(1000, dtype=torch.float64)
        mean = sum(s.sum() for s in full.chunk(4)) / full.numel()
        self.assertEqual(mean, full.mean(), atol=1e-12, rtol=0)

    @disttest.skip_if_lt_x_gpu(2)
    def test_needs_two_gpus(self):
        self.fail("runs only with two accelerators")


if __name__ == "__main__":
    unittest.main()
