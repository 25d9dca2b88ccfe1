"""The verdict of one failing rank whose peers wait in a collective: the same
in every run, quiet and under load (issue 24).

Rank 2 of 4 fails an assertion while ranks 0, 1 and 3 wait in a collective
that rank 2's leaving breaks. The right verdict is a FAIL that names rank 2
alone ("rank 2/4 raised AssertionError"); the peers' communication errors
("Connection closed by peer") are consequences. Each body runs N times on
every runner, first on the quiet machine, then with busy processes loading
every core, and the script prints how many runs gave the right verdict and
what the wrong ones said. Bodies:

- ``full_tensor``: the issue's DTensor case (tests/dtensor_cases.py);
  ``with_comms`` destroys rank 2's group as it leaves, before it reports;
- ``funcol all_gather``: a functional collective, issued from C++
  (disttest's tracking does not see the call, only its traceback does);
- ``all_reduce``: a collective disttest tracks.

    .venv/bin/python benchmarks/verdicts.py [-n 20] [--busy N]

Exits non-zero unless every run of every body gave the right verdict.
Upstream's harness is not run beside it: it reports the first failing
process it polls, so the count would measure its poll order, not a verdict.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import unittest
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import dtensor_cases  # noqa: E402
import runner_cases  # noqa: E402

BODIES = [
    ("full_tensor", "test_rank_2_fails_in_full_tensor",
     {"processes": dtensor_cases.FourRanks, "pool": dtensor_cases.FourRanksPool,
      "threads": dtensor_cases.FourThreads}),
    ("funcol all_gather", "test_wide_assert_while_peers_gather",
     {"processes": runner_cases.ProcessRunner, "pool": runner_cases.PoolRunner,
      "threads": runner_cases.ThreadRunner}),
    ("all_reduce", "test_wide_assert_while_peers_reduce",
     {"processes": runner_cases.ProcessRunner, "pool": runner_cases.PoolRunner,
      "threads": runner_cases.ThreadRunner}),
]
RIGHT = "failed (disttest): rank 2/4 raised AssertionError"


def _verdict(result: unittest.TestResult) -> str:
    """The report's header, or what else unittest recorded."""
    for kind, entries in (("FAIL", result.failures), ("ERROR", result.errors)):
        for _, text in entries:
            header = next((line for line in text.splitlines() if "(disttest): " in line), text.splitlines()[-1])
            return f"{kind} {header.split('(disttest): ', 1)[-1]}" if "(disttest)" in header else f"{kind} {header}"
    return "passed" if result.wasSuccessful() else "?"


def _runs(cls: type, name: str, n: int) -> Counter[str]:
    """``n`` runs of one test; for a pool, ``n`` tests in one class run."""
    verdicts: Counter[str] = Counter()
    for _ in range(n):
        result = unittest.TestResult()
        unittest.TestSuite([cls(name)]).run(result)
        ok = not result.errors and len(result.failures) == 1 and RIGHT + "\n" in result.failures[0][1]
        verdicts["right" if ok else _verdict(result)] += 1
    return verdicts


def _busy() -> None:
    while True:
        pass


def _table(n: int, load: str) -> bool:
    print(f"\n{load}: {n} runs of each body on each runner")
    print(f"  {'body':<20}{'runner':<11}{'right':>7}   wrong verdicts")
    all_right = True
    for label, name, runners in BODIES:
        for runner, cls in runners.items():
            start = time.monotonic()
            verdicts = _runs(cls, name, n)
            right = verdicts.pop("right", 0)
            all_right &= right == n
            wrong = "; ".join(f"{c}x {v}" for v, c in verdicts.most_common()) or "-"
            print(f"  {label:<20}{runner:<11}{right:>4}/{n}   {wrong}   ({time.monotonic() - start:.0f}s)",
                  flush=True)
    return all_right


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="runs of each body on each runner")
    parser.add_argument("--busy", type=int, default=max(2, os.cpu_count() or 1),
                        help="busy processes for the loaded round (default: the cores, at least 2)")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} cores")
    ok = _table(args.n, "quiet")
    ctx = multiprocessing.get_context("spawn")
    busy = [ctx.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        ok &= _table(args.n, f"under load ({args.busy} busy processes)")
    finally:
        for p in busy:
            p.kill()
            p.join()
    print("\nevery run gave the right verdict" if ok else "\nSOME RUNS GAVE THE WRONG VERDICT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
