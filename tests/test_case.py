"""disttest.TestCase: tensor-aware assertEqual, seeding, exit-code skips."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import unittest
from unittest import mock

import numpy as np
import torch

import disttest
from disttest import TEST_SKIPS

HERE = os.path.dirname(os.path.abspath(__file__))


def run_case(case_cls: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case_cls(name).run(result)
    return result


class AssertEqualTest(disttest.TestCase):
    def assertMismatch(self, a, b, *fragments, **kwargs):
        with self.assertRaises(AssertionError) as ctx:
            self.assertEqual(a, b, **kwargs)
        for fragment in fragments:
            self.assertIn(fragment, str(ctx.exception))
        return str(ctx.exception)

    def test_equal_tensors(self):
        self.assertEqual(torch.arange(4.0), torch.arange(4.0))

    def test_value_mismatch_is_readable(self):
        self.assertMismatch(
            torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]),
            "Mismatched elements: 1 / 2", "Greatest absolute difference: 1.0",
        )

    def test_shape_mismatch(self):
        self.assertMismatch(torch.zeros(2, 3), torch.zeros(3, 2), "shape")

    def test_dtype_checked_by_default_and_relaxable(self):
        self.assertMismatch(torch.zeros(2), torch.zeros(2, dtype=torch.float64), "dtype")
        self.assertEqual(torch.zeros(2), torch.zeros(2, dtype=torch.float64), exact_dtype=False)

    def test_nan_equal_by_default(self):
        self.assertEqual(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))
        self.assertEqual(math.nan, math.nan)
        self.assertMismatch(torch.tensor([math.nan]), torch.tensor([math.nan]), "", equal_nan=False)

    def test_tolerances(self):
        a, b = torch.tensor([1.0]), torch.tensor([1.1])
        self.assertMismatch(a, b, "not close")
        self.assertEqual(a, b, atol=0.2, rtol=0)
        # Only one tolerance given: the other is 0.
        self.assertEqual(a, b, atol=0.2)
        self.assertMismatch(a, b, "not close", rtol=0.01)

    def test_float_scalars_use_tolerance(self):
        self.assertEqual(0.1 + 0.2, 0.3)
        self.assertEqual(3, 3.0)
        self.assertMismatch(1.0, 1.5, "not close")

    def test_tensor_against_scalar_and_list(self):
        self.assertEqual(torch.tensor(3), 3)
        self.assertEqual(torch.tensor([1, 2, 3]), [1, 2, 3])
        self.assertEqual([1.0, 2.0], torch.tensor([1.0, 2.0]))
        self.assertMismatch(torch.tensor([1, 2, 3]), [1, 2, 4], "Mismatched elements: 1 / 3")

    def test_numpy_arrays(self):
        self.assertEqual(np.arange(3), np.arange(3))
        self.assertEqual(torch.arange(3), np.arange(3))
        self.assertMismatch(np.arange(3), np.array([0, 1, 5]), "Mismatched")

    def test_nested_containers_name_the_path(self):
        a = {"w": [torch.zeros(2), (1, "x")], "b": torch.ones(1)}
        self.assertEqual(a, {"w": [torch.zeros(2), (1, "x")], "b": torch.ones(1)})
        msg = self.assertMismatch(
            a, {"w": [torch.ones(2), (1, "x")], "b": torch.ones(1)}, "at ['w'][0]"
        )
        self.assertIn("Mismatched elements", msg)
        self.assertMismatch(a, {"w": [torch.zeros(2), (1, "y")], "b": torch.ones(1)},
                            "at ['w'][1][1]", "'x' != 'y'")

    def test_container_shape_mismatches(self):
        self.assertMismatch([1, 2], [1, 2, 3], "lengths differ: 2 != 3")
        self.assertMismatch({"a": 1}, {"b": 1}, "keys differ", "missing [\"'b'\"]")

    def test_plain_objects_and_types(self):
        self.assertEqual("abc", "abc")
        self.assertEqual(None, None)
        self.assertMismatch("1", 1, "types differ")

    def test_user_message_kept(self):
        self.assertMismatch(torch.zeros(1), torch.ones(1), "on rank 3", msg="on rank 3")

    def test_assert_not_equal(self):
        self.assertNotEqual(torch.zeros(2), torch.ones(2))
        with self.assertRaises(AssertionError):
            self.assertNotEqual(torch.zeros(2), torch.zeros(2))

    def test_assert_greater_almost_equal(self):
        self.assertGreaterAlmostEqual(2.0, 1.0)
        self.assertGreaterAlmostEqual(1.0, 1.0 + 1e-9)
        self.assertGreaterAlmostEqual(0.9, 1.0, delta=0.2)
        with self.assertRaisesRegex(AssertionError, "0.5 is not greater than or equal to 1.0 within 0.2 delta"):
            self.assertGreaterAlmostEqual(0.5, 1.0, delta=0.2)
        with self.assertRaises(TypeError):
            self.assertGreaterAlmostEqual(1, 2, places=1, delta=1)

    def test_assert_expected_inline_available(self):
        self.assertExpectedInline(str(1 + 1), """2""")


class SeedingTest(unittest.TestCase):
    def test_setup_seeds_every_rng(self):
        draws = []

        class Case(disttest.TestCase):
            def test_draw(self):
                draws.append((torch.rand(1).item(), np.random.rand(), random.random()))

        for _ in range(2):
            torch.rand(5), np.random.rand(), random.random()  # disturb the state
            self.assertTrue(run_case(Case, "test_draw").wasSuccessful())
        self.assertEqual(draws[0], draws[1])

    def test_seed_is_a_class_attribute(self):
        draws = []

        class Case(disttest.TestCase):
            def test_draw(self):
                draws.append(torch.rand(1).item())

        class Other(Case):
            seed = 7

        run_case(Case, "test_draw")
        run_case(Other, "test_draw")
        self.assertNotEqual(draws[0], draws[1])


class ChainBreakerTest(unittest.TestCase):
    """A base whose setUp and tearDown call no super()'s (upstream's
    common_utils.TestCase) placed before disttest's: disttest's part of the
    chain still runs, once."""

    @staticmethod
    def breaker(calls: list[str]) -> type:
        def set_up(self):
            calls.append("breaker setUp")

        def tear_down(self):
            calls.append("breaker tearDown")

        cls = type("TestCase", (unittest.TestCase,), {"setUp": set_up, "tearDown": tear_down})
        cls.__module__ = "torch.testing._internal.common_utils"
        return cls

    def test_disttest_setup_and_teardown_run_after_the_breaker(self):
        calls: list[str] = []

        class Mine(disttest.TestCase):
            def setUp(self):
                super().setUp()
                calls.append("disttest setUp")

            def tearDown(self):
                calls.append("disttest tearDown")
                super().tearDown()

            def test_it(self):
                calls.append("test")

        class Device(self.breaker(calls), Mine):  # the order instantiate_device_type_tests makes
            pass

        torch.set_grad_enabled(True)
        result = unittest.TestResult()
        Device("test_it").run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        # From where the breaker stopped, as if it had called super()'s.
        self.assertEqual(calls, ["breaker setUp", "disttest setUp", "test", "breaker tearDown",
                                 "disttest tearDown"])

    def test_no_double_run_when_the_chain_is_whole(self):
        calls: list[str] = []

        class Mine(disttest.TestCase):
            def setUp(self):
                calls.append("setUp")
                super().setUp()

            def test_it(self):
                pass

        class AfterBreaker(Mine, self.breaker(calls)):  # disttest's part first: nothing cut
            pass

        with mock.patch("disttest.runners.case.set_rng_seed") as seed:
            AfterBreaker("test_it").run(unittest.TestResult())
        self.assertEqual(calls, ["setUp", "breaker setUp", "breaker tearDown"])
        self.assertEqual(seed.call_count, 1)

    def test_upstream_device_type_classes_start_their_ranks(self):
        # The real case: instantiate_device_type_tests on a DistributedTestBase
        # (PyTorch's test_c10d_object_collectives: "no ranks were started").
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "device_type_cases"], cwd=HERE,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("test_sum_cpu (device_type_cases.CollectCPU.test_sum_cpu) ... ok", proc.stderr)


class ExitCodeSkipTest(unittest.TestCase):
    def test_sys_exit_with_skip_code_is_a_skip(self):
        class Case(disttest.TestCase):
            def test_exit(self):
                sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

        result = run_case(Case, "test_exit")
        self.assertEqual([reason for _, reason in result.skipped], ["Need at least 2 CUDA devices"])

    def test_sys_exit_with_other_code_is_an_error(self):
        class Case(disttest.TestCase):
            def test_exit(self):
                sys.exit(3)

        result = run_case(Case, "test_exit")
        self.assertEqual(len(result.errors), 1)
        self.assertIn("SystemExit: 3", result.errors[0][1])
