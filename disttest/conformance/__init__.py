"""A conformance suite for process-group backends: a specification, not a smoke test.

Checks that a backend keeps the collective semantics of gloo and NCCL, case
by case: every collective torch exposes x dtypes x reduce ops x sizes
(empty, one element, an odd prime, about 1M) x contiguous and strided
inputs x sync and ``async_op=True`` x the default group, a subgroup and
overlapping subgroups; each result against numpy. Then behaviour: a
barrier holds the ranks until the last arrives, a missing peer raises
within the group's timeout, an async Work completes only once its data is
there, bad arguments raise and leave outputs alone, inputs stay as they
were. Use it as a mixin (:class:`CollectiveConformance`) or from the
command line::

    python -m disttest.conformance --backend gloo --world-size 3
    python -m disttest.conformance --backend mine --world-size 3 --import my_pkg.register \\
        --unsupported all_to_all,PREMUL_SUM --json report.json

It prints a table per collective, a dtype x reduce-op matrix and one
summary line, and exits non-zero on any failure. A case is unsupported only
when declared: ``--unsupported TOKENS``, a ``CONFORMANCE_UNSUPPORTED``
mapping in an ``--import`` module (``{"mine": {"all_to_all": "why"}}``),
or disttest's table for the backends it knows. ``threaded`` runs its ranks
as threads; any other backend as a pool of processes that lives for the
whole run.
"""

from __future__ import annotations

import importlib
import sys
import time
import unittest
from collections.abc import Mapping, Sequence
from typing import Any

from disttest import _compat
from disttest.conformance.cases import CASES, Case, Declaration
from disttest.conformance.report import STATUSES, CaseResult, ConformanceResult
from disttest.conformance.suite import (
    UNSUPPORTED,
    CollectiveConformance,
    Unsupported,
    declaration_for,
)

__unittest = True

__all__ = [
    "CASES", "STATUSES", "UNSUPPORTED", "Case", "CaseResult", "CollectiveConformance", "ConformanceResult",
    "Declaration", "Unsupported", "conformance_class", "default_device", "device_problem", "module_declaration",
    "run",
]

MODULE_ATTRIBUTE = "CONFORMANCE_UNSUPPORTED"
UNKNOWN_BACKEND = ("--backend {backend!r}: no such c10d backend is registered on this host (disttest); "
                   "pass the module that registers it with --import")
NOT_BUILT_BACKEND = ("--backend {backend!r}: c10d knows it, but this torch ({version}) was not built with it "
                     "(disttest); run on a torch that has it, or choose another backend")
#: The backends c10d names itself, which a torch build may lack.
BUILT_IN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
DEVICE_REFUSED = "{source} {device!r}: {problem} (disttest)"
DEFAULT_DEVICE_REFUSED = ("device {device!r}, the default for backend {backend!r}: {problem}; run on a host that has "
                          "one, or choose another device (--device) or backend (disttest)")
NOT_A_DEVICE = "not a torch device ({error})"
NO_SUCH_DEVICE = "this host has no {kind} device (torch {version})"
ONE_DEVICE = "name a device type ({kind}), not one device: the pool's rank r uses device r modulo the host's count"
BAD_DECLARATION = "{module}.{attr} must map backend names to tokens (a list or a mapping token -> reason), got {value!r}"


def module_declaration(module: Any, backend: str) -> Declaration:
    """What ``module`` (one that registers backends) declares ``backend`` lacks."""
    raw = getattr(module, MODULE_ATTRIBUTE, None)
    out = Declaration()
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        raise TypeError(BAD_DECLARATION.format(module=module.__name__, attr=MODULE_ATTRIBUTE, value=raw))
    tokens = raw.get(backend)
    if tokens is not None:
        out.extend(tokens, f"declared by {module.__name__}")
    return out


def _prepare_backend(backend: str) -> None:
    if backend == "fake":
        from disttest.pg.fake import register_fake_backend

        register_fake_backend()


