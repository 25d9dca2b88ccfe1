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
from collections.abc import Callable
from typing import Any, cast

__unittest = True

__all__ = [
    "LOCAL_TENSOR_MISSING",
    "LOCAL_TENSOR_SPEEDUPS",
    "TORCH_FEATURES",
    "UNKNOWN_SPEEDUP",
    "accelerator_count",
    "accelerator_type",
    "activation_checkpoint",
    "backend_creator",
    "c10d_world",
    "checkpoint_extension",
    "clear_cublas_workspaces",
    "clear_sharding_prop_cache",
    "concatenate_meshes",
    "cuda_multicast_support",
    "cuda_sleep",
    "default_backend_for_device",
    "default_group",
    "default_tolerances",
    "dtensor_sharding_prop_lock",
    "dtensor_spec",
    "dynamo_config_patch",
    "enable_record_function",
    "ensure_fake_backend",
    "fake_process_group",
    "flight_status",
    "fsdp_param_group",
    "fsdp_runtime_utils",
    "functional_collectives",
    "gather_state_dict",
    "group_name",
    "has_feature",
    "has_triton",
    "hybrid_sharding_strategies",
    "inductor_config",
    "install_fake_backend",
    "install_local_tensor_speedups",
    "is_functional_tensor",
    "load_faulty_rpc_agent",
    "local_int_values",
    "local_tensor",
    "local_tensor_shards",
    "local_tensor_speedups_available",
    "mark_uncoalesced",
    "missing_feature",
    "new_c10d_world",
    "preload_dynamo",
    "premul_sum",
    "privateuse1_backend_name",
    "pytree",
    "redistribute_local_tensor",
    "reduce_op_parts",
    "register_backend",
    "register_op_strategy",
    "register_python_group_backend",
    "registered_backend_names",
    "remove_dynamo_trace_handler",
    "reset_dtensor_rng_tracker",
    "reset_dynamo",
    "rref_debug_info",
    "set_c10d_world",
    "set_device_index",
    "set_dtensor_spec",
    "set_rref_leak_check",
    "set_thread_isolation",
    "shard_api",
    "shard_chunk_sizes",
    "shard_order_entry",
    "sharding_propagator",
    "silence_dynamo_trace_log",
    "sparse_coo_raw",
    "thread_local_modes",
    "torch_at_least",
    "torch_version",
    "torchcomms_process_group",
    "use_shard_order_spec",
    "use_torchcomms",
    "wait_tensor",
    "work_base",
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
    """Register c10d's ``fake`` backend (``FakeProcessGroup``), once, for
    the rest of the process, as torch's own helpers do (a skip where torch
    lacks it).

    torch names the backend (``Backend.FAKE``) but only its private test
    utilities register it; this does the same through the private
    ``FakeProcessGroup._create_internal``.
    """
    reason = missing_feature("Backend.FAKE")
    if reason is not None:
        import unittest

        raise unittest.SkipTest(f"c10d's fake backend {reason} (disttest)")
    install_fake_backend()


def install_fake_backend() -> Callable[[], None] | None:
    """Register c10d's ``fake`` backend as upstream's test helpers do, where
    torch has it and nothing registered it yet; return the undo (None when
    there was nothing to do). For ranks: upstream's ranks have it, since its
    helpers register it when imported."""
    if missing_feature("Backend.FAKE") is not None:
        return None
    import torch.distributed as dist

    if dist.Backend.FAKE.upper() in dist.Backend._plugins:
        return None
    from torch._C._distributed_c10d import FakeProcessGroup

    def create(common_opts: Any, backend_opts: Any) -> Any:
        return FakeProcessGroup._create_internal(  # type: ignore[call-arg]
            common_opts.group_rank, common_opts.group_size, backend_opts
        )

    undo: Callable[[], None] = register_backend(dist.Backend.FAKE, create, ["cpu", "cuda", "hpu", "xpu"])
    return undo


def fake_process_group() -> type:
    """c10d's ``FakeProcessGroup`` class (upstream's ``fake_pg`` hands it on)."""
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup


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


_MISSING = object()


def register_backend(name: str, creator: Any, devices: list[str]) -> Any:
    """Register a c10d backend (``Backend.register_backend``, extended API);
    return a function that undoes exactly that registration.

    The undo puts back what this name had before (another harness's plugin
    of the same name, e.g. torch's own ``threaded``) or removes it: the class
    attribute, ``backend_list``, ``backend_type_map``, ``backend_capability``,
    ``default_device_backend_map`` entries and ``_plugins`` (all private
    c10d state).
    """
    import torch.distributed as dist

    backend = dist.Backend
    low, up = name.lower(), name.upper()
    saved = {
        "attr": backend.__dict__.get(up, _MISSING),
        "listed": low in backend.backend_list,
        "type": backend.backend_type_map.get(low, _MISSING),
        "capability": backend.backend_capability.get(low, _MISSING),
        "plugin": backend._plugins.get(up, _MISSING),
        "devices": {d: backend.default_device_backend_map.get(d, _MISSING) for d in devices},
    }
    try:
        backend.register_backend(name, creator, extended_api=True, devices=devices)
    except AssertionError:
        # Before torch 2.7 a name may be registered once: take the earlier
        # entry out first (the undo puts it back).
        if up in backend.__dict__:
            delattr(backend, up)
        if low in backend.backend_list:
            backend.backend_list.remove(low)
        backend._plugins.pop(up, None)
        backend.backend_capability.pop(low, None)
        backend.backend_type_map.pop(low, None)
        backend.register_backend(name, creator, extended_api=True, devices=devices)

    def put(mapping: dict[str, Any], key: str, value: Any) -> None:
        if value is _MISSING:
            mapping.pop(key, None)
        else:
            mapping[key] = value

    def undo() -> None:
        if saved["attr"] is _MISSING:
            if up in backend.__dict__:
                delattr(backend, up)
        else:
            setattr(backend, up, saved["attr"])
        if not saved["listed"] and low in backend.backend_list:
            backend.backend_list.remove(low)
        put(backend.backend_type_map, low, saved["type"])
        put(backend.backend_capability, low, saved["capability"])
        put(backend._plugins, up, saved["plugin"])
        for device, value in saved["devices"].items():
            if backend.default_device_backend_map.get(device) == low:
                put(backend.default_device_backend_map, device, value)

    return undo


def backend_creator(name: str) -> Any:
    """The creator function registered for backend ``name``, or None
    (``Backend._plugins``)."""
    import torch.distributed as dist

    plugin = dist.Backend._plugins.get(name.upper())
    return None if plugin is None else plugin.creator_fn


def registered_backend_names() -> set[str]:
    """Lower-case names of every registered plugin backend (``Backend._plugins``)."""
    import torch.distributed as dist

    return {name.lower() for name in dist.Backend._plugins}


def work_base() -> type:
    """The Python-subclassable c10d Work (``torch.distributed._Work``)."""
    import torch.distributed as dist

    return dist._Work


def default_group() -> Any:
    """The default process group (``distributed_c10d._get_default_group``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def preload_dynamo() -> None:
    """Import ``torch._dynamo`` (a fork server does it once for its ranks)."""
    import torch._dynamo  # noqa: F401


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


def thread_local_modes() -> tuple[Any, ...]:
    """This thread's torch state that a new thread starts with at its
    default: grad and inference mode, CPU autocast, the default device, and
    how many torch function and dispatch modes are pushed
    (``torch._C._len_torch_function_stack``, ``_len_torch_dispatch_stack``)."""
    import torch

    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"),
            torch.get_default_device(), torch._C._len_torch_function_stack(),
            torch._C._len_torch_dispatch_stack())


def c10d_world() -> Any:
    """c10d's registry of process groups (``distributed_c10d._world``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world


def set_c10d_world(world: Any) -> None:
    """Replace c10d's registry (``distributed_c10d._world``)."""
    from torch.distributed import distributed_c10d

    distributed_c10d._world = world


_isolated_world_class: list[type] = []


def new_c10d_world(per_thread: bool = False) -> Any:
    """An empty, self-contained registry of c10d's own type; with
    ``per_thread``, one whose every field is per thread (each thread sees
    its own empty registry: its own default group).

    ``distributed_c10d._World`` keeps most of its state in module globals
    (``_pg_map``, ``_group_count``...), so a plain new instance would share
    them; this subclass keeps every field on the instance.
    """
    if not _isolated_world_class:
        import threading

        from torch.distributed import distributed_c10d

        fields = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag")

        def own(name: str) -> property:
            return property(lambda self: self._own[name])

        def get_count(self: Any) -> int:
            return cast(int, self._own["group_count"])

        def set_count(self: Any, value: int) -> None:
            self._own["group_count"] = value

        def init(self: Any) -> None:
            distributed_c10d._World.__init__(self)
            self._own = {name: {} for name in fields}
            self._own["group_count"] = 0

        namespace: dict[str, Any] = {name: own(name) for name in fields}
        namespace["group_count"] = property(get_count, set_count)
        namespace["__init__"] = init
        isolated = type("_IsolatedWorld", (distributed_c10d._World,), namespace)
        # NB: a threading.local subclass runs __init__ once in each thread
        # that touches it; c10d reads its registry often, so this costs far
        # less than a proxy that looks the thread's registry up per read.
        _isolated_world_class.extend([isolated, type("_ThreadWorld", (threading.local, isolated), {})])
    return _isolated_world_class[1 if per_thread else 0]()


def flight_status() -> dict[str, list[Any]] | None:
    """What c10d's flight recorder knows of this process's groups, per group:
    ``{key: [enqueued, completed, op of the enqueued one, ranks or None]}``,
    ``key`` "default" for the default group, else the group's id; None when
    this torch has no recorder or it is off (``TORCH_FR_BUFFER_SIZE``).

    Reads ``torch._C._distributed_c10d._dump_fr_trace_json`` (private): the
    recorder sees every collective a backend runs, also those issued from
    C++ (DDP's reducer) and functional collectives.
    """
    import json

    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        # Counts first (cheap); the entries only when a collective is pending.
        dump = json.loads(_dump_fr_trace_json(False, True))
        pending = any(int(v.get("last_enqueued_collective", 0)) > int(v.get("last_completed_collective", 0))
                      for v in (dump.get("pg_status") or {}).values())
        if pending:
            dump = json.loads(_dump_fr_trace_json(True, True))
    except Exception:  # noqa: BLE001 (no recorder: nothing known)
        return None
    ops: dict[str, tuple[int, str, str]] = {}
    for entry in dump.get("entries") or ():
        if entry.get("is_p2p") or entry.get("retired"):
            continue
        pg = str(entry.get("pg_id"))
        seq = int(entry.get("collective_seq_id", 0))
        name, desc = (list(entry.get("process_group") or ["", ""]) + ["", ""])[:2]
        if seq >= ops.get(pg, (0, "", ""))[0]:
            op = str(entry.get("profiling_name", "")).split(":")[-1]
            ops[pg] = (seq, op, desc if desc == "default_pg" else name)
    configs = dump.get("pg_config") or {}
    status: dict[str, list[Any]] = {}
    for pg, state in (dump.get("pg_status") or {}).items():
        enqueued = int(state.get("last_enqueued_collective", 0))
        completed = int(state.get("last_completed_collective", 0))
        _, op, name = ops.get(pg, (0, "", ""))
        ranks: Any = None
        if name != "default_pg":
            config = configs.get(name)
            if config is None:
                continue  # a group whose ranks are unknown is not judged
            ranks = json.loads(config.get("ranks", "null"))
        status["default" if name == "default_pg" or pg == "0" else pg] = [enqueued, completed, op, ranks]
    return status


def hybrid_sharding_strategies() -> set[Any]:
    """FSDP1's hybrid strategies (``ShardingStrategy._HYBRID_SHARD_ZERO2`` is private)."""
    from torch.distributed.fsdp import ShardingStrategy

    found = {ShardingStrategy.HYBRID_SHARD}
    zero2 = getattr(ShardingStrategy, "_HYBRID_SHARD_ZERO2", None)
    if zero2 is not None:
        found.add(zero2)
    return found


def activation_checkpoint() -> Any:
    """The composable ``checkpoint`` (``torch.distributed._composable``)."""
    from torch.distributed._composable import checkpoint

    return checkpoint


def premul_sum(factor: Any) -> Any:
    """The PREMUL_SUM reduce op with ``factor`` (``dist._make_nccl_premul_sum``)."""
    import torch.distributed as dist

    return dist._make_nccl_premul_sum(factor)


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


#: Why the local-tensor bases skip on a torch without the mode.
LOCAL_TENSOR_MISSING = (
    "needs torch.distributed._local_tensor (LocalTensorMode), which torch {version} lacks; "
    "torch 2.10 and later have it (disttest)"
)


def local_tensor() -> Any:
    """torch's private local-tensor module (``torch.distributed._local_tensor``:
    ``LocalTensorMode``, ``LocalTensor``, ``LocalIntNode``,
    ``maybe_disable_local_tensor_mode``, ``maybe_run_for_local_tensor``), or
    None on a torch without it."""
    try:
        import torch.distributed._local_tensor as module
    except ImportError:
        return None
    return module


def dtensor_sharding_prop_lock(lock: Any | None = None) -> Any:
    """DTensor's ``ShardingPropagator._fake_mode_lock`` (a no-op lock unless
    threads share the propagator); with ``lock``, set it and return the old one."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    old = ShardingPropagator._fake_mode_lock
    if lock is not None:
        ShardingPropagator._fake_mode_lock = lock
    return old


def enable_record_function(enabled: bool) -> None:
    """``torch.autograd._enable_record_function`` (profiler ranges on ops)."""
    import torch

    torch.autograd._enable_record_function(enabled)


def reset_dtensor_rng_tracker() -> None:
    """Forget DTensor's random-state tracker (``tensor._random._rng_tracker``)."""
    from torch.distributed.tensor import _random

    _random._rng_tracker = None


def is_functional_tensor(t: Any) -> bool:
    """``torch._is_functional_tensor``."""
    import torch

    return bool(torch._is_functional_tensor(t))


def pytree() -> Any:
    """torch's pytree module (``torch.utils._pytree``: tree_flatten, tree_unflatten)."""
    import torch.utils._pytree as module

    return module


def fsdp_param_group() -> Any:
    """FSDP2's private param-group module
    (``torch.distributed.fsdp._fully_shard._fsdp_param_group``: ``FSDPParamGroup``,
    ``RegisterPostBackwardFunction``, ``foreach_all_gather``, ``foreach_reduce``)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as module

    return module


def inductor_config() -> Any:
    """Inductor's private config module (``torch._inductor.config``:
    ``compile_threads``...), imported on first use."""
    import torch._inductor.config as module

    return module


def has_triton() -> bool:
    """``torch.utils._triton.has_triton()``: Triton and a device it can compile for."""
    from torch.utils._triton import has_triton as probe

    return bool(probe())


def cuda_sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: keep the current CUDA stream busy for ``cycles``."""
    import torch

    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # torch: _sleep is unannotated


