"""Run every example suite under examples/ and print one line per suite.

Each suite runs in its own interpreter with `python -m unittest -v`; the
exit status is non-zero if any suite fails.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    failed = 0
    suites = sorted(HERE.glob("test_*.py"))
    for suite in suites:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", suite.name],
            cwd=HERE, capture_output=True, text=True, timeout=240,
        )
        took = time.monotonic() - start
        status = "ok" if proc.returncode == 0 else "FAILED"
        summary = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        print(f"{status:6} {suite.name:40} {took:6.1f}s  {summary}")
        if proc.returncode != 0:
            failed += 1
            print(proc.stdout + proc.stderr)
    print(f"{len(suites) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
