"""``make stress``: the runner tests, several rounds in a row, while busy
processes load every core (issue 12: what passes on a quiet machine must
pass on a saturated one).

Usage: python tests/stress.py [--rounds 5] [--busy N] [pytest args...]
(default busy processes: the number of cores, at least two). Exits non-zero
if any round failed, naming the failures of each round.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
#: The runner tests: every runner's behaviours (hostile ones included), the
#: pool, threads, the fault battery and the launchers (about 2 minutes a round on a 2-core
#: machine, under 3 with two busy processes).
DEFAULT = ["test_runners.py", "test_continuous.py", "test_multithread.py", "test_faults.py", "test_launchers.py"]


def _busy() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", type=int, default=max(2, os.cpu_count() or 1))
    args, pytest_args = parser.parse_known_args()
    files = pytest_args or [os.path.join(TESTS, f) for f in DEFAULT]
    ctx = multiprocessing.get_context("spawn")
    busy = [ctx.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    failed = []
    try:
        for n in range(1, args.rounds + 1):
            start = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                                  *files], cwd=os.path.dirname(TESTS), capture_output=True, text=True)
            lines = out.stdout.strip().splitlines()
            summary = lines[-1] if lines else out.stderr.strip()[-200:]
            print(f"round {n}/{args.rounds} ({time.monotonic() - start:.0f}s, {args.busy} busy): {summary}",
                  flush=True)
            if out.returncode != 0:
                failed.append(n)
                for line in lines:
                    if line.startswith(("FAILED", "ERROR", "SUBFAILED")):
                        print("  " + line, flush=True)
                # Kept on purpose: what failed under load is the point of the run.
                fd, path = tempfile.mkstemp(prefix=f"disttest-stress-round{n}-", suffix=".log")
                with os.fdopen(fd, "w") as f:
                    f.write(out.stdout + out.stderr)
                print(f"  the whole output of round {n} is kept in {path}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.join()
    print(f"stress: {args.rounds - len(failed)}/{args.rounds} rounds passed" +
          (f"; failed: rounds {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
