"""MultiProcessTestCase from the outside: a SIGKILLed test process leaves no
rank behind, and pytest (-x, -k, --junitxml) reports the right outcomes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import xml.etree.ElementTree as ET

import psutil

SUITE = textwrap.dedent(
    """
    import os, sys, time, unittest
    import torch
    import torch.distributed as dist
    from disttest import MultiProcessTestCase, skip_if_lt_x_gpu

    class Suite(MultiProcessTestCase):
        timeout = 20

        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_a_pass(self):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=2)
            t = torch.ones(1)
            dist.all_reduce(t)
            self.assertEqual(t, torch.tensor([2.0]))

        def test_b_failure(self):
            self.assertEqual(self.rank, 0, "rank mismatch")

        def test_c_error(self):
            if self.rank == 1:
                raise ValueError("bad value in rank 1")

        @skip_if_lt_x_gpu(8)
        def test_d_skip(self):
            pass

        def test_e_pids(self):
            with open(os.environ["PIDS_FILE"], "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(60)

    if __name__ == "__main__":
        unittest.main()
    """
)


class SuiteDir:
    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "test_suite.py")
        with open(self.path, "w") as f:
            f.write(SUITE)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=self.tmp.name, capture_output=True, text=True,
            timeout=timeout, env=dict(os.environ, PIDS_FILE=os.path.join(self.tmp.name, "pids")),
        )


class PytestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.suite = SuiteDir()

    @classmethod
    def tearDownClass(cls):
        cls.suite.tmp.cleanup()

    def test_outcomes_and_junitxml(self):
        xml = os.path.join(self.suite.tmp.name, "junit.xml")
        proc = self.suite.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_suite.py",
                              "-k", "not pids", f"--junitxml={xml}", "-rs")
        out = proc.stdout
        # pytest files an exception in a unittest test body as "failed".
        self.assertIn("2 failed, 1 passed, 1 skipped, 1 deselected", out, out)
        self.assertIn("Need at least 8 CUDA devices", out)
        # The rank's own line, rebuilt from its traceback, and none of the
        # runner's frames.
        self.assertIn('self.assertEqual(self.rank, 0, "rank mismatch")', out)
        self.assertNotIn("multiprocess.py", out)
        cases = {c.get("name"): c for c in ET.parse(xml).getroot().iter("testcase")}
        self.assertEqual(sorted(cases), ["test_a_pass", "test_b_failure", "test_c_error", "test_d_skip"])
        failure = cases["test_b_failure"].find("failure")
        self.assertIsNotNone(failure)
        self.assertIn("rank 1/2", failure.get("message") + (failure.text or ""))
        error = cases["test_c_error"].find("failure")  # pytest files unittest errors as failures
        self.assertIn("bad value in rank 1", error.get("message") + (error.text or ""))

    def test_x_stops_after_the_first_failure(self):
        proc = self.suite.run("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "test_suite.py")
        self.assertIn("1 failed, 1 passed", proc.stdout)
        self.assertIn("stopping after 1 failures", proc.stdout)

    def test_xdist_runs_classes_in_parallel(self):
        # Two workers, each with its own fork server, ports and directories.
        proc = self.suite.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                              "test_suite.py", "-k", "not pids")
        self.assertIn("2 failed, 1 passed, 1 skipped", proc.stdout, proc.stdout[-2000:])
        self.assertIn("bringing up nodes", proc.stdout)
        self.assertIn("rank 1/2 raised ValueError", proc.stdout)

    def test_unittest_main(self):
        proc = self.suite.run("-m", "unittest", "test_suite.Suite.test_a_pass",
                              "test_suite.Suite.test_b_failure", "test_suite.Suite.test_d_skip")
        self.assertIn("FAILED (failures=1, skipped=1)", proc.stderr)
        self.assertIn("'test_b_failure' failed (disttest): rank 1/2", proc.stderr)


class KilledParentTest(unittest.TestCase):
    def test_sigkilled_test_process_leaves_no_rank(self):
        suite = SuiteDir()
        self.addCleanup(suite.tmp.cleanup)
        pids_file = os.path.join(suite.tmp.name, "pids")
        proc = subprocess.Popen(
            [sys.executable, "-m", "unittest", "test_suite.Suite.test_e_pids"],
            cwd=suite.tmp.name, env=dict(os.environ, PIDS_FILE=pids_file),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            if os.path.exists(pids_file):
                with open(pids_file) as f:
                    pids = [int(line) for line in f if line.strip()]
        self.assertEqual(len(pids), 2, "the ranks never started")
        helpers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        alive = pids + helpers
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if psutil.pid_exists(p)
                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        self.assertEqual(alive, [], "ranks or the fork server outlived the killed test process")