def fsdp_runtime_utils() -> Any:
    """FSDP1's private runtime module (``torch.distributed.fsdp._runtime_utils``:
    ``_reshard``)."""
    import torch.distributed.fsdp._runtime_utils as module

    return module


def shard_api() -> Any:
    """torch's sharded-tensor package (``torch.distributed._shard``), with its
    ``sharded_tensor`` (``ShardedTensor``, ``rand``...) and ``sharding_spec``
    (``ChunkShardingSpec``, ``EnumerableShardingSpec``, ``ShardMetadata``)
    modules imported."""
    import torch.distributed._shard as module
    import torch.distributed._shard.sharded_tensor
    import torch.distributed._shard.sharding_spec  # noqa: F401  (loads the attribute)

    return module


def shard_chunk_sizes() -> tuple[Callable[[int, int], int], Callable[[int, int, int], int]]:
    """``(get_split_size, get_chunked_dim_size)`` of
    ``torch.distributed._shard.sharding_spec._internals``: how
    ``ChunkShardingSpec`` sizes its chunks."""
    from torch.distributed._shard.sharding_spec._internals import (
        get_chunked_dim_size,
        get_split_size,
    )

    return get_split_size, get_chunked_dim_size


def checkpoint_extension() -> Any:
    """Distributed checkpoint's private extension module
    (``torch.distributed.checkpoint._extension``: ``ExtensionRegistry``,
    ``StreamTransformExtension``)."""
    import torch.distributed.checkpoint._extension as module

    return module


