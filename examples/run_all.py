"""Run every example suite under examples/ and print one line per suite.

Each suite runs in its own interpreter with `python -m unittest -v`, with
a temp folder of its own (TMPDIR); a suite fails if it fails or if it leaves
anything in that folder. The exit status is non-zero if any suite fails.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    failed = 0
    suites = sorted(HERE.glob("test_*.py"))
    for suite in suites:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="disttest-example-") as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "unittest", "-v", suite.name],
                cwd=HERE, capture_output=True, text=True, timeout=240,
                env=dict(os.environ, TMPDIR=tmp),
            )
            # torch's own compile cache (torchinductor_<user>, made by DDP too) is
            # kept across runs by design: not a test's leftover.
            left = sorted(n for n in os.listdir(tmp) if not n.startswith("torchinductor_"))
        took = time.monotonic() - start
        ok = proc.returncode == 0 and not left
        summary = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        print(f"{'ok' if ok else 'FAILED':6} {suite.name:40} {took:6.1f}s  {summary}")
        if left:
            print(f"left in its temp folder: {', '.join(left)}")
        if not ok:
            failed += 1
            print(proc.stdout + proc.stderr)
    print(f"{len(suites) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
