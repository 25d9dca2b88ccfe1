"""Thread worlds from 8 to 1024 ranks: disttest vs torch.testing._internal.

Each test spawns the world, runs one all_reduce, one broadcast and one
barrier, and joins (issue 26). For each harness and world size a fresh
interpreter runs a class of N such tests (the first pays for starting the
rank threads, the rest show the marginal cost per test) and reports the
median of tests 2..N, the first test's time and how much the process's
resident memory grew per rank. Upstream's harness runs in its own
interpreters (importing it re-registers the "threaded" backend). A world
size upstream does not finish within ``--limit`` seconds is shown as such.
The floor column runs the same body with no harness at all (kept threads one
at a time, c10d's own ``init_process_group``, collectives and destroy, the
least process group a Python group can be): what any thread harness over
c10d costs at least, and its ratio to upstream's.

    .venv/bin/python benchmarks/scale.py [--sizes 8,64,256,1024] [-n N]
        [--json OUT] [--simulated SIM.json] [--plot PNG]

``--simulated`` adds the simulated worlds measured by
``benchmarks/simulated.py --json`` to the plot; ``--plot`` draws time per
test against world size (log-log) with matplotlib.

Targets (issue 26): 1024 ranks at most 1 s per test; 256 to 1024 ranks at
most 5x; 256 ranks at most 0.5x upstream's; the first threaded test in a
process at most 0.1 s.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
import unittest
from collections.abc import Callable

HARNESSES = ("disttest", "upstream")


def worker(harness: str, size: int, n: int) -> dict[str, object]:
    """In a fresh interpreter: run ``n`` tests of ``size`` thread ranks."""
    import psutil
    import torch
    import torch.distributed as dist

    if harness == "disttest":
        from disttest import MultiThreadedTestCase
    else:
        from torch.testing._internal.common_distributed import MultiThreadedTestCase

    class Scale(MultiThreadedTestCase):
        @property
        def world_size(self) -> int:
            return size

        def setUp(self) -> None:
            super().setUp()
            self._spawn_threads()

    def body(self: unittest.TestCase) -> None:
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.barrier()

    names = [f"test_{i}" for i in range(n)]
    for name in names:
        setattr(Scale, name, body)
    times: list[float] = []

    class Timed(unittest.TextTestResult):
        def startTest(self, test: unittest.TestCase) -> None:
            self.began = time.perf_counter()
            super().startTest(test)

        def stopTest(self, test: unittest.TestCase) -> None:
            super().stopTest(test)
            times.append(time.perf_counter() - self.began)

    rss = psutil.Process().memory_info().rss
    with open("/dev/null", "w") as sink:
        result = unittest.TextTestRunner(stream=sink, resultclass=Timed).run(
            unittest.TestSuite([Scale(name) for name in names]))
    grown = psutil.Process().memory_info().rss - rss
    if not result.wasSuccessful():
        raise SystemExit(f"{harness} at {size} ranks failed: {(result.errors + result.failures)[0][1]}")
    return {"harness": harness, "size": size, "first": times[0],
            "marginal": statistics.median(times[1:]) if n > 1 else times[0],
            "kib_per_rank": grown / 1024 / size}


def floor_worker(size: int, n: int) -> dict[str, object]:
    """In a fresh interpreter: the least a thread harness over c10d can cost
    per test, the same body with no harness around it: ``size`` kept threads
    run one at a time, each rank's ``init_process_group``, collectives and
    ``destroy_process_group`` are c10d's own, and its group is the least a
    group can be (each collective a list of arrivals; a rank that is not the
    last hands the turn on and sleeps until the last completes it). No
    timeout, report, tracking or checks of any kind."""
    import threading
    from collections import deque

    import psutil
    import torch
    import torch.distributed as dist
    from torch.futures import Future

    from disttest import _compat

    ready: deque[threading.Lock] = deque()  # threads that may run, in order
    turn = threading.Lock()  # guards ready
    arrivals: dict[int, list[tuple[int, list[torch.Tensor], threading.Lock | None]]] = {}

    def hand_on() -> None:
        with turn:
            nxt = ready.popleft() if ready else None
        if nxt is not None:
            nxt.release()

    class Work(_compat.work_base()):  # type: ignore[misc]
        def __init__(self, gate: threading.Lock | None) -> None:
            super().__init__()
            self.gate = gate

        def wait(self, timeout: object = None) -> bool:
            if self.gate is not None:
                hand_on()
                self.gate.acquire()
            return True

        def get_future(self) -> Future:  # type: ignore[type-arg]
            fut: Future = Future()  # type: ignore[type-arg]
            fut.set_result(None)
            return fut

    class Group(dist.ProcessGroup):
        def __init__(self, rank: int, world: int) -> None:
            super().__init__(rank, world)
            self.seq = 0

        def _join(self, tensors: list[torch.Tensor], finish: Callable[[list[list[torch.Tensor]]], None]) -> Work:
            self.seq += 1
            calls = arrivals.setdefault(self.seq, [])
            if len(calls) + 1 < self.size():
                gate = threading.Lock()
                gate.acquire()
                calls.append((self.rank(), tensors, gate))
                return Work(gate)
            del arrivals[self.seq]
            calls.append((self.rank(), tensors, None))
            finish([t for _, t, _ in sorted(calls, key=lambda c: c[0])])  # by rank
            with turn:
                ready.extend(g for _, _, g in calls if g is not None)
            return Work(None)

        def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> Work:
            def finish(each: list[list[torch.Tensor]]) -> None:
                total = torch.stack([t[0] for t in each]).sum(0)
                for t in each:
                    t[0].copy_(total)
            return self._join(tensors, finish)

        def broadcast(self, tensors: list[torch.Tensor], opts: object = None) -> Work:
            # (the body's src is 0)
            return self._join(tensors, lambda each: [t[0].copy_(each[0][0]) for t in each[1:]])

        def barrier(self, opts: object = None) -> Work:
            return self._join([], lambda each: None)

        def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
            return "floor"

    dist.Backend.register_backend("floor", lambda store, rank, world, timeout: Group(rank, world), devices=["cpu"])
    store = dist.HashStore()
    _compat.set_thread_isolation(True)
    gates = [threading.Lock() for _ in range(size)]
    for gate in gates:
        gate.acquire()
    finished = threading.Semaphore(0)
    sums: list[float] = []

    def rank_loop(rank: int) -> None:
        while True:
            gates[rank].acquire()
            dist.init_process_group("floor", rank=rank, world_size=size, store=store)
            t = torch.ones(4)
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            dist.barrier()
            sums.append(float(t[0]))
            dist.destroy_process_group()
            hand_on()
            finished.release()

    for rank in range(size):
        threading.Thread(target=rank_loop, args=(rank,), daemon=True).start()
    rss = psutil.Process().memory_info().rss
    times = []
    for _ in range(n):
        began = time.perf_counter()
        sums.clear()
        _compat.set_c10d_world(_compat.new_c10d_world(per_thread=True))
        with turn:
            ready.extend(gates[1:])
        gates[0].release()
        for _ in range(size):
            finished.acquire()
        times.append(time.perf_counter() - began)
        if sums != [float(size)] * size:
            raise SystemExit(f"the floor's all_reduce at {size} ranks is wrong: {sorted(set(sums))}")
    grown = psutil.Process().memory_info().rss - rss
    return {"harness": "floor", "size": size, "first": times[0], "marginal": statistics.median(times[1:]),
            "kib_per_rank": grown / 1024 / size}


def measure(harness: str, size: int, n: int, limit: float) -> dict[str, object] | None:
    """One fresh interpreter's figures, or None if it did not finish in ``limit`` s."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", harness, str(size), str(n)],
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"{harness} at {size} ranks: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(rows: list[dict[str, object]], sizes: list[int]) -> None:
    got = {(r["harness"], r["size"]): r for r in rows}
    print(f"{'ranks':>6} {'disttest s/test':>16} {'upstream s/test':>16} {'ratio':>6} {'KiB/rank':>9} "
          f"{'floor s/test':>13} {'floor ratio':>12}")
    for size in sizes:
        mine, theirs, floor = (got.get((h, size)) for h in ("disttest", "upstream", "floor"))
        ratio = f"{mine['marginal'] / theirs['marginal']:.2f}" if mine and theirs else "-"
        least = f"{floor['marginal'] / theirs['marginal']:.2f}" if floor and theirs else "-"
        print(f"{size:>6} {fmt(mine):>16} {fmt(theirs):>16} {ratio:>6} "
              f"{(mine or {}).get('kib_per_rank', float('nan')):>9.1f} {fmt(floor):>13} {least:>12}")
    for harness in HARNESSES:
        a, b = got.get((harness, 256)), got.get((harness, 1024))
        if a and b:
            print(f"{harness}: 256 -> 1024 ranks costs {b['marginal'] / a['marginal']:.1f}x")


