"""Platform checks and skips of upstream's ``common_distributed`` that depend
on the machine: torchcomms, symmetric memory, NCCL shrink, multicast, ROCm,
compute capability, plus its ``logger``, ``tmp_dir`` and
``retrieve_result_from_completion_queue``.

Facts are read when asked for (module ``__getattr__``), never at import:
``TORCHCOMM_HAS_NCCL`` imports torchcomms only when a test reads it, and
``PLATFORM_SUPPORTS_SYMM_MEM`` asks CUDA only then. On a CPU machine every
GPU and ROCm check says no, and the decorators skip with upstream's reasons.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import unittest
from collections.abc import Callable
from typing import Any

from disttest._typing import F
from disttest.support import skips

__unittest = True

# Names read through the module __getattr__ (facts found when first read).
__all__ = [  # noqa: F822
    "DDP_RANK_DEVICES",
    "PLATFORM_SUPPORTS_SYMM_MEM",
    "TORCHCOMM_HAS_GLOO",
    "TORCHCOMM_HAS_NCCL",
    "TORCHCOMM_HAS_NCCLX",
    "TORCHCOMM_HAS_RCCL",
    "TORCHCOMM_HAS_RCCLX",
    "TORCHCOMM_HAS_XCCL",
    "evaluate_platform_supports_symm_mem",
    "logger",
    "requires_ddp_rank",
    "requires_multicast_support",
    "requires_nccl_shrink",
    "retrieve_result_from_completion_queue",
    "skip_if_rocm_arch_multiprocess",
    "skip_if_rocm_ver_atleast_multiprocess",
    "skip_if_rocm_ver_lessthan_multiprocess",
    "sm_is_or_higher_than",
    "tmp_dir",
]

#: Devices whose DDP tests place one rank per device (upstream's list).
DDP_RANK_DEVICES = ["cuda", "xpu"]
#: disttest's logger for the distributed test helpers (upstream's
#: ``common_distributed.logger``); its level is left to the test's logging set-up.
logger = logging.getLogger("disttest")
#: The torchcomms backends upstream asks about, by flag.
_TORCHCOMM_FLAGS = {
    "TORCHCOMM_HAS_GLOO": "gloo", "TORCHCOMM_HAS_XCCL": "xccl", "TORCHCOMM_HAS_NCCL": "nccl",
    "TORCHCOMM_HAS_RCCL": "rccl", "TORCHCOMM_HAS_NCCLX": "ncclx", "TORCHCOMM_HAS_RCCLX": "rcclx",
}
_facts: dict[str, bool] = {}


def _torchcomm_has(backend: str) -> bool:
    """Whether torchcomms is installed and built with ``backend``."""
    import importlib.util

    if importlib.util.find_spec("torchcomms") is None:
        return False
    import torchcomms  # type: ignore[import-not-found]

    return bool(torchcomms.is_backend_built(backend))


def _on_rocm() -> bool:
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


def _rocm_version() -> tuple[int, ...] | None:
    """This ROCm's version (``(6, 4, 1)``, its git sha dropped), or None off ROCm."""
    if not _on_rocm():
        return None
    import torch

    found = str(torch.version.hip).split("-", maxsplit=1)[0]
    return tuple(int(x) for x in found.split(".") if x.isdigit())


def evaluate_platform_supports_symm_mem() -> bool:
    """Whether symmetric memory can work here: CUDA, and on ROCm only the
    gfx942 and gfx950 architectures (upstream's rule)."""
    import torch

    if not torch.cuda.is_available():
        return False
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName
        return any(a in arch for a in ("gfx942", "gfx950"))
    return True


