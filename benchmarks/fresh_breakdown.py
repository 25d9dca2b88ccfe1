"""Fresh rank processes: where a 4-rank test's time goes (issue 26, item 3).

One 4-rank gloo test (init through the test's file store, one all_reduce,
destroy) runs, in this one process:

- under disttest's ``MultiProcessTestCase``, plain (the per-test time), then
  again with every phase timestamped: the test process's, the fork
  server's and each rank's (``time.monotonic`` is one clock for every
  process of the machine), by wrapping the functions named in ``PHASES``;
- as the floor: four ranks forked from this process (torch and disttest
  imported, no tensor work done), each running the same body, the parent
  waiting for their exits; no harness at all;
- under ``torch.testing._internal``'s ``MultiProcessTestCase`` (a few runs:
  about 6 s each), for the ratio.

It prints the timeline of a disttest test (median ms from the test's start
over the traced runs) beside the floor's, and what the harness adds::

    .venv/bin/python benchmarks/fresh_breakdown.py [-n 20] [--upstream 3]

Target (issue 26): per test at least 100x faster than upstream's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import unittest
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase as Upstream

from disttest import MultiProcessTestCase
from disttest._runner import launcher, zygote
from disttest._runner import rank as rank_mod

WORLD = 4
#: A folder: while it holds a file "on", every process appends its events to
#: its file "trace" (set before the fork server starts, so that it knows it).
TRACE_ENV = "BENCH_TRACE_DIR"


def mark(what: str) -> None:
    """Append ``what`` and the time to the trace, if tracing is on."""
    folder = os.environ.get(TRACE_ENV)
    if not folder or not os.path.exists(os.path.join(folder, "on")):
        return
    fd = os.open(os.path.join(folder, "trace"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps([time.monotonic(), os.getpid(), what]) + "\n").encode())
    finally:
        os.close(fd)


def body(self: Any) -> None:
    mark("body>")
    store = dist.FileStore(self.file_name, WORLD)
    dist.init_process_group("gloo", store=store, rank=self.rank, world_size=WORLD)
    mark("inited")
    t = torch.ones(4) * self.rank
    dist.all_reduce(t)
    mark("reduced")
    assert t[0].item() == sum(range(WORLD))
    dist.destroy_process_group()
    mark("destroyed")


def _wrap(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)  # NB: fails loudly when a traced function is renamed

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        mark(label + ">")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(label + "<")

    setattr(owner, name, traced)


def _traced_fork() -> int:
    pid = _real_fork()
    if pid:
        mark("forked")
    return pid


def _traced_reap(children: dict[int, Any], outbox: Any) -> None:
    before = len(children)
    _real_reap(children, outbox)
    if len(children) < before:
        mark("reaped")


#: (owner, function, label): the phases of a fresh-process test, wrapped in
#: every process that imports this module (the fork server imports it to
#: find the test class, before it forks the ranks).
PHASES: list[tuple[Any, str, str]] = [
    (rank_mod, "_prepare", "prepare"),
    (rank_mod, "_run_one", "run_one"),
    (rank_mod, "_exit", "exit"),
    (zygote.ZygoteLauncher, "start", "start"),
    (launcher.ProcessLauncher, "close", "close"),
]
_real_fork: Callable[[], int] = os.fork
_real_reap = zygote._reap
for owner, name, label in PHASES:
    _wrap(owner, name, label)
if __name__ != "__main__":  # in the fork server: its forks and reaps
    os.fork = _traced_fork
    zygote._reap = _traced_reap
del owner, name, label


class _Fresh:
    """The test, on whichever harness's MultiProcessTestCase it is mixed into."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self._spawn_processes()  # type: ignore[attr-defined]

    @property
    def world_size(self) -> int:
        return WORLD

    test_body = body


class Fresh(_Fresh, MultiProcessTestCase):
    pass


def _run_case(cls: type[unittest.TestCase]) -> float:
    result = unittest.TestResult()
    start = time.perf_counter()
    mark("test>")
    cls("test_body").run(result)
    mark("test<")
    elapsed = time.perf_counter() - start
    if not result.wasSuccessful():
        raise SystemExit(f"{cls.__name__} failed: {result.errors + result.failures}")
    return elapsed


