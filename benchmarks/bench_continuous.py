"""MultiProcContinousTest: disttest vs torch.testing._internal, side by side.

A class of N four-rank gloo tests (one all_reduce each) runs under each
harness in this one process. Prints the class's start (the first test's
latency, pool start included), the marginal cost per test (the mean of the
other tests), the whole class, and the ratios.

    .venv/bin/python benchmarks/bench_continuous.py [-n 200]

Targets (issue 5): marginal cost per test at most upstream's; the class's
start at most 1.5 s.
"""

from __future__ import annotations

import argparse
import time
import unittest

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest as Upstream

from disttest import MultiProcContinousTest

N_DEFAULT = 200


def _test(self: unittest.TestCase) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 4


class DisttestPool(MultiProcContinousTest):
    world_size = 4

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"


class UpstreamPool(Upstream):
    world_size = 4

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"


for _i in range(N_DEFAULT):
    setattr(DisttestPool, f"test_{_i:03d}", _test)
    setattr(UpstreamPool, f"test_{_i:03d}", _test)


class _Timed(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self._t = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._t = time.perf_counter()

    def stopTest(self, test: unittest.TestCase) -> None:
        self.times.append(time.perf_counter() - self._t)
        super().stopTest(test)


def measure(cls: type, n: int) -> tuple[float, float, float]:
    names = sorted(name for name in dir(cls) if name.startswith("test_"))[:n]
    suite = unittest.TestSuite([cls(name) for name in names])
    result = _Timed()
    start = time.perf_counter()
    suite.run(result)  # a suite calls setUpClass/tearDownClass
    total = time.perf_counter() - start
    if not result.wasSuccessful() or result.testsRun != n:
        raise SystemExit(f"{cls.__name__}: {result.errors + result.failures}")
    first, rest = result.times[0], result.times[1:]
    return first, sum(rest) / len(rest), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=N_DEFAULT, help=f"tests per class (<= {N_DEFAULT})")
    args = parser.parse_args()
    mine = measure(DisttestPool, args.n)
    theirs = measure(UpstreamPool, args.n)
    print(f"{args.n} four-rank gloo tests (one all_reduce each), torch {torch.__version__}")
    print(f"{'':10}{'start':>10}{'per test':>11}{'class':>10}")
    for name, (first, per, total) in (("disttest", mine), ("upstream", theirs)):
        print(f"{name:10}{first * 1000:>8.0f}ms{per * 1000:>9.2f}ms{total:>9.2f}s")
    print(f"per-test ratio disttest/upstream: {mine[1] / theirs[1]:.2f} (target <= 1)")
    print(f"start: {mine[0]:.2f}s (target <= 1.5s; upstream {theirs[0]:.2f}s)")


if __name__ == "__main__":
    main()
