"""``make gpu-check`` and the GPU tests (tests/gpu/): every GPU test is
marked ``gpu``, so the target selects them all, and on a host without CUDA
each one skips, saying why, so that CI on CPU stays green. tests/gpu/ runs
them for real on a GPU host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest

import torch

from disttest.runners._pytest import GPU_NO_CUDA_BUILD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


class GpuCheckTest(unittest.TestCase):
    def test_the_target_runs_every_test_marked_gpu(self):
        with open(os.path.join(ROOT, "Makefile")) as f:
            recipe = re.search(r"^gpu-check:.*\n\t(.+)$", f.read(), re.M)
        self.assertIsNotNone(recipe)
        self.assertEqual(recipe.group(1), "$(PY) -m pytest -q -p no:cacheprovider -rs -m gpu tests")

    def test_every_test_under_tests_gpu_is_marked(self):
        proc = pytest("--collect-only", "-q", "-m", "not gpu", "tests/gpu")
        self.assertIn("no tests collected", proc.stdout, proc.stdout[-3000:])
        self.assertRegex(proc.stdout, r"\d+ deselected")

    def test_without_cuda_every_gpu_test_skips_saying_why(self):
        if torch.backends.cuda.is_built():
            self.skipTest("a CUDA build of torch: tests/gpu/ runs for real (make gpu-check)")
        proc = pytest("-q", "-rs", "-m", "gpu", "tests/gpu")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
        summary = proc.stdout.strip().splitlines()[-1]  # "27 skipped in 0.4s": nothing else
        self.assertRegex(summary, r"^=* ?\d+ skipped in ")
        total = int(re.search(r"(\d+) skipped", summary).group(1))
        self.assertGreater(total, 20)
        reason = GPU_NO_CUDA_BUILD.format(version=torch.__version__)
        counts = re.findall(rf"^SKIPPED \[(\d+)\] .*: {re.escape(reason)}$", proc.stdout, re.M)
        self.assertEqual(sum(map(int, counts)), total, proc.stdout[-3000:])


if __name__ == "__main__":
    unittest.main()
