"""Every touch of private torch API in disttest goes through this module,
and so does every public torch API that only newer releases have.

Each function names the private API it uses, so that a torch upgrade that
moves one breaks here, in one place, and ``tests/test_compat.py`` says which.
``TORCH_FEATURES`` names each version-dependent API with the first torch
release that has it; ``missing_feature`` turns a missing one into the reason
a test skips ("needs torch >= 2.10").
"""

from __future__ import annotations

import sys
from typing import Any

__unittest = True

__all__ = [
    "TORCH_FEATURES",
    "accelerator_count",
    "accelerator_type",
    "c10d_world",
    "default_backend_for_device",
    "dynamo_config_patch",
    "ensure_fake_backend",
    "group_name",
    "has_feature",
    "load_faulty_rpc_agent",
    "missing_feature",
    "new_c10d_world",
    "reduce_op_parts",
    "register_python_group_backend",
    "register_backend",
    "remove_dynamo_trace_handler",
    "reset_dynamo",
    "rref_debug_info",
    "set_c10d_world",
    "set_device_index",
    "set_rref_leak_check",
    "set_thread_isolation",
    "silence_dynamo_trace_log",
    "torch_at_least",
    "torch_version",
]

#: Version-dependent torch API: feature -> (the first torch release that has
#: it, the dotted name probed). Versions read from the released wheels
#: (2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0-2.13.0, 2.14.1). torch before
#: 2.7 is not supported (README, "Supported platforms"); the fallbacks below
#: for older releases only keep ``import disttest`` working there.
TORCH_FEATURES: dict[str, tuple[str, str]] = {
    "torch.accelerator": ("2.6", "torch.accelerator"),
    "dist.all_gather_single": ("2.13", "torch.distributed.all_gather_single"),
    "dist.reduce_scatter_single": ("2.13", "torch.distributed.reduce_scatter_single"),
    "funcol.all_gather_single": ("2.13", "torch.distributed._functional_collectives.all_gather_single"),
    "Backend.FAKE": ("2.11", "torch.distributed.Backend.FAKE"),
    "dist.get_default_backend_for_device": ("2.6", "torch.distributed.get_default_backend_for_device"),
    "dist.is_xccl_available": ("2.6", "torch.distributed.is_xccl_available"),
}

FEATURE_MISSING = "needs torch >= {version} ({feature}; this is torch {installed})"


def torch_version() -> str:
    """The installed torch's version, without a local part (``2.8.0``)."""
    import torch

    return str(torch.__version__).split("+")[0]


def torch_at_least(version: str) -> bool:
    """True when the installed torch is ``version`` (``"2.7"``) or newer."""

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())

    return parts(torch_version()) >= parts(version)


