"""PyTorch's own distributed test files, as they are and migrated to disttest.

    .venv/bin/python benchmarks/migrated_suites.py DIR [--timeout SECONDS] [--json OUT] [-k PATTERN]

DIR holds test files from PyTorch's ``test/distributed/`` (they stay out of
this repository; use the commit of the installed torch). Its ``*.py`` files
are copied into two temporary folders and one copy is rewritten with
``python -m disttest.migrate`` (the thing measured). Each ``test_*.py`` file
then runs on each side in its own process, with the same command::

    python -m pytest -q -p no:cacheprovider --junitxml=OUT.xml --rootdir=COPY [-k PATTERN] FILE

(the installed disttest pytest plugin is loaded on both sides; each file runs
in its own session, whose leftover processes are killed when it ends). A file that
runs past ``--timeout`` (default 900 s) has its whole process tree killed
and counts as timed out, with no outcomes. The script prints, per file, the
passes, failures, errors and skips of each side, the seconds, and the ratio
upstream/disttest; then the totals; then every test that passes upstream but
not migrated ("lost") and every test that passes only migrated. ``--json``
saves every test's outcome and failure text. Exit status 1 if a pass was
lost. The temporary folders go at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

SIDES = ("upstream", "disttest")
OUTCOMES = ("passed", "failed", "error", "skipped")
DETAIL_CHARS = 4000
TAIL_CHARS = 3000


@dataclass
class CaseResult:
    outcome: str  # one of OUTCOMES
    detail: str = ""


@dataclass
class FileRun:
    """One file on one side: its tests' outcomes, the wall time, how it ended."""

    seconds: float
    status: str  # "ok", "timed out", or "no report (exit N)"
    tests: dict[str, CaseResult] = field(default_factory=dict)
    tail: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests.values() if t.outcome == outcome)

    def passed(self) -> set[str]:
        return {name for name, t in self.tests.items() if t.outcome == "passed"}


def parse_junit(text: str) -> dict[str, CaseResult]:
    """pytest's JUnit XML -> {"module.Class::test": result}. A test reported
    twice (a teardown error after a pass) keeps its worst outcome."""
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    tests: dict[str, CaseResult] = {}
    for case in ET.fromstring(text).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        result = CaseResult("passed")
        for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None and rank[outcome] > rank[result.outcome]:
                # The message (the exception's first line) first, then the end of the report.
                parts = (node.get("message", "")[:DETAIL_CHARS], (node.text or "")[-DETAIL_CHARS:])
                result = CaseResult(outcome, "\n".join(x for x in parts if x))
        old = tests.get(name)
        if old is None or rank[result.outcome] > rank[old.outcome]:
            tests[name] = result
    return tests


def compare(upstream: FileRun, disttest: FileRun) -> tuple[list[str], list[str]]:
    """(lost, gained): tests passing upstream only, and migrated only."""
    return sorted(upstream.passed() - disttest.passed()), sorted(disttest.passed() - upstream.passed())


def ratio(upstream_seconds: float, disttest_seconds: float) -> str:
    if disttest_seconds <= 0:
        return "-"
    return f"{upstream_seconds / disttest_seconds:.1f}x"


def _cells(run: FileRun) -> str:
    mark = {"ok": " ", "timed out": "T"}.get(run.status, "!")
    return (f"{run.count('passed'):5} {run.count('failed'):4} {run.count('error'):4} "
            f"{run.count('skipped'):4} {run.seconds:8.1f}{mark}")


def render(report: dict[str, dict[str, FileRun]]) -> tuple[list[str], list[str]]:
    """The table's lines, and the lost tests (each with its outcome on disttest)."""
    head = f"{'pass':>5} {'fail':>4} {'err':>4} {'skip':>4} {'seconds':>9}"
    lines = [f"{'':32} {'upstream':^30} | {'disttest':^30} |",
             f"{'file':32} {head} | {head} | {'ratio':>6}"]
    total = {side: FileRun(0.0, "ok") for side in SIDES}
    lost: list[str] = []
    gained: list[str] = []
    notes: list[str] = []
    for name, runs in report.items():
        up, dt = runs["upstream"], runs["disttest"]
        lines.append(f"{name:32} {_cells(up)} | {_cells(dt)} | {ratio(up.seconds, dt.seconds):>6}")
        for side in SIDES:
            run = runs[side]
            total[side].seconds += run.seconds
            total[side].tests.update({f"{name}::{k}": v for k, v in run.tests.items()})
            if run.status != "ok":
                notes.append(f"  {name} ({side}): {run.status}")
        file_lost, file_gained = compare(up, dt)
        for test in file_lost:
            got = dt.tests.get(test)
            why = got.outcome if got else ("not reported" if dt.status == "ok" else dt.status)
            lost.append(f"{name}::{test}: {why} on disttest" + (_first_line(got.detail) if got else ""))
        gained += [f"{name}::{test}" for test in file_gained]
    up, dt = total["upstream"], total["disttest"]
    lines.append(f"{'total (' + str(len(report)) + ' files)':32} {_cells(up)} | {_cells(dt)} | "
                 f"{ratio(up.seconds, dt.seconds):>6}")
    lines.append("ratio = upstream seconds / disttest seconds; T: the file timed out, "
                 "!: it left no report")
    lines += notes
    lines.append(f"passes lost on disttest: {len(lost) or 'none'}")
    lines += ["  " + line for line in lost]
    lines.append(f"passes on disttest only: {len(gained) or 'none'}")
    lines += ["  " + line for line in gained]
    return lines, lost


