"""The dynamo test cases run on CPU (gloo) and reset dynamo around tests."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import mp_cases as cases
import torch
import torch.distributed as dist

import disttest


class SingleProc(disttest.DynamoDistributedSingleProcTestCase):
    def test_group_of_one_on_cpu(self):
        self.assertTrue(dist.is_initialized())
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (0, 1))
        self.assertEqual(self.device, "cpu:0")
        self.assertIsNone(self.device_ids)
        self.assertEqual(os.environ["MASTER_ADDR"], "127.0.0.1")

    def test_compile_and_state_is_fresh(self):
        from torch._dynamo.utils import counters

        self.assertEqual(sum(counters["stats"].values()), 0)

        @torch.compile(backend="eager")
        def f(x):
            dist.all_reduce(x)
            return x * 3

        self.assertEqual(f(torch.ones(2)), torch.full((2,), 3.0))
        self.assertGreater(counters["stats"]["calls_captured"], 0)


    def test_dynamo_config_is_upstreams_for_the_test(self):
        # Upstream's base sets nested_graph_breaks for each test: a graph break
        # in a nested call is one more frame without it (3 frames, not 2).
        import torch._dynamo
        from torch._dynamo.testing import CompileCounter

        if not hasattr(torch._dynamo.config, "nested_graph_breaks"):
            self.skipTest("this torch's dynamo has no nested_graph_breaks")
        self.assertTrue(torch._dynamo.config.nested_graph_breaks)

        def inner(x):
            x = x + 1
            torch._dynamo.graph_break()
            return x * 2

        def outer(x):
            return inner(x) - 1

        counter = CompileCounter()
        self.assertEqual(torch.compile(outer, backend=counter)(torch.ones(2)), torch.full((2,), 3.0))
        self.assertEqual(counter.frame_count, 2)


class DynamoConfigPutBackTest(unittest.TestCase):
    def test_after_the_class_dynamo_config_is_as_it_was(self):
        import torch._dynamo

        before = getattr(torch._dynamo.config, "nested_graph_breaks", None)
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromName("test_dynamo_config_is_upstreams_for_the_test",
                                                      SingleProc).run(result)
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual(getattr(torch._dynamo.config, "nested_graph_breaks", None), before)


class MultiProc(unittest.TestCase):
    def test_compiled_collective_in_two_ranks(self):
        result = unittest.TestResult()
        cases.DynamoMulti("test_compiled_allreduce").run(result)
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual(result.testsRun, 1)


class PerRankInit(unittest.TestCase):
    def test_fake_pg_and_cleanup_on_error(self):
        with self.assertRaises(ValueError):
            with disttest._dynamo_dist_per_rank_init(3, 8, fake_pg=True):
                self.assertEqual((dist.get_rank(), dist.get_world_size()), (3, 8))
                raise ValueError("body fails")
        self.assertFalse(dist.is_initialized())

    def test_several_ranks_need_a_port(self):
        env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
        code = ("import disttest\n"
                "with disttest._dynamo_dist_per_rank_init(0, 2): pass\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("environment variable MASTER_PORT", out.stderr)

    def test_import_disttest_does_not_import_dynamo(self):
        code = "import sys, disttest; print('torch._dynamo' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.strip(), "False", out.stderr)