def _probe(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def has_feature(feature: str) -> bool:
    """True when the installed torch has ``feature`` (a key of TORCH_FEATURES)."""
    return _probe(TORCH_FEATURES[feature][1])


def missing_feature(feature: str) -> str | None:
    """None when the installed torch has ``feature``; else the skip reason,
    naming the torch version it needs (``FEATURE_MISSING``)."""
    if feature not in TORCH_FEATURES:
        raise KeyError(f"unknown torch feature {feature!r}; expected one of {sorted(TORCH_FEATURES)} (disttest)")
    if has_feature(feature):
        return None
    return FEATURE_MISSING.format(version=TORCH_FEATURES[feature][0], feature=feature, installed=torch_version())


def accelerator_type() -> str | None:
    """The type of this host's accelerator (``"cuda"``, ``"xpu"``...), or None.

    ``torch.accelerator`` where torch has it (2.6+); before, the CUDA and XPU
    device counts, which ask NVML/the driver without initialising CUDA (a
    later ``fork`` stays safe).
    """
    import torch

    acc_mod = getattr(torch, "accelerator", None)
    if acc_mod is not None:
        acc = acc_mod.current_accelerator() if acc_mod.is_available() else None
        return acc.type if acc is not None else None
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
        return int(acc_mod.device_count()) if acc_mod.is_available() else 0
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


def reset_dynamo() -> None:
    """``torch._dynamo.reset()`` and clear its counters, if dynamo is loaded.

    Does nothing when no code imported ``torch._dynamo`` (importing it only
    to reset it would cost seconds).
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    dynamo.reset()
    dynamo.utils.counters.clear()


def group_name(group: object) -> str:
    """The name c10d gives a process group (``ProcessGroup.group_name``,
    else ``distributed_c10d._get_process_group_name``)."""
    name = getattr(group, "group_name", None)
    if name is None:
        from torch.distributed import distributed_c10d

        name = distributed_c10d._get_process_group_name(group)  # type: ignore[arg-type]
    return str(name)


def ensure_fake_backend() -> None:
    """Register c10d's ``fake`` backend (``FakeProcessGroup``), once.

    torch names the backend (``Backend.FAKE``) but only its private test
    utilities register it; this does the same through the private
    ``FakeProcessGroup._create_internal``.
    """
    reason = missing_feature("Backend.FAKE")
    if reason is not None:
        import unittest

        raise unittest.SkipTest(f"c10d's fake backend {reason} (disttest)")
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    if dist.Backend.FAKE.upper() in dist.Backend._plugins:
        return

    def create(common_opts: Any, backend_opts: Any) -> Any:
        return FakeProcessGroup._create_internal(  # type: ignore[call-arg]
            common_opts.group_rank, common_opts.group_size, backend_opts
        )

    register_backend(dist.Backend.FAKE, create, extended_api=True, devices=["cpu", "cuda", "hpu", "xpu"])


def register_backend(name: str, creator: Any, *, extended_api: bool, devices: list[str]) -> None:
    """``dist.Backend.register_backend``, replacing an earlier registration.

    torch 2.7+ replaces one itself; before, it asserts the name is new, so
    the earlier entry (``Backend.<NAME>``, ``backend_list``, ``_plugins``,
    ``backend_capability``, ``backend_type_map``) is removed first.
    """
    import torch.distributed as dist

    backend = dist.Backend
    try:
        backend.register_backend(name, creator, extended_api=extended_api, devices=devices)
        return
    except AssertionError:
        pass
    if hasattr(backend, name.upper()):
        delattr(backend, name.upper())
    if name.lower() in backend.backend_list:
        backend.backend_list.remove(name.lower())
    backend._plugins.pop(name.upper(), None)
    for table in ("backend_capability", "backend_type_map"):
        getattr(backend, table, {}).pop(name.lower(), None)
    backend.register_backend(name, creator, extended_api=extended_api, devices=devices)


def register_python_group_backend(group: Any, rank: int, world_size: int) -> None:
    """Give a Python-implemented process group a placeholder C++ backend for
    CPU (``ProcessGroup._register_backend``), which supports nothing itself.

    torch 2.14's ``batch_isend_irecv`` asks every group for its CPU backend
    (``_get_backend``) to see whether it coalesces; a group without one raises
    "No backend type associated with device type cpu". Collectives still go
    to the group's Python methods.
    """
    import torch
    import torch.distributed as dist

    if not _placeholder_backend:
        from torch._C._distributed_c10d import Backend

        class _Placeholder(Backend):
            # NB: the base class's properties recurse when it is made from
            # Python; the ones c10d reads are answered here.
            supports_coalescing = False
            supports_splitting = False
            supports_time_estimate = False

        _placeholder_backend.append(_Placeholder)
    try:
        backend = _placeholder_backend[0](rank, world_size)
    except TypeError:
        # Before 2.14 c10d's Backend has no Python constructor, and
        # batch_isend_irecv does not ask a Python group for its backend.
        return
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)


_placeholder_backend: list[type] = []


def dynamo_config_patch(**changes: Any) -> Any:
    """``torch._dynamo.config.patch(**changes)`` (a context manager)."""
    import torch._dynamo

    return torch._dynamo.config.patch(**changes)


def silence_dynamo_trace_log() -> Any:
    """Add a NullHandler to torch's trace log (as dynamo's TestCase does);
    return the handler so the caller can remove it."""
    import logging

    from torch._logging._internal import trace_log

    handler = logging.NullHandler()
    trace_log.addHandler(handler)
    return handler


def remove_dynamo_trace_handler(handler: Any) -> None:
    from torch._logging._internal import trace_log

    trace_log.removeHandler(handler)


def set_thread_isolation(enabled: bool) -> None:
    """c10d's thread isolation mode: process groups registered by name per
    thread (``_set_thread_isolation_mode``), for functional collectives."""
    from torch._C._distributed_c10d import _set_thread_isolation_mode  # type: ignore[attr-defined]

    _set_thread_isolation_mode(enabled)


def c10d_world() -> Any:
    """c10d's registry of process groups (``distributed_c10d._world``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world


def set_c10d_world(world: Any) -> None:
    """Replace c10d's registry (``distributed_c10d._world``)."""
    from torch.distributed import distributed_c10d

    distributed_c10d._world = world


_isolated_world_class: list[type] = []


def new_c10d_world() -> Any:
    """An empty, self-contained registry of c10d's own type.

    ``distributed_c10d._World`` keeps most of its state in module globals
    (``_pg_map``, ``_group_count``...), so a plain new instance would share
    them; this subclass keeps every field on the instance.
    """
    if not _isolated_world_class:
        from torch.distributed import distributed_c10d

        fields = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag")

        def own(name: str) -> property:
            return property(lambda self: self._own[name])

        def get_count(self: Any) -> int:
            return self._own["group_count"]

        def set_count(self: Any, value: int) -> None:
            self._own["group_count"] = value

        def init(self: Any) -> None:
            distributed_c10d._World.__init__(self)
            self._own = {name: {} for name in fields}
            self._own["group_count"] = 0

        namespace: dict[str, Any] = {name: own(name) for name in fields}
        namespace["group_count"] = property(get_count, set_count)
        namespace["__init__"] = init
        _isolated_world_class.append(type("_IsolatedWorld", (distributed_c10d._World,), namespace))
    return _isolated_world_class[0]()


def reduce_op_parts(op: Any) -> tuple[Any, Any]:
    """(RedOpType, PREMUL_SUM factor or None) of a ``ReduceOp`` or RedOpType."""
    import torch.distributed as dist

    if isinstance(op, dist.ReduceOp):
        state: Any = op.__getstate__()
        return state[0], (state[1] if len(state) > 1 else None)
    return op, None


def set_rref_leak_check(enabled: bool) -> None:
    """Whether RPC reports leaked RRefs at shutdown (``rpc.api._ignore_rref_leak``)."""
    import torch.distributed.rpc.api as api

    api._ignore_rref_leak = not enabled


def rref_debug_info() -> dict[str, str]:
    """This node's RRef context counters (``rpc._rref_context_get_debug_info``)."""
    from torch.distributed.rpc import _rref_context_get_debug_info

    return dict(_rref_context_get_debug_info())


def load_faulty_rpc_agent() -> None:
    """Register the FAULTY_TENSORPIPE RPC backend (``rpc._testing``)."""
    import torch.distributed.rpc._testing  # noqa: F401
