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
from collections.abc import Callable
from typing import Any

from disttest import _compat
from disttest._runner import tracking

__unittest = True

__all__ = ["FUNCTIONAL", "wrap_functional"]

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
    @functools.wraps(func)
    def functional(*args: Any, **kwargs: Any) -> Any:
        tracker = tracking._current() if tracking._hook else None
        if tracker is None:
            return func(*args, **kwargs)
        local = tracker._local
        depth = getattr(local, "depth", 0)
        # (outermost only: all_gather_tensor calls all_gather_single; not while
        # dynamo traces the call, which the hook's bookkeeping would break)
        if depth or tracking._compiling():
            return func(*args, **kwargs)
        after = tracking._hook[0](op, tracker.rank)
        local.depth = depth + 1
        try:
            result = func(*args, **kwargs)
        finally:
            local.depth = depth
        if after is not None:  # a corrupt fault: on the values, once they are here
            values = [_compat.wait_tensor(t) for t in result] if isinstance(result, list) else \
                _compat.wait_tensor(result)
            after((values,), _broadcast_root(args, kwargs) if op == "broadcast" else {}, None)
        return result

    functional.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return functional


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


def wrap_functional() -> Callable[[], None]:
    """Wrap the functional collectives of the installed torch; return the
    undo, which puts back each function it finds still wrapped."""
    module = _compat.functional_collectives()
    namespace = vars(module)
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

    def undo() -> None:
        for name, (func, wrapper) in done.items():
            if namespace.get(name) is wrapper:  # not if someone replaced it since
                namespace[name] = func
        done.clear()

    return undo
