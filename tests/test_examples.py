"""The examples run, in a subprocess, and print what their suites promise."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import unittest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


class ExamplesTest(unittest.TestCase):
    def test_run_all(self):
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / "run_all.py")],
            capture_output=True, text=True, timeout=900,
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        suites = sorted(p.name for p in EXAMPLES.glob("test_*.py"))
        for name in suites:
            self.assertRegex(proc.stdout, rf"ok +{name} ")
        self.assertIn(f"{len(suites)} passed, 0 failed", proc.stdout)

    def test_tensor_asserts_example(self):
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", "test_tensor_asserts.py"],
            cwd=EXAMPLES, capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("test_needs_two_gpus", proc.stderr)
        self.assertIn("skipped 'Need at least 2 CUDA devices'", proc.stderr)
        self.assertIn("OK (skipped=1)", proc.stderr)