def gather_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``torch.distributed._state_dict_utils._gather_state_dict``: the state dict
    with every DTensor and ShardedTensor gathered into a full tensor
    (collective over their groups)."""
    from torch.distributed._state_dict_utils import _gather_state_dict

    return _gather_state_dict(state_dict)


def sparse_coo_raw(t: Any) -> tuple[Any, Any]:
    """A COO tensor's indices and values as stored, also when it is not
    coalesced (``Tensor._indices``, ``Tensor._values``)."""
    return t._indices(), t._values()


def mark_uncoalesced(t: Any) -> Any:
    """Flag a COO tensor as not coalesced (``Tensor._coalesced_(False)``); return it."""
    return t._coalesced_(False)


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


def shard_order_entry() -> type:
    """DTensor's ``ShardOrderEntry(tensor_dim, mesh_dims)``
    (``torch.distributed.tensor._dtensor_spec``)."""
    from torch.distributed.tensor._dtensor_spec import ShardOrderEntry

    return ShardOrderEntry


def dtensor_spec(dt: Any) -> Any:
    """A DTensor's spec (``DTensor._spec``: mesh, placements, shard order)."""
    return dt._spec


def set_dtensor_spec(dt: Any, spec: Any) -> None:
    """Replace a DTensor's spec (``DTensor._spec``)."""
    dt._spec = spec


