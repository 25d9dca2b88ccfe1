"""A conformance run's result: per case, per collective, per dtype x op;
rendered as a table for people, JSON for machines, and one summary line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from disttest.conformance.cases import Case
from disttest.conformance.reference import DTYPES, OPS

__unittest = True

__all__ = ["STATUSES", "CaseResult", "ConformanceResult"]

#: The statuses a case can end with, in the order the tables show them.
STATUSES = ("passed", "failed", "unsupported", "skipped")
SUMMARY = ("conformance of backend {backend!r}, world size {world}: {passed} passed, {failed} failed, "
           "{unsupported} unsupported, {skipped} skipped ({total} cases, {seconds:.1f}s) -- {verdict}")
CELL = {"passed": "ok", "failed": "FAIL", "unsupported": "unsup", "skipped": "skip"}


@dataclass
class CaseResult:
    """One case's outcome: its status and, unless it passed, why."""

    case: Case
    status: str
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        c = self.case
        return {"name": c.name, "collective": c.collective, "dtype": c.dtype, "op": c.op,
                "tags": sorted(c.tags), "status": self.status, "message": self.message}


@dataclass
class ConformanceResult:
    """Every case's result in a run, in the suite's order."""

    backend: str
    world_size: int
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    declared: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"

    @property
    def ok(self) -> bool:
        """No case failed, and some case was judged (every case skipped, for
        a world too small, checked nothing: not a conforming backend)."""
        return not any(r.status == "failed" for r in self.cases) and not self.nothing_checked

    @property
    def nothing_checked(self) -> bool:
        return bool(self.cases) and all(r.status == "skipped" for r in self.cases)

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.cases) for s in STATUSES}

    @property
    def rows(self) -> dict[str, dict[str, list[str]]]:
        """collective -> status -> case names."""
        out: dict[str, dict[str, list[str]]] = {}
        for r in self.cases:
            out.setdefault(r.case.collective, {}).setdefault(r.status, []).append(r.case.name)
        return out

    def summary(self) -> str:
        counts = self.counts()
        return SUMMARY.format(backend=self.backend, world=self.world_size, total=len(self.cases),
                              seconds=self.seconds, verdict="OK" if self.ok else
                              "NOTHING CHECKED: every case skipped" if self.nothing_checked else "FAILED", **counts)

    def table(self) -> str:
        header = f"{'collective':26}" + "".join(f"{s:>12}" for s in STATUSES)
        on = f", tensors on {self.device}" if self.device != "cpu" else ""
        lines = [f"conformance of backend {self.backend!r}, world size {self.world_size}{on} "
                 f"(disttest, torch {torch.__version__})", header, "-" * len(header)]
        rows = self.rows
        for collective in sorted(rows):
            lines.append(f"{collective:26}" + "".join(f"{len(rows[collective].get(s, [])):>12}" for s in STATUSES))
        lines.append("-" * len(header))
        lines.append(f"{'total':26}" + "".join(f"{n:>12}" for n in self.counts().values()))
        lines += ["", *self.matrix()]
        for r in self.cases:
            if r.status == "failed":
                lines += ["", f"FAILED {r.case.name}:", _short(r.message)]
        unsupported = [r for r in self.cases if r.status == "unsupported"]
        if unsupported:
            lines.append("")
        for r in unsupported:
            lines.append(f"UNSUPPORTED {r.case.name}: {r.message.removeprefix('unsupported: ')}")
        lines += ["", self.summary()]
        return "\n".join(lines)

    def matrix(self) -> list[str]:
        """dtype x reduce op over every case that has both: ok, FAIL (any
        failed), ok* (the rest declared unsupported), unsup, skip, or '.'
        (not defined / not checked)."""
        cells: dict[tuple[str, str], set[str]] = {}
        for r in self.cases:
            if r.case.dtype and r.case.op:
                cells.setdefault((r.case.dtype, r.case.op), set()).add(r.status)
        lines = ["reduce ops by dtype (every reduction collective)",
                 f"{'dtype':12}" + "".join(f"{op:>11}" for op in OPS)]
        for dtype in DTYPES:
            row = []
            for op in OPS:
                seen = cells.get((dtype, op), set())
                status = next((s for s in ("failed", "passed", "unsupported", "skipped") if s in seen), None)
                partly = status == "passed" and "unsupported" in seen
                row.append("ok*" if partly else CELL[status] if status else ".")
            lines.append(f"{dtype:12}" + "".join(f"{c:>11}" for c in row))
        lines.append("(ok*: every case ran passed, some were declared unsupported; '.': op not defined)")
        return lines

    def as_json(self) -> str:
        return json.dumps({
            "backend": self.backend, "world_size": self.world_size, "device": self.device,
            "torch": torch.__version__,
            "seconds": round(self.seconds, 2), "ok": self.ok, "counts": self.counts(),
            "declared_unsupported": self.declared,
            "collectives": {k: {s: len(v.get(s, [])) for s in STATUSES} for k, v in sorted(self.rows.items())},
            "cases": [r.as_dict() for r in self.cases],
        }, indent=1)


def _short(message: str, lines: int = 8) -> str:
    # The end of a report holds the ranks' own errors; keep it readable.
    text = [ln for ln in message.rstrip().splitlines() if ln.strip()]
    picked = [ln for ln in text if "Error" in ln or "rank " in ln][-lines:] or text[-lines:]
    return "\n".join("    " + ln.strip()[:300] for ln in picked)
