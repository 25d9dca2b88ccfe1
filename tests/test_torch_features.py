"""disttest._compat: feature detection of version-dependent torch API, and
its fallbacks, checked against the installed torch and against a faked
older one."""

from __future__ import annotations

import types
import unittest
from unittest import mock

import torch
import torch.distributed as dist

import disttest
from disttest import _compat


class FeaturesTest(unittest.TestCase):
    def test_every_feature_is_probed_on_this_torch(self):
        for feature, (version, dotted) in _compat.TORCH_FEATURES.items():
            with self.subTest(feature=feature):
                if _compat.torch_at_least(version):
                    self.assertTrue(_compat.has_feature(feature), f"{dotted} missing from torch >= {version}")
                elif feature != "Backend.FAKE":  # registering "fake" (upstream's fake_pg) adds it
                    self.assertFalse(_compat.has_feature(feature), f"{dotted} found before torch {version}")

    def test_the_probe_imports_only_what_has_no_attribute_of_the_name(self):
        import importlib

        from disttest._compat import versions

        with mock.patch.object(importlib, "import_module", wraps=importlib.import_module) as imported:
            self.assertTrue(versions._probe("torch.distributed.Backend.FAKE"))
        # torch, then attributes: no failed import of "torch.distributed.Backend.FAKE" and the like
        self.assertEqual([c.args[0] for c in imported.call_args_list], ["torch"])
        module = "disttest._probe_target_not_imported_yet"
        target = types.ModuleType(module)
        target.answer = 42
        with mock.patch.dict("sys.modules", {module: target}):
            self.assertTrue(versions._probe(f"{module}.answer"))  # a submodule the attribute walk lacks
            self.assertFalse(versions._probe(f"{module}.question"))
        self.assertFalse(versions._probe("torch.distributed.Backend.FAKE.nothing_here"))
        self.assertFalse(versions._probe("no_such_top_level_module_for_disttest"))

    def test_the_probe_finds_a_submodule_its_package_shadows(self):
        # A package that exports a function under its submodule's name (torch
        # 2.4's _composable.fsdp: ``from .fully_shard import fully_shard``):
        # the dotted name still reaches the submodule, as an import would.
        from disttest._compat import versions

        package = types.ModuleType("disttest_probe_package")
        package.__path__ = []
        sub = types.ModuleType("disttest_probe_package.fully_shard")
        sub.FSDPModule = object

        def fully_shard():
            pass

        package.fully_shard = fully_shard
        with mock.patch.dict("sys.modules", {package.__name__: package, sub.__name__: sub}):
            self.assertTrue(versions._probe("disttest_probe_package.fully_shard.FSDPModule"))
            self.assertTrue(versions._probe("disttest_probe_package.fully_shard"))
            self.assertFalse(versions._probe("disttest_probe_package.fully_shard.nothing_here"))

    def test_missing_feature_names_the_version_it_needs(self):
        with mock.patch.dict(_compat.TORCH_FEATURES, {"dist.all_gather_single": ("99.0", "torch.distributed.nope")}):
            reason = _compat.missing_feature("dist.all_gather_single")
        self.assertEqual(reason, f"needs torch >= 99.0 (dist.all_gather_single; this is torch {_compat.torch_version()})")
        self.assertIsNone(_compat.missing_feature("dist.get_default_backend_for_device"))
        with self.assertRaises(KeyError) as ctx:
            _compat.missing_feature("dist.nope")
        self.assertIn("dist.nope", str(ctx.exception))

    def test_requires_torch_feature_skips_with_the_reason(self):
        with mock.patch.dict(_compat.TORCH_FEATURES, {"funcol.all_gather_single": ("99.0", "torch.nope")}):
            @disttest.requires_torch_feature("funcol.all_gather_single")
            def body():
                raise AssertionError("must skip")

        class Case(unittest.TestCase):
            test_body = staticmethod(body)

        result = unittest.TestResult()
        Case("test_body").run(result)
        self.assertEqual([r for _, r in result.skipped],
                         [f"needs torch >= 99.0 (funcol.all_gather_single; this is torch {_compat.torch_version()})"])

    def test_torch_at_least(self):
        with mock.patch.object(torch, "__version__", "2.8.0+cu128"):
            self.assertTrue(_compat.torch_at_least("2.8"))
            self.assertTrue(_compat.torch_at_least("2.7.1"))
            self.assertFalse(_compat.torch_at_least("2.10"))
            self.assertEqual(_compat.torch_version(), "2.8.0")


class OlderTorchFallbacksTest(unittest.TestCase):
    """torch before 2.6 has no torch.accelerator nor get_default_backend_for_device."""

    def test_device_counts_through_the_device_modules(self):
        cuda = types.SimpleNamespace(device_count=lambda: 3, set_device=mock.Mock())
        with mock.patch.object(torch, "accelerator", None), mock.patch.object(torch, "cuda", cuda):
            self.assertEqual(_compat.accelerator_type(), "cuda")
            self.assertEqual(_compat.accelerator_count(), 3)
            _compat.set_device_index(1)
        cuda.set_device.assert_called_once_with(1)
        none = types.SimpleNamespace(device_count=lambda: 0)
        with mock.patch.object(torch, "accelerator", None), mock.patch.object(torch, "cuda", none), \
                mock.patch.object(torch, "xpu", none, create=True):
            self.assertIsNone(_compat.accelerator_type())
            self.assertEqual(_compat.accelerator_count(), 0)

    def test_default_backend_by_device(self):
        with mock.patch.object(dist, "get_default_backend_for_device", None):
            self.assertEqual([_compat.default_backend_for_device(d) for d in ("cpu", "cuda:1", "xpu")],
                             ["gloo", "nccl", "xccl"])
        self.assertEqual(_compat.default_backend_for_device("cpu"), dist.get_default_backend_for_device("cpu"))

    def test_fake_backend_skips_before_2_11(self):
        with mock.patch.dict(_compat.TORCH_FEATURES, {"Backend.FAKE": ("2.11", "torch.distributed.Backend.NOPE")}):
            with self.assertRaises(unittest.SkipTest) as ctx:
                disttest.register_fake_backend()
        self.assertIn("needs torch >= 2.11 (Backend.FAKE", str(ctx.exception))

    def test_register_backend_replaces_where_torch_refuses(self):
        calls = []
        real = dist.Backend.register_backend

        def refuse_once(name, func, extended_api=False, devices=None):
            calls.append(name)
            if len(calls) == 1:
                raise AssertionError(f"{name.upper()} c10d backend already exist")  # torch < 2.7
            return real(name, func, extended_api=extended_api, devices=devices)

        def creator(*args):
            raise AssertionError("never called")

        with mock.patch.object(dist.Backend, "register_backend", side_effect=refuse_once):
            undo = _compat.register_backend("disttestcompat", creator, ["cpu"])
        try:
            self.assertEqual(calls, ["disttestcompat", "disttestcompat"])
            self.assertIs(dist.Backend._plugins["DISTTESTCOMPAT"].creator_fn, creator)
        finally:
            undo()
        self.assertNotIn("DISTTESTCOMPAT", dist.Backend._plugins)
        self.assertNotIn("disttestcompat", dist.Backend.backend_list)

if __name__ == "__main__":
    unittest.main()