def use_shard_order_spec(dt: Any) -> None:
    """Make a DTensor's spec keep an explicit shard order instead of reading
    one from ``_StridedShard`` placements (``DTensorSpec.__post_init__``)."""
    spec = dt._spec
    spec.use_strided_shard_as_shard_order = False
    spec.__post_init__()


def redistribute_local_tensor(local: Any, current_spec: Any, target_spec: Any,
                              use_graph_based_transform: bool | None = None) -> Any:
    """One rank's shard moved from ``current_spec`` to ``target_spec``
    (``torch.distributed.tensor._redistribute.redistribute_local_tensor``)."""
    from torch.distributed.tensor._redistribute import redistribute_local_tensor as move

    return move(local, current_spec, target_spec, use_graph_based_transform=use_graph_based_transform)


def sharding_propagator() -> Any:
    """DTensor's sharding propagator (``DTensor._op_dispatcher.sharding_propagator``:
    ``op_strategy_funcs``, ``op_to_schema_info``)."""
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def register_op_strategy(op: Any, strategy_func: Any, schema_info: Any = None) -> None:
    """Register ``strategy_func`` as DTensor's strategy for ``op``
    (``torch.distributed.tensor._ops.utils.register_op_strategy``)."""
    from torch.distributed.tensor._ops.utils import register_op_strategy as register

    register(op, schema_info=schema_info)(strategy_func)


def clear_sharding_prop_cache() -> None:
    """Clear DTensor's sharding-propagation caches
    (``torch.distributed.tensor.debug._clear_sharding_prop_cache``)."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # type: ignore[no-untyped-call]  # torch: unannotated


def functional_collectives() -> Any:
    """torch's functional collectives (``torch.distributed._functional_collectives``:
    ``all_gather_single_autograd``, ``reduce_scatter_single_autograd``)."""
    import torch.distributed._functional_collectives as module

    return module


def wait_tensor(t: Any) -> Any:
    """Wait for a functional collective's result (``torch.ops._c10d_functional.wait_tensor``)."""
    import torch

    return torch.ops._c10d_functional.wait_tensor(t)


