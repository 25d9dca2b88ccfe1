"""Test classes whose module the fork server imports slowly when the test
process's ``sys.argv`` asks for it (tests/test_multiprocess.py: a fork
server that does not answer), or spawned ranks import slowly when the
environment asks for it (a slow start-up). Only those tests import this
module."""

import multiprocessing
import os
import sys
import time

import torch
import torch.distributed as dist
from mp_cases import Base, init_pg

SLOW_ARG = "--disttest-test-slow-import"
if SLOW_ARG in sys.argv:  # in the fork server, which imports the module under the test process's argv
    time.sleep(float(sys.argv[sys.argv.index(SLOW_ARG) + 1]))


class SlowToImport(Base):
    def test_rank(self):
        self.assertIn(self.rank, (0, 1))


# A spawned rank imports this module to find its class: with this variable
# set, the ranks named in it ("process 1") sleep in that import for the
# seconds given ("process 1=30"; "*=2": every rank).
SLOW_SPAWN_ENV = "DISTTEST_TEST_SLOW_SPAWN"
_slow = dict(item.split("=") for item in os.environ.get(SLOW_SPAWN_ENV, "").split(",") if "=" in item)
_name = multiprocessing.current_process().name  # a spawned rank's: "process 1"
if _name != "MainProcess" and (_name in _slow or "*" in _slow):
    time.sleep(float(_slow.get(_name, _slow.get("*", "0"))))
#: With this variable set to a rank's name ("process 1"), that spawned rank's import fails.
FAIL_SPAWN_ENV = "DISTTEST_TEST_FAIL_SPAWN"
if _name != "MainProcess" and os.environ.get(FAIL_SPAWN_ENV) == _name:
    raise ImportError(f"{_name} cannot import this module (a test of disttest)")


class SlowToSpawn(Base):
    """Ranks started by ``spawn``, their test's own limit a second."""

    timeout = 1
    start_method = "spawn"

    def test_init_and_all_reduce(self):
        init_pg(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), self.world_size)
