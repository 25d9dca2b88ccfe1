"""RPC helpers: dist_init, the agent fixtures, the bounded wait helpers."""

from __future__ import annotations

import contextlib
import os
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import rpc_cases as cases
from runner_cases import live_ranks

import disttest
from disttest import WaitTimeout


@contextlib.contextmanager
def an_agent(*, timeout: float, **rpc_sync):
    """RPC as if an agent ran with ``timeout`` as its RPC timeout; ``rpc_sync``: how its calls behave (mock's)."""
    with mock.patch("torch.distributed.rpc.rpc_sync", **rpc_sync), \
            mock.patch("torch.distributed.rpc.get_rpc_timeout", return_value=timeout), \
            mock.patch("disttest._compat.rpc_agent_running", return_value=True):
        yield


def run(cls, name):
    result = unittest.TestResult()
    cls(name).run(result)
    return result


class RpcBetweenWorkersTest(unittest.TestCase):
    def tearDown(self):
        deadline = time.monotonic() + 5
        while live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(live_ranks(), [])

    def check(self, cls, name):
        result = run(cls, name)
        self.assertTrue(result.wasSuccessful(), (result.errors + result.failures)[:1])

    def test_rpc_sync_async_and_remote(self):
        self.check(cases.Rpc, "test_sync_async_remote")

    def test_rref_wait_helpers(self):
        self.check(cases.Rpc, "test_rref_wait_helpers")

    def test_dist_init_without_rpc(self):
        self.check(cases.Rpc, "test_without_rpc")

    def test_killed_worker_detected(self):
        self.check(cases.Rpc, "test_killed_worker_is_detected")

    def test_a_rank_that_skips_shuts_down_with_its_peers(self):
        # (it shut RPC down as after a failure, and its peer's graceful
        # shutdown waited for it until the test's limit)
        for name, reason in (("test_one_rank_skips", "rank 1 has nothing to check"),
                             ("test_one_rank_exits_with_a_skip_code", disttest.TEST_SKIPS["multi-gpu-2"].message)):
            with self.subTest(name):
                start = time.monotonic()
                result = run(cases.RpcSkip, name)
                self.assertEqual([r for _, r in result.skipped], [reason])
                self.assertEqual(result.errors + result.failures, [])
                self.assertLess(time.monotonic() - start, 15)

    def test_a_test_that_shut_rpc_down_keeps_its_own_verdict(self):
        # dist_init shut RPC down again after it: torch's "RPC has not been
        # initialized" was every rank's error, hiding the failure or skip.
        result = run(cases.RpcShutByTest, "test_shuts_down_then_fails")
        self.assertEqual(len(result.failures), 1, result.errors)
        self.assertIn("the real assertion", result.failures[0][1])
        self.assertNotIn("has not been initialized", result.failures[0][1])
        result = run(cases.RpcShutByTest, "test_shuts_down_then_skips")
        self.assertEqual([r for _, r in result.skipped], ["the real skip"])
        self.assertEqual(result.errors + result.failures, [])

    def test_a_rank_waiting_in_the_shutdown_for_a_hung_peer_is_its_consequence(self):
        # Both ranks "timed out", the waiting one's stack (in rpc's
        # _all_gather) first, as if it had hung.
        result = run(cases.RpcHang, "test_one_rank_hangs")
        text = result.errors[0][1]
        self.assertIn("errored (disttest): rank 1/2 timed out after 4s\n", text)
        self.assertIn("rank 0/2 waits in rpc.shutdown #1 of group rpc for rank 1/2, which never entered it: that "
                      "rank hung (a consequence)", text)
        # (torch's own TensorPipe set-up warns in every rank: it was in every report's output)
        self.assertNotIn("as a ProcessGroup", text)

    def test_delayed_message_type_times_out(self):
        self.check(cases.Faulty, "test_delayed_message_type_times_out")

    def test_fault_injection_setup(self):
        self.check(cases.Faulty, "test_no_faults_when_none_asked")


