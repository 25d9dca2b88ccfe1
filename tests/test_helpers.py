"""Misc helpers: output capture, env switches, DDP error check, subtests,
tensor builders, devices."""

from __future__ import annotations

import functools
import operator
import os
import subprocess
import sys
import unittest
from unittest import mock

import torch

import disttest
from disttest.support import devices


class HelpersTest(disttest.TestCase):
    def test_captured_output(self):
        with disttest.captured_output() as (out, err):
            print("to out")
            print("to err", file=sys.stderr)
        self.assertEqual((out.getvalue(), err.getvalue()), ("to out\n", "to err\n"))

    def test_nccl_blocking_wait_restores_unset_variables(self):
        seen = {}

        @disttest.with_nccl_blocking_wait
        def body():
            seen["blocking"] = os.environ.get("TORCH_NCCL_BLOCKING_WAIT")
            seen["async"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")

        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NCCL")}
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"
        with mock.patch.dict(os.environ, env, clear=True):
            body()
            self.assertEqual(seen, {"blocking": "1", "async": None})
            self.assertNotIn("TORCH_NCCL_BLOCKING_WAIT", os.environ)
            self.assertEqual(os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3")

    def test_dist_debug_levels_runs_each_and_restores(self):
        seen = []

        @disttest.with_dist_debug_levels(levels=["OFF", "INFO", "DETAIL"])
        def body():
            seen.append(os.environ["TORCH_DISTRIBUTED_DEBUG"])
            if len(seen) == 2:
                raise ValueError("second level fails")

        with mock.patch.dict(os.environ, {"TORCH_DISTRIBUTED_DEBUG": "OFF"}):
            with self.assertRaises(ValueError):
                body()
            self.assertEqual(seen, ["OFF", "INFO"])
            self.assertEqual(os.environ["TORCH_DISTRIBUTED_DEBUG"], "OFF")

    def test_verify_ddp_error_logged(self):
        class FakeDDP:
            def _get_ddp_logging_data(self):
                return {"iteration": 1, "has_error": 1, "error": "bad thing happened"}

        disttest.verify_ddp_error_logged(FakeDDP(), "bad thing\nException raised from x")
        with self.assertRaisesRegex(AssertionError, "did not find 'other'"):
            disttest.verify_ddp_error_logged(FakeDDP(), "other")

    def test_run_subtests_covers_the_product(self):
        calls = []
        disttest.run_subtests(self, {"a": [1, 2], "b": ["x", "y"]}, lambda a, b: calls.append((a, b)))
        self.assertEqual(calls, [(1, "x"), (1, "y"), (2, "x"), (2, "y")])

    def test_run_subtests_reports_failing_combination(self):
        class Case(disttest.TestCase):
            def test_sub(self):
                def check(n):
                    self.assertEqual(n % 2, 0)

                disttest.run_subtests(self, {"n": [0, 1, 2]}, check)

        result = unittest.TestResult()
        Case("test_sub").run(result)
        self.assertEqual(len(result.failures), 1)
        self.assertIn("n=1", str(result.failures[0][0]))

    def test_tensor_builders(self):
        t = disttest.build_tensor(3)
        self.assertEqual(t, torch.full((3, 3, 3), 3.0))
        self.assertEqual(disttest._build_tensor(2, 5, torch.int64), torch.full((2, 2, 2), 5))
        self.assertEqual(disttest._build_multidim_tensor(4, 2).shape, torch.Size([2, 2, 2, 2]))
        self.assertEqual(disttest.build_multidim_tensor(2, 3, value=1.5), torch.full((3, 3), 1.5))

    def test_sparse_reduce_cases_sum_over_ranks(self):
        world = 3
        per_rank = [disttest.simple_sparse_reduce_tests(r, world) for r in range(world)]
        self.assertEqual(len(per_rank[0]), 6)
        for case in range(6):
            total = functools.reduce(operator.add, [per_rank[r][case][0][0] for r in range(world)])
            self.assertEqual(total.to_dense(), per_rank[0][case][1][0].to_dense())

    def test_multigpu_helper_and_transports(self):
        with mock.patch("disttest.support.devices.accelerator_count", return_value=4):
            self.assertEqual(disttest.init_multigpu_helper(2, "nccl"), {0: [0], 1: [1]})
        with mock.patch("disttest.support.devices.accelerator_count", return_value=8):
            self.assertEqual(disttest.init_multigpu_helper(4, "nccl")[3], [3])
        self.assertIn(disttest.tp_transports(), (None, ["shm", "uv"]))
        self.assertIsNotNone(disttest.create_device())

    def test_efa_probe_result_is_none_until_has_efa_asks(self):
        # Upstream's EFA_PROBE_RESULT (torch 2.7 to 2.9): has_efa's cached answer.
        devices.has_efa.cache_clear()
        self.addCleanup(devices.has_efa.cache_clear)
        self.assertIsNone(disttest.EFA_PROBE_RESULT)
        answers = mock.Mock(return_value=subprocess.CompletedProcess(["fi_info"], 0))
        with mock.patch.object(devices.shutil, "which", return_value="/usr/bin/fi_info"), \
                mock.patch.object(devices.subprocess, "run", answers):
            self.assertIs(disttest.has_efa(), True)
            self.assertIs(disttest.EFA_PROBE_RESULT, True)
            self.assertIs(devices.EFA_PROBE_RESULT, True)
        self.assertEqual(answers.call_count, 1)  # asked once, as upstream's global
        with self.assertRaises(AttributeError):
            devices.NO_SUCH_NAME  # noqa: B018
