"""disttest.bases.fsdp: the FSDP bases run their tests (run_subtests included)
under their runners with disttest's reports; parity checks, patches, models."""

from __future__ import annotations

import subprocess
import sys
import unittest
from unittest import mock

import dtensor_cases as cases
import torch

import disttest.bases.fsdp as fsdp
from disttest.support.skips import TEST_SKIPS


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


def ok(test: unittest.TestCase, result: unittest.TestResult) -> None:
    test.assertTrue(result.wasSuccessful() and not result.skipped,
                    result.errors + result.failures + result.skipped)


class ProcessesTest(unittest.TestCase):
    def test_group_per_test_and_run_subtests(self):
        ok(self, run(cases.FsdpProcesses("test_group_and_subtests")))

    def test_fully_shard_parity_on_cpu(self):
        ok(self, run(cases.FsdpProcesses("test_parity")))

    def test_failing_subtest_fails_the_test_with_the_rank(self):
        result = run(cases.FsdpProcesses("test_failing_subtest"))
        self.assertEqual(len(result.failures), 1, result.errors)
        text = result.failures[0][1]
        self.assertIn("'test_failing_subtest' failed (disttest): rank 1/2 raised AssertionError", text)
        self.assertIn("subtest a=2 fails on rank 1", text)

    def test_fake_pg(self):
        ok(self, run(cases.FsdpFake("test_fake_group")))

    def test_too_few_accelerators_skip_in_the_parent(self):
        case = cases.FsdpProcesses("test_group_and_subtests")
        with mock.patch.object(fsdp, "DEVICE_TYPE", "cuda"), \
                mock.patch.object(fsdp, "accelerator_count", return_value=1), \
                mock.patch.object(case, "_start_processes", side_effect=AssertionError("ranks started")):
            result = run(case)
        self.assertEqual([r for _, r in result.skipped], [TEST_SKIPS["multi-gpu-2"].message])


class ThreadsTest(unittest.TestCase):
    def test_run_subtests(self):
        ok(self, run(cases.FsdpThreads("test_subtests")))

    def test_patch_is_shared_and_always_restored(self):
        # The identity checks run in the rank threads (see the case).
        ok(self, run(cases.FsdpThreads("test_patch_all_reduce")))


class PoolTest(unittest.TestCase):
    def test_run_subtests_and_parity_in_the_pool(self):
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(cases.FsdpPool).run(result)
        self.assertEqual(result.testsRun, 2)
        ok(self, result)


class Group:
    def rank(self):
        return 0

    def size(self):
        return 2


class ModelsTest(unittest.TestCase):
    def test_models_build_and_run(self):
        torch.manual_seed(0)
        x = torch.randn(3, 8)
        self.assertEqual(fsdp.MLP(8, with_buffer=True)(x).shape, (3, 8))
        self.assertEqual(fsdp.MLPStack(8)(x).shape, (3, 8))
        self.assertEqual(len(fsdp.MLPStack(8, with_seq_parallel=True)), 4)
        a, b = fsdp.DoubleLinear(8)(x)
        self.assertEqual((a.shape, b.shape), ((3, 8), (3, 8)))
        self.assertEqual(fsdp.DoubleLinear(8, use_second_linear=False)(x).shape, (3, 8))
        nwm = fsdp.NestedWrappedModule.init(Group(), fsdp.FSDPInitMode.NO_FSDP, fsdp.DEVICEInitMode.DEVICE_NEVER)
        self.assertEqual(nwm(*nwm.get_input("cpu")).shape, (4, 8))
        tf = fsdp.TransformerWithSharedParams.init(Group(), fsdp.FSDPInitMode.NO_FSDP,
                                                   fsdp.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
        inp = tf.get_input("cpu")
        loss = tf.get_loss(inp, tf(*inp))
        tf.run_backward(loss)
        self.assertIs(tf.output_proj.weight, tf.embed_tokens.weight)
        self.assertIsNotNone(tf.embed_tokens.weight.grad)

    def test_unsupported_init_mode_is_named(self):
        with self.assertRaisesRegex(ValueError, "'bogus' for NestedWrappedModule"):
            fsdp.NestedWrappedModule.init(Group(), "bogus", fsdp.DEVICEInitMode.DEVICE_NEVER)

    def test_import_builds_nothing(self):
        code = ("import sys, torch; import disttest.bases.fsdp; "
                "print('torch.distributed.fsdp' in sys.modules, torch.nn.Linear.__init__.__name__)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.split(), ["False", "__init__"], out.stderr[-2000:])

    def test_reduce_scatter_with_assert(self):
        seen = []
        out = fsdp.reduce_scatter_with_assert(None, lambda *a, **k: "done", seen.append, "output", 1)
        self.assertEqual((out, seen), ("done", ["output"]))
        with self.assertRaisesRegex(AssertionError, "no output tensor in args"):
            fsdp.reduce_scatter_with_assert(None, lambda: None, seen.append)
