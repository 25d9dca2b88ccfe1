"""disttest.support.janitor: the reaper removes a test process's folders and
kills what its ranks started when the process ends without Python's exit
(SIGKILL, os._exit: pytest-timeout's thread method)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from test_hostile import _running as _alive

CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    from disttest.support import janitor

    folder, mode = sys.argv[1], sys.argv[2]
    if mode == "token":  # as a pool does: the ranks' environment before the registration
        env = dict(os.environ, **janitor.rank_environ())
    token = janitor.register(lambda: None, paths=[folder])
    if mode == "unregistered":
        janitor.unregister(token)
    if mode == "token":
        import psutil  # one reaper (the one the ranks' token names), and it is the one disttest knows
        deadline = time.monotonic() + 10
        while True:  # NB: a child just spawned shows its command line once it has exec'd
            reapers = {p.pid for p in psutil.Process().children() if "-S" in p.cmdline()}
            if reapers or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert reapers == janitor.reaper_pids() and len(reapers) == 1, (reapers, janitor.reaper_pids())
        sleeper = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
        print(sleeper.pid, flush=True)
    if mode == "fork":
        if os.fork() == 0:  # a rank forked from the test process outlives it a while
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            time.sleep(5)
            os._exit(0)
    print("ready", flush=True)
    os._exit(1)  # no atexit, no cleanups
""")




class ReaperTest(unittest.TestCase):
    def run_child(self, mode: str) -> tuple[str, list[str]]:
        folder = tempfile.mkdtemp(prefix="disttest-janitor-test-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        with open(os.path.join(folder, "inside"), "w") as f:
            f.write("x")
        out = subprocess.run([sys.executable, "-c", CHILD, folder, mode], capture_output=True, text=True,
                             timeout=60)
        self.assertIn("ready", out.stdout, out.stderr)
        return folder, out.stdout.split()

    def wait_gone(self, check, seconds: float = 5.0) -> bool:
        deadline = time.monotonic() + seconds
        while check() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not check()

    def test_a_registered_folder_is_removed_after_os_exit(self):
        folder, _ = self.run_child("registered")
        self.assertTrue(self.wait_gone(lambda: os.path.exists(folder)), "the folder outlived the process")

    def test_an_unregistered_folder_is_left_alone(self):
        folder, _ = self.run_child("unregistered")
        time.sleep(0.5)
        self.assertTrue(os.path.exists(os.path.join(folder, "inside")))
        os.remove(os.path.join(folder, "inside"))

    def test_what_a_rank_started_in_its_own_session_is_killed(self):
        folder, words = self.run_child("token")
        sleeper = int(words[0])
        self.addCleanup(lambda: _alive(sleeper) and os.kill(sleeper, 9))
        self.assertTrue(self.wait_gone(lambda: _alive(sleeper)), "the rank's process outlived the test process")
        self.assertTrue(self.wait_gone(lambda: os.path.exists(folder)))

    def test_a_forked_child_does_not_keep_the_reaper_waiting(self):
        # The forked child lives 5 s after the test process's os._exit; timed
        # from that exit (not from starting the interpreter, slow under load).
        folder, _ = self.run_child("fork")
        start = time.monotonic()
        self.assertTrue(self.wait_gone(lambda: os.path.exists(folder), 4))
        self.assertLess(time.monotonic() - start, 3.5, "the reaper waited for the forked child")


if __name__ == "__main__":
    unittest.main()