def concatenate_meshes(meshes: list[Any]) -> Any:
    """One DeviceMesh over the dimensions of ``meshes``, slices of one mesh
    (``DeviceMesh._concatenate``)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh._concatenate(meshes)


def cuda_multicast_support(device_index: int = 0) -> bool:
    """Whether CUDA device ``device_index`` supports multicast for symmetric
    memory (``torch._C._distributed_c10d._SymmetricMemory.has_multicast_support``)."""
    try:
        from torch._C._autograd import DeviceType
        from torch._C._distributed_c10d import _SymmetricMemory
    except ImportError:
        return False
    return bool(_SymmetricMemory.has_multicast_support(DeviceType.CUDA, device_index))


def use_torchcomms(enabled: bool) -> None:
    """Route c10d through torchcomms (``torch.distributed.config.use_torchcomms``)."""
    import importlib

    config: Any = importlib.import_module("torch.distributed.config")
    config.use_torchcomms = enabled


def torchcomms_process_group(backend: str, rank: int, world_size: int, device: Any, store_path: str,
                             group_name: str) -> Any:
    """A ProcessGroup over a torchcomms comm, published in c10d's world
    (``distributed_c10d._BackendWrapper``, ``_register_pg_in_world``), as
    upstream's ``setup_torchcomms_pg`` builds it."""
    import importlib

    torchcomms: Any = importlib.import_module("torchcomms")
    c10d: Any = importlib.import_module("torch.distributed.distributed_c10d")
    file_store = c10d.FileStore(store_path, world_size)
    comm = torchcomms.new_comm(backend, device, name=f"{group_name}_comm",
                               store=c10d.PrefixStore(f"{group_name}_tc/", file_store),
                               hints={"persistent_store": "true"})
    pg = c10d.ProcessGroup(c10d.PrefixStore(f"{group_name}_pg/", file_store), comm.get_rank(), comm.get_size())
    pg._register_backend(comm.get_device(), c10d.ProcessGroup.BackendType.NCCL, c10d._BackendWrapper(comm))
    pg._set_default_backend(c10d.ProcessGroup.BackendType.NCCL)
    pg._set_group_name(group_name)
    c10d._register_pg_in_world(pg, backend_name=backend, store=file_store, group_name=group_name,
                               backend_config=backend, rank_mapping={r: r for r in range(world_size)})
    return pg


def default_tolerances(*inputs: Any) -> tuple[float, float]:
    """``torch.testing.assert_close``'s default (rtol, atol) for ``inputs``'
    dtypes (``torch.testing._comparison.default_tolerances``)."""
    import torch
    from torch.testing._comparison import default_tolerances as tolerances

    rtol, atol = tolerances(*(x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in inputs))
    return float(rtol), float(atol)



# --- local-tensor mode at scale ------------------------------------------------
#
# torch's LocalTensorMode simulates every rank in one thread, but some of its
# bookkeeping costs O(world) per op per rank, or O(world^2) per mesh. The
# helpers below replace five of its private functions (in six parts) with
# equivalents that give every rank the same values, RNG streams and errors,
# for as long as a test needs them (install_local_tensor_speedups returns the
# undo). Each part replaces upstream code whose source it was checked against
# (fingerprints below): where the installed torch's differs, that part is
# left out, so a torch upgrade costs speed, never correctness.
# tests/test_simulated.py proves each part against upstream's.

#: The parts ``install_local_tensor_speedups`` knows, each replacing upstream
#: code: ``coordinates`` (``_LocalDeviceMesh.get_coordinate``: one pass over
#: the mesh instead of recomputing its layout for every rank), ``rng``
#: (``_for_each_rank_run_func``: no per-rank RNG save and restore for an aten
#: op that draws no random numbers), ``args`` (the same function: per-rank
#: arguments without a pytree unflatten per rank), ``meta``
#: (``_compute_local_tensor_meta`` in one pass), ``enter``
#: (``LocalTensorMode.__enter__``: the ranks share one copy of the RNG state
#: instead of a clone each) and ``dispatch`` (``LocalTensorMode.__torch_dispatch__``:
#: an op on plain tensors runs without a pytree flatten).
LOCAL_TENSOR_SPEEDUPS = ("coordinates", "rng", "args", "meta", "enter", "dispatch")

UNKNOWN_SPEEDUP = "unknown local-tensor speedup {name!r}; expected some of {known} (disttest)"

# sha256 (first 16 hex digits) of the dedented source of the upstream code
# each part replaces or relies on, per known version of it (torch 2.13).
_SPEEDUP_SOURCES: dict[str, tuple[str, ...]] = {
    "coordinates": ("_LocalDeviceMesh.get_coordinate",),
    "rng": ("_for_each_rank_run_func", "_map_to_rank_local_val"),
    "args": ("_for_each_rank_run_func", "_map_to_rank_local_val"),
    "meta": ("_compute_local_tensor_meta", "_get_extra_dispatch_keys"),
    "enter": ("LocalTensorMode.__enter__",),
    "dispatch": ("LocalTensorMode.__torch_dispatch__", "_check_for_subclass_arg"),
}
_SPEEDUP_FINGERPRINTS: dict[str, frozenset[str]] = {
    "coordinates": frozenset({"7bb3de11b3803ce7"}),
    "rng": frozenset({"06a826708f789205"}),
    "args": frozenset({"06a826708f789205"}),
    "meta": frozenset({"04821731ed723a67"}),
    "enter": frozenset({"d74dd2a3056fb1d6"}),
    "dispatch": frozenset({"caf1d052860cf956"}),
}


def local_tensor_shards(t: Any) -> dict[int, Any] | None:
    """A LocalTensor's per-rank tensors (``LocalTensor._local_tensors``), or
    None when ``t`` is not a LocalTensor (or torch lacks the mode)."""
    lt = local_tensor()
    if lt is None or not isinstance(t, lt.LocalTensor):
        return None
    return dict(t._local_tensors)