def fmt(row: dict[str, object] | None) -> str:
    return "did not finish" if row is None else f"{row['marginal']:.3f}"


def first_test(n: int) -> None:
    """The first 4-rank threaded test in a process (median over ``n`` processes)."""
    for harness in HARNESSES:
        firsts = [measure(harness, 4, 1, 120)["first"] for _ in range(n)]  # type: ignore[index]
        print(f"first 4-rank test in a process, {harness}: {statistics.median(firsts):.3f} s")


def plot(rows: list[dict[str, object]], simulated: list[dict[str, object]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for harness, style in (("disttest", "o-"), ("upstream", "s--")):
        points = sorted((r["size"], r["marginal"]) for r in rows if r["harness"] == harness)
        if points:
            ax.plot(*zip(*points, strict=True), style, label=f"threads, {harness}")
    for label, key, style in (("simulated, disttest", "seconds", "^-"), ("simulated, upstream", "upstream", "v--")):
        points = sorted((r["size"], r[key]) for r in simulated if r.get(key) is not None)
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("seconds per test")
    ax.set_title("Time per test against world size (2 cores, torch CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        work = floor_worker if sys.argv[2] == "floor" else functools.partial(worker, sys.argv[2])
        print(json.dumps(work(int(sys.argv[3]), int(sys.argv[4]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256,1024", help="world sizes, comma-separated")
    parser.add_argument("-n", type=int, default=6, help="tests per class (default 6)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per interpreter (default 600)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--simulated", help="benchmarks/simulated.py --json output, for the plot")
    parser.add_argument("--plot", help="draw the plot into this PNG")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected comma-separated integers")
    if args.n < 2 or any(s < 1 for s in sizes):
        parser.error(f"-n {args.n} / --sizes {args.sizes!r}: need at least 2 tests and sizes >= 1")
    import torch

    print(f"torch {torch.__version__}, {args.n} tests per class, marginal = median of tests 2..{args.n}")
    rows = []
    for size in sizes:
        for harness in (*HARNESSES, "floor"):
            row = measure(harness, size, args.n, args.limit)
            if row is not None:
                rows.append(row)
    report(rows, sizes)
    first_test(5)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        simulated = []
        if args.simulated:
            with open(args.simulated) as f:
                simulated = json.load(f)
        plot(rows, simulated, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
