"""Compare two runs of benchmarks/distributed_suite.py (their JSON lines).

    .venv/bin/python benchmarks/compare_suites.py disttest.json upstream.json

Prints both runs' counts and times, the speed-up, and the tests that pass
under one harness but not under the other. Exit status 1 if a test that
passes upstream does not pass on disttest, or disttest passes fewer.
"""

from __future__ import annotations

import json
import sys


def load(path: str) -> dict:
    with open(path) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def main() -> int:
    mine, theirs = load(sys.argv[1]), load(sys.argv[2])
    print(f"backend {mine['backend']}, world size {mine['world_size']}")
    for run in (mine, theirs):
        print(f"  {run['harness']:9} run {run['run']:4}  passed {run['passed']:4}  failed {run['failed']:3}  "
              f"errors {run['errors']:3}  skipped {run['skipped']:4}  {run['seconds']:8.1f}s")
    print(f"  speed-up: {theirs['seconds'] / mine['seconds']:.1f}x")
    lost = sorted(set(theirs["passed_names"]) - set(mine["passed_names"]))
    gained = sorted(set(mine["passed_names"]) - set(theirs["passed_names"]))
    print(f"  pass upstream only: {lost or 'none'}")
    print(f"  pass on disttest only: {gained or 'none'}")
    return 1 if lost or mine["passed"] < theirs["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