def local_int_values(value: Any) -> dict[int, int] | None:
    """A per-rank int's values (``LocalIntNode._local_ints`` of a SymInt), or
    None when ``value`` is not one."""
    lt = local_tensor()
    node = getattr(value, "node", None)
    if lt is None or not isinstance(node, lt.LocalIntNode):
        return None
    return dict(node._local_ints)


def _fingerprint(lt: Any, names: tuple[str, ...]) -> str | None:
    import hashlib
    import inspect
    import textwrap

    digest = hashlib.sha256()
    for name in names:
        obj: Any = lt
        for part in name.split("."):
            obj = getattr(obj, part, None)
        try:
            digest.update(textwrap.dedent(inspect.getsource(inspect.unwrap(obj))).encode())
        except (OSError, TypeError):  # no source, or no such function
            return None
    return digest.hexdigest()[:16]


def local_tensor_speedups_available() -> tuple[str, ...]:
    """The parts of ``LOCAL_TENSOR_SPEEDUPS`` whose upstream code is the code
    they were checked against (none on a torch without the mode)."""
    lt = local_tensor()
    if lt is None:
        return ()
    return tuple(p for p in LOCAL_TENSOR_SPEEDUPS
                 if _fingerprint(lt, _SPEEDUP_SOURCES[p]) in _SPEEDUP_FINGERPRINTS[p])


def _closed_form_coordinate(mesh: Any) -> Any:
    """``_LocalDeviceMesh.get_coordinate`` in O(world). Upstream recomputes
    the layout's rank tensor under the mode once per rank, each of its ops
    running once per rank (O(world^2)); here it is computed once with the mode
    off, and one pass over its values places every rank. Same cache, lock,
    values (in the same order) and errors; the cached meshes kept alive."""
    import math

    import torch

    lt = local_tensor()
    lm = lt.enabled_local_tensor_mode()
    if lm is None:
        raise AssertionError("Unexpectedly not in LocalTensorMode")
    mesh_id = id(mesh)
    cache = lm._coordinate_cache
    if mesh_id in cache:
        return cache[mesh_id]
    with lm._coordinate_cache_lock:
        if mesh_id in cache:
            return cache[mesh_id]
        with lm.disable():
            # a clone, as upstream: inference mode forbids using the map itself
            rank_tensor = mesh._layout.remap_to_tensor(mesh._rank_map.clone())
        shape = list(rank_tensor.shape[1:])  # dim 0 enumerates the sibling submeshes
        per_submesh = math.prod(shape)
        where: dict[int, int] = {}
        for index, rank in enumerate(rank_tensor.reshape(-1).tolist()):
            where[rank] = -1 if rank in where else index % per_submesh
        coords: list[dict[int, int]] = [{} for _ in shape]
        for rank in lm.ranks:
            pos = where.get(rank, -1)
            if pos < 0:  # as upstream: each rank must appear exactly once
                raise AssertionError
            for dim in range(len(shape) - 1, -1, -1):
                pos, coords[dim][rank] = divmod(pos, shape[dim])
        out = [torch.SymInt(lt.LocalIntNode(c)) for c in coords]  # type: ignore[no-untyped-call]  # torch: unannotated
        cache[mesh_id] = out
        # NB: the cache is keyed by id(); upstream lets a cached mesh die, and
        # a mesh made later at its address (a temporary submesh: mesh["a", "b"])
        # gets its coordinates. A cached mesh lives as long as the mode here.
        lm.__dict__.setdefault("_disttest_cached_meshes", []).append(mesh)
        return out


def _draws_no_random_numbers(func: Any) -> bool:
    """An aten op torch does not tag ``nondeterministic_seeded`` neither reads
    nor advances a generator (every aten op with a Generator argument has the
    tag). Other callables (custom and higher-order ops, the Python functions
    of ``maybe_run_for_local_tensor``) keep upstream's per-rank RNG."""
    import torch

    return (isinstance(func, torch._ops.OpOverload) and func.namespace == "aten"
            and torch.Tag.nondeterministic_seeded not in func.tags)


def _compile_unflatten(spec: Any, start: int = 0) -> Callable[[list[Any]], Any]:
    """``spec.unflatten(leaves[start:])`` as a closure, resolved once per op
    instead of once per rank: the same node functions and contexts."""
    from torch.utils import _pytree

    if spec.is_leaf():
        return lambda leaves: leaves[start]
    unflatten = _pytree.SUPPORTED_NODES[spec.type].unflatten_fn
    context = spec.context
    children = list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)
    if all(child.is_leaf() for child in children):
        end = start + len(children)
        return lambda leaves: unflatten(leaves[start:end], context)
    parts = []
    for child in children:
        parts.append(_compile_unflatten(child, start))
        start += child.num_leaves
    return lambda leaves: unflatten([part(leaves) for part in parts], context)


_NO_KWARGS: dict[str, Any] = {}


