"""Test classes that a subprocess runs to be interrupted (tests/test_hostile.py).

Each rank writes its pid (and that of a child it started) into the folder
``DISTTEST_PIDS_DIR`` names, then waits in a collective until the test
process is interrupted. At module level (not a test_*.py file) so that the
fork server can import the classes by name and pytest does not collect them.
"""

from __future__ import annotations

import os
import subprocess
import time

import torch
import torch.distributed as dist

import disttest


def note_pids(rank: int) -> None:
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
