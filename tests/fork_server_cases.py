"""Fresh-process classes whose ranks check where their fork server came from.

tests/test_fork_server.py runs this module with ``python -m unittest`` in a
new process (so that no fork server exists yet), with ``EXPECT_SERVER`` set
to ``copy`` or ``fresh``, and some classes in its own process. At module
level so that a fresh fork server can import the classes by name.
"""

from __future__ import annotations

import os
import signal
import sys
import unittest

import psutil
import torch

import disttest

#: Which process ran this module's top-level code: the test process for a
#: copy of it, the fork server for a fresh one.
IMPORTED_IN = os.getpid()
TEST_PID_ENV = "FORK_SERVER_TEST_PID"
EXPECT_ENV = "EXPECT_SERVER"
SERVERS_FILE_ENV = "FORK_SERVERS_FILE"


def server_of_this_rank() -> psutil.Process:
    return psutil.Process(os.getppid())


class Base(disttest.MultiProcessTestCase):
    world_size = 2
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        os.environ[TEST_PID_ENV] = str(os.getpid())  # (the ranks get the environment)
        self.addCleanup(os.environ.pop, TEST_PID_ENV, None)
        self._spawn_processes()


class CopyOrFresh(Base):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.set_after_super = True  # the class's own set-up

    def note_server(self) -> None:
        """The server of this test's ranks, for the outer test to compare."""
        with open(os.environ[SERVERS_FILE_ENV], "a") as f:
            f.write(f"{self._testMethodName} rank {self.rank}: {os.getppid()}\n")

    def test_where_the_server_came_from(self) -> None:
        self.note_server()
        test_pid = int(os.environ[TEST_PID_ENV])
        server = server_of_this_rank()
        self.assertEqual(server.ppid(), test_pid)
        test = psutil.Process(test_pid)
        if os.environ[EXPECT_ENV] == "copy":
            # A fork of the test process: its command line, the module the
            # test process imported, the class before its own set-up.
            self.assertEqual(server.cmdline(), test.cmdline())
            self.assertEqual(IMPORTED_IN, test_pid)
            self.assertFalse(hasattr(type(self), "set_after_super"), "the copy saw the class's set-up")
        else:
            self.assertEqual(server.cmdline()[1], "-c")
            self.assertEqual(IMPORTED_IN, server.pid)

    def test_a_second_test_uses_the_same_server(self) -> None:
        self.note_server()
        self.assertEqual(server_of_this_rank().ppid(), int(os.environ[TEST_PID_ENV]))
        # Neither server loads torch.distributed.tensor (0.9 s), nor does
        # comparing tensors in a rank (assert_close would, for nothing).
        self.assertEqual(torch.ones(2), torch.ones(2))
        self.assertFalse("torch.distributed.tensor" in sys.modules, "the rank has torch.distributed.tensor")


class ManyThreads(Base):
    """Ranks that keep torch's default threads: never from a copy."""

    rank_threads = None

    def test_server_is_fresh(self) -> None:
        self.assertEqual(server_of_this_rank().cmdline()[1], "-c")


class OneThread(Base):

    def test_runs(self) -> None:
        self.assertEqual(torch.ones(2) * self.world_size, torch.full((2,), 2.0))

    def test_server_is_a_copy(self) -> None:
        self.assertEqual(server_of_this_rank().cmdline(), psutil.Process(int(os.environ[TEST_PID_ENV])).cmdline())


#: Set in the test process by DirtyTheProcess (never at import): a copy of
#: the test process made after it carries it; a fresh server's import does not.
DIRT = {"set": False}


class DirtyTheProcess(unittest.TestCase):
    """A plain test that leaves state in the test process (as one that made
    a gloo group in it would)."""

    def test_dirty(self) -> None:
        DIRT["set"] = True


class CrashesInACopy(Base):
    """Rank 0 crashes where the dirt was copied: only in ranks of a copy."""

    def test_crashes_in_a_copy_only(self) -> None:
        print(f"body of rank {self.rank}", flush=True)
        if DIRT["set"] and self.rank == 0:
            os.kill(os.getpid(), signal.SIGSEGV)

    def test_second_runs_on_the_fresh_server(self) -> None:
        self.assertEqual(server_of_this_rank().cmdline()[1], "-c")


class CrashesAnywhere(Base):
    """Rank 1 crashes wherever it runs: the crash is the test's."""

    def test_crashes(self) -> None:
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)

    def test_later_the_copy_serves_again(self) -> None:
        self.assertEqual(server_of_this_rank().cmdline(), psutil.Process(int(os.environ[TEST_PID_ENV])).cmdline())


if __name__ == "__main__":
    unittest.main()


#: Set by PatchedFirst's set-up before its super() call, undone after it.
STATE = {"patched": False}


class PatchedFirst(Base):
    """Changes the test process before its base's set-up (so its copy sees
    it), and undoes it when the class ends."""

    @classmethod
    def setUpClass(cls) -> None:
        STATE["patched"] = True
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        STATE["patched"] = False
        super().tearDownClass()

    def test_sees_its_own_set_up(self) -> None:
        self.assertTrue(STATE["patched"])


class LaterClass(Base):
    def test_does_not_see_what_an_earlier_class_undid(self) -> None:
        self.assertFalse(STATE["patched"], "a copy made for an earlier class, as that class left it")
