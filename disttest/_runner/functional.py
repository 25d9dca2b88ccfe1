"""torch's functional collectives (``torch.distributed._functional_collectives``,
which DTensor, tensor parallelism and FSDP2 call) seen by fault injection and
schedule fuzzing.

They reach the process group from C++, past the wrappers of
``torch.distributed`` (:mod:`.tracking`): a fault declared at ``all_reduce``
never saw DTensor's all-reduce, and ``DISTTEST_CHAOS`` delayed none of them.
:func:`wrap_functional` wraps them while a rank is armed (with its undo):
each outermost call asks the collective hook as the collective
``torch.distributed`` names it, and a ``corrupt`` fault changes the values
the call returns once they have arrived.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from disttest import _compat
from disttest._runner import refusals, tracking

__unittest = True

__all__ = ["FUNCTIONAL", "track_functional", "wrap_functional"]

#: Each functional collective -> the collective of ``torch.distributed`` it
#: is, as faults name it (``at="all_gather_into_tensor"`` sees DTensor's
#: all-gathers). Those the installed torch lacks are left out.
FUNCTIONAL = {
    "broadcast": "broadcast",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_single_autograd": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced",
    "all_gather_single_coalesced": "all_gather_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_single_autograd": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_single_autograd": "all_to_all_single",
}
_wrappers: dict[str, tuple[Any, Any]] = {}  # name -> (function, its wrapper), made once


def _wrap(op: str, func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    get_group, get_tag = tracking._getter(sig, "group"), tracking._getter(sig, "tag")

    @functools.wraps(func)
    def functional(*args: Any, **kwargs: Any) -> Any:
        tracker = tracking._current()
        if tracker is None:
            return func(*args, **kwargs)
        local = tracker._local
        depth = getattr(local, "depth", 0)
        # (outermost only: all_gather_tensor calls all_gather_single; not while
        # dynamo traces the call, which the hook's bookkeeping would break)
        if depth or tracking._compiling():
            return func(*args, **kwargs)
        after = tracking._hook[0](op, tracker.rank) if tracking._hook else None
        # A rank thread's calls reach the threaded group, which records them itself.
        call = None if tracker.threads else _enter(tracker, op, get_group(args, kwargs),
                                                          get_tag(args, kwargs))
        local.depth = depth + 1
        local.began = False  # (set by a wait inside the call: all_gather_single's)
        local.functional_call = call  # (a wait inside the call is a wait in it: all_gather_single's)
        failed = True
        try:
            result = func(*args, **kwargs)
            failed = False
        except Exception as e:
            # It returns before its collective completes (an asynchronous
            # tensor): what torch raises there, its own checks raised
            # (AssertionError, RuntimeError, ValueError) before the call
            # reached the group (not a backend written in Python).
            if call is not None and refusals.refused(e, op, getattr(local, "began", False)):
                tracker.refused([call["group"]])
                refusals.mark_refused(e)
                failed = False
            raise
        finally:
            local.depth = depth
            local.functional_call = None
            if call is not None:
                tracker.leave(failed)
        if call is not None:
            for t in result if isinstance(result, (list, tuple)) else (result,):
                _POSTED.remember(getattr(t, "elem", t), call)
        if after is not None:  # a corrupt fault: on the values, once they are here
            values = [_compat.wait_tensor(t) for t in result] if isinstance(result, list) else \
                _compat.wait_tensor(result)
            after((values,), _broadcast_root(args, kwargs) if op == "broadcast" else {}, None)
        return result

    functional.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return functional


def _enter(tracker: Any, op: str, group: Any, tag: Any) -> dict[str, Any] | None:
    """Record a functional collective as entered (it is asynchronous: the
    rank waits in it at :func:`_wait_tensor`); what a wait on its result is.
    None where its group cannot be told (the call is not recorded)."""
    import torch.distributed as dist

    try:
        pg = _compat.functional_group(group, tag or "")
        if pg is None:
            return None
        name, ranks = tracker.group_of(dist, pg)
        tracker.enter(op, name, range(dist.get_world_size()) if ranks is None else ranks, waits=False)
        call = {k: tracker.record.get(k) for k in ("op", "seq", "group", "peers")}
        call["limit"] = tracker.limit(dist, pg)
        return call
    except Exception:  # noqa: BLE001 (never let bookkeeping break the user's call)
        return None


class _Posted:
    """The functional collectives posted and not yet waited for: each
    result tensor (by identity: a tensor's ``==`` compares values) -> its call."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[weakref.ref[Any], dict[str, Any]]] = {}

    def remember(self, tensor: Any, call: dict[str, Any]) -> None:
        key = id(tensor)
        try:
            ref = weakref.ref(tensor, functools.partial(self._forget, key))
        except TypeError:
            return
        self._calls[key] = (ref, call)

    def _forget(self, key: int, ref: Any) -> None:
        entry = self._calls.get(key)
        if entry is not None and entry[0] is ref:
            del self._calls[key]

    def clear(self) -> None:
        """Forget every posted call (a test's start: an earlier test's result
        first waited now would name a call of that test)."""
        self._calls.clear()

    def pop(self, tensor: Any) -> dict[str, Any] | None:
        entry = self._calls.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        del self._calls[id(tensor)]
        return entry[1]


_POSTED = _Posted()


def _wait_tensor(func: Callable[..., Any]) -> Callable[..., Any]:
    """``wait_tensor``, which an asynchronous result calls when first used:
    the rank waits in the collective that made the tensor."""

    @functools.wraps(func)
    def wait(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = tracking._current()
        call = None
        if tracker is not None and not tracker.threads:
            call = _POSTED.pop(tensor) or getattr(tracker._local, "functional_call", None)
        if tracker is not None and getattr(tracker._local, "functional_call", None) is not None:
            tracker._local.began = True  # (a functional call waits inside itself: not refused after this)
        if tracker is None or call is None:
            return func(tensor, *args, **kwargs)
        tracker.wait_in(call, call.get("limit"))
        failed = True
        try:
            result = func(tensor, *args, **kwargs)
            failed = False
            return result
        finally:
            tracker.leave(failed)

    wait.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return wait


#: Module name -> whether it is the user's (a test's module, a helper of the
#: suite): not torch's, disttest's, the standard library's or an installed
#: package's. Decided once per module.
_user_modules: dict[str, bool] = {}


def _is_user_module(name: str, module: Any) -> bool:
    if not isinstance(module, types.ModuleType) or name in ("torch", "disttest") \
            or name.startswith(("torch.", "disttest.")):
        return False  # (sys.modules may hold None, or a lazy object whose attributes import)
    file = vars(module).get("__file__")
    if not isinstance(file, str):  # (built in, a namespace package)
        return False
    return not file.startswith(_library_paths())


@functools.cache
def _library_paths() -> tuple[str, ...]:
    """The folders of the standard library and of installed packages."""
    import site
    import sysconfig

    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    # (as given and with links resolved: a module's file is named by the sys.path entry it came from)
    return tuple({os.path.join(f(p), "") for p in paths for f in (os.path.abspath, os.path.realpath)})


def _rebind(pairs: Iterable[tuple[Any, Any]]) -> Callable[[], None]:
    """Bind each wrapper of ``pairs`` (function, wrapper) where a user's
    module bound its function by name (``from
    torch.distributed._functional_collectives import all_reduce`` before the
    test: the name kept the unwrapped function, and a fault declared at
    ``all_reduce`` never fired); return the undo. (Faults only: a few ms the
    first time in a process, which every test would pay for tracking, whose
    hang and desync reports c10d's flight recorder covers.)"""
    swap = {id(func): (func, wrapper) for func, wrapper in pairs}
    done: list[tuple[dict[str, Any], str, Any, Any]] = []
    for name, module in list(sys.modules.items()):
        user = _user_modules.get(name)
        if user is None:
            user = _is_user_module(name, module)
            if isinstance(module, types.ModuleType):  # (None, a lazy stand-in: asked again once loaded)
                _user_modules[name] = user
        if not user:
            continue
        namespace = vars(module)
        for key, value in list(namespace.items()):
            pair = swap.get(id(value))
            if pair is not None and value is pair[0]:
                namespace[key] = pair[1]
                done.append((namespace, key, pair[0], pair[1]))

    def undo() -> None:
        for namespace, key, func, wrapper in done:
            if namespace.get(key) is wrapper:  # not if someone replaced it since
                namespace[key] = func
        done.clear()

    return undo


def track_functional() -> None:
    """In a rank process: wrap the functional collectives and their wait,
    so that a rank waiting in one is seen there (a desync, a hang), for the
    rest of the process, as :func:`~.tracking.install_tracking` wraps
    ``torch.distributed``'s. Only where torch's module is loaded already
    (the test's module imported it): importing it costs a test that does
    not use it; a rank calls this at each test's start."""
    _POSTED.clear()
    module = sys.modules.get("torch.distributed._functional_collectives")
    if module is None:
        return
    namespace = vars(module)
    _install(namespace)
    wait = namespace.get("wait_tensor")
    if wait is not None and not getattr(wait, "__disttest_tracked__", False):
        namespace["wait_tensor"] = _wait_tensor(wait)


def _broadcast_root(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What tells a broadcast's root from the ranks that receive (as a
    ``torch.distributed.broadcast`` call's ``src``, a global rank): a
    functional broadcast's ``src`` is a rank of its group, which may be a
    subgroup, a list of ranks or a mesh."""
    import torch.distributed as dist

    named = dict(zip(("self", "src", "group", "tag"), args, strict=False)) | kwargs
    group = _compat.functional_group(named.get("group"), named.get("tag", ""))
    if group is None:
        return {}
    me = dist.get_rank()
    return {"src": me if dist.get_rank(group) == named.get("src") else -1}  # (-1: no rank's)


def _install(namespace: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Put each functional collective of ``namespace`` not wrapped yet in
    its wrapper (made once per function); return what it wrapped, name ->
    (function, wrapper)."""
    done: dict[str, tuple[Any, Any]] = {}
    for name, op in FUNCTIONAL.items():
        func = namespace.get(name)
        if func is None or getattr(func, "__disttest_tracked__", False):
            continue
        made = _wrappers.get(name)
        if made is None or made[0] is not func:
            made = _wrappers[name] = (func, _wrap(op, func))
        namespace[name] = made[1]
        done[name] = made
    return done


def wrap_functional() -> Callable[[], None]:
    """Wrap the functional collectives of the installed torch; return the
    undo, which puts back each function it finds still wrapped."""
    namespace = vars(_compat.functional_collectives())
    done = _install(namespace)
    unbind = _rebind(_wrappers.values())

    def undo() -> None:
        unbind()
        for name, (func, wrapper) in done.items():
            if namespace.get(name) is wrapper:  # not if someone replaced it since
                namespace[name] = func
        done.clear()

    return undo
