"""A rank stuck on the GPU is ended within the test's limit and reported
with its stack, and leaves no process and no GPU memory behind: a rank in a
CUDA spin kernel, a rank making an NCCL group whose peer died (one GPU), and
a rank in an NCCL collective whose peer died (two GPUs). Run by
``make gpu-check``; skipped where CUDA is absent."""

from __future__ import annotations

import os
import tempfile
import time
import unittest
from unittest import mock

import gpu_cases
import pytest

pytestmark = pytest.mark.gpu


class GpuHangsTest(unittest.TestCase):
    def run_case(self, case: unittest.TestCase) -> tuple[unittest.TestResult, float, set[int]]:
        """Run ``case``; its result, how long it took, and its ranks' pids."""
        result = unittest.TestResult()
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {gpu_cases.PIDS_ENV: tmp}):
            start = time.monotonic()
            case.run(result)
            elapsed = time.monotonic() - start
            pids = {int(open(os.path.join(tmp, f)).read()) for f in os.listdir(tmp)}
        return result, elapsed, pids

    def assertNothingLeft(self, pids: set[int]) -> None:
        deadline = time.monotonic() + 20  # the driver frees a killed context's memory
        while (gpu_cases.live_ranks() or pids & gpu_cases.gpu_pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(gpu_cases.live_ranks(), [], "a rank outlived its test")
        self.assertEqual(pids & gpu_cases.gpu_pids(), set(), "a rank's process still holds GPU memory")

    def test_a_rank_in_a_spin_kernel(self):
        result, elapsed, pids = self.run_case(gpu_cases.SpinKernel("test_spin"))
        self.assertEqual(len(result.errors), 1, result.failures)
        text = result.errors[0][1]
        self.assertIn("rank 1/2 did not finish 'test_spin' within 10s", text)
        self.assertIn("in synchronize", text)  # its stack, taken while it waited on the GPU
        self.assertIn("in barrier", text)  # rank 0's
        self.assertLess(elapsed, 10 + 15)
        self.assertEqual(len(pids), 2)
        self.assertNothingLeft(pids)

    def test_a_rank_in_an_nccl_collective_whose_peer_died(self):
        result, elapsed, pids = self.run_case(gpu_cases.NcclPeerDies("test_peer_dies"))
        if result.skipped:
            self.skipTest(result.skipped[0][1])  # one GPU: "Need at least 2 CUDA devices"
        self.assertEqual(len(result.errors), 1, result.failures)
        text = result.errors[0][1]
        self.assertIn("rank 1/2 exited with code 7", text)
        self.assertIn("in synchronize", text)  # rank 0, stopped while it waited for the dead peer
        self.assertLess(elapsed, 30)  # fail-fast, not the 60 s limit
        self.assertNothingLeft(pids)

    def test_a_rank_making_an_nccl_group_whose_peer_died(self):
        result, elapsed, pids = self.run_case(gpu_cases.NcclPeerDiesBeforeInit("test_peer_dies"))
        self.assertEqual(len(result.errors), 1, result.failures)
        text = result.errors[0][1]
        self.assertIn("rank 1/2 exited with code 7", text)
        self.assertIn("in init_process_group", text)  # rank 0's stack, stopped while it waited for rank 1
        self.assertLess(elapsed, 30)  # fail-fast, not the 60 s limit
        self.assertNothingLeft(pids)
