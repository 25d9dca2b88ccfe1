"""c10d backend registration: register a backend with its exact undo,
c10d's ``fake`` backend, a placeholder C++ backend for Python groups, and
process groups over torchcomms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from disttest._compat.versions import missing_feature

__unittest = True

__all__ = [
    "backend_creator",
    "ensure_fake_backend",
    "fake_process_group",
    "future_class",
    "install_fake_backend",
    "register_backend",
    "register_python_group_backend",
    "registered_backend_names",
    "torchcomms_process_group",
    "use_torchcomms",
    "work_base",
]


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
    _fake_kept[:] = [True]  # the undos of install_fake_backend leave it registered from now on
    install_fake_backend()


#: Set once the fake backend was asked for the rest of the process
#: (:func:`ensure_fake_backend`, ``disttest.register_fake_backend()``).
_fake_kept: list[bool] = []


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

    unregister: Callable[[], None] = register_backend(dist.Backend.FAKE, create, ["cpu", "cuda", "hpu", "xpu"])

    def undo() -> None:
        if not _fake_kept:  # (kept where the test asked for it for the process meanwhile)
            unregister()

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
            #: the group's backend name (c10d asks the backend for it: monitored_barrier)
            backend_name = "placeholder"

            def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
                return self.backend_name

        _placeholder_backend.append(_Placeholder)
    if _placeholder_backend[0] is None:
        return
    try:
        backend = _placeholder_backend[0](rank, world_size)
    except TypeError:
        # Before 2.14 c10d's Backend has no Python constructor, and
        # batch_isend_irecv does not ask a Python group for its backend
        # (asked once: a thousand thread ranks make a group each per test).
        _placeholder_backend[0] = None
        return
    backend.backend_name = group.getBackendName()
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)


_placeholder_backend: list[type | None] = []


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


def future_class() -> type:
    """The class of the futures c10d's ``Work.get_future`` returns
    (``torch._C.Future``; ``torch.futures.Future`` is a Python subclass of
    it, and ``get_future`` returns the base)."""
    import torch

    return cast(type, torch._C.Future)


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