def _fast_for_each_rank(upstream: Callable[..., Any], fast_rng: bool, fast_args: bool) -> Callable[..., Any]:
    """``_for_each_rank_run_func``, with the per-rank RNG round trip skipped
    for an op that draws no random numbers (``fast_rng``) and the per-rank
    arguments built by a compiled unflatten (``fast_args``).

    Upstream sets each rank's saved RNG state before the op and saves it
    after. For an op that draws none the state it saves is the one it set, so
    all that can be seen is where the generator is left: at the last rank's
    state (the failing rank's, on an error), which is set once."""
    import torch
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.fx.experimental._constant_symnode import ConstantIntNode
    from torch.utils import _pytree
    from torch.utils._python_dispatch import return_and_correct_aliasing

    lt = local_tensor()
    LocalTensor, LocalIntNode = lt.LocalTensor, lt.LocalIntNode

    def run(func: Any, ranks: Any, args: Any, kwargs: Any, *, alias: bool = True) -> Any:
        lm = lt.enabled_local_tensor_mode()
        states = lm._per_rank_rng_states if lm is not None else {}
        per_rank_rng = len(states) > 0
        skip_rng = fast_rng and _draws_no_random_numbers(func) and (not per_rank_rng or states.keys() >= ranks)
        if not (skip_rng or fast_args):
            return upstream(func, ranks, args, kwargs, alias=alias)
        flat_args, spec = _pytree.tree_flatten((args, kwargs))
        flat_args = [a.wait() if isinstance(a, AsyncCollectiveTensor) else a for a in flat_args]
        # upstream's _map_to_rank_local_val, decided once per argument
        base = list(flat_args)
        varying: list[tuple[int, dict[int, Any]]] = []
        for i, a in enumerate(flat_args):
            if isinstance(a, LocalTensor):
                varying.append((i, a._local_tensors))
            elif isinstance(a, torch.SymInt):
                if isinstance(a.node, LocalIntNode):
                    varying.append((i, a.node._local_ints))
                elif isinstance(a.node, ConstantIntNode):
                    base[i] = a.node.val
        build_args = build_kwargs = None
        if fast_args:
            args_spec, kwargs_spec = spec.children() if hasattr(spec, "children") else spec.children_specs
            build_args = _compile_unflatten(args_spec)
            if kwargs_spec.num_leaves:
                build_kwargs = _compile_unflatten(kwargs_spec, args_spec.num_leaves)
        global_state = None if skip_rng or per_rank_rng else lt._get_rng_state()
        is_hash = func is torch.ops.aten.hash_tensor.default
        is_split = func is torch.ops.aten.split.Tensor
        results: dict[int, Any] = {}
        default_value = None
        rank = None
        try:
            for rank in sorted(ranks):
                if not skip_rng:
                    if per_rank_rng:
                        if rank in states:
                            lt._set_rng_state(*states[rank])
                    else:
                        lt._set_rng_state(*cast(tuple[Any, ...], global_state))
                rank_flat = base.copy()
                for i, per_rank in varying:
                    rank_flat[i] = per_rank[rank]
                if build_args is None:
                    rank_args, rank_kwargs = spec.unflatten(rank_flat)
                else:
                    rank_args = build_args(rank_flat)
                    rank_kwargs = _NO_KWARGS if build_kwargs is None else build_kwargs(rank_flat)
                if is_hash and rank_args[0].numel() == 0:
                    results[rank] = torch.empty(0, dtype=torch.uint64, device=rank_args[0].device)
                else:
                    results[rank] = func(*rank_args, **rank_kwargs)
                if per_rank_rng and not skip_rng:
                    states[rank] = lt._get_rng_state()
                if default_value is None and is_split:
                    split_dim = 0 if len(rank_flat) < 3 else rank_flat[2]
                    default_value = lt._zero_sized_like(rank_flat[0], split_dim)
        finally:
            if skip_rng and per_rank_rng and rank is not None:
                lt._set_rng_state(*states[rank])
        if lt._is_inplace_op(func):
            ret = args[0]
            if torch.Tag.inplace_view in func.tags:
                ret._sync_meta()
            return ret
        ret = lt._combine_rank_results(results, default_value)
        return return_and_correct_aliasing(func, args, kwargs, ret) if alias else ret  # type: ignore[no-untyped-call]  # torch: unannotated

    return run


