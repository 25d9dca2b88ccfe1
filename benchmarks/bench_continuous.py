"""MultiProcContinousTest: disttest vs torch.testing._internal, side by side.

A class of N four-rank gloo tests runs under each harness in this one
process, twice: tests of one all_reduce each, and tests with an empty body
(the harness's own cost). Prints the class's start (the first test's
latency, pool start included), the marginal cost per test (the mean of the
other tests), the whole class, the ratios, and the scheduling policy of
disttest's ranks (``DISTTEST_RANK_SCHEDULING``, README "Rank scheduling";
upstream's ranks keep the normal policy; run with
``DISTTEST_RANK_SCHEDULING=normal`` to compare without).

    .venv/bin/python benchmarks/bench_continuous.py [-n 200]

Targets: marginal cost per one-all_reduce test at most half of upstream's
(issue 11); the class's start at most 1.5 s (issue 5).
"""

from __future__ import annotations

import argparse
import time
import unittest
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest as Upstream

from disttest import MultiProcContinousTest
from disttest._runner import settings

N_DEFAULT = 200


def _test(self: unittest.TestCase) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 4


def _empty(self: unittest.TestCase) -> None:
    pass


def _gloo() -> str:
    return "gloo"


def _class(name: str, base: type, body: Any) -> type:
    """A class of N_DEFAULT tests running ``body``, at module level (upstream's
    spawned ranks import it by name). Each derives from the harness's base
    directly: upstream keeps its pool in class attributes."""
    attrs: dict[str, Any] = {"world_size": 4, "backend_str": classmethod(lambda cls: _gloo()),
                             "__module__": __name__, "__qualname__": name}
    attrs.update({f"test_{i:03d}": body for i in range(N_DEFAULT)})
    cls = type(name, (base,), attrs)
    globals()[name] = cls
    return cls


DisttestPool = _class("DisttestPool", MultiProcContinousTest, _test)
UpstreamPool = _class("UpstreamPool", Upstream, _test)
DisttestEmpty = _class("DisttestEmpty", MultiProcContinousTest, _empty)
UpstreamEmpty = _class("UpstreamEmpty", Upstream, _empty)


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
    names = sorted(name for name in vars(cls) if name.startswith("test_"))[:n]
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
    # NB: disttest's classes first: upstream's pool leaves four queue feeder
    # threads in this process, after which a fork of it is unsafe and the
    # next disttest class starts a fresh fork server (about 3 s of "start").
    runs = {key: measure(cls, args.n) for key, cls in (
        ("disttest", DisttestPool), ("disttest, empty", DisttestEmpty),
        ("upstream", UpstreamPool), ("upstream, empty", UpstreamEmpty))}
    print(f"{args.n} four-rank gloo tests per class, torch {torch.__version__}; "
          f"disttest's rank scheduling: {settings.rank_scheduling(DisttestPool)}")
    print(f"{'':17}{'start':>10}{'per test':>11}{'class':>10}")
    for name, (first, per, total) in runs.items():
        print(f"{name:17}{first * 1000:>8.0f}ms{per * 1000:>9.2f}ms{total:>9.2f}s")
    ratio = runs["disttest"][1] / runs["upstream"][1]
    empty = runs["disttest, empty"][1] / runs["upstream, empty"][1]
    print(f"per-test ratio disttest/upstream, one all_reduce: {ratio:.2f} (target <= 0.5)")
    print(f"per-test ratio disttest/upstream, empty body: {empty:.2f}")
    print(f"start: {runs['disttest'][0]:.2f}s (target <= 1.5s; upstream {runs['upstream'][0]:.2f}s)")


if __name__ == "__main__":
    main()
