"""One probe body (:func:`rank_probe.look`) under each runner.

tests/test_rank_look.py runs it; each rank writes what it saw to
``$RANK_LOOK_DIR/<class>-<rank>.json``. At module level (not a test_*.py
file) so that the fork server can import the classes by name.
"""

from __future__ import annotations

import json
import os
import sys

import rank_probe

import disttest

OUT_ENV = "RANK_LOOK_DIR"  # a test's channel to its ranks (tests only)
#: What this module's top-level code saw (in the fork server: the process
#: that imported it for a rank).
IMPORT_ARGV = list(sys.argv)


class Looks:
    rank: int

    def test_look(self):
        data = rank_probe.look(self)
        data["import_argv"] = IMPORT_ARGV
        path = os.path.join(os.environ[OUT_ENV], f"{type(self).__name__}-{self.rank}.json")
        with open(path, "w") as f:
            json.dump(data, f, default=str)


class ProcessLook(Looks, disttest.MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class FreshServerLook(ProcessLook):
    """ProcessLook's ranks forked by a fresh interpreter, not a copy of the
    test process (``DISTTEST_FORK_SERVER``)."""

    fork_server = "fresh"


ProcessLook.fork_server = "copy"


class ThreadLook(Looks, disttest.MultiThreadedTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()


class PoolLook(Looks, disttest.MultiProcContinousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"


RUNNERS = (ProcessLook, FreshServerLook, ThreadLook, PoolLook)
PROCESS_RUNNERS = (ProcessLook, FreshServerLook, PoolLook)
FRESH_RUNNERS = (ProcessLook, FreshServerLook)
