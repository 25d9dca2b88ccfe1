"""Fault injection costs nothing to tests that declare no fault.

The same tests run in one process, interleaved, in two configurations:

- "feature": disttest as shipped (the tracking wrapper asks the fault
  interceptor at every collective; each test is armed and judged);
- "disabled": the interceptor replaced by a bare no-op, arming and judging
  stubbed out: what a test cost before fault injection existed.

Bodies: a 4-rank MultiThreadedTestCase test making 200 all_reduces, and a
2-rank MultiProcessTestCase test (gloo, ranks forked) making 200. Prints the
median time per test of each configuration and the ratio.

    .venv/bin/python benchmarks/bench_faults.py [-n N]

Target (issue 14): ratio within noise of 1.0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import unittest
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist

import disttest
from disttest.faults import judge as _faults_judge
from disttest.faults import rank as _faults_rank

CALLS = 200


class Threads(disttest.MultiThreadedTestCase):
    world_size = 4

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_all_reduces(self) -> None:
        t = torch.ones(4)
        for _ in range(CALLS):
            dist.all_reduce(t)


class Processes(disttest.MultiProcessTestCase):
    world_size = 2
    start_method = "fork"  # the ranks inherit this process's patches

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_all_reduces(self) -> None:
        dist.init_process_group("gloo", rank=self.rank, world_size=2,
                                store=dist.FileStore(self.file_name, 2))
        t = torch.ones(4)
        for _ in range(CALLS):
            dist.all_reduce(t)


class _Inactive:
    expected_end = None

    def judge(self, outcomes: list) -> list:
        return list(outcomes)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    @contextlib.contextmanager
    def unarmed(*args: object) -> Iterator[None]:
        yield

    with mock.patch.object(_faults_rank, "before_collective", lambda op, rank: None), \
            mock.patch.object(_faults_judge.Injection, "for_test", lambda *a: _Inactive()), \
            mock.patch("disttest.runners.multiprocess.armed", unarmed), \
            mock.patch("disttest.runners.multithread.armed", unarmed):
        yield


def once(cls: type[unittest.TestCase]) -> float:
    result = unittest.TestResult()
    start = time.perf_counter()
    cls("test_all_reduces").run(result)
    took = time.perf_counter() - start
    if not result.wasSuccessful():
        raise SystemExit(f"{cls.__name__} failed: {result.errors + result.failures}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=15, help="runs per configuration and body")
    args = parser.parse_args()
    for var in ("DISTTEST_FAULT", "DISTTEST_CHAOS"):
        os.environ.pop(var, None)
    print(f"torch {torch.__version__}, {CALLS} all_reduces per test, {args.n} runs each, interleaved")
    for cls in (Threads, Processes):
        once(cls)  # warm up
        feature: list[float] = []
        off: list[float] = []
        for i in range(args.n):
            if i % 2:  # alternate which goes first
                feature.append(once(cls))
            with disabled():
                off.append(once(cls))
            if not i % 2:
                feature.append(once(cls))
        f, d = statistics.median(feature), statistics.median(off)
        print(f"{cls.__name__:10} feature {f * 1000:8.1f} ms/test   disabled {d * 1000:8.1f} ms/test   "
              f"ratio {f / d:.3f}")
    calls = 1_000_000
    start = time.perf_counter()
    for _ in range(calls):
        _faults_rank.before_collective("all_reduce", 0)
    per_call = (time.perf_counter() - start) / calls
    print(f"the unarmed interceptor: {per_call * 1e9:.0f} ns a collective "
          f"({per_call * CALLS * 1e6:.0f} us for the {CALLS} collectives of a test)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
