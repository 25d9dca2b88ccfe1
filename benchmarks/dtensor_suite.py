"""PyTorch's own DTensor test files, under torch's harness and under disttest.

    .venv/bin/python benchmarks/dtensor_suite.py FOLDER [-k PATTERN] [--upstream-max N]

FOLDER holds test files from PyTorch's ``test/distributed/tensor/`` (they
stay out of this repository). Get them as a user would, for example::

    mkdir -p /tmp/dtensor_upstream && cd /tmp/dtensor_upstream
    for f in test_init.py test_api.py test_tensor_ops.py; do
      curl -fsSLO https://raw.githubusercontent.com/pytorch/pytorch/main/test/distributed/tensor/$f
    done

(use the tag or commit closest to the installed torch: ``v2.13.0`` for 2.13).
Each file is copied twice into a temporary folder: once as it is (torch's
harness: ``torch.testing._internal.distributed._tensor.common_dtensor``) and
once after the README's migration ``sed`` line (disttest). Each copy runs in
its own Python process, every test through a recording ``unittest`` result;
the script prints, per file and harness, the counts of passed / failed /
errors / skipped tests, the time, and the mean time of a process-based test
(DTensorTestBase, one set of rank processes per test), then the ratio, and
lists every test that passes under torch's harness but not under disttest.
``--json FILE`` saves every test's outcome and time; ``--from-json FILE``
prints the table of a saved run again.
``--upstream-max N`` time-boxes torch's side to the first N tests of each
file (upstream spawns 4 fresh interpreters per test); the counts then cover
those tests on both sides. Exit status 1 when a test lost its pass.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESSES = ("upstream", "disttest")


def migrate(paths: list[str]) -> None:
    """The README's migration command (the thing measured), on ``paths``."""
    subprocess.run([sys.executable, "-m", "disttest.migrate", "-q", *paths], check=True)


