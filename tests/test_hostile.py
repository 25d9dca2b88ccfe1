"""Hostile tests and users (issue 12): interrupted test processes, ranks that
start processes, kill the fork server, crash, start their ranks twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import psutil

TESTS = os.path.dirname(os.path.abspath(__file__))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class InterruptTest(unittest.TestCase):
    """Ctrl-C or SIGTERM of the test process while its ranks wait: it exits
    at once, and leaves no file in TMPDIR and no process behind."""

    def interrupt(self, cls: str, sig: int, pytest: bool = False) -> None:
        root = tempfile.mkdtemp(prefix="disttest-hostile-")
        self.addCleanup(shutil.rmtree, root, True)
        tmp, pids_dir = os.path.join(root, "tmp"), os.path.join(root, "pids")
        os.mkdir(tmp)
        os.mkdir(pids_dir)
        env = dict(os.environ, TMPDIR=tmp, DISTTEST_PIDS_DIR=pids_dir, PYTHONPATH=TESTS)
        if pytest:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"interrupt_cases.py::{cls}::test_wait"]
        else:
            cmd = [sys.executable, "-m", "unittest", f"interrupt_cases.{cls}.test_wait"]
        with open(os.path.join(root, "out"), "w+") as out:
            proc = subprocess.Popen(cmd, cwd=TESTS, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while len(os.listdir(pids_dir)) < 2 and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertIsNone(proc.poll(), "the test process ended before being interrupted")
                self.assertEqual(len(os.listdir(pids_dir)), 2, "the ranks did not start")
                time.sleep(0.2)  # the ranks wait in the all_reduce
                proc.send_signal(sig)
                start = time.monotonic()
                proc.wait(timeout=20)
                elapsed = time.monotonic() - start
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            out.seek(0)
            output = out.read()
        self.assertLess(elapsed, 10, output)
        pids = [int(p) for name in os.listdir(pids_dir)
                for p in open(os.path.join(pids_dir, name)).read().split()]
        deadline = time.monotonic() + 5
        while any(_running(p) for p in pids if p != proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in pids if p != proc.pid and _running(p)], [], output)
        left = [os.path.join(d, f) for d, dirs, files in os.walk(tmp) for f in dirs + files]
        self.assertEqual(left, [], output)

    def test_sigint_process_runner(self):
        self.interrupt("ProcessWaits", signal.SIGINT)

    def test_sigterm_process_runner(self):
        self.interrupt("ProcessWaits", signal.SIGTERM)

    def test_sigint_pool(self):
        self.interrupt("PoolWaits", signal.SIGINT)

    def test_sigterm_pool(self):
        self.interrupt("PoolWaits", signal.SIGTERM)

    def test_sigterm_threads(self):
        self.interrupt("ThreadWaits", signal.SIGTERM)

    def test_sigint_under_pytest(self):
        self.interrupt("ProcessWaits", signal.SIGINT, pytest=True)

    def test_sigterm_under_pytest(self):
        self.interrupt("PoolWaits", signal.SIGTERM, pytest=True)


if __name__ == "__main__":
    unittest.main()
