"""A conformance suite for process-group backends.

Checks that a backend keeps the collective semantics of gloo and NCCL:
every collective and reduce op, dtypes, subgroups, async ops,
point-to-point, object collectives and argument errors, each against values
computed directly. Use it as a mixin (:class:`CollectiveConformance`) in
your own test class, or from the command line::

    python -m disttest.conformance --backend gloo --world-size 2
    python -m disttest.conformance --backend mybackend --world-size 4 --import my_pkg.register

which prints a table of what passed, failed, was skipped or is unsupported,
per collective, and exits non-zero on any failure. ``threaded`` (disttest's
in-process backend) runs with threads; any other backend with processes.
"""

from __future__ import annotations

import importlib
import unittest
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from disttest.conformance.suite import UNSUPPORTED, CollectiveConformance, Unsupported

__unittest = True

__all__ = ["UNSUPPORTED", "CollectiveConformance", "ConformanceResult", "Unsupported", "conformance_class", "run"]

STATUSES = ("passed", "failed", "unsupported", "skipped")


def conformance_class(backend: str, world_size: int, imports: Sequence[str] = (),
                      timeout: float = 60) -> type[unittest.TestCase]:
    """A test class running :class:`CollectiveConformance` on ``backend``
    with ``world_size`` ranks (threads for ``threaded``, else processes,
    each importing ``imports`` and making the group through a file store)."""
    for module in imports:
        importlib.import_module(module)
    if backend == "threaded":
        from disttest.multithread import MultiThreadedTestCase

        class ThreadedConformance(CollectiveConformance, MultiThreadedTestCase):
            def setUp(self) -> None:
                super().setUp()
                self._spawn_threads()

        cls: type[Any] = ThreadedConformance
    else:
        from disttest.multiprocess import MultiProcessTestCase

        class ProcessConformance(CollectiveConformance, MultiProcessTestCase):
            def setUp(self) -> None:
                super().setUp()
                self._spawn_processes()

            @classmethod
            def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
                for module in imports:
                    importlib.import_module(module)
                store = dist.FileStore(file_name, world_size)
                dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)
                dist.barrier()  # every rank is connected before any test body runs
                super()._run(rank, test_name, file_name, parent_pipe, **kwargs)

        cls = ProcessConformance
    cls.world_size = property(lambda self: world_size)
    cls.timeout = timeout
    cls.conformance_backend = backend
    return cls


@dataclass
class ConformanceResult:
    """Per collective, the tests in each status; and the unittest result."""

    backend: str
    world_size: int
    rows: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    result: unittest.TestResult = field(default_factory=unittest.TestResult)

    @property
    def ok(self) -> bool:
        return self.result.wasSuccessful()

    def table(self) -> str:
        header = f"{'collective':28}" + "".join(f"{s:>13}" for s in STATUSES)
        lines = [f"conformance of backend {self.backend!r}, world size {self.world_size} (disttest)",
                 header, "-" * len(header)]
        for collective in sorted(self.rows):
            row = self.rows[collective]
            lines.append(f"{collective:28}" + "".join(f"{len(row.get(s, [])):>13}" for s in STATUSES))
        totals = {s: sum(len(r.get(s, [])) for r in self.rows.values()) for s in STATUSES}
        lines.append("-" * len(header))
        lines.append(f"{'total':28}" + "".join(f"{totals[s]:>13}" for s in STATUSES))
        for test, text in self.result.failures + self.result.errors:
            lines.append("")
            lines.append(f"FAILED {test.id().rsplit('.', 1)[-1]}:")
            lines.append(text.rstrip())
        for test, reason in self.result.skipped:
            if reason.startswith("unsupported:"):
                lines.append(f"UNSUPPORTED {test.id().rsplit('.', 1)[-1]}: {reason[13:]}")
        return "\n".join(lines)


def run(backend: str, world_size: int, imports: Sequence[str] = (), timeout: float = 60,
        pattern: str | None = None) -> ConformanceResult:
    """Run the suite on ``backend``; return the per-collective result."""
    cls = conformance_class(backend, world_size, imports, timeout)
    names = unittest.defaultTestLoader.getTestCaseNames(cls)
    if pattern:
        import fnmatch

        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    out = ConformanceResult(backend, world_size)
    status: dict[str, str] = {}

    class Recording(unittest.TestResult):
        def addSuccess(self, test: unittest.TestCase) -> None:
            super().addSuccess(test)
            status[test._testMethodName] = "passed"

        def addFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addFailure(test, err)
            status[test._testMethodName] = "failed"

        def addError(self, test: unittest.TestCase, err: Any) -> None:
            super().addError(test, err)
            status[test._testMethodName] = "failed"

        def addSkip(self, test: unittest.TestCase, reason: str) -> None:
            super().addSkip(test, reason)
            status[test._testMethodName] = "unsupported" if reason.startswith("unsupported:") else "skipped"

    out.result = Recording()
    unittest.TestSuite(cls(n) for n in names).run(out.result)
    for name in names:
        collective = getattr(getattr(cls, name), "__conformance__", ("other", ""))[0]
        out.rows.setdefault(collective, {}).setdefault(status.get(name, "failed"), []).append(name)
    return out