class _Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, Any]] = {}
        self._start = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._start = time.perf_counter()

    def _set(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        row = self.rows.setdefault(test.id(), {"outcome": "passed", "seconds": 0.0, "detail": ""})
        if row["outcome"] == "passed" or outcome != "passed":
            row["outcome"], row["detail"] = outcome, detail[-600:]

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.rows.setdefault(test.id(), {"outcome": "passed", "seconds": 0.0, "detail": ""})
        self.rows[test.id()]["seconds"] = time.perf_counter() - self._start
        self.rows[test.id()]["process_based"] = _process_based(test)

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._set(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._set(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        self._set(test, "errors", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._set(test, "skipped", reason)

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any) -> None:
        if err is not None:
            kind = "failed" if issubclass(err[0], test.failureException) else "errors"
            self._set(test, kind, self._exc_info_to_string(err, test))


def _process_based(test: unittest.TestCase) -> bool:
    """A test with fresh rank processes (not a pool, threads or local tensors)."""
    names = [c.__name__ for c in type(test).__mro__]
    return ("MultiProcessTestCase" in names and "LocalDTensorTestBase" not in names
            and not type(test).__name__.endswith("WithLocalTensor"))


def run_one(folder: str, module: str, pattern: str, limit: int | None) -> None:
    """In a child process: run one test module, print one JSON line."""
    sys.argv = [sys.argv[0]]  # torch's common_utils parses argv at import
    sys.path.insert(0, folder)
    os.chdir(folder)
    mod = __import__(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    tests = [t for t in _flatten(suite) if fnmatch.fnmatch(t.id().rsplit(".", 1)[-1], pattern)]
    if limit is not None:
        tests = tests[:limit]
    result = _Recorder()
    start = time.perf_counter()
    unittest.TestSuite(tests).run(result)
    print(json.dumps({"seconds": time.perf_counter() - start, "tests": result.rows}))


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for item in suite:
        out.extend(_flatten(item) if isinstance(item, unittest.TestSuite) else [item])  # type: ignore[arg-type]
    return out


def run_file(copy_dir: str, module: str, pattern: str, limit: int | None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", copy_dir, module, "-k", pattern]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"seconds"')]
    if not lines:
        raise SystemExit(f"{module} in {copy_dir} produced no result (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def summary(run: dict[str, Any]) -> dict[str, Any]:
    rows = run["tests"].values()
    counts = {k: sum(1 for r in rows if r["outcome"] == k) for k in ("passed", "failed", "errors", "skipped")}
    proc = sorted(r["seconds"] for r in rows if r.get("process_based") and r["outcome"] != "skipped")
    counts["seconds"] = run["seconds"]
    counts["per_process_test"] = sum(proc) / len(proc) if proc else None
    counts["median_process_test"] = proc[len(proc) // 2] if proc else None
    return counts


def print_report(report: dict[str, Any]) -> list[str]:
    """Print the table; return the tests that lost their pass under disttest."""
    print(f"{'file':24} {'harness':9} {'pass':>5} {'fail':>5} {'err':>4} {'skip':>5} "
          f"{'seconds':>8} {'s/proc-test':>11} {'median':>7}")
    lost: list[str] = []
    totals = {h: 0.0 for h in HARNESSES}
    for module, runs in report.items():
        for h in HARNESSES:
            s = summary(runs[h])
            totals[h] += s["seconds"]
            per = f"{s['per_process_test']:.2f}" if s["per_process_test"] is not None else "-"
            med = f"{s['median_process_test']:.2f}" if s["median_process_test"] is not None else "-"
            print(f"{module:24} {h:9} {s['passed']:5} {s['failed']:5} {s['errors']:4} {s['skipped']:5} "
                  f"{s['seconds']:8.1f} {per:>11} {med:>7}")
        up, dt = summary(runs["upstream"]), summary(runs["disttest"])
        if up["per_process_test"] and dt["per_process_test"]:
            print(f"{'':24} ratio: {up['per_process_test'] / dt['per_process_test']:.1f}x per process-based "
                  f"test (mean), {up['median_process_test'] / dt['median_process_test']:.1f}x (median), "
                  f"{up['seconds'] / max(dt['seconds'], 1e-9):.1f}x for the file")
        else:
            print(f"{'':24} ratio: {up['seconds'] / max(dt['seconds'], 1e-9):.1f}x for the file")
        for test_id, row in runs["upstream"]["tests"].items():
            theirs = runs["disttest"]["tests"].get(test_id, {"outcome": "missing"})
            if row["outcome"] == "passed" and theirs["outcome"] != "passed":
                lost.append(f"{test_id}: {theirs['outcome']} under disttest {theirs.get('detail', '')[-300:]}")
    print(f"total seconds: upstream {totals['upstream']:.1f}, disttest {totals['disttest']:.1f} "
          f"({totals['upstream'] / max(totals['disttest'], 1e-9):.1f}x)")
    print("passes lost under disttest: " + (str(len(lost)) if lost else "none"))
    for line in lost:
        print("  " + line)
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?")
    parser.add_argument("-k", default="*", help="fnmatch pattern on test method names")
    parser.add_argument("--upstream-max", type=int, default=None, help="first N tests per file on both sides")
    parser.add_argument("--json", help="also write every test's outcome and time to this file")
    parser.add_argument("--from-json", help="print the table of a run saved with --json (no run)")
    parser.add_argument("--run-one", nargs=2, metavar=("DIR", "MODULE"), help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        run_one(args.run_one[0], args.run_one[1], args.k, args.limit)
        return
    if args.from_json:
        with open(args.from_json) as saved:
            sys.exit(1 if print_report(json.load(saved)) else 0)
    if not args.folder or not os.path.isdir(args.folder):
        parser.error(f"FOLDER {args.folder!r} is not a directory of test files")
    files = sorted(f for f in os.listdir(args.folder) if re.fullmatch(r"test_\w+\.py", f))
    if not files:
        parser.error(f"no test_*.py files in {args.folder!r}")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dtensor-suite-") as tmp:
        dirs = {h: os.path.join(tmp, h) for h in HARNESSES}
        for d in dirs.values():
            os.mkdir(d)
            for f in files:
                shutil.copy(os.path.join(args.folder, f), d)
        ported = [os.path.join(dirs["disttest"], f) for f in files]
        migrate(ported)
        for f in files:
            module = f[:-3]
            report[module] = {h: run_file(dirs[h], module, args.k, args.upstream_max) for h in HARNESSES}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    lost = print_report(report)
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
