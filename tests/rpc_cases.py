"""RPC test classes for tests/test_rpc.py (importable by the fork server)."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed.rpc as rpc

import disttest
from disttest import dist_init, worker_name


def add(a, b):
    return a + b


def slow_add(a, b):
    time.sleep(0.2)
    return a + b


class Rpc(disttest.RpcTestCase):
    timeout = 120

    @property
    def world_size(self):
        return 2

    @dist_init
    def test_sync_async_remote(self):
        peer = worker_name((self.rank + 1) % self.world_size)
        self.assertEqual(rpc.rpc_sync(peer, add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))
        self.assertEqual(rpc.rpc_async(peer, add, args=(3, 4)).wait(), 7)
        rref = rpc.remote(peer, add, args=(torch.ones(1), 2))
        self.assertEqual(rref.to_here(), torch.tensor([3.0]))

    @dist_init
    def test_rref_wait_helpers(self):
        if self.rank == 0:
            rref = rpc.remote(worker_name(1), add, args=(torch.ones(1), 1))
            rref.to_here()
            disttest.wait_until_pending_futures_and_users_flushed(timeout=30)
            # Rank 1 owns the value, and counts rank 0's reference as a fork.
            disttest.wait_until_owners_and_forks_on_rank(1, 1, rank=1, timeout=30)
            owners, forks = disttest.get_num_owners_and_forks()
            self.assertEqual((int(owners), int(forks)), (0, 0))  # rank 0 owns nothing
            del rref
            disttest.wait_until_owners_and_forks_on_rank(0, 0, rank=1, timeout=30)
        rpc.api._wait_all_workers()

    @dist_init(setup_rpc=False)
    def test_without_rpc(self):
        self.assertFalse(rpc.api._is_current_rpc_agent_set())

    @dist_init(clean_shutdown=False)
    def test_killed_worker_is_detected(self):
        if self.rank == 1:
            os._exit(0)  # dies without shutting RPC down
        message = disttest.wait_until_node_failure(1, timeout=60)
        self.assertRegex(message, self.get_shutdown_error_regex())

    def setUp(self):
        super().setUp()
        if self._testMethodName == "test_killed_worker_is_detected":
            # Rank 1 dies on purpose: its exit is not a failure.
            self.skip_return_code_checks = [getattr(self, self._testMethodName).__wrapped__]


class RpcSkip(disttest.RpcTestCase):
    timeout = 20

    @property
    def world_size(self):
        return 2

    @dist_init
    def test_one_rank_skips(self):
        # Rank 0's graceful shutdown waits for rank 1's.
        if self.rank == 1:
            self.skipTest("rank 1 has nothing to check")
        self.assertEqual(rpc.rpc_sync(worker_name(0), add, args=(1, 2)), 3)

    @dist_init
    def test_one_rank_exits_with_a_skip_code(self):
        if self.rank == 1:
            sys.exit(disttest.TEST_SKIPS["multi-gpu-2"].exit_code)
        self.assertEqual(rpc.rpc_sync(worker_name(0), add, args=(1, 2)), 3)


class RpcShutByTest(disttest.RpcTestCase):
    """Tests that shut RPC down themselves before they fail or skip."""

    timeout = 30

    @property
    def world_size(self):
        return 2

    @dist_init
    def test_shuts_down_then_fails(self):
        rpc.shutdown()
        self.assertEqual(1, 2, "the real assertion")

    @dist_init
    def test_shuts_down_then_skips(self):
        rpc.shutdown()
        self.skipTest("the real skip")


class RpcHang(disttest.RpcTestCase):
    timeout = 4

    @property
    def world_size(self):
        return 2

    @dist_init
    def test_one_rank_hangs(self):
        # Rank 0's graceful shutdown waits for rank 1, which sleeps.
        if self.rank == 1:
            for _ in range(300):
                time.sleep(0.1)


class Faulty(disttest.FaultyRpcTestCase):
    timeout = 120

    @property
    def world_size(self):
        return 2

    @dist_init(messages_to_delay={"PYTHON_CALL": 3.0})
    def test_delayed_message_type_times_out(self):
        if self.rank == 0:
            with self.assertRaisesRegex(RuntimeError, self.get_timeout_error_regex()):
                rpc.rpc_sync(worker_name(1), slow_add, args=(1, 2), timeout=0.5)

    @dist_init(faulty_messages=[])
    def test_no_faults_when_none_asked(self):
        self.assertEqual(self.messages_to_fail, [])
        if self.rank == 0:
            self.assertEqual(rpc.rpc_sync(worker_name(1), add, args=(1, 2)), 3)
