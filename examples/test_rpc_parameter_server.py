"""Example: a parameter server over torch.distributed.rpc.

Rank 0 holds the parameters and drives a training step on each worker; a
worker computes its gradient and pushes it back to the server with rpc_sync.
RpcTestCase starts the ranks, @dist_init starts and stops RPC in each.
Run: python -m unittest -v examples/test_rpc_parameter_server.py
"""

import threading
import unittest

import torch
import torch.distributed.rpc as rpc

import disttest
from disttest import dist_init, worker_name

_lock = threading.Lock()
_params = {"w": torch.zeros(4)}


def push_gradient(grad: torch.Tensor, lr: float) -> None:
    with _lock:
        _params["w"] -= lr * grad


def pull() -> torch.Tensor:
    with _lock:
        return _params["w"].clone()


def train_step(rank: int) -> None:
    """Runs on a worker: a fake gradient, pushed to the server (rank 0)."""
    rpc.rpc_sync(worker_name(0), push_gradient, args=(torch.ones(4) * rank, 0.5))


class ParameterServer(disttest.RpcTestCase):
    timeout = 120

    @property
    def world_size(self):
        return 3

    @dist_init
    def test_workers_update_the_server(self):
        if self.rank == 0:
            for worker in (1, 2):
                rpc.rpc_sync(worker_name(worker), train_step, args=(worker,))
            # Workers 1 and 2 pushed 1s and 2s at lr 0.5: w = -(0.5 + 1.0).
            self.assertEqual(pull(), torch.full((4,), -1.5))


if __name__ == "__main__":
    unittest.main()