def _one_pass_tensor_meta(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``_compute_local_tensor_meta`` in one pass where every rank's shard has
    one shape: the same checks in the same order, the same errors and result
    (strides as a LocalIntNode only where ranks differ); upstream's where
    shapes differ."""
    import torch

    lt = local_tensor()
    mismatch = "Tensors representing LocalTensor shards must have the same {}"

    def meta(local_tensors: dict[int, Any]) -> Any:
        values = list(local_tensors.values())
        first = values[0]
        dtype, layout = first.dtype, first.layout
        extra = lt._get_extra_dispatch_keys(first)
        # upstream's extra keys are Conjugate and Negative: the conj and neg bits
        bits = (first.is_conj(), first.is_neg())
        shape, stride = first.shape, first.stride()
        same_shape = same_stride = True
        for t in values[1:]:
            if dtype != t.dtype:
                raise AssertionError(mismatch.format("dtype"))
            if layout != t.layout:
                raise AssertionError(mismatch.format("layout"))
            if bits != (t.is_conj(), t.is_neg()):
                raise AssertionError(mismatch.format("set of extra dispatch keys"))
            same_shape = same_shape and t.shape == shape
            same_stride = same_stride and t.stride() == stride
        if not same_shape:
            return upstream(local_tensors)
        strides: list[Any] = list(stride)
        if not same_stride:
            for d in range(len(shape)):
                per_rank = {r: t.stride(d) for r, t in local_tensors.items()}
                if any(v != stride[d] for v in per_rank.values()):
                    strides[d] = torch.SymInt(lt.LocalIntNode(per_rank))  # type: ignore[no-untyped-call]  # torch: unannotated
        return list(shape), strides, first.device, dtype, layout, extra

    return meta


def _shared_state_enter(mode: Any) -> Any:
    """``LocalTensorMode.__enter__`` with the ranks sharing one copy of the
    generator's state instead of a clone each (upstream clones world-size
    states on every entry, and LocalTensor's own dispatch enters a new mode
    for every op it sees). Safe because no saved state is written in place:
    upstream only replaces them (``_per_rank_rng_states[rank] = ...``) and
    copies from them (``set_rng_state``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    lt = local_tensor()
    lt.get_local_tensor_mode_list().append(mode)
    mode.enable_()
    if not lt._is_in_fake_tensor_mode():
        shared = lt._get_rng_state()  # fresh tensors, owned by no one else
        states = mode._per_rank_rng_states
        for rank in mode.ranks:
            states[rank] = shared
    return TorchDispatchMode.__enter__(mode)  # type: ignore[no-untyped-call]  # torch: unannotated


def _plain_dispatch(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``LocalTensorMode.__torch_dispatch__`` with a short path for an op
    whose arguments hold tensors of the plain kinds only (no LocalTensor, no
    other subclass): the ops a per-rank function runs on one rank's tensors,
    which upstream runs unchanged after flattening their arguments with
    pytree. An argument it cannot see through at a glance (a container other
    than a list, tuple or Size) sends the op to upstream."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree

    nodes = _pytree.SUPPORTED_NODES
    plain = (torch.Tensor, FakeTensor, torch.nn.Parameter, torch.nn.Buffer)  # upstream's _check_for_subclass_arg
    sequences = (list, tuple, torch.Size)
    mesh_ops = getattr(torch.ops, "device_mesh", None)
    coordinate_op = getattr(getattr(mesh_ops, "_runtime_compute_coordinate_on_dim", None), "default", None)

    def count(values: Any) -> int:
        """How many plain tensors ``values`` holds; -1 if anything else."""
        found = 0
        for a in values:
            kind = type(a)
            if kind in plain:
                found += 1
            elif kind in sequences:
                inner = count(a)
                if inner < 0:
                    return -1
                found += inner
            elif isinstance(a, (torch.Tensor, tuple, list, dict)) or kind in nodes:
                return -1
        return found

    def dispatch(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not types and func is not coordinate_op:
            found = count(args)
            if found >= 0 and kwargs:
                more = count(kwargs.values())
                found = -1 if more < 0 else found + more
            # upstream: no LocalTensor, and a tensor among the arguments or the
            # mode disabled: the op as it is
            if found > 0 or (found == 0 and mode._disable):
                return func(*args, **(kwargs or _NO_KWARGS))
        return upstream(mode, func, types, args, kwargs)

    return dispatch


def install_local_tensor_speedups(parts: Any = LOCAL_TENSOR_SPEEDUPS) -> Callable[[], None]:
    """Replace the upstream code behind ``parts`` (names from
    ``LOCAL_TENSOR_SPEEDUPS``; those not in ``local_tensor_speedups_available()``
    are left out) in torch's local-tensor module; return the undo, which puts
    back exactly what was there. Install before entering a LocalTensorMode and
    undo after leaving it (an entered mode keeps the mesh methods it found).

    Private API: ``torch.distributed._local_tensor``'s
    ``_LocalDeviceMesh.get_coordinate``, ``_for_each_rank_run_func``,
    ``_compute_local_tensor_meta``, ``LocalTensorMode.__enter__`` and
    ``__torch_dispatch__``, and what they use (``_per_rank_rng_states``,
    ``_coordinate_cache``, ``_get_rng_state``, ``_combine_rank_results``...).
    """
    chosen = tuple(parts)
    for name in chosen:
        if name not in LOCAL_TENSOR_SPEEDUPS:
            raise ValueError(UNKNOWN_SPEEDUP.format(name=name, known=LOCAL_TENSOR_SPEEDUPS))
    lt = local_tensor()
    usable = set(chosen) & set(local_tensor_speedups_available())
    saved: list[tuple[Any, str, Any]] = []

    def replace(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    if "coordinates" in usable:
        replace(lt._LocalDeviceMesh, "get_coordinate", staticmethod(_closed_form_coordinate))
    if usable & {"rng", "args"}:
        replace(lt, "_for_each_rank_run_func",
                _fast_for_each_rank(lt._for_each_rank_run_func, "rng" in usable, "args" in usable))
    if "meta" in usable:
        replace(lt, "_compute_local_tensor_meta", _one_pass_tensor_meta(lt._compute_local_tensor_meta))
    if "enter" in usable:
        replace(lt.LocalTensorMode, "__enter__", _shared_state_enter)
    if "dispatch" in usable:
        replace(lt.LocalTensorMode, "__torch_dispatch__", _plain_dispatch(lt.LocalTensorMode.__torch_dispatch__))

    def undo() -> None:
        while saved:
            owner, name, value = saved.pop()
            setattr(owner, name, value)

    return undo