def _first_line(detail: str) -> str:
    line = next((x.strip() for x in detail.splitlines() if x.strip()), "")
    return f": {line[:200]}" if line else ""


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the process, every process under it, and its session's group."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.kill()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what left the tree but not the group
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()  # NB: before psutil's waits, which would reap it and lose its exit status
    psutil.wait_procs(children, timeout=10)


def run_command(cmd: list[str], cwd: str, log: str, timeout: float) -> tuple[str, int]:
    """Run ``cmd`` in its own session, output to ``log``; past ``timeout``
    seconds kill its process tree. Returns ("ok" or "timed out", exit status)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            status = "ok"
        except subprocess.TimeoutExpired:
            status = "timed out"
        finally:
            _kill_tree(proc)  # also on Ctrl-C; and the ranks a finished run left behind
    return status, proc.returncode


def run_file(folder: str, name: str, timeout: float, pattern: str | None) -> FileRun:
    """Run one test file in ``folder`` under pytest."""
    stem = name[:-3]
    xml = os.path.join(folder, f".{stem}.junit.xml")
    log = os.path.join(folder, f".{stem}.log")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           f"--rootdir={folder}", *(["-k", pattern] if pattern else []), name]
    start = time.monotonic()
    status, returncode = run_command(cmd, folder, log, timeout)
    seconds = time.monotonic() - start
    with open(log, "rb") as f:
        tail = f.read().decode(errors="replace")[-TAIL_CHARS:]
    if status == "ok" and not os.path.exists(xml):
        status = f"no report (exit {returncode})"
    tests: dict[str, CaseResult] = {}
    if status == "ok":
        with open(xml) as f:
            tests = parse_junit(f.read())
    return FileRun(seconds, status, tests, tail)


def migrate(folder: str) -> str:
    """The README's migration command on ``folder``; returns what it printed."""
    proc = subprocess.run([sys.executable, "-m", "disttest.migrate", "-q", folder],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"python -m disttest.migrate failed on {folder} (exit {proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def _timeout(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(
            f"invalid timeout {value!r} from --timeout: give a positive number of seconds")
    return seconds


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the cleanups, as Ctrl-C does


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", metavar="DIR", help="folder of PyTorch test files (test_*.py)")
    parser.add_argument("--timeout", type=_timeout, default=900.0, metavar="SECONDS",
                        help="limit per file and side; the process tree is killed past it (default 900)")
    parser.add_argument("--json", metavar="OUT", help="also write every test's outcome to this file")
    parser.add_argument("-k", dest="pattern", metavar="PATTERN", help="pytest's -k, on both sides")
    args = parser.parse_args()
    if not os.path.isdir(args.dir):
        parser.error(f"DIR {args.dir!r} is not a directory")
    sources = sorted(f for f in os.listdir(args.dir) if f.endswith(".py"))
    files = [f for f in sources if re.fullmatch(r"test_\w+\.py", f)]
    if not files:
        parser.error(f"no test_*.py files in DIR {args.dir!r}")
    signal.signal(signal.SIGTERM, _terminate)
    try:
        report, printed = _run_all(args.dir, sources, files, args.timeout, args.pattern)
    except KeyboardInterrupt:
        print("interrupted: the running file's processes were killed, the temporary folders removed",
              file=sys.stderr)
        return 130
    lines, lost = render(report)
    print(f"{len(files)} files from {os.path.abspath(args.dir)}, torch {_torch_version()}, "
          f"timeout {args.timeout:g}s per file and side")
    print("migration (python -m disttest.migrate -q):")
    print("\n".join("  " + line for line in printed.splitlines()) or "  (nothing printed)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({name: {side: asdict(run) for side, run in runs.items()}
                       for name, runs in report.items()}, out, indent=1)
    return 1 if lost else 0


def _run_all(source_dir: str, sources: list[str], files: list[str], timeout: float,
             pattern: str | None) -> tuple[dict[str, dict[str, FileRun]], str]:
    report: dict[str, dict[str, FileRun]] = {}
    with tempfile.TemporaryDirectory(prefix="migrated-suites-") as tmp:
        folders = {side: os.path.join(tmp, side) for side in SIDES}
        for folder in folders.values():
            os.mkdir(folder)
            for f in sources:
                shutil.copy(os.path.join(source_dir, f), folder)
        printed = migrate(folders["disttest"])
        print(f"python -m disttest.migrate -q: {len(printed.splitlines())} lines", file=sys.stderr)
        for i, name in enumerate(files, 1):
            report[name] = {}
            for side in SIDES:
                run = report[name][side] = run_file(folders[side], name, timeout, pattern)
                print(f"[{i}/{len(files)}] {name} {side}: {run.count('passed')} passed, "
                      f"{run.seconds:.1f}s, {run.status}", file=sys.stderr, flush=True)
    return report, printed


def _torch_version() -> str:
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
