"""The pytest plugin: --disttest-timeout, --disttest-mode, the world_size marker."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SUITE = textwrap.dedent("""
    import time
    import pytest
    import torch.distributed as dist
    import disttest

    class Threads(disttest.MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_hang(self):
            if self.rank == 1:
                while True:
                    time.sleep(0.01)
            dist.barrier()

        @pytest.mark.world_size(3)
        def test_three(self):
            assert (dist.get_world_size(), self.world_size) == (3, 3)

    @pytest.mark.world_size(5)
    class Five(disttest.MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_five(self):
            assert (dist.get_world_size(), self.world_size) == (5, 5)

    class Procs(disttest.MultiProcessTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

        @pytest.mark.world_size(3)
        def test_three_processes(self):
            # The README's pattern: it hangs if self.world_size is not the ranks started.
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    init_method=f"file://{self.file_name}")
            assert (dist.get_world_size(), self.world_size) == (3, 3)

        def test_hang_in_a_rank(self):
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    init_method=f"file://{self.file_name}")
            if self.rank == 1:
                time.sleep(600)
            dist.barrier()

    @pytest.mark.world_size(3)
    class Pooled(disttest.MultiProcContinousTest):
        def test_three_pooled(self):
            assert (dist.get_world_size(), self.world_size) == (3, 3)
""")


def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_plugin_suite.py"), "w") as f:
            f.write(SUITE)
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "test_plugin_suite.py", *args],
                              cwd=tmp, capture_output=True, text=True, timeout=300)


class PluginTest(unittest.TestCase):
    def test_timeout_option_bounds_disttest_tests(self):
        proc = pytest_run("--disttest-timeout=2", "-k", "Threads and hang")
        self.assertIn("rank 1/4 did not finish 'test_hang' within 2s", proc.stdout)
        self.assertIn("1 failed", proc.stdout)

    def test_bad_timeout_is_a_usage_error_naming_it(self):
        proc = pytest_run("--disttest-timeout=soon")
        self.assertEqual(proc.returncode, 4)
        self.assertIn("Invalid timeout 'soon' from --disttest-timeout", proc.stderr)

    def test_world_size_marker_on_methods_and_classes(self):
        proc = pytest_run("--disttest-timeout=30", "-k", "three or five")
        self.assertIn("4 passed", proc.stdout, proc.stdout[-2000:])

    def test_a_hang_is_reported_with_stacks_before_pytest_timeout_fires(self):
        proc = pytest_run("--timeout=20", "-k", "hang_in_a_rank")
        out = proc.stdout
        self.assertIn("1 failed", out, out[-3000:])
        # disttest's limit (below pytest-timeout's 20 s) fired first...
        self.assertIn("did not finish 'test_hang_in_a_rank' within 16s", out)
        self.assertNotIn("from pytest-timeout", out)
        # ...with the stack of the rank that hangs, not pytest's selectors.py frame.
        self.assertRegex(out, r'test_plugin_suite.py", line \d+ in test_hang_in_a_rank')
