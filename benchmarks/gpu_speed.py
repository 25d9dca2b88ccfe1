"""Fresh 1-rank NCCL tests on a GPU: disttest vs torch.testing._internal.

The same test (a group over NCCL on cuda:0, one all_reduce of a CUDA
tensor, checked) is written into files of 1 and of ``--tests`` tests, once
importing ``MultiProcessTestCase`` from disttest and once from upstream.
Each file runs as ``python file.py`` in a new interpreter, the harnesses
alternating, ``-n`` times. Prints the card, the median one-test file, the
marginal cost of a test (the difference between the two files over the
extra tests) and the ratios, beside the floor (``python -c "import torch"``).

    python benchmarks/gpu_speed.py [-n 3] [--tests 6]

Without a CUDA device it says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SOURCE = """
import unittest
import torch
import torch.distributed as dist
from {module} import MultiProcessTestCase


class Nccl(MultiProcessTestCase):
    @property
    def world_size(self):
        return 1

    def setUp(self):
        super().setUp()
        self._spawn_processes()
{tests}

if __name__ == "__main__":
    unittest.main()
"""

TEST = """
    def test_all_reduce_{i}(self):
        torch.cuda.set_device(0)
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("nccl", store=store, rank=self.rank, world_size=1,
                                device_id=torch.device("cuda", 0))
        t = torch.full((1024,), 2.0, device="cuda")
        dist.all_reduce(t)
        assert t.sum().item() == 2048.0, t
        dist.destroy_process_group()
"""

MODULES = {"disttest": "disttest", "upstream": "torch.testing._internal.common_distributed"}


def write(folder: str, harness: str, tests: int) -> str:
    path = os.path.join(folder, f"{harness}_{tests}.py")
    with open(path, "w") as f:
        f.write(SOURCE.format(module=MODULES[harness], tests="".join(TEST.format(i=i) for i in range(tests))))
    return path


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return elapsed


def card() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "unknown card"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="runs of each file (median reported)")
    parser.add_argument("--tests", type=int, default=6, help="tests in the longer file (at least 2)")
    args = parser.parse_args()
    if args.n < 1:
        parser.error(f"-n {args.n}: at least 1")
    if args.tests < 2:
        parser.error(f"--tests {args.tests}: at least 2 (the marginal cost is a difference)")
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_speed: no CUDA device (torch {torch.__version__}); nothing to measure")
        return
    print(f"fresh 1-rank NCCL tests, python file.py, median of {args.n} runs; {card()}; "
          f"torch {torch.__version__}; {os.cpu_count()} cores")
    times: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {(h, k): write(tmp, h, k) for h in MODULES for k in (1, args.tests)}
        floor = [timed([sys.executable, "-c", "import torch, torch.distributed"]) for _ in range(args.n)]
        print(f"  floor (python -c import torch): {statistics.median(floor):.3f}s", flush=True)
        for run in range(args.n):  # alternating, so a busy spell falls on both
            for key, path in files.items():
                times.setdefault(key, []).append(timed([sys.executable, path]))
                print(f"  run {run + 1}: {key[0]}, {key[1]} test(s): {times[key][-1]:.3f}s", flush=True)
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'':28}{'disttest':>10}{'upstream':>10}{'ratio':>8}{'speed-up':>10}")
    one = (med["disttest", 1], med["upstream", 1])
    marginal = tuple((med[h, args.tests] - med[h, 1]) / (args.tests - 1) for h in MODULES)
    for label, (d, u) in (("one-test file", one), (f"marginal per test (of {args.tests})", marginal)):
        print(f"{label:28}{d:>9.3f}s{u:>9.3f}s{d / u:>8.2f}{u / d:>9.1f}x")
    print(f"{'floor: python -c import torch':28}{statistics.median(floor):>9.3f}s")


if __name__ == "__main__":
    main()
