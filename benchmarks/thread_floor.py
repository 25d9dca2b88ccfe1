"""What the threaded world itself costs per 4-rank test, without a harness.

A diagnostic for bench_multithread.py: the floor under any thread harness
(disttest's or upstream's) that gives each test a fresh default group. Each
line runs N rounds of four rank threads and prints the mean wall and CPU
time (all threads) per round:

- kept threads, new world: what disttest's thread runner does per test
  with ``DISTTEST_THREAD_SCHEDULING=free`` (fresh threaded world and
  default group, one all_reduce, destroy; the rank threads run at once);
- kept threads, kept group: one all_reduce alone;
- an empty job: handing work to four kept threads and collecting it;
- new threads: the same as the first line in four new threads per round
  (what upstream's harness does).

    .venv/bin/python benchmarks/thread_floor.py [-n N]
    taskset -c 0 .venv/bin/python benchmarks/thread_floor.py   # one core

NB: the rank threads hand the GIL to one another many times per test (each
torch op releases it); across two cores each hand-off costs far more CPU
than on one, so the same work takes about twice the time when the
scheduler spreads the threads. That is what disttest's default, turns
(``disttest/pg/_baton.py``), avoids; ``bench_multithread.py`` measures it.
"""

from __future__ import annotations

import argparse
import importlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from disttest.pg.threaded import BACKEND, _bind_thread, install_threaded_pg, uninstall_threaded_pg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="rounds per line")
    n = parser.parse_args().n
    importlib.import_module("torch.distributed.tensor")  # as the harness does before ranks start

    inboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(4)]
    done: queue.SimpleQueue[int] = queue.SimpleQueue()

    def worker(rank: int) -> None:
        while (job := inboxes[rank].get()) is not None:
            job(rank)
            done.put(rank)

    for rank in range(4):
        threading.Thread(target=worker, args=(rank,), daemon=True).start()

    def on_kept_threads(job: Callable[[int], None]) -> None:
        for inbox in inboxes:
            inbox.put(job)
        for _ in range(4):
            done.get()

    state: dict[str, Any] = {}

    def new_world() -> Any:
        # The rank threads run at once (the world's turns are the thread
        # runner's: nothing here hands them out).
        world = install_threaded_pg()
        world.baton.go_free()
        return world

    def one_test(rank: int) -> None:
        world = state["world"]
        _bind_thread(world)
        dist.init_process_group(backend=BACKEND, rank=rank, world_size=4, store=world.store)
        t = torch.ones(8)
        dist.all_reduce(t)
        dist.destroy_process_group()

    def kept_threads_new_world() -> None:
        state["world"] = new_world()
        on_kept_threads(one_test)
        uninstall_threaded_pg()

    def all_reduce(rank: int) -> None:
        dist.all_reduce(torch.ones(8))

    def new_threads() -> None:
        state["world"] = new_world()
        threads = [threading.Thread(target=one_test, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        uninstall_threaded_pg()

    def measure(label: str, fn: Callable[[], None]) -> None:
        for _ in range(30):
            fn()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn()
        wall, cpu = (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n
        print(f"{label:50}{wall * 1000:>8.2f}ms{cpu * 1000:>8.2f}ms")

    print(f"4 rank threads, {n} rounds, torch {torch.__version__}")
    print(f"{'':50}{'wall':>10}{'cpu':>10}")
    measure("kept threads, new world: init, all_reduce, destroy", kept_threads_new_world)
    state["world"] = world = new_world()
    on_kept_threads(lambda r: (_bind_thread(world), dist.init_process_group(
        backend=BACKEND, rank=r, world_size=4, store=world.store)))
    measure("kept threads, kept group: all_reduce", lambda: on_kept_threads(all_reduce))
    measure("kept threads: an empty job", lambda: on_kept_threads(lambda r: None))
    on_kept_threads(lambda r: dist.destroy_process_group())
    uninstall_threaded_pg()
    measure("new threads, new world: init, all_reduce, destroy", new_threads)
    for inbox in inboxes:
        inbox.put(None)


if __name__ == "__main__":
    main()
