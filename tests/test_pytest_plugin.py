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
            assert dist.get_world_size() == 3

    @pytest.mark.world_size(5)
    class Five(disttest.MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_five(self):
            assert dist.get_world_size() == 5
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
        proc = pytest_run("--disttest-timeout=2", "-k", "hang")
        self.assertIn("rank 1/4 did not finish 'test_hang' within 2s", proc.stdout)
        self.assertIn("1 failed", proc.stdout)

    def test_bad_timeout_is_a_usage_error_naming_it(self):
        proc = pytest_run("--disttest-timeout=soon")
        self.assertEqual(proc.returncode, 4)
        self.assertIn("Invalid timeout 'soon' from --disttest-timeout", proc.stderr)

    def test_world_size_marker_on_methods_and_classes(self):
        proc = pytest_run("--disttest-timeout=30", "-k", "three or five")
        self.assertIn("2 passed", proc.stdout, proc.stdout[-2000:])