def __getattr__(name: str) -> Any:
    # Facts of the machine, found once when first read.
    if name in _TORCHCOMM_FLAGS or name == "PLATFORM_SUPPORTS_SYMM_MEM":
        if name not in _facts:
            _facts[name] = (evaluate_platform_supports_symm_mem() if name == "PLATFORM_SUPPORTS_SYMM_MEM"
                            else _torchcomm_has(_TORCHCOMM_FLAGS[name]))
        return _facts[name]
    if name == "tmp_dir":
        return _tmp_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _TempDir:
    """What upstream's ``tmp_dir`` is to its tests: an object with ``.name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def cleanup(self) -> None:
        from disttest.support.tempdirs import cleanup_temp_dir

        cleanup_temp_dir()


def _tmp_dir() -> _TempDir | None:
    """The directory of the last ``initialize_temp_directories`` of this
    process still in place (upstream's ``tmp_dir``), or None."""
    from disttest.support import tempdirs

    mine = [path for pid, path, _ in tempdirs._created if pid == os.getpid()]
    return _TempDir(mine[-1]) if mine else None


def requires_ddp_rank(device: str) -> bool:
    """Whether DDP tests on ``device`` give each rank its own device."""
    return device in DDP_RANK_DEVICES


def requires_nccl_shrink() -> Callable[[F], F]:
    """Skip unless NCCL 2.27 or newer is there (``shrink_group`` needs it)."""
    decorate: Callable[[F], F] = skips.requires_nccl_version((2, 27), "Need NCCL 2.27+ for shrink_group")
    return decorate


def requires_multicast_support() -> Callable[[F], F]:
    """Skip unless CUDA device 0 supports multicast (symmetric memory)."""
    import torch

    from disttest import _compat

    supported = torch.cuda.is_available() and _compat.cuda_multicast_support()
    return skips.skip_but_pass_in_sandcastle_if(not supported, "multicast support is not available")


def skip_if_rocm_arch_multiprocess(arch: tuple[str, ...]) -> Callable[[F], F]:
    """Skip on ROCm devices of the architectures ``arch`` (never elsewhere)."""

    def decorate(func: F) -> F:
        reason = None
        if _on_rocm():
            import torch

            prop = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
            if prop in arch:
                reason = f"skip_if_rocm_arch_multiprocess: test skipped on {arch}"
        return unittest.skipIf(reason is not None, reason or "")(func)

    return decorate


def skip_if_rocm_ver_lessthan_multiprocess(version: tuple[int, ...] | None = None) -> Callable[[F], F]:
    """Skip on ROCm older than ``version`` (never off ROCm)."""

    def decorate(func: F) -> F:
        reason = None
        found = _rocm_version()
        if found is not None and (version is None or found < tuple(version)):
            reason = (f"skip_if_rocm_ver_lessthan_multiprocess: ROCm {found} is available but "
                      f"{version} required")
        return unittest.skipIf(reason is not None, reason or "")(func)

    return decorate


def skip_if_rocm_ver_atleast_multiprocess(version: tuple[int, ...] | None = None) -> Callable[[F], F]:
    """Skip on ROCm ``version`` or newer, a known failure there (never off
    ROCm, nor with no ``version``)."""

    def decorate(func: F) -> F:
        reason = None
        found = _rocm_version()
        if found is not None and version is not None and found >= tuple(version):
            reason = f"skip_if_rocm_ver_atleast_multiprocess: known failure on ROCm {found} (>= {version})"
        return unittest.skipIf(reason is not None, reason or "")(func)

    return decorate


def sm_is_or_higher_than(device: Any, major: int, minor: int) -> bool:
    """Whether a CUDA ``device``'s compute capability is at least
    (``major``, ``minor``): True for a non-CUDA device, False on ROCm."""
    import torch

    if torch.device(device).type != "cuda":
        return True
    if torch.version.hip is not None:
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= (major, minor)


def retrieve_result_from_completion_queue(process: Any, completion_queue: Any, timeout: int | None = None) -> Any:
    """The result ``process`` put on ``completion_queue``; a ``RuntimeError``
    instance (returned, as upstream does) when the process ended without
    one or ``timeout`` seconds passed. Every wait is bounded."""
    queue_timeout = 120 if timeout is None else max(10, min(120, timeout // 4))
    start = time.time()
    while True:
        try:
            return completion_queue.get(timeout=min(queue_timeout, 1.0))
        except queue.Empty:
            # A result put just before the process ended is still read.
            if not process.is_alive() and completion_queue.empty():
                return RuntimeError(f"Exited with {process.exitcode}")
        if timeout is not None and time.time() - start > timeout:
            return RuntimeError(f"Process timed out after {time.time() - start}s")
