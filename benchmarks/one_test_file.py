"""A file of one test, run as ``python file.py``: disttest vs torch.testing._internal.

For each runner (fresh processes, the pool, threads) the same 4-rank test
(one all_reduce) is written to a file twice, importing its base class from
disttest and from upstream; each file runs in a new interpreter, the two
alternating, ``-n`` times. Prints the median wall time per file, the ratio,
the target, and a bare interpreter that imports torch (the floor every
file pays). The fresh-process file also runs with
``DISTTEST_FORK_SERVER=fresh`` (a fork server that imports torch and the
test's module again, instead of a copy of the test process).

    .venv/bin/python benchmarks/one_test_file.py [-n 5]

Targets (issue 26): a one-test file at most 0.3x upstream's for fresh
processes, 0.15x for the pool, 0.65x for threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HEADER = """
import unittest
import torch
import torch.distributed as dist
from {module} import {base} as Base
"""

BODY = """
    def test_all_reduce(self):
        {init}
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t[0].item() == 4, t


if __name__ == "__main__":
    unittest.main()
"""

INIT_PG = ("store = dist.FileStore(self.file_name, self.world_size); "
           "dist.init_process_group('gloo', store=store, rank=self.rank, world_size=self.world_size)")

RUNNERS = {
    # name: (base class, class body before the test, the test's set-up line, target)
    "fresh processes": ("MultiProcessTestCase", """
    world_size = 4

    def setUp(self):
        super().setUp()
        self._spawn_processes()
""", INIT_PG, 0.3),
    "pool": ("MultiProcContinuousTest", """
    world_size = 4

    @classmethod
    def backend_str(cls):
        return "gloo"
""", "pass", 0.15),
    "threads": ("MultiThreadedTestCase", """
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()
""", "pass", 0.65),
}
MODULES = {"disttest": "disttest", "upstream": "torch.testing._internal.common_distributed"}


def write(folder: str, runner: str, harness: str) -> str:
    base, attrs, init, _ = RUNNERS[runner]
    source = (HEADER.format(module=MODULES[harness], base=base)
              + f"\n\nclass OneTest(Base):{attrs}" + BODY.format(init=init))
    path = os.path.join(folder, f"{harness}_{runner.replace(' ', '_')}.py")
    with open(path, "w") as f:
        f.write(source)
    return path


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each file (median reported)")
    args = parser.parse_args()
    if args.n < 1:
        parser.error(f"-n {args.n}: at least 1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    fresh_env = {**env, "DISTTEST_FORK_SERVER": "fresh"}
    import torch

    print(f"one-test files (4 ranks, one all_reduce), python file.py, median of {args.n} runs, "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    print(f"{'':34}{'disttest':>10}{'upstream':>10}{'ratio':>8}{'target':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        floor = [timed([sys.executable, "-c", "import torch, torch.distributed"], env) for _ in range(args.n)]
        for runner, (_, _, _, target) in RUNNERS.items():
            ours, theirs = write(tmp, runner, "disttest"), write(tmp, runner, "upstream")
            rows: dict[str, list[float]] = {"disttest": [], "upstream": [], "fresh": []}
            for _ in range(args.n):  # alternating, so a busy spell falls on both
                rows["disttest"].append(timed([sys.executable, ours], env))
                rows["upstream"].append(timed([sys.executable, theirs], env))
                if runner == "fresh processes":
                    rows["fresh"].append(timed([sys.executable, ours], fresh_env))
            d, u = statistics.median(rows["disttest"]), statistics.median(rows["upstream"])
            print(f"{runner:34}{d:>9.2f}s{u:>9.2f}s{d / u:>8.2f}{target:>8.2f}")
            if rows["fresh"]:
                f = statistics.median(rows["fresh"])
                print(f"{'  with DISTTEST_FORK_SERVER=fresh':34}{f:>9.2f}s{u:>9.2f}s{f / u:>8.2f}")
    print(f"{'floor: python -c import torch':34}{statistics.median(floor):>9.2f}s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
