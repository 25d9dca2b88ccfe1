"""The host's accelerator: its type and device count (without initialising
CUDA), the current device, c10d's backend per device, and CUDA internals
(``torch.cuda._sleep``, cuBLAS workspaces, multicast support)."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "accelerator_count",
    "accelerator_type",
    "clear_cublas_workspaces",
    "cuda_multicast_support",
    "cuda_sleep",
    "default_backend_for_device",
    "nvml_device_count",
    "privateuse1_backend_name",
    "set_device_index",
]


def accelerator_type() -> str | None:
    """The type of this host's accelerator (``"cuda"``, ``"xpu"``...), or None.

    ``torch.accelerator`` where torch has it (2.6+); before, the CUDA and XPU
    device counts. Both ask NVML/the driver without initialising CUDA, so a
    later ``fork`` stays safe (NB: not ``torch.accelerator.is_available()``,
    which on CUDA marks the process unable to fork CUDA children).
    """
    import torch

    acc_mod = getattr(torch, "accelerator", None)
    if acc_mod is not None:
        acc = acc_mod.current_accelerator()  # what torch was built for: no driver call
        return acc.type if acc is not None and acc_mod.device_count() > 0 else None
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and module.device_count() > 0:
            return name
    return None


def accelerator_count() -> int:
    """How many devices this host's accelerator has (0 without one)."""
    import torch

    acc_mod = getattr(torch, "accelerator", None)
    if acc_mod is not None:
        return int(acc_mod.device_count())  # 0 without one; NVML, fork stays safe
    kind = accelerator_type()
    return int(getattr(torch, kind).device_count()) if kind is not None else 0


def set_device_index(device: Any) -> None:
    """Make ``device`` (an index or a ``torch.device``) this thread's current
    accelerator device (``torch.accelerator.set_device_index``, 2.6+; before,
    the device module's ``set_device``)."""
    import torch

    acc_mod = getattr(torch, "accelerator", None)
    if acc_mod is not None:
        acc_mod.set_device_index(device)
        return
    kind = device.type if isinstance(device, torch.device) else accelerator_type()
    if kind is not None:
        getattr(torch, kind).set_device(device)


def default_backend_for_device(device: str) -> str:
    """c10d's backend for ``device`` (``dist.get_default_backend_for_device``,
    2.6+; before, nccl for cuda, xccl for xpu, gloo for cpu)."""
    import torch.distributed as dist

    get = getattr(dist, "get_default_backend_for_device", None)
    if get is not None:
        return str(get(device))
    kind = device.split(":")[0]
    return {"cuda": "nccl", "xpu": "xccl"}.get(kind, "gloo")


def cuda_sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: keep the current CUDA stream busy for ``cycles``."""
    import torch

    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # torch: _sleep is unannotated


def clear_cublas_workspaces() -> None:
    """Free cuBLAS workspaces, which a CUDA memory check must not count as a
    leak (``torch._C._cuda_clearCublasWorkspaces``); nothing without CUDA."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def privateuse1_backend_name() -> str:
    """The name of the PrivateUse1 device (``torch._C._get_privateuse1_backend_name``)."""
    import torch

    return str(torch._C._get_privateuse1_backend_name())


def cuda_multicast_support(device_index: int = 0) -> bool:
    """Whether CUDA device ``device_index`` supports multicast for symmetric
    memory (``torch._C._distributed_c10d._SymmetricMemory.has_multicast_support``)."""
    try:
        from torch._C._autograd import DeviceType
        from torch._C._distributed_c10d import _SymmetricMemory
    except ImportError:
        return False
    return bool(_SymmetricMemory.has_multicast_support(DeviceType.CUDA, device_index))


def nvml_device_count() -> int:
    """CUDA devices counted through NVML only (``torch.cuda._device_count_nvml``),
    never through the driver, which would poison fork; -1 where NVML cannot
    count (or this torch lacks the function)."""
    import torch

    count = getattr(torch.cuda, "_device_count_nvml", None)
    if count is None:
        return -1
    try:
        return int(count())
    except Exception:  # noqa: BLE001 (NVML's own failures: unknown)
        return -1