def default_device(backend: str) -> str:
    """Where the cases' tensors live unless told: CUDA for NCCL (it takes
    nothing else), the CPU for every other backend."""
    return "cuda" if backend == "nccl" else "cpu"


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot hold the cases' tensors on this host, or None.
    Asks without the CUDA driver (the pool forks from this process): where
    NVML cannot count CUDA devices, a device is assumed."""
    import torch

    from disttest._runner import cuda_fork

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as e:
        return NOT_A_DEVICE.format(error=str(e).splitlines()[0])
    kind = parsed.type
    if kind == "cpu" and parsed.index in (None, 0):
        return None
    if parsed.index is not None:
        return ONE_DEVICE.format(kind=kind)
    if kind == "cuda" and cuda_fork.no_cuda_device() or kind != "cuda" and _compat.accelerator_type() != kind:
        return NO_SUCH_DEVICE.format(kind=kind, version=torch.__version__)
    return None


def conformance_class(backend: str, world_size: int, imports: Sequence[str] = (), timeout: float = 60,
                      unsupported: Declaration | None = None, lenient: bool = False,
                      device: str | None = None, device_from: str = "device") -> type[unittest.TestCase]:
    """A test class running every case on ``backend`` with ``world_size``
    ranks: threads for ``threaded``, else a pool of processes that lives
    for the class (each case a test; the group is made once). ``device``
    (a device type; default :func:`default_device`): where the cases'
    tensors live; on an accelerator, the pool's rank ``r`` uses device ``r``
    modulo the host's count (threaded ranks share the current device).
    ``device_from`` names where ``device`` came from, for the error."""
    backend = backend.strip().lower()  # (c10d's names are: "GLOO" was gloo without gloo's declaration)
    declared = Declaration()
    for name in imports:
        declared.reasons.update(module_declaration(importlib.import_module(name), backend).reasons)
    if unsupported is not None:
        declared.reasons.update(unsupported.reasons)
    _prepare_backend(backend)
    if backend != "threaded":
        import torch.distributed as dist

        if not dist.is_backend_available(backend):
            if backend.lower() in BUILT_IN_BACKENDS:
                import torch

                raise ValueError(NOT_BUILT_BACKEND.format(backend=backend, version=torch.__version__))
            raise ValueError(UNKNOWN_BACKEND.format(backend=backend))
    import torch

    chosen = device or default_device(backend)
    problem = device_problem(chosen)
    if problem and device:
        raise ValueError(DEVICE_REFUSED.format(source=device_from, device=device, problem=problem))
    if problem:
        raise ValueError(DEFAULT_DEVICE_REFUSED.format(device=chosen, backend=backend, problem=problem))
    device = torch.device(chosen).type  # "cpu:0" is the CPU
    attrs: dict[str, Any] = {"conformance_backend": backend, "conformance_unsupported": declared,
                             "conformance_lenient": lenient, "world_size": world_size, "timeout": timeout,
                             "conformance_device": device}
    if backend == "threaded":
        from disttest.runners.multithread import MultiThreadedTestCase

        def setUp(self: Any) -> None:
            MultiThreadedTestCase.setUp(self)
            self._spawn_threads()

        attrs["setUp"] = setUp
        return type("ThreadedConformance", (CollectiveConformance, MultiThreadedTestCase), attrs)
    from disttest.runners.continuous import MultiProcContinousTest

    attrs["backend_str"] = classmethod(lambda cls: backend)
    # Every case is judged on its own: a backend that breaks the pool in
    # every case must still get a verdict for each one.
    attrs["max_pool_rebuilds"] = sys.maxsize
    # NB: made in a function, as its qualname says: the pool forks its ranks
    # from this process (a fork server could not import the class by name).
    attrs["__qualname__"] = "conformance_class.<locals>.ProcessConformance"
    made: Any = type("ProcessConformance", (CollectiveConformance, MultiProcContinousTest), attrs)
    if device != "cpu":
        def _init_pg(cls: Any, rank: int, world: int, rdvz_file: str | None) -> None:
            _compat.set_device_index(rank % max(1, _compat.accelerator_count()))  # (in a rank: may ask the driver)
            super(made, cls)._init_pg(rank, world, rdvz_file)

        made._init_pg = classmethod(_init_pg)
    return made  # type: ignore[no-any-return]


class _Recording(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcome: dict[str, tuple[str, str]] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.outcome[test._testMethodName] = ("passed", "")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self.outcome[test._testMethodName] = ("failed", self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self.outcome[test._testMethodName] = ("failed", self.errors[-1][1])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        status = "unsupported" if reason.startswith("unsupported:") else "skipped"
        self.outcome[test._testMethodName] = (status, reason)


def run(backend: str, world_size: int, imports: Sequence[str] = (), timeout: float = 60,
        pattern: str | Sequence[str] | None = None, unsupported: Declaration | None = None,
        lenient: bool = False, device: str | None = None, device_from: str = "device") -> ConformanceResult:
    """Run the suite on ``backend``; every case's result, in order.

    ``pattern``: one or several (a case matching any runs), as unittest's
    ``-k``: fnmatch with a wildcard, else a part of the case's name.
    """
    import fnmatch

    backend = backend.strip().lower()

    cls = conformance_class(backend, world_size, imports, timeout, unsupported, lenient, device, device_from)
    patterns = [pattern] if isinstance(pattern, str) else list(pattern or ())
    # (unittest's -k rule: a pattern without a wildcard matches as a substring)
    patterns = [p if any(ch in p for ch in "*?[") else f"*{p}*" for p in patterns if p]
    cases = [c for c in CASES if not patterns or any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    recording = _Recording()
    start = time.monotonic()
    suite = unittest.TestSuite(cls(c.name) for c in cases)
    unittest.TestSuite([suite]).run(recording)  # (an outer suite runs the class teardown)
    device = cls.conformance_device  # type: ignore[attr-defined]
    out = ConformanceResult(backend, world_size, seconds=time.monotonic() - start, device=device,
                            declared=declaration_for(backend, cls.conformance_unsupported,  # type: ignore[attr-defined]
                                                     device).reasons)
    for c in cases:
        status, message = recording.outcome.get(c.name, ("failed", "the case did not report (disttest)"))
        out.cases.append(CaseResult(c, status, message))
    return out
