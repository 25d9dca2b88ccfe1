"""Temp directories: private, published to ranks, removed by their owner only."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import time
import unittest
from unittest import mock

import disttest
from disttest import cleanup_temp_dir, initialize_temp_directories


class TempDirTest(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(cleanup_temp_dir)

    def test_layout_and_environment(self):
        path = initialize_temp_directories()
        self.assertEqual(os.environ["TEMP_DIR"], path)
        self.assertEqual(sorted(os.listdir(path)), ["barrier", "init_dir", "test_dir"])
        self.assertEqual(
            os.environ["INIT_METHOD"], "file://" + os.path.join(path, "init_dir", "shared_init_file")
        )
        for d in (path, *(os.path.join(path, s) for s in os.listdir(path))):
            self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o700, d)

    def test_explicit_init_method(self):
        initialize_temp_directories("tcp://127.0.0.1:1234")
        self.assertEqual(os.environ["INIT_METHOD"], "tcp://127.0.0.1:1234")

    def test_cleanup_removes_every_directory_and_unsets_variables(self):
        first = initialize_temp_directories()
        second = initialize_temp_directories()
        with open(os.path.join(second, "test_dir", "f"), "w") as f:
            f.write("x")
        cleanup_temp_dir()
        self.assertFalse(os.path.exists(first))
        self.assertFalse(os.path.exists(second))
        self.assertNotIn("TEMP_DIR", os.environ)
        self.assertNotIn("INIT_METHOD", os.environ)
        cleanup_temp_dir()  # idempotent

    def test_a_forked_child_does_not_remove_its_parents_directory(self):
        path = initialize_temp_directories()
        ctx = multiprocessing.get_context("fork")
        child = ctx.Process(target=cleanup_temp_dir)
        child.start()
        child.join(30)
        self.assertEqual(child.exitcode, 0)
        self.assertTrue(os.path.isdir(path))

    def test_aliases(self):
        self.assertIs(disttest._rank_temp_file, disttest.rank_temp_file)


class ProcessDeathTest(unittest.TestCase):
    """A test process that ends without ``cleanup_temp_dir`` (SIGTERM, or
    SIGKILL where no Python runs) leaves no temp directory behind."""

    CHILD = (
        "import os, signal, sys\n"
        "from disttest import initialize_temp_directories\n"
        "print(initialize_temp_directories(), flush=True)\n"
        "os.kill(os.getpid(), getattr(signal, sys.argv[1]))\n"
    )

    def _ends_by(self, name):
        out = subprocess.run([sys.executable, "-c", self.CHILD, name], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, -getattr(signal, name), out.stderr[-2000:])
        path = out.stdout.strip()
        self.assertTrue(path.startswith("/"), out.stdout)
        deadline = time.monotonic() + 10  # the reaper removes it once the process is gone
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(os.path.exists(path), f"{path} outlived a process ended by {name}")

    def test_sigterm(self):
        self._ends_by("SIGTERM")

    def test_sigkill(self):
        self._ends_by("SIGKILL")
