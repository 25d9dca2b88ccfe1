"""Accelerator discovery and device/transport helpers.

Counting devices goes through ``torch.accelerator`` (through ``_compat``, so
that torch before 2.6 counts CUDA/XPU devices instead), which does not poison
a later ``fork`` on CUDA hosts where NVML answers.

``EFA_PROBE_RESULT`` (torch 2.7 to 2.9 have it) is read through the module
``__getattr__``: what :func:`has_efa` found, None before it first asks.
``HAS_ACCELERATOR`` is read there too, so that importing disttest counts no
device: the count is asked at the first read, then kept (NB: where NVML
cannot count, torch falls back to ``cudaGetDeviceCount``, which would make
the importing process unable to fork CUDA ranks).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from typing import Any

import torch

from disttest import _compat

__unittest = True

# EFA_PROBE_RESULT and HAS_ACCELERATOR are read through the module __getattr__.
__all__ = [  # noqa: F822
    "ACCELERATOR_DIST_BACKENDS",
    "EFA_PROBE_RESULT",
    "HAS_ACCELERATOR",
    "accelerator_count",
    "accelerator_type",
    "at_least_x_gpu",
    "create_device",
    "has_accelerator",
    "has_efa",
    "init_multigpu_helper",
    "tp_transports",
]

#: Communication backends that need an accelerator (nccl, xccl, hccl).
ACCELERATOR_DIST_BACKENDS = ["nccl", "xccl", "hccl"]


def accelerator_type() -> str | None:
    """The type of this host's accelerator (``"cuda"``, ``"xpu"``...), or None."""
    return _compat.accelerator_type()


def accelerator_count() -> int:
    """How many accelerator devices this host has (0 on a CPU-only host)."""
    return _compat.accelerator_count()


@functools.cache
def has_accelerator() -> bool:
    """True when this host has at least one accelerator device.

    Asked once, at the first call (``HAS_ACCELERATOR`` reads it), never at
    import.
    """
    return accelerator_count() > 0


def at_least_x_gpu(x: int) -> bool:
    """True when this host has at least ``x`` accelerator devices."""
    return accelerator_count() >= x


def init_multigpu_helper(world_size: int, backend: str) -> dict[int, list[int]]:
    """Split the visible devices evenly among ``world_size`` ranks.

    Returns ``{rank: [device indices]}``; a rank gets one device when there
    are at least as many devices as ranks. ``backend`` is accepted for
    upstream compatibility.
    """
    n_devices = accelerator_count()
    per_rank = 1 if world_size <= n_devices else n_devices // world_size
    return {
        rank: list(range(rank * per_rank, (rank + 1) * per_rank))
        for rank in range(world_size)
    }


def create_device(interface: str | None = None, lazy_init: bool = False) -> object:
    """A gloo device on ``interface``, or on loopback (127.0.0.1) by default."""
    pg_gloo = torch.distributed.ProcessGroupGloo
    if sys.platform == "win32" or interface is None:
        return pg_gloo.create_device(hostname="127.0.0.1", lazy_init=lazy_init)
    return pg_gloo.create_device(interface=interface, lazy_init=lazy_init)


@functools.cache
def has_efa() -> bool:
    """True when libfabric's EFA provider answers (``fi_info -p efa``)."""
    if shutil.which("fi_info") is None:
        return False
    try:
        result = subprocess.run(
            ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"],
            check=False, capture_output=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def __getattr__(name: str) -> Any:
    # Upstream's has_efa() keeps its answer in this module global (torch 2.7
    # to 2.9); here the cache of has_efa is the one place it is kept.
    if name == "EFA_PROBE_RESULT":
        return has_efa() if has_efa.cache_info().currsize else None
    if name == "HAS_ACCELERATOR":
        return has_accelerator()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tp_transports() -> list[str] | None:
    """TensorPipe transports to use: without InfiniBand where EFA is present."""
    return ["shm", "uv"] if has_efa() else None