def _floor_rank(rank: int, path: str) -> None:
    torch.set_num_threads(1)  # as disttest's ranks (the fork trap)
    mark("body>")
    store = dist.FileStore(path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    mark("inited")
    t = torch.ones(4)
    dist.all_reduce(t)
    mark("reduced")
    dist.destroy_process_group()
    mark("destroyed")
    mark("exit>")
    os._exit(0)


def _run_floor() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rendezvous")
        open(path, "w").close()
        start = time.perf_counter()
        mark("test>")
        pids = []
        for rank in range(WORLD):
            pid = os.fork()
            if pid == 0:
                try:
                    _floor_rank(rank, path)
                finally:
                    os._exit(1)
            mark("forked")
            pids.append(pid)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            mark("reaped")
            if status != 0:
                raise SystemExit(f"a floor rank ended with wait status {status}")
        mark("test<")
        return time.perf_counter() - start


def _timelines(path: str) -> dict[str, tuple[float, float]]:
    """Each event's median (first, last) time in ms from its test's start."""
    with open(path) as f:
        rows = sorted(json.loads(line) for line in f)
    runs: list[dict[str, list[float]]] = []
    start = 0.0
    for t, _pid, what in rows:
        if what == "test>":
            runs.append({})
            start = t
        elif runs:
            runs[-1].setdefault(what, []).append((t - start) * 1000)
    events = {k for run in runs for k in run}
    return {
        k: (statistics.median(min(r[k]) for r in runs if k in r), statistics.median(max(r[k]) for r in runs if k in r))
        for k in events
    }


#: (label, event, first or last of the ranks): the rows of the timeline.
ROWS = [
    ("test process: run dir, channel; Start sent", "start>", 0),
    ("fork server: first rank forked", "forked", 0),
    ("fork server: last rank forked", "forked", 1),
    ("last rank prepared (environment, output, tracking)", "prepare<", 1),
    ("last rank in the test body", "body>", 1),
    ("body: last rank out of the rendezvous", "inited", 1),
    ("body: last rank out of the all_reduce", "reduced", 1),
    ("body: last rank out of destroy", "destroyed", 1),
    ("last rank answered (Done)", "run_one<", 1),
    ("last rank exiting (after Leave)", "exit>", 1),
    ("last rank reaped", "reaped", 1),
    ("test returned (join, verdict, cleanup)", "test<", 0),
]


def _table(d: dict[str, tuple[float, float]], f: dict[str, tuple[float, float]]) -> None:
    print(f"{'':52}{'disttest':>10}{'floor':>10}")
    for label, event, which in ROWS:
        mine = f"{d[event][which]:8.1f}ms" if event in d else "-"
        floor = f"{f[event][which]:8.1f}ms" if event in f else "-"
        print(f"{label:52}{mine:>10}{floor:>10}")
    prep = [d["prepare<"][0] - d["prepare>"][0], d["prepare<"][1] - d["prepare>"][1]]
    print(f"(a rank's prepare: {min(prep):.1f} to {max(prep):.1f} ms)")


class UpstreamFresh(_Fresh, Upstream):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="runs of each kind (default 20)")
    parser.add_argument("--upstream", type=int, default=3, help="upstream runs (default 3; 0: none)")
    args = parser.parse_args()
    if args.n < 2:
        parser.error(f"-n {args.n}: at least 2 (the first disttest run starts the fork server)")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[TRACE_ENV] = tmp
        _run_case(Fresh)  # starts the fork server
        plain = statistics.median(_run_case(Fresh) for _ in range(args.n))
        floor_plain = statistics.median(_run_floor() for _ in range(args.n))
        timelines = {}
        for kind, run in (("disttest", lambda: _run_case(Fresh)), ("floor", _run_floor)):
            open(os.path.join(tmp, "on"), "w").close()
            for _ in range(args.n):
                run()
            os.remove(os.path.join(tmp, "on"))
            timelines[kind] = _timelines(os.path.join(tmp, "trace"))
            os.remove(os.path.join(tmp, "trace"))
        d, f = timelines["disttest"], timelines["floor"]
    print(f"{WORLD}-rank gloo test (init, all_reduce, destroy), {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"median of {args.n} traced runs, ms from the test's start; the ranks' events: the last rank's")
    _table(d, f)
    print(f"per test, untraced: disttest {plain * 1000:.1f} ms, floor {floor_plain * 1000:.1f} ms, "
          f"harness {(plain - floor_plain) * 1000:.1f} ms")
    if args.upstream:
        up = statistics.median(_run_case(UpstreamFresh) for _ in range(args.upstream))
        print(f"upstream {up * 1000:.0f} ms per test: disttest {up / plain:.0f}x faster (target >= 100x), "
              f"the floor {up / floor_plain:.0f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
