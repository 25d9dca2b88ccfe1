"""disttest.bases.composable: the models of upstream's common_dist_composable,
under the same names, built as upstream's (same parameters, buffers and
values for the same seed) and running; one under fully_shard in ranks."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import unittest

import fsdp_more_cases as cases
import torch
import torch.testing._internal.common_dist_composable as upstream

import disttest.bases.composable as composable

MODELS = ["UnitModule", "CompositeModel", "UnitParamModule", "CompositeParamModel", "NestedSequentialModel"]


def build(module, name, seed=0):
    torch.manual_seed(seed)
    return getattr(module, name)(torch.device("cpu"))


class PublicNamesTest(unittest.TestCase):
    def test_every_upstream_public_name_is_offered(self):
        tree = ast.parse(pathlib.Path(upstream.__file__).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)
                 and not n.name.startswith("_")}
        self.assertEqual(sorted(names), sorted(composable.__all__))
        for name in names:
            self.assertTrue(issubclass(getattr(composable, name), torch.nn.Module), name)

    def test_import_builds_nothing(self):
        code = ("import torch; torch.manual_seed(0); a = torch.rand(1); torch.manual_seed(0); "
                "import disttest.bases.composable; print(torch.equal(torch.rand(1), a))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.split(), ["True"], out.stderr[-2000:])


class ModelsTest(unittest.TestCase):
    def test_same_structure_and_values_as_upstream(self):
        for name in MODELS:
            with self.subTest(model=name):
                ours, theirs = build(composable, name), build(upstream, name)
                self.assertEqual([(n, m.__class__.__name__) for n, m in ours.named_modules()],
                                 [(n, m.__class__.__name__) for n, m in theirs.named_modules()])
                self.assertEqual(list(ours.state_dict()), list(theirs.state_dict()))
                for key, value in ours.state_dict().items():
                    self.assertTrue(torch.equal(value, theirs.state_dict()[key]), key)

    def test_same_outputs_as_upstream(self):
        x = torch.randn(4, 100)
        for name in MODELS[:-1]:
            with self.subTest(model=name):
                ours, theirs = build(composable, name), build(upstream, name)
                torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)

    def test_composite_param_model_has_a_persistent_buffer_and_a_bare_parameter(self):
        model = build(composable, "CompositeParamModel")
        self.assertEqual(list(dict(model.named_buffers())), ["buffer"])
        self.assertIn("buffer", model.state_dict())
        self.assertEqual(model.p.shape, (100, 100))

    def test_fake_sequential_runs_its_modules_without_registering_them(self):
        double, inc = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1)
        with torch.no_grad():
            double.weight.fill_(2.0)
            inc.weight.fill_(1.0)
            inc.bias.fill_(1.0)
        seq = composable.FakeSequential(double, inc)
        self.assertEqual(seq(torch.tensor([[3.0]])).item(), 7.0)
        self.assertEqual(list(seq.parameters()), [])
        self.assertEqual(list(seq.children()), [])

    def test_nested_sequential_model_runs_unlike_upstream(self):
        ours, theirs = build(composable, "NestedSequentialModel"), build(upstream, "NestedSequentialModel")
        x = torch.randn(5, 1)
        self.assertEqual(ours(x).shape, (5, 4))
        # Upstream's forward is a local function of __init__: the model cannot run.
        with self.assertRaises(NotImplementedError):
            theirs(x)


class FullyShardTest(unittest.TestCase):
    def test_composite_param_model_under_fully_shard_in_two_ranks(self):
        result = unittest.TestResult()
        cases.ComposableProcesses("test_fully_shard_composite_param_model").run(result)
        self.assertTrue(result.wasSuccessful() and not result.skipped and result.testsRun == 1,
                        result.errors + result.failures + result.skipped)


if __name__ == "__main__":
    unittest.main()
