"""MultiProcessTestCase: disttest vs torch.testing._internal, side by side.

The same 4-rank gloo test (init the process group through the test's file
store, one all_reduce, destroy) runs N times under each harness in this one
process. Prints the mean time per test, the ratio, and the ranks' peak
memory (RSS, and USS: the pages a rank does not share).

    .venv/bin/python benchmarks/bench_multiprocess.py [--disttest N] [--upstream N]

Targets: disttest <= 150 ms per test (issue 3), >= 50x faster than upstream
(issue 11), rank peak memory no higher than upstream's (issue 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import unittest

import psutil
import torch
import torch.distributed as dist

MEM_FILE_ENV = "BENCH_MEM_FILE"


def _body(self: unittest.TestCase) -> None:
    store = dist.FileStore(self.file_name, self.world_size)
    dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
    t = torch.ones(4) * self.rank
    dist.all_reduce(t)
    assert t[0].item() == sum(range(self.world_size))
    dist.destroy_process_group()
    info = psutil.Process().memory_full_info()
    with open(os.environ[MEM_FILE_ENV], "a") as f:
        f.write(json.dumps({"rss": info.rss, "uss": info.uss}) + "\n")


from torch.testing._internal.common_distributed import (  # noqa: E402
    MultiProcessTestCase as UpstreamMPTC,
)

from disttest import MultiProcessTestCase  # noqa: E402


class DisttestBench(MultiProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    test_allreduce = _body


class UpstreamBench(UpstreamMPTC):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    test_allreduce = _body


def _run(cls: type, n: int, mem_file: str) -> tuple[float, float, dict[str, int]]:
    open(mem_file, "w").close()
    os.environ[MEM_FILE_ENV] = mem_file
    times = []
    for _ in range(n):
        result = unittest.TestResult()
        start = time.perf_counter()
        cls("test_allreduce").run(result)
        times.append(time.perf_counter() - start)
        if not result.wasSuccessful():
            raise SystemExit(f"{cls.__name__} failed: {result.errors + result.failures}")
    with open(mem_file) as f:
        rows = [json.loads(line) for line in f]
    peak = {k: max(r[k] for r in rows) for k in ("rss", "uss")}
    # The first run pays one-off costs (the fork server's start); report both.
    steady = times[1:] or times
    return times[0], sum(steady) / len(steady), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--disttest", type=int, default=20, help="tests under disttest")
    parser.add_argument("--upstream", type=int, default=3, help="tests under upstream")
    args = parser.parse_args()
    mine, theirs = DisttestBench, UpstreamBench
    with tempfile.TemporaryDirectory() as tmp:
        d_first, d_mean, d_mem = _run(mine, args.disttest, os.path.join(tmp, "d"))
        u_first, u_mean, u_mem = _run(theirs, args.upstream, os.path.join(tmp, "u"))
    mb = 1 << 20
    print(f"4-rank gloo test (init, all_reduce, destroy), {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"{'':10}{'first':>10}{'per test':>12}{'peak RSS':>12}{'peak USS':>12}")
    for name, first, mean, mem in (("disttest", d_first, d_mean, d_mem), ("upstream", u_first, u_mean, u_mem)):
        print(f"{name:10}{first * 1000:>8.0f}ms{mean * 1000:>10.0f}ms"
              f"{mem['rss'] / mb:>10.0f}MB{mem['uss'] / mb:>10.0f}MB")
    print(f"speed-up per test: {u_mean / d_mean:.1f}x (target >= 50x, disttest <= 150 ms)")
    print(f"rank peak USS ratio disttest/upstream: {d_mem['uss'] / u_mem['uss']:.2f} (target <= 1)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