class HelpersTest(unittest.TestCase):
    def test_names_and_templates(self):
        self.assertEqual(disttest.worker_name(3), "worker3")
        self.assertEqual(disttest.INIT_METHOD_TEMPLATE.format(file_name="/x"), "file:///x")
        self.assertIsNone(disttest.noop())

    def test_bad_fault_arguments_are_named_before_any_rank_starts(self):
        # A string went in letter by letter: every rank raised "No mapping to
        # rpc::MessageType exists for R".
        bad = {
            "faulty_messages": ("RREF_FORK_REQUEST", ["RREF_FORK_REQUEST", 3], {"PYTHON_CALL": 1}),
            "messages_to_delay": ({"PYTHON_CALL": "x"}, {"PYTHON_CALL": -1}, {"PYTHON_CALL": True},
                                  [("PYTHON_CALL", 1)]),
        }
        for arg, values in bad.items():
            for value in values:
                with self.subTest(**{arg: value}), self.assertRaises(disttest.ConfigError) as ctx:
                    disttest.dist_init(**{arg: value})(lambda self: None)
                self.assertIn(f"{value!r} from dist_init({arg}=...)", str(ctx.exception))
        # What upstream's suites pass is taken.
        disttest.dist_init(faulty_messages=["RREF_FORK_REQUEST"], messages_to_delay={"PYTHON_CALL": 1.5})(
            lambda self: None)
        disttest.dist_init(faulty_messages=[], messages_to_delay={})(lambda self: None)

    def test_fixture_init_method(self):
        fixture = disttest.TensorPipeRpcAgentTestFixture()
        fixture.file_name = "/tmp/rdvz"
        self.assertEqual(fixture.init_method, "file:///tmp/rdvz")
        env = {"RPC_INIT_WITH_TCP": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
        with mock.patch.dict("os.environ", env):
            self.assertEqual(fixture.init_method, "tcp://127.0.0.1:1234")
        with mock.patch.dict("os.environ", {"RPC_INIT_WITH_TCP": "1", "MASTER_PORT": "1234"}), \
                self.assertRaisesRegex(disttest.ConfigError, "MASTER_ADDR.*RPC_INIT_WITH_TCP=1"):
            os.environ.pop("MASTER_ADDR", None)
            fixture.init_method  # noqa: B018 (the property raises)
        self.assertEqual(fixture.get_timeout_error_regex(), "RPC ran for more than")

    def test_fixture_without_an_agent_names_the_missing_hook(self):
        from disttest.bases.rpc import MISSING_HOOK, RpcAgentTestFixture

        fixture = RpcAgentTestFixture()
        hooks = {
            "rpc_backend": lambda: fixture.rpc_backend,
            "rpc_backend_options": lambda: fixture.rpc_backend_options,
            "get_shutdown_error_regex": fixture.get_shutdown_error_regex,
            "get_timeout_error_regex": fixture.get_timeout_error_regex,
        }
        for hook, read in hooks.items():
            with self.subTest(hook=hook), self.assertRaises(NotImplementedError) as ctx:
                read()
            self.assertEqual(str(ctx.exception), MISSING_HOOK.format(fixture="RpcAgentTestFixture", hook=hook))

    def test_node_failure_wait_is_bounded(self):
        with an_agent(return_value=None, timeout=60.0):
            start = time.monotonic()
            with self.assertRaises(WaitTimeout) as ctx:
                disttest.wait_until_node_failure(1, timeout=0.5)
        self.assertLess(time.monotonic() - start, 3)
        self.assertIn("an RPC to worker1 to fail", str(ctx.exception))
        self.assertIsInstance(ctx.exception, ValueError)  # upstream raised ValueError

    def test_a_slow_peer_is_no_failure_of_the_node(self):
        # Each call had a 5 s timeout: a peer that answered in 6 s "failed"
        # ("RPC ran for more than set timeout"), and the default pattern
        # matched it. Calls now have the agent's timeout, as upstream's.
        timeouts = []

        def slow_peer(to, func, args=(), timeout=-1.0):
            timeouts.append(timeout)
            if 0 < timeout < 6:  # the peer answers in 6 s
                raise RuntimeError(f"RPC ran for more than set timeout ({timeout * 1000:.0f} ms)")
            if len(timeouts) == 3:
                raise RuntimeError("Connection reset by peer")

        with an_agent(side_effect=slow_peer, timeout=10.0):
            self.assertEqual(disttest.wait_until_node_failure(1, timeout=30), "Connection reset by peer")
        self.assertEqual(timeouts, [-1.0] * 3)

    def test_a_call_that_runs_out_of_the_limit_is_no_failure_of_the_node(self):
        def hangs(to, func, args=(), timeout=-1.0):
            time.sleep(timeout)
            raise RuntimeError(f"RPC ran for more than set timeout ({timeout * 1000:.0f} ms)")

        with an_agent(side_effect=hangs, timeout=60.0):
            start = time.monotonic()
            with self.assertRaises(WaitTimeout) as ctx:
                disttest.wait_until_node_failure(1, timeout=0.3)
        self.assertLess(time.monotonic() - start, 2)
        self.assertIn("ran past what was left of the limit", str(ctx.exception))

    def test_without_rpc_the_error_is_rpc_sync_s_as_upstream_s(self):
        from torch.testing._internal import dist_utils

        ours = disttest.wait_until_node_failure(1, timeout=5)
        self.assertEqual(ours, dist_utils.wait_until_node_failure(1))
        self.assertIn("RPC has not been initialized", ours)

    def test_node_failure_returns_the_matching_error(self):
        errors = [RuntimeError("other"), RuntimeError("Connection reset by peer")]
        with an_agent(side_effect=errors, timeout=60.0):
            self.assertEqual(disttest.wait_until_node_failure(2, "reset", timeout=5), "Connection reset by peer")

    def test_flush_wait_is_bounded_and_says_what_it_saw(self):
        info = {"num_pending_futures": "2", "num_pending_users": "1"}
        with mock.patch("disttest._compat.rref_debug_info", return_value=info):
            with self.assertRaisesRegex(WaitTimeout, "2 pending futures, 1 pending users"):
                disttest.wait_until_pending_futures_and_users_flushed(timeout=0.3)

    def test_get_function_event(self):
        events = [SimpleNamespace(name="aten::add"), SimpleNamespace(name="rpc_sync#worker1")]
        self.assertIs(disttest.get_function_event(events, "rpc_sync"), events[1])
        with self.assertRaisesRegex(IndexError, "no profiler event contains 'missing'"):  # upstream's type
            disttest.get_function_event(events, "missing")
