"""Reference models: forward passes and lazy shared instances."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest

import torch

import disttest
from disttest.support import models


class ModelsTest(disttest.TestCase):
    def test_forward_shapes(self):
        cases = [
            (models.Net(), torch.randn(4, 2), (4, 4)),
            (models.NetWithBuffers(), torch.randn(3, 10), (3, 1)),
            (models.LargeNet(), torch.randn(2, 1000), (2, 500)),
            (models.Task(), torch.randn(2, 2), (2, 2)),
            (models.BatchNormNet(), torch.randn(8, 2), (8, 4)),
            (models.BatchNormNet(affine=False), torch.randn(8, 2), (8, 4)),
            (models.FC2(), torch.randn(3, 10), (3, 50)),
            (models.EmbeddingNetDifferentParams(1), torch.tensor([1, 2]), (2, 1)),
            (models.ControlFlowToyModel(), torch.ones(20, 10), (20, 10)),
            (models.SaveForwardInputsModel({}, False), torch.randn(2, 100), (2, 100)),
        ]
        for model, x, shape in cases:
            with self.subTest(model=type(model).__name__):
                self.assertEqual(tuple(model(x).shape), shape)

    def test_multi_output_models(self):
        a, b = models.TwoLinLayerNet()(torch.randn(2, 10))
        self.assertEqual((a.shape, b.shape), (torch.Size([2, 10]), torch.Size([2, 1])))
        out = models.DictOutputModule()(torch.randn(2, 10))
        self.assertEqual(sorted(out), ["loss", "predictions"])
        self.assertEqual(out["loss"].dim(), 0)

    def test_behaviours(self):
        net = models.NetWithBuffers()
        before = net.buffer.clone()
        net(torch.randn(1, 10))
        self.assertEqual(net.buffer, before + 1)
        self.assertFalse(models.Net().fc2.fc.bias.requires_grad)
        inputs = {}
        model = models.SaveForwardInputsModel(inputs, cast_forward_inputs=True)
        model(torch.randn(2, 100, dtype=torch.float64))
        self.assertEqual(len(inputs), 3)
        self.assertEqual(
            models.EmbeddingNetDifferentParams(0).embedding.embedding_dim,
            500,
        )

    def test_shared_instances_are_built_once(self):
        self.assertIs(disttest.DDP_NET, disttest.DDP_NET)
        self.assertIsInstance(disttest.DDP_NET, models.Net)
        self.assertFalse(disttest.BN_NET_NO_AFFINE.bn.affine)
        self.assertIsInstance(disttest.ONLY_SBN_NET, torch.nn.SyncBatchNorm)
        self.assertEqual(len(disttest.COLLECTIVES_OBJECT_TEST_LIST), 5)
        self.assertIs(disttest._FC2, models.FC2)

    def test_foo_equality(self):
        self.assertEqual(models.Foo(torch.ones(2)), models.Foo(torch.ones(2)))
        self.assertNotEqual(models.Foo(torch.ones(2)), models.Foo(torch.zeros(2)))
        self.assertNotEqual(models.Foo(1), object())

    def test_seeded_object_list_is_reproducible(self):
        disttest.set_rng_seed(3)
        a = models.create_collectives_object_test_list()
        disttest.set_rng_seed(3)
        self.assertEqual(a, models.create_collectives_object_test_list())

    def test_named_tuples_are_not_collected_as_tests(self):
        self.assertFalse(models.TestNamedTupleInput_1.__test__)
        self.assertEqual(models.TestNamedTupleInput_0._fields, ("a", "b"))


class ImportHygieneTest(unittest.TestCase):
    def test_import_does_no_tensor_work_so_fork_is_safe(self):
        # A process that ran a parallel op hangs in a forked child at its next
        # parallel op (see DEVELOPERS.md); import disttest, fork, and let the
        # child run a large matmul.
        code = textwrap.dedent(
            """
            import os, sys
            import disttest, disttest.support.models as m
            assert m._built == {}, m._built
            pid = os.fork()
            if pid == 0:
                import torch
                torch.ones(512, 512) @ torch.ones(512, 512)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status))
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
            env=dict(os.environ, OMP_NUM_THREADS="2"),
        )
        self.assertEqual(out.stdout.strip(), "child 0", out.stderr)

    def test_all_is_sorted_and_resolves(self):
        self.assertEqual(disttest.__all__, sorted(disttest.__all__))
        missing = [name for name in disttest.__all__ if not hasattr(disttest, name)]
        self.assertEqual(missing, [])
