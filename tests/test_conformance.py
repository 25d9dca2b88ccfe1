"""The backend conformance suite and its command line."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

from disttest import _compat

HERE = os.path.dirname(os.path.abspath(__file__))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "disttest.conformance", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def row(table: str, collective: str) -> list[int]:
    line = next(ln for ln in table.splitlines() if ln.startswith(collective + " "))
    return [int(x) for x in line.split()[1:]]


class ConformanceCliTest(unittest.TestCase):
    def test_threaded_backend_passes_with_threads(self):
        proc = cli("--backend", "threaded", "--world-size", "3")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("conformance of backend 'threaded', world size 3", proc.stdout)
        # The single-tensor forms skip as "unsupported by this torch" before 2.13.
        too_old = sum(_compat.missing_feature(f) is not None
                      for f in ("dist.all_gather_single", "dist.reduce_scatter_single"))
        self.assertEqual(row(proc.stdout, "total")[1:], [0, 0, too_old])
        self.assertEqual(row(proc.stdout, "all_reduce"), [10, 0, 0, 0])

    def test_gloo_passes_with_processes_and_reports_what_it_lacks(self):
        proc = cli("--backend", "gloo", "--world-size", "2", "-k", "test_[ab]*")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(row(proc.stdout, "all_reduce"), [9, 0, 1, 0])
        self.assertIn("UNSUPPORTED test_all_reduce_premul_sum: all_reduce PREMUL_SUM (gloo lacks it)", proc.stdout)

    def test_a_broken_backend_is_caught_and_named(self):
        proc = cli("--backend", "toybroken", "--world-size", "2", "--import", "toy_backend",
                   "-k", "test_[ab]*")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        out = proc.stdout
        self.assertGreater(row(out, "all_reduce")[1], 0)   # wrong results
        self.assertEqual(row(out, "broadcast"), [0, 0, 1, 0])  # says it is not supported
        self.assertEqual(row(out, "all_gather")[1], 1)
        self.assertIn("FAILED test_all_reduce_sum:", out)
        self.assertIn("Mismatched elements", out)
        self.assertIn("toy allgather exploded", out)
        self.assertIn("UNSUPPORTED test_broadcast_each_source: broadcast (broadcast is not supported by toybroken)", out)

    def test_bad_arguments(self):
        proc = cli("--backend", "gloo", "--world-size", "zero")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("Invalid world size 'zero' from --world-size", proc.stderr)
        proc = cli("--backend", "gloo", "--world-size", "2", "--import", "no_such_module_here")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--import 'no_such_module_here': no such module", proc.stderr)


class MixinTest(unittest.TestCase):
    def test_mixin_in_a_users_class(self):
        import torch.distributed as dist

        import disttest
        from disttest.conformance import CollectiveConformance

        class Mine(CollectiveConformance, disttest.MultiThreadedTestCase):
            def setUp(self):
                super().setUp()
                self._spawn_threads()

        result = unittest.TestResult()
        Mine("test_all_reduce_sum").run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertFalse(dist.is_initialized())
