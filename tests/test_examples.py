"""An example runs, in a subprocess, and prints what its suite promises.

Every example suite runs in CI through the README's command (``make
examples``, in ``.ci/run``); the one here checks a skip's report in detail."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import unittest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


class ExamplesTest(unittest.TestCase):
    def test_tensor_asserts_example(self):
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", "test_tensor_asserts.py"],
            cwd=EXAMPLES, capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("test_needs_two_gpus", proc.stderr)
        self.assertIn("skipped 'Need at least 2 CUDA devices'", proc.stderr)
        self.assertIn("OK (skipped=1)", proc.stderr)
