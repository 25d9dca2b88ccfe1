"""What disttest's collective tracking costs per call, against c10d's own.

Every rank of disttest's runners records each collective it enters and
leaves (the progress board that desync and hang reports read); upstream's
ranks call c10d directly. This times one gloo ``all_reduce`` of 4 elements
at world size 1 in this process, through the tracking wrapper and through
c10d's function, alternating, and prints the medians and the difference;
then the same for a functional ``all_reduce`` and its wait (the path
DTensor, tensor parallelism and FSDP2 take) on a subgroup.

    .venv/bin/python benchmarks/tracking_cost.py [-n 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20000, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=5, help="timings of each (median reported)")
    args = parser.parse_args()
    if args.n < 1 or args.rounds < 1:
        parser.error(f"-n {args.n} --rounds {args.rounds}: each at least 1")
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from disttest._runner import board as boards
    from disttest._runner import functional, tracking

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    direct, direct_functional = dist.all_reduce, funcol.all_reduce
    subgroup = dist.new_group([0])
    undo = tracking.install_tracking()
    with tempfile.TemporaryDirectory() as tmp:
        board = boards.ProgressBoard(os.path.join(tmp, "board"), 1, create=True)
        tracking.track_into(board, 0)
        functional.track_functional()  # (as a rank does at each test's start)
        t = torch.ones(4)

        def per_call(f: object) -> float:
            start = time.perf_counter()
            for _ in range(args.n):
                f(t)  # type: ignore[operator]
            return (time.perf_counter() - start) / args.n * 1e6

        def compare(tracked_call: object, direct_call: object) -> tuple[float, float]:
            per_call(tracked_call), per_call(direct_call)  # warm
            tracked, untracked = [], []
            for _ in range(args.rounds):
                tracked.append(per_call(tracked_call))
                untracked.append(per_call(direct_call))
            return statistics.median(tracked), statistics.median(untracked)

        plain = compare(dist.all_reduce, direct)
        tracked_functional = funcol.all_reduce
        functional_pair = compare(lambda x: funcol.wait_tensor(tracked_functional(x, "sum", subgroup)),
                                  lambda x: funcol.wait_tensor(direct_functional(x, "sum", subgroup)))
        board.close()
    undo()
    dist.destroy_process_group()
    print(f"gloo, world size 1, torch {torch.__version__}, median of {args.rounds} x {args.n} calls")
    for label, (a, b) in (("all_reduce", plain), ("functional all_reduce + wait, a subgroup", functional_pair)):
        print(label)
        print(f"  tracked (disttest's ranks) {a:7.1f} us/call")
        print(f"  c10d's own (upstream's)    {b:7.1f} us/call")
        print(f"  tracking adds              {a - b:7.1f} us/call ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
