"""The package layout: the layers hold (import-linter's contracts in
``.importlinter``), no import cycles, the tree shows the architecture, and the
flat module paths of 0.1 keep importing the moved modules."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import sysconfig
import textwrap
import unittest
from unittest import mock

import disttest
from disttest import _moved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "disttest")


def lint_imports(config: str) -> subprocess.CompletedProcess[str]:
    exe = os.path.join(sysconfig.get_path("scripts"), "lint-imports")
    return subprocess.run([exe, "--config", config, "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


class LayersTest(unittest.TestCase):
    def test_contracts_are_kept(self):
        result = lint_imports(".importlinter")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("Contracts: 2 kept, 0 broken.", result.stdout)

    def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(self):
        # The contracts can fail: the same configuration on a copy of the
        # package where the core imports a runner.
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(PACKAGE, os.path.join(tmp, "disttest"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            with open(os.path.join(tmp, "disttest", "_runner", "verdict.py"), "a") as f:
                f.write("\n\ndef _upward():\n    from disttest.runners import multiprocess  # noqa\n")
            with open(os.path.join(tmp, "disttest", "_runner", "channel.py"), "a") as f:
                f.write("\n\ndef _cycle():\n    from disttest._runner import launcher  # noqa\n")
            config = os.path.join(tmp, ".importlinter")
            shutil.copyfile(os.path.join(ROOT, ".importlinter"), config)
            exe = os.path.join(sysconfig.get_path("scripts"), "lint-imports")
            result = subprocess.run([exe, "--config", config, "--no-cache"], cwd=tmp, capture_output=True,
                                    text=True, timeout=120, env={**os.environ, "PYTHONPATH": tmp})
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("disttest._runner.verdict -> disttest.runners.multiprocess", result.stdout)
        self.assertIn("Contracts: 0 kept, 2 broken.", result.stdout)


class TreeTest(unittest.TestCase):
    def test_top_level_holds_the_foundation_the_plugin_and_the_packages(self):
        # A new module finds its package (runners, support, pg, bases, faults,
        # conformance, migrate, _runner) instead of sitting flat beside 30 others.
        entries = sorted(e for e in os.listdir(PACKAGE) if e != "__pycache__")
        self.assertEqual(entries, [
            "__init__.py", "_compat", "_moved.py", "_ops.py", "_runner", "_typing.py", "bases",
            "config.py", "conformance", "faults", "migrate", "pg", "py.typed", "pytest_plugin.py", "runners",
            "support",
        ])

    def test_fault_injection_is_one_package(self):
        self.assertEqual(sorted(f for f in os.listdir(os.path.join(PACKAGE, "faults")) if f.endswith(".py")),
                         ["__init__.py", "judge.py", "pytest_options.py", "rank.py"])


class MovedPathsTest(unittest.TestCase):
    def test_every_flat_path_of_0_1_is_the_moved_module(self):
        for old, new in _moved.MOVED.items():
            with self.subTest(old=old):
                module = importlib.import_module(f"disttest.{old}")
                self.assertIs(module, importlib.import_module(new))
                self.assertIs(getattr(disttest, old), module)
                self.assertEqual(module.__name__, new)
                self.assertEqual(module.__spec__.name, new)
                self.assertEqual(module.__spec__.origin, module.__file__)

    def test_reload_after_an_old_path_import(self):
        import importlib

        import disttest.tensors  # noqa: F401  (the old path first)
        from disttest.support import tensors

        original = tensors.build_tensor
        tensors.build_tensor = None  # type: ignore[assignment]
        try:
            self.assertIs(importlib.reload(tensors), tensors)
            self.assertTrue(callable(tensors.build_tensor), "reload did not execute the module")
        finally:
            tensors.build_tensor = original
        self.assertEqual(tensors.__name__, "disttest.support.tensors")

    def test_from_import_and_patch_through_an_old_path(self):
        from disttest.fake import with_fake_comms
        from disttest.pg import fake

        self.assertIs(with_fake_comms, fake.with_fake_comms)
        with mock.patch("disttest.fake.with_fake_comms", "patched"):
            self.assertEqual(fake.with_fake_comms, "patched")
        self.assertIs(fake.with_fake_comms, with_fake_comms)

    def test_old_paths_in_a_fresh_interpreter(self):
        # Before anything else imported the new paths, and attribute access on
        # the package without an import statement.
        code = textwrap.dedent("""
            import sys
            import disttest.threaded_pg as t
            from disttest.multiprocess import MultiProcessTestCase
            from disttest.dtensor import DTensorTestBase
            import disttest
            assert t is sys.modules["disttest.pg.threaded"], t
            assert MultiProcessTestCase is disttest.MultiProcessTestCase
            assert disttest.launchers.detect is sys.modules["disttest.support.launchers"].detect
            try:
                import disttest.no_such_module
            except ModuleNotFoundError as e:
                assert e.name == "disttest.no_such_module", e
            else:
                raise AssertionError("imported a module that does not exist")
            print("ok")
        """)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.stdout.strip(), "ok", result.stderr)

    def test_ruff_bans_exactly_the_flat_paths_in_the_code(self):
        import tomllib

        with open(os.path.join(ROOT, "ruff.toml"), "rb") as f:
            banned = tomllib.load(f)["lint"]["flake8-tidy-imports"]["banned-api"]
        self.assertEqual(sorted(banned), sorted(f"disttest.{old}" for old in _moved.MOVED))
        for old, new in _moved.MOVED.items():
            self.assertIn(f"use {new} ", banned[f"disttest.{old}"]["msg"])

    def test_a_new_name_is_not_aliased(self):
        with self.assertRaises(AttributeError):
            disttest.no_such_module  # noqa: B018


if __name__ == "__main__":
    unittest.main()
