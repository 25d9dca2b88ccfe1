"""PyTorch's own backend suite (DistributedTest._DistTestBase) on a harness.

    BACKEND=gloo WORLD_SIZE=2 .venv/bin/python benchmarks/distributed_suite.py disttest [-k PATTERN]
    BACKEND=gloo WORLD_SIZE=2 .venv/bin/python benchmarks/distributed_suite.py upstream [-k PATTERN]

Runs every test of the suite that ships in the torch wheel
(torch.testing._internal.distributed.distributed_test) on disttest's
TestDistBackend, or on upstream's, as upstream's test_distributed_spawn.py
does, then prints one JSON line: counts, the time, and the names of the
tests that passed (to compare the two runs: benchmarks/compare_suites.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
import unittest

if "BACKEND" not in os.environ or "WORLD_SIZE" not in os.environ:
    raise SystemExit("set BACKEND and WORLD_SIZE (e.g. BACKEND=gloo WORLD_SIZE=2)")

import torch  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest  # noqa: E402

HARNESS = os.environ.get("SUITE_HARNESS") or (sys.argv[1] if len(sys.argv) > 1 else "disttest")
if HARNESS == "disttest":
    from disttest import TestDistBackend as Base
else:
    from torch.testing._internal.distributed.distributed_test import TestDistBackend as Base


class TestDistBackendWithSpawn(Base, DistributedTest._DistTestBase):  # type: ignore[misc,valid-type]
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Record(unittest.TextTestResult):
    passed: list[str]

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed.append(test.id().rsplit(".", 1)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("harness", choices=("disttest", "upstream"))
    parser.add_argument("-k", default="*", help="fnmatch pattern on test names")
    args = parser.parse_args()
    os.environ["SUITE_HARNESS"] = args.harness  # spawned ranks re-import this module
    names = sorted(n for n in unittest.defaultTestLoader.getTestCaseNames(TestDistBackendWithSpawn)
                   if fnmatch.fnmatch(n, args.k))
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(verbosity=1, resultclass=_Record, stream=sys.stderr)
    _Record.passed = []
    start = time.monotonic()
    result = runner.run(suite)
    elapsed = time.monotonic() - start
    print(json.dumps({
        "harness": args.harness, "backend": os.environ["BACKEND"], "world_size": os.environ["WORLD_SIZE"],
        "run": result.testsRun, "passed": len(_Record.passed), "failed": len(result.failures),
        "errors": len(result.errors), "skipped": len(result.skipped), "seconds": round(elapsed, 1),
        "passed_names": _Record.passed,
        "failed_names": sorted(t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors),
    }))
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
