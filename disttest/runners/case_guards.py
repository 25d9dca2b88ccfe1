"""Context managers and text helpers behind :class:`~disttest.runners.case_parity.CaseParityMixin`.

Upstream keeps these in ``common_utils``: :class:`CudaMemoryLeakCheck`,
:class:`CudaNonDefaultStream` (CUDA only), :class:`DeterministicGuard` and
:func:`munge_exc`. Each acts in the process or thread that enters it; the
torch settings it changes are put back when the block ends.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from disttest import _compat
from disttest.support.devices import accelerator_type

__unittest = True

__all__ = [
    "LEAK_CONFIRMED",
    "LEAK_UNVERIFIED",
    "NEEDS_CUDA",
    "CudaMemoryLeakCheck",
    "CudaNonDefaultStream",
    "DeterministicGuard",
    "munge_exc",
]

#: Why a CUDA-only helper skips the test on a host without CUDA.
NEEDS_CUDA = "{helper} needs a CUDA device; this host has none (disttest)"
LEAK_CONFIRMED = (
    "CUDA driver API confirmed a leak in {name}! Caching allocator allocated memory was {before} "
    "and is now reported as {after} on device {device}. "
    "CUDA driver allocated memory was {driver_before} and is now {driver_after}."
)
LEAK_UNVERIFIED = (
    "CUDA caching allocator reports a memory leak not verified by the driver API in {name}! "
    "Caching allocator allocated memory was {before} and is now reported as {after} on device {device}. "
    "CUDA driver allocated memory was {driver_before} and is now {driver_after}."
)


def _has_cuda() -> bool:
    # NB: asks without initialising CUDA, so a later fork stays safe.
    return accelerator_type() == "cuda"


def _as_posix_path(path: str) -> str:
    posix = os.path.normpath(path).replace(os.sep, "/")
    return posix + "/" if path.endswith((os.sep, "/")) else posix


def munge_exc(e: object, *, suppress_suffix: bool = True, suppress_prefix: bool = True, file: str | None = None,
              skip: int = 0, strip_carets: bool = True, strip_stack_attribution: bool = True) -> str:
    """``str(e)`` with what varies between runs taken out, as upstream's
    ``munge_exc``: stack frames of other files than ``file`` (default: the
    caller's, ``skip`` frames up), line numbers, torch's install path, the
    "Set TORCH_LOGS..." suffixes and caret lines."""
    if file is None:
        file = inspect.stack()[1 + skip].filename
    file = _as_posix_path(file)
    s = _as_posix_path(str(e))

    def repl_frame(m: re.Match[str]) -> str:
        # frames of other files go, and top-level ones, which depend on how the script ran
        return "" if m.group(2) != file or m.group(3) == "<module>" else m.group(0)

    s = re.sub(r'( *)File "([^"]+)", line \d+, in (.+)\n(\1  .+\n( +[~^]* *\n)?)*', repl_frame, s)
    s = re.sub(r"line \d+", "line N", s)
    s = re.sub(r".py:\d+", ".py:N", s)
    s = re.sub(r"https:/([a-zA-Z0-9_.-]+)", r"https://\1", s)
    s = re.sub(file, _as_posix_path(os.path.basename(file)), s)
    s = re.sub(_as_posix_path(os.path.join(os.path.dirname(torch.__file__), "")), "", s)
    s = re.sub(r"attempting to trace CALL_FUNCTION:.*$", "attempting to trace CALL: a function call, e.g. f(x, y):",
               s, flags=re.MULTILINE)
    if suppress_suffix:
        s = re.sub(r"\n*Set TORCH_LOGS.+", "", s, flags=re.DOTALL)
        s = re.sub(r"\n*You can suppress this exception.+", "", s, flags=re.DOTALL)
        s = re.sub(r"\n*Set TORCHDYNAMO_VERBOSE=1.+", "", s, flags=re.DOTALL)
    if suppress_prefix:
        s = re.sub(r"Cannot export model.+\n\n", "", s)
    s = re.sub(r" +$", "", s, flags=re.MULTILINE)
    if strip_stack_attribution:
        s = re.sub(r"(\nStack variable source attribution:)\n(?:.*\n)*?\n", r"\1\n\n", s)
    if strip_carets:
        s = re.sub(r"\n[ ~^]*[~^][ ~^]*(?=\n|\Z)", "", s)
    return s


@contextlib.contextmanager
def _warn_always(enabled: bool) -> Iterator[None]:
    old = torch.is_warn_always_enabled()
    torch.set_warn_always(enabled)
    try:
        yield
    finally:
        torch.set_warn_always(old)


class DeterministicGuard:
    """Within the block, ``torch.use_deterministic_algorithms(deterministic,
    warn_only=...)`` and ``fill_uninitialized_memory``; the previous settings after."""

    def __init__(self, deterministic: bool, *, warn_only: bool = False,
                 fill_uninitialized_memory: bool = True) -> None:
        self.deterministic = deterministic
        self.warn_only = warn_only
        self.fill_uninitialized_memory = fill_uninitialized_memory

    @classmethod
    def _current_state(cls) -> DeterministicGuard:
        import torch.utils.deterministic

        return cls(torch.are_deterministic_algorithms_enabled(),
                   warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
                   fill_uninitialized_memory=torch.utils.deterministic.fill_uninitialized_memory)  # type: ignore[attr-defined]

    def _update(self) -> None:
        import torch.utils.deterministic

        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = self.fill_uninitialized_memory  # type: ignore[attr-defined]

    def __enter__(self) -> None:
        self._restore = self._current_state()
        self._update()

    def __exit__(self, *exc: object) -> None:
        self._restore._update()


class CudaNonDefaultStream:
    """Within the block, every CUDA device's current stream is a new,
    non-default one (so a test that assumes the default stream fails); the
    previous streams and device after."""

    def __enter__(self) -> None:
        before_device = torch.cuda.current_device()
        self.before_streams = []
        for d in range(torch.cuda.device_count()):
            self.before_streams.append(torch.cuda.current_stream(d))
            stream = torch.cuda.Stream(device=d)  # type: ignore[no-untyped-call]
            self.before_streams[-1].synchronize()
            torch.cuda.set_stream(stream)
        torch.cuda.set_device(before_device)

    def __exit__(self, *exc: object) -> None:
        before_device = torch.cuda.current_device()
        for stream in self.before_streams:
            torch.cuda.set_stream(stream)
        torch.cuda.set_device(before_device)


_cuda_warmed: list[bool] = []


class CudaMemoryLeakCheck:
    """Fail the block (``RuntimeError``, :data:`LEAK_CONFIRMED`) when CUDA
    memory allocated in it is still allocated after it, by the caching
    allocator and the driver; warn (:data:`LEAK_UNVERIFIED`) when only the
    allocator says so. Not checked when the block raises."""

    def __init__(self, testcase: Any, name: str | None = None) -> None:
        self.name = testcase.id() if name is None else name
        self.testcase = testcase
        if not _cuda_warmed:
            # a context and RNG made by the first test must not count as its leak
            for i in range(torch.cuda.device_count()):
                torch.randn(1, device=f"cuda:{i}")
            _cuda_warmed.append(True)

    def __enter__(self) -> None:
        self.allocator_before: list[int] = []
        self.driver_before: list[int] = []
        n = torch.cuda.device_count()
        if any(torch.cuda.memory_allocated(i) > 0 for i in range(n)):
            gc.collect()
            _compat.clear_cublas_workspaces()
            torch.cuda.empty_cache()
        for i in range(n):
            self.allocator_before.append(torch.cuda.memory_allocated(i))
            free, total = torch.cuda.mem_get_info(i)
            self.driver_before.append(total - free)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            return
        self.testcase.before_cuda_memory_leak_check()
        gc.collect()
        _compat.clear_cublas_workspaces()
        torch.cuda.empty_cache()
        n = torch.cuda.device_count()
        if not any(torch.cuda.memory_allocated(i) > self.allocator_before[i] for i in range(n)):
            return
        gc.collect()
        torch.cuda.empty_cache()
        for i in range(n):
            for _ in range(3):  # a leak must persist
                allocated = torch.cuda.memory_allocated(i)
                free, total = torch.cuda.mem_get_info(i)
                driver = total - free
                allocator_leak, driver_leak = allocated > self.allocator_before[i], driver > self.driver_before[i]
                if not (allocator_leak or driver_leak):
                    break
            else:
                fields = dict(name=self.name, before=self.allocator_before[i], after=allocated, device=i,
                              driver_before=self.driver_before[i], driver_after=driver)
                if allocator_leak and driver_leak:
                    raise RuntimeError(LEAK_CONFIRMED.format(**fields))
                if allocator_leak:
                    warnings.warn(LEAK_UNVERIFIED.format(**fields), stacklevel=2)
