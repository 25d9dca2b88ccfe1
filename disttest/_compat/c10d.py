"""c10d's groups and registry: the default group and group names, the
registry of process groups (``distributed_c10d._world``) and self-contained
ones per thread, thread isolation, reduce ops, functional collectives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

__unittest = True

__all__ = [
    "adopt_thread_world_state",
    "c10d_logger",
    "c10d_world",
    "default_group",
    "default_store",
    "functional_collectives",
    "functional_group",
    "group_name",
    "group_timeout",
    "new_c10d_world",
    "premul_sum",
    "reduce_op_parts",
    "set_c10d_world",
    "set_group_timeout",
    "set_thread_isolation",
    "skip_store_barriers",
    "thread_local_modes",
    "thread_world_state",
    "wait_tensor",
]


def group_name(group: object) -> str:
    """The name c10d gives a process group (``ProcessGroup.group_name``,
    else ``distributed_c10d._get_process_group_name``)."""
    name = getattr(group, "group_name", None)
    if name is None:
        from torch.distributed import distributed_c10d

        name = distributed_c10d._get_process_group_name(group)  # type: ignore[arg-type]
    return str(name)


def c10d_logger() -> Any:
    """The logger c10d's collectives log their exceptions to (at DEBUG, a
    dict per call: ``c10d_logger._c10d_logger``), or None."""
    try:
        from torch.distributed import c10d_logger
    except ImportError:
        return None
    return getattr(c10d_logger, "_c10d_logger", None)


def default_group() -> Any:
    """The default process group (``distributed_c10d._get_default_group``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def default_store() -> Any:
    """The store the default group was made with (``distributed_c10d._get_default_store``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def set_group_timeout(seconds: float) -> bool:
    """Make the default group's calls raise after ``seconds`` from now on
    (``distributed_c10d._set_pg_timeout``); False where this torch cannot."""
    from datetime import timedelta

    from torch.distributed import distributed_c10d

    setter = getattr(distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return False
    try:
        setter(timedelta(seconds=seconds))
    except Exception:  # noqa: BLE001 (a backend it does not know: the group keeps its own)
        return False
    return True


def group_timeout(group: Any) -> float | None:
    """Seconds after which a call of process group ``group`` raises by
    itself: the threaded group's own ``timeout``, else its CPU backend's
    options (``group._get_backend(cpu).options._timeout``); None where
    unknown."""
    import torch

    own = getattr(group, "timeout", None)
    if isinstance(own, (int, float)) and not isinstance(own, bool):
        return float(own)
    try:
        return float(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())
    except Exception:  # noqa: BLE001 (a backend without options, a torch without the call)
        return None


def set_thread_isolation(enabled: bool) -> None:
    """c10d's thread isolation mode: process groups registered by name per
    thread (``_set_thread_isolation_mode``), for functional collectives."""
    from torch._C._distributed_c10d import _set_thread_isolation_mode  # type: ignore[attr-defined]

    _set_thread_isolation_mode(enabled)


def thread_local_modes() -> tuple[Any, ...]:
    """This thread's torch state that a new thread starts with at its
    default: grad and inference mode, CPU autocast, the default device (the
    context ``set_default_device`` keeps per thread,
    ``torch._GLOBAL_DEVICE_CONTEXT.device_context``), and how many torch
    function and dispatch modes are pushed
    (``torch._C._len_torch_function_stack``, ``_len_torch_dispatch_stack``)."""
    import torch

    # NB: not torch.get_default_device(), ten times the cost of the rest: a
    # rank thread asks after each test.
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    device = getattr(holder, "device_context", None) if holder is not None else torch.get_default_device()
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"),
            device, torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())


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


def functional_collectives() -> Any:
    """torch's functional collectives (``torch.distributed._functional_collectives``:
    ``all_gather_single_autograd``, ``reduce_scatter_single_autograd``)."""
    import torch.distributed._functional_collectives as module

    return module


def functional_group(group: Any, tag: str = "") -> Any:
    """The process group a functional collective's ``group`` argument (a
    group, a list of ranks, a mesh, a name) means, or None where it cannot
    be told (``_functional_collectives._resolve_group_name``,
    ``distributed_c10d._resolve_process_group``)."""
    try:
        from torch.distributed import distributed_c10d

        name = functional_collectives()._resolve_group_name(group, tag)
        return distributed_c10d._resolve_process_group(name)
    except Exception:  # noqa: BLE001 (an older torch, a group it cannot name)
        return None


def wait_tensor(t: Any) -> Any:
    """Wait for a functional collective's result (``torch.ops._c10d_functional.wait_tensor``)."""
    import torch

    return torch.ops._c10d_functional.wait_tensor(t)


def skip_store_barriers(skip: Callable[[], bool]) -> Callable[[], None]:
    """Make c10d's store-based barrier after ``init_process_group`` and
    ``new_group`` (``TORCH_DIST_INIT_BARRIER=1``;
    ``distributed_c10d._store_based_barrier``) return at once while
    ``skip()`` is true (a world whose other ranks do not exist); return the
    undo. A torch without it: nothing to do."""
    from torch.distributed import distributed_c10d

    barrier = getattr(distributed_c10d, "_store_based_barrier", None)
    if barrier is None:
        return lambda: None

    def maybe(*args: Any, **kwargs: Any) -> None:
        if not skip():
            barrier(*args, **kwargs)

    distributed_c10d._store_based_barrier = maybe

    def undo() -> None:
        if distributed_c10d._store_based_barrier is maybe:
            distributed_c10d._store_based_barrier = barrier

    return undo


def thread_world_state() -> dict[str, Any] | None:
    """The calling thread's view of a per-thread registry
    (:func:`new_c10d_world` with ``per_thread``), for a thread it starts to
    share (:func:`adopt_thread_world_state`): its default group and the
    registry of its groups. None where c10d's registry is not per thread or
    this thread has no default group."""
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    if not _isolated_world_class or not isinstance(world, _isolated_world_class[1]):
        return None
    state = world.__dict__  # (a threading.local: this thread's)
    if state.get("_default_pg") is None:
        return None
    return dict(state)


def adopt_thread_world_state(state: dict[str, Any]) -> Callable[[], None]:
    """In another thread: see the registry ``state`` (what
    :func:`thread_world_state` returned in a rank's thread) as its own: the
    same default group and groups (new ones it makes are the rank's too);
    its own coalescing state. Returns the undo (the thread's registry as it
    was, and the names registered for functional collectives removed)."""
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    if not _isolated_world_class or not isinstance(world, _isolated_world_class[1]):
        return lambda: None
    before = dict(world.__dict__)
    world.__dict__.update(state, _pg_coalesce_state={}, _comms=[])
    # (under thread isolation c10d's registry by name, which functional
    # collectives resolve groups in, is per thread too)
    from torch._C._distributed_c10d import _register_process_group, _unregister_process_group

    registered = []
    for pg, name in list(world.pg_names.items()):
        try:
            _register_process_group(name, pg)
        except RuntimeError:  # (already registered in this thread)
            continue
        registered.append(name)

    def undo() -> None:
        for name in registered:
            try:
                _unregister_process_group(name)
            except RuntimeError:
                pass
        world.__dict__.clear()
        world.__dict__.update(before)

    return undo
