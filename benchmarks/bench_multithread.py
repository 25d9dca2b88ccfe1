"""MultiThreadedTestCase: disttest vs torch.testing._internal, side by side.

Two 4-rank test bodies, each run N times under each harness: one all_reduce,
and a mix of ten collectives. Each harness runs in its own interpreter
(importing upstream's module re-registers the "threaded" backend, so the two
cannot share a process), both launched by this one script, which prints the
mean time per test and the ratio.

    .venv/bin/python benchmarks/bench_multithread.py [-n N]

Target (issue 11): disttest at most half of upstream's time per 4-rank
one-all_reduce test (ratio <= 0.5), ten collectives well below 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import unittest

import torch
import torch.distributed as dist


def one_all_reduce(self: unittest.TestCase) -> None:
    t = torch.ones(8)
    dist.all_reduce(t)
    assert t[0].item() == 4


def ten_collectives(self: unittest.TestCase) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(8) * rank
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_gather([torch.zeros(8) for _ in range(n)], t)
    dist.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(n)])
    dist.all_to_all([torch.zeros(2) for _ in range(n)], [torch.ones(2) for _ in range(n)])
    dist.all_to_all_single(torch.zeros(n), torch.arange(n, dtype=torch.float32))
    dist.scatter(torch.zeros(2), [torch.ones(2) for _ in range(n)] if rank == 0 else None, src=0)
    dist.gather(torch.ones(2), [torch.zeros(2) for _ in range(n)] if rank == 0 else None, dst=0)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.barrier()


def _suite(harness: str) -> type:
    if harness == "disttest":
        from disttest import MultiThreadedTestCase as Base
    else:
        from torch.testing._internal.common_distributed import MultiThreadedTestCase as Base

    class Bench(Base):  # type: ignore[misc,valid-type]
        @property
        def world_size(self) -> int:
            return 4

        def setUp(self) -> None:
            super().setUp()
            self._spawn_threads()

        test_one_all_reduce = one_all_reduce
        test_ten_collectives = ten_collectives

    return Bench


def measure(harness: str, n: int) -> dict[str, float]:
    """In this interpreter: mean seconds per test for each body."""
    cls = _suite(harness)
    out = {}
    for name in ("test_one_all_reduce", "test_ten_collectives"):
        cls(name).run(unittest.TestResult())  # warm-up
        start = time.perf_counter()
        for _ in range(n):
            result = unittest.TestResult()
            cls(name).run(result)
            if not result.wasSuccessful():
                raise SystemExit(f"{harness} {name} failed: {result.errors + result.failures}")
        out[name] = (time.perf_counter() - start) / n
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100, help="runs of each test per harness")
    parser.add_argument("--child", choices=("disttest", "upstream"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.n)))
        return
    results = {}
    for harness in ("disttest", "upstream"):
        proc = subprocess.run([sys.executable, __file__, "--child", harness, "-n", str(args.n)],
                              capture_output=True, text=True, timeout=1800, check=True)
        results[harness] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"4-rank thread tests, {args.n} runs each, torch {torch.__version__}")
    print(f"{'':24}{'disttest':>12}{'upstream':>12}{'ratio':>8}")
    for name in ("test_one_all_reduce", "test_ten_collectives"):
        d, u = results["disttest"][name], results["upstream"][name]
        print(f"{name:24}{d * 1000:>10.2f}ms{u * 1000:>10.2f}ms{d / u:>8.2f}")
    print("ratio = disttest / upstream per test (target: one all_reduce <= 0.5)")


if __name__ == "__main__":
    main()
