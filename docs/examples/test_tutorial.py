"""The tutorial's suite: one function under test, checked with ranks as
threads, as fresh processes, and in a pool (docs/tutorial.rst shows it in
parts; tests/test_docs.py runs it).

Run: python -m unittest -v test_tutorial.py
"""

import unittest

import torch
import torch.distributed as dist

import disttest


def average_gradients(model: torch.nn.Module) -> None:
    """Average every gradient of ``model`` over the default group."""
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world


def one_step(rank: int) -> torch.nn.Linear:
    """A backward pass on this rank's own batch, then the averaging."""
    model = torch.nn.Linear(4, 2)
    batch = torch.full((3, 4), float(rank))  # 3 rows, all equal to the rank
    model(batch).sum().backward()  # weight.grad: 3 * rank everywhere
    average_gradients(model)
    return model


def expected_weight_grad(world_size: int) -> torch.Tensor:
    mean_rank = sum(range(world_size)) / world_size
    return torch.full((2, 4), 3 * mean_rank)


class AverageOnThreads(disttest.MultiThreadedTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_threads()  # 4 rank threads, each with its default group

    def test_gradients_are_the_mean(self):  # runs in every rank thread
        model = one_step(self.rank)
        self.assertEqual(model.weight.grad, expected_weight_grad(self.world_size))
        self.assertEqual(model.bias.grad, torch.full((2,), 3.0))


class AverageOnProcesses(disttest.MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()  # 2 fresh rank processes for each test

    def test_gradients_are_the_mean(self):  # runs in every rank process
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        model = one_step(self.rank)
        self.assertEqual(model.weight.grad, expected_weight_grad(self.world_size))


class AverageInAPool(disttest.MultiProcContinousTest):
    world_size = 3  # the class's pool: 3 processes and one group, made once

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_gradients_are_the_mean(self):
        model = one_step(self.rank)
        self.assertEqual(model.weight.grad, expected_weight_grad(self.world_size))

    def test_a_model_without_gradients_is_left_alone(self):
        model = torch.nn.Linear(4, 2)
        average_gradients(model)  # no collective is called
        self.assertIsNone(model.weight.grad)


if __name__ == "__main__":
    unittest.main()
