"""Skips and device choice on a GPU host behave as upstream's:
``skip_if_lt_x_gpu``, ``requires_nccl``, ``skip_if_no_gpu``, the DTensor and
FSDP bases' ``device_type``. Run by ``make gpu-check``; skipped where CUDA is
absent."""

from __future__ import annotations

import time
import unittest

import gpu_cases
import pytest
import torch

import disttest

pytestmark = pytest.mark.gpu


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class DecoratorsTest(unittest.TestCase):
    def test_skip_if_lt_x_gpu(self):
        n = torch.cuda.device_count()

        class Case(unittest.TestCase):
            @disttest.skip_if_lt_x_gpu(n)
            def test_enough(self):
                pass

            @disttest.skip_if_lt_x_gpu(n + 1)
            def test_too_few(self):
                raise AssertionError("ran with too few GPUs")

        self.assertEqual(run(Case("test_enough")).skipped, [])
        result = run(Case("test_too_few"))
        self.assertEqual(result.failures + result.errors, [])
        self.assertEqual([reason for _, reason in result.skipped], [f"Need at least {n + 1} CUDA devices"])

    def test_requires_nccl_and_skip_if_no_gpu_run(self):
        class Case(unittest.TestCase):
            ran: list[str] = []
            world_size = 1  # skip_if_no_gpu compares it with the GPUs (upstream reads WORLD_SIZE)

            @disttest.requires_nccl()
            def test_nccl(self):
                self.ran.append("nccl")

            @disttest.skip_if_no_gpu
            def test_gpu(self):
                self.ran.append("gpu")

        for name in ("test_nccl", "test_gpu"):
            result = run(Case(name))
            self.assertEqual(result.skipped + result.failures + result.errors, [], name)
        self.assertEqual(Case.ran, ["nccl", "gpu"])

    def test_too_few_gpus_skips_before_any_rank_starts(self):
        start = time.monotonic()
        result = run(gpu_cases.TooFewGpus("test_needs_more"))
        self.assertEqual(len(result.skipped), 1, result.errors)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(gpu_cases.live_ranks(), [])


class DeviceTypeTest(unittest.TestCase):
    def test_dtensor_and_fsdp_bases_choose_cuda(self):
        from disttest.bases import dtensor, fsdp

        self.assertEqual(dtensor.DEVICE_TYPE, "cuda")
        self.assertEqual(fsdp.DEVICE_TYPE, "cuda")
        self.assertEqual(dtensor.PG_BACKEND, "nccl")

        class Fits(dtensor.DTensorTestBase):
            world_size = 1

        class TooBig(dtensor.DTensorTestBase):
            world_size = torch.cuda.device_count() + 1

        self.assertEqual(Fits().device_type, "cuda")
        self.assertEqual(TooBig().device_type, "cpu")  # as upstream: not every rank has a GPU

    def test_pool_and_process_bases(self):
        self.assertEqual(disttest.MultiProcContinousTest.device_type(), "cuda")
        self.assertEqual(disttest.DistributedTestBase.backend(None, "cuda"), "nccl")  # type: ignore[arg-type]
