"""Example: a hand-written ring all-reduce (send/recv), tested on threads.

Each rank is a thread with its own default group of the in-process
"threaded" backend. The custom collective is checked against
dist.all_reduce for several world sizes.
Run: python -m unittest -v examples/test_ring_allreduce_threads.py
"""

import unittest

import torch
import torch.distributed as dist

import disttest


def ring_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over all ranks with 2(n-1) send/recv steps."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(t.clone().chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):  # reduce-scatter
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        ops = [dist.P2POp(dist.isend, chunks[send_i], right), dist.P2POp(dist.irecv, incoming, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        chunks[recv_i] += incoming
    for step in range(n - 1):  # all-gather
        send_i, recv_i = (rank - step + 1) % n, (rank - step) % n
        incoming = torch.empty_like(chunks[recv_i])
        ops = [dist.P2POp(dist.isend, chunks[send_i], right), dist.P2POp(dist.irecv, incoming, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        chunks[recv_i] = incoming
    return torch.cat(chunks)


class RingAllReduce(disttest.MultiThreadedTestCase):
    timeout = 30

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_matches_all_reduce(self):
        x = torch.arange(12, dtype=torch.float64) * (self.rank + 1)
        expected = x.clone()
        dist.all_reduce(expected)
        self.assertEqual(ring_all_reduce(x), expected)


class ThreeRanks(RingAllReduce):
    @property
    def world_size(self):
        return 3


if __name__ == "__main__":
    unittest.main()
