"""A CUDA build of torch on a host without GPUs (the usual CI runner): torch
reports NCCL available, but no GPU is visible. Every NCCL path skips, saying
why, instead of failing with "ProcessGroupNCCL is only supported with GPUs".
Faked with mock (``dist.is_nccl_available`` true, ``torch.cuda.device_count``
0) so the tests run on any build; the real CUDA builds of the version matrix
(``make test-torch``) run the same paths unmocked.
"""

from __future__ import annotations

import contextlib
import os
import unittest
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist

import disttest
from disttest.bases.backend import backend_available
from disttest.support.skips import (
    NCCL_NO_GPU,
    NCCL_NOT_BUILT,
    backend_skip_reason,
    nccl_skip_reason,
)


@contextlib.contextmanager
def cuda_build_without_gpus() -> Iterator[None]:
    with mock.patch.object(dist, "is_nccl_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=0):
        yield


@contextlib.contextmanager
def cpu_only_build() -> Iterator[None]:
    with mock.patch.object(dist, "is_nccl_available", return_value=False), \
            mock.patch.object(torch.cuda, "device_count", return_value=0):
        yield


def skip_reasons(cls: type, name: str = "test_body") -> list[str]:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result) if name == "*" else cls(name).run(result)
    assert not result.errors and not result.failures, result.errors + result.failures
    return [reason for _, reason in result.skipped]


def plain_case(decorator) -> type:
    class Case(unittest.TestCase):
        @decorator
        def test_body(self):
            raise AssertionError("must skip")

    return Case


class NcclReasonTest(unittest.TestCase):
    def test_each_build(self):
        with cuda_build_without_gpus():
            self.assertEqual(nccl_skip_reason(), NCCL_NO_GPU)
            self.assertEqual(backend_skip_reason("nccl"), f"Backend 'nccl' is not available: {NCCL_NO_GPU}")
            self.assertIsNone(backend_skip_reason("gloo"))
        with cpu_only_build():
            self.assertEqual(nccl_skip_reason(), NCCL_NOT_BUILT)
        with mock.patch.object(dist, "is_nccl_available", return_value=True), \
                mock.patch.object(torch.cuda, "device_count", return_value=2):
            self.assertIsNone(nccl_skip_reason())
            self.assertIsNone(backend_skip_reason("nccl"))

    def test_unknown_backend(self):
        self.assertEqual(backend_skip_reason("nosuch"), "Backend 'nosuch' is not available (disttest)")


class DecoratorsTest(unittest.TestCase):
    def test_requires_nccl_skips_without_a_gpu(self):
        with cuda_build_without_gpus():
            case = plain_case(disttest.requires_nccl())
        self.assertEqual(skip_reasons(case), [NCCL_NO_GPU])

    def test_requires_nccl_version_skips_without_a_gpu(self):
        with cuda_build_without_gpus():
            case = plain_case(disttest.requires_nccl_version((2, 0), "x"))
        self.assertEqual(skip_reasons(case), [NCCL_NO_GPU])

    def test_requires_accelerator_dist_backend_skips_without_a_gpu(self):
        with cuda_build_without_gpus():
            case = plain_case(disttest.requires_accelerator_dist_backend(["nccl"]))
        self.assertEqual(skip_reasons(case), ["No accelerator communication backend available among ['nccl']"])

    def test_backend_suite_sees_nccl_unavailable(self):
        with cuda_build_without_gpus():
            self.assertFalse(backend_available("nccl"))
        with mock.patch.object(dist, "is_nccl_available", return_value=True), \
                mock.patch.object(torch.cuda, "device_count", return_value=1):
            self.assertTrue(backend_available("nccl"))


class PooledNccl(disttest.MultiProcContinousTest):
    __test__ = False  # run below, under the faked build

    @classmethod
    def backend_str(cls):
        return "nccl"

    def test_never_runs(self):
        raise AssertionError("the class must skip")


class ForkedNccl(disttest.DistributedTestBase):
    __test__ = False  # run below, under the faked build
    start_method = "fork"  # the ranks inherit the faked build
    timeout = 30

    @property
    def world_size(self):
        return 2

    def test_create_pg_on_cuda(self):
        self.create_pg("cuda")
        raise AssertionError("must skip")


class RunnersTest(unittest.TestCase):
    def test_pooled_class_with_nccl_skips_before_starting_ranks(self):
        with cuda_build_without_gpus(), mock.patch("disttest.runners.continuous.Pool") as pool:
            reasons = skip_reasons(PooledNccl, "*")
        pool.assert_not_called()
        self.assertEqual(reasons, [f"Backend 'nccl' is not available: {NCCL_NO_GPU}"])

    def test_process_runner_nccl_group_skips_in_the_ranks(self):
        with cuda_build_without_gpus(), mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "fork"}):
            reasons = skip_reasons(ForkedNccl, "test_create_pg_on_cuda")
        self.assertEqual(reasons, [f"Backend 'nccl' is not available: {NCCL_NO_GPU}"])


if __name__ == "__main__":
    unittest.main()
