"""The distribution: a wheel and an sdist built from a copy of the tree carry
the right name, torch as a range, the licence and what the tests import, and
installing the wheel keeps the user's torch.

Builds offline (``--no-build-isolation``: the venv's setuptools and wheel,
from the ``dev`` extra); a few seconds.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIP_DIRS or n.startswith(".venv") or n.endswith(".egg-info")}


def _tracked(prefix: str) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, prefix)):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        files += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames if f.endswith(".py")]
    return sorted(files)


class DistributionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="disttest-pkg-")
        src = os.path.join(cls.tmp, "src")
        shutil.copytree(ROOT, src, ignore=_ignore)
        out = os.path.join(cls.tmp, "out")
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "-w", out, src], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            shutil.rmtree(cls.tmp)
            raise AssertionError(f"building the wheel failed:\n{proc.stdout}{proc.stderr}")
        sdist = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", out], cwd=src,
                               capture_output=True, text=True, timeout=300)
        if sdist.returncode != 0:
            shutil.rmtree(cls.tmp)
            raise AssertionError(f"building the sdist failed:\n{sdist.stdout}{sdist.stderr}")
        cls.wheel = os.path.join(out, next(f for f in os.listdir(out) if f.endswith(".whl")))
        cls.sdist = os.path.join(out, next(f for f in os.listdir(out) if f.endswith(".tar.gz")))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def metadata(self):
        with zipfile.ZipFile(self.wheel) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            return email.parser.Parser().parsestr(whl.read(name).decode()), whl.namelist()

    def test_wheel_is_torch_disttest(self):
        self.assertTrue(os.path.basename(self.wheel).startswith("torch_disttest-0.1.0-py3-none-any"), self.wheel)
        meta, names = self.metadata()
        self.assertEqual(meta["Name"], "torch-disttest")
        self.assertIn("disttest/__init__.py", names)
        self.assertIn("disttest/py.typed", names)

    def test_the_wheel_carries_every_module_of_every_package(self):
        # A package that setup.cfg's find: misses (no __init__.py, not in
        # include) would be absent from the wheel: disttest/_compat/ included.
        _, names = self.metadata()
        modules = _tracked("disttest")
        self.assertIn("disttest/_compat/__init__.py", modules)
        self.assertIn("disttest/_compat/local_speedups.py", modules)
        self.assertEqual([m for m in modules if m not in names], [])

    def test_torch_is_a_range_with_no_upper_bound(self):
        meta, _ = self.metadata()
        torch_req = [r for r in meta.get_all("Requires-Dist") if r.split(">")[0].split("=")[0].strip() == "torch"]
        self.assertEqual(torch_req, ["torch>=2.7"])

    def test_licence_is_in_the_wheel(self):
        meta, names = self.metadata()
        licences = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
        self.assertEqual(len(licences), 1, names)
        with zipfile.ZipFile(self.wheel) as whl:
            text = whl.read(licences[0]).decode()
        self.assertIn("BSD 3-Clause License", text)
        self.assertIn("Copyright (c) 2026, the disttest authors", text)
        self.assertIn("Operating System :: POSIX :: Linux", meta.get_all("Classifier"))

    def test_sdist_carries_everything_the_tests_and_examples_need(self):
        with tarfile.open(self.sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        for needed in ["LICENSE", "README.rst", "CHANGELOG.rst", "pyproject.toml", "setup.cfg", "setup.py",
                       "tests/toy_backend.py", "tests/mp_cases.py", "tests/surface_names.json", *_tracked("tests"), *_tracked("examples")]:
            self.assertIn(needed, names, f"{needed} missing from {top}")

    def test_installing_the_wheel_keeps_the_installed_torch(self):
        import torch

        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", self.wheel],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        installs = {item["metadata"]["name"]: item["metadata"]["version"]
                    for item in json.loads(proc.stdout)["install"]}
        if "torch-disttest" not in installs:  # (some pip versions: this version is installed already, editable)
            from importlib.metadata import version

            self.assertEqual(installs, {})
            self.assertEqual(version("torch-disttest"), self.metadata()[0]["Version"])
        self.assertNotIn("torch", installs, f"pip would replace torch {torch.__version__}")


@unittest.skipIf(shutil.which("make") is None, "needs make")
class VersionMatrixTargetTest(unittest.TestCase):
    def make(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    def test_a_venv_per_torch_running_the_suite_and_the_examples(self):
        proc = self.make("-n", "test-torch", "TORCH=9.9.9", "TORCH_TESTS=tests/test_config.py")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(".venv-torch-9.9.9/bin/python -m pip install -q torch==9.9.9", proc.stdout)
        self.assertIn(".venv-torch-9.9.9/bin/python -m pytest -q -p no:cacheprovider tests/test_config.py", proc.stdout)
        self.assertIn(".venv-torch-9.9.9/bin/python examples/run_all.py", proc.stdout)

    def test_without_a_version_it_says_how(self):
        proc = self.make("test-torch")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("usage: make test-torch TORCH=2.8.0", proc.stdout)

    def test_the_dev_install_keeps_the_pinned_cpu_wheel(self):
        proc = self.make("-n", "-B", "install")
        self.assertIn("pip install -q 'torch==2.13.0+cpu'", proc.stdout)  # (the CPU build, not the index's default)


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(shutil.which("make") is None, "needs make")
class BytecodeTest(unittest.TestCase):
    """``make pyc`` (which ``make test`` and ``make examples`` run first)
    leaves the bytecode of every disttest module up to date: an editable
    install writes none, and where ``PYTHONDONTWRITEBYTECODE`` is set no
    interpreter writes its own, so each would compile disttest again."""

    def test_every_module_has_current_bytecode(self):
        proc = subprocess.run(["make", "-s", "pyc"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        import importlib.util

        stale = []
        for rel_path in _tracked("disttest"):
            path = os.path.join(ROOT, rel_path)
            st = os.stat(path)
            try:
                with open(importlib.util.cache_from_source(path), "rb") as f:
                    header = f.read(16)
            except FileNotFoundError:
                stale.append(rel_path)
                continue
            flags = int.from_bytes(header[4:8], "little")
            mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
            if (header[:4] != importlib.util.MAGIC_NUMBER or flags != 0
                    or (mtime, size) != (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)):
                stale.append(rel_path)
        self.assertEqual(stale, [], "modules without current bytecode")

    def test_the_suite_and_the_examples_bring_it_up_to_date_first(self):
        for target in ("test", "examples"):
            proc = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
            lines = proc.stdout.splitlines()
            compiles = [i for i, line in enumerate(lines) if "-m compileall" in line]
            runs = [i for i, line in enumerate(lines) if "-m pytest" in line or "run_all.py" in line]
            self.assertTrue(compiles and runs and compiles[0] < runs[0], proc.stdout)
