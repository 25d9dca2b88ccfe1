"""Test classes for tests/test_hostile.py.

The ``*Waits`` classes run in a subprocess that is interrupted: each rank writes its pid (and that of a child it started) into the folder
``DISTTEST_PIDS_DIR`` names, then waits in a collective until the test
process is interrupted. At module level (not a test_*.py file) so that the
fork server can import the classes by name and pytest does not collect them.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import torch
import torch.distributed as dist

import disttest


def note_pids(rank: int, own_environment: bool = False) -> None:
    if own_environment:  # (no janitor token: only its process group is the rank's)
        child = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    else:
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    folder = os.environ["DISTTEST_PIDS_DIR"]
    with open(os.path.join(folder, f"rank{rank}.{os.getpid()}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(f.name, f.name[:-4])


class Waits:
    rank: int
    timeout = 60

    def init(self) -> None:
        pass

    def test_wait(self):
        self.init()
        note_pids(self.rank)
        if self.rank == 1:
            while True:
                time.sleep(0.01)
        dist.all_reduce(torch.ones(1))

    def test_wait_own_environment(self):
        self.init()
        note_pids(self.rank, own_environment=True)
        if self.rank == 1:
            while True:
                time.sleep(0.01)
        dist.all_reduce(torch.ones(1))

    def test_brief(self):
        self.init()
        note_pids(self.rank)
        time.sleep(0.3)
        dist.barrier()


class ProcessWaits(Waits, disttest.MultiProcessTestCase):
    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)


class ThreadWaits(Waits, disttest.MultiThreadedTestCase):
    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()


class PoolWaits(Waits, disttest.MultiProcContinousTest):
    world_size = 2

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"


class ProcessSpawnsTwice(disttest.MultiProcessTestCase):
    """A base class's setUp and a subclass's both start the ranks."""

    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        self._spawn_processes()

    def test_pass(self):
        pass


class ThreadSpawnsTwice(disttest.MultiThreadedTestCase):
    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()
        self._spawn_threads()

    def test_pass(self):
        pass


class ThreadCases(disttest.MultiThreadedTestCase):
    world_size = 2
    timeout = 10

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_pass(self):
        dist.all_reduce(torch.ones(1))

    def test_leaves_a_thread(self):
        if self.rank == 0:
            stop = threading.Event()
            LEFT.append(stop)
            threading.Thread(target=stop.wait, name="left behind", daemon=False).start()

    def test_leaves_a_thread_of_default_kind(self):
        # (a rank thread is a daemon for the process; the threads it starts were too, and went unnamed)
        if self.rank == 1:
            stop = threading.Event()
            LEFT.append(stop)
            threading.Thread(target=stop.wait, name="left by default").start()
            threading.Thread(target=stop.wait, name="a daemon by choice", daemon=True).start()


LEFT: list[threading.Event] = []  # to end the thread that test_leaves_a_thread leaves


class TinyTimeout(disttest.MultiProcessTestCase):
    world_size = 2
    timeout = 1e-9

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_sleep(self):
        time.sleep(1)


class KillsItsServer(disttest.MultiProcessTestCase):
    """Rank 1 kills the fork server that forked it; rank 0 has started a
    process of its own (environment and session) first."""

    world_size = 2
    timeout = 30

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_kill_the_server(self):
        if self.rank == 0:
            child = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                     start_new_session=True)
            with open(os.path.join(os.environ["DISTTEST_PIDS_DIR"], "child"), "w") as f:
                f.write(str(child.pid))
            time.sleep(300)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(os.environ["DISTTEST_PIDS_DIR"], "child")):
            assert time.monotonic() < deadline, "rank 0 did not start its child"
            time.sleep(0.01)
        os.kill(os.getppid(), 9)  # (the fork server: this rank's parent)
        time.sleep(300)


class HangsWithSharedFiles(disttest.MultiProcessTestCase):
    """Rank processes that leave shared memory and semaphores in /dev/shm
    (each through multiprocessing's resource tracker, which removes them
    once its rank has ended), then hang until disttest's limit stops them."""

    world_size = 2
    timeout = 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_hang(self):
        import multiprocessing
        from multiprocessing import shared_memory

        queue = multiprocessing.get_context("spawn").Queue()  # (a semaphore, and the tracker)
        queue.put(1)
        queue.get()
        shared_memory.SharedMemory(create=True, size=4096, name=f"{os.environ['DISTTEST_SHM_PREFIX']}{self.rank}")
        note_pids(self.rank)
        time.sleep(300)


class HangsInARankFile(disttest.MultiThreadedTestCase):
    """Thread ranks that share a rank_temp_file, one hanging in its body
    past the test's limit."""

    world_size = 2
    timeout = 1

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_hang(self):
        with disttest.rank_temp_file() as name:
            assert os.path.exists(name)
            if self.rank == 0:
                time.sleep(30)
            dist.barrier()
