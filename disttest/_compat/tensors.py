"""Tensor internals: pytree, functional and sparse tensors, profiler
ranges, ``assert_close``'s default tolerances."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__unittest = True

__all__ = [
    "comparison",
    "default_tolerances",
    "dispatch_modes",
    "drop_function_modes",
    "enable_record_function",
    "fp32_precision",
    "function_mode_depth",
    "function_state",
    "function_state_enabled",
    "is_functional_tensor",
    "lazy_dtensor_comparison",
    "mark_uncoalesced",
    "pytree",
    "restore_function_state",
    "script_containers",
    "set_fp32_precision",
    "sparse_coo_raw",
    "typed_storage_bytes",
    "unwrap_dtensors",
]


def enable_record_function(enabled: bool) -> None:
    """``torch.autograd._enable_record_function`` (profiler ranges on ops)."""
    import torch

    torch.autograd._enable_record_function(enabled)


def is_functional_tensor(t: Any) -> bool:
    """``torch._is_functional_tensor``."""
    import torch

    return bool(torch._is_functional_tensor(t))


def pytree() -> Any:
    """torch's pytree module (``torch.utils._pytree``: tree_flatten, tree_unflatten)."""
    import torch.utils._pytree as module

    return module


def sparse_coo_raw(t: Any) -> tuple[Any, Any]:
    """A COO tensor's indices and values as stored, also when it is not
    coalesced (``Tensor._indices``, ``Tensor._values``)."""
    return t._indices(), t._values()


def mark_uncoalesced(t: Any) -> Any:
    """Flag a COO tensor as not coalesced (``Tensor._coalesced_(False)``); return it."""
    return t._coalesced_(False)


def default_tolerances(*inputs: Any) -> tuple[float, float]:
    """``torch.testing.assert_close``'s default (rtol, atol) for ``inputs``'
    dtypes (``torch.testing._comparison.default_tolerances``)."""
    import torch
    from torch.testing._comparison import default_tolerances as tolerances

    rtol, atol = tolerances(*(x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in inputs))
    return float(rtol), float(atol)


def lazy_dtensor_comparison() -> Callable[[], None]:
    """Let ``assert_close`` leave ``torch.distributed.tensor`` unimported while
    nothing else has imported it; return the undo.

    torch's ``assert_close`` (and so ``assertEqual``) imports the package (about
    0.9 s on a 2-core machine) only to ask whether an input is a ``DTensor``
    (``torch.testing._comparison._unwrap_dtensor_for_comparison``), which no
    input can be before the package is loaded. The wrapper answers "no" then,
    and asks torch's function otherwise: the same results. Installed in
    disttest's own processes (a fork server, a rank process), and in the test
    process while a threaded test runs (undone after it); never at import.
    """
    try:
        from torch.testing import _comparison as comparison
    except ImportError:
        return lambda: None
    original = getattr(comparison, "_unwrap_dtensor_for_comparison", None)
    if original is None or getattr(original, "_disttest_lazy", False):
        return lambda: None  # a torch without it, or installed already

    def unwrap(actual: Any, expected: Any) -> tuple[Any, Any]:
        if "torch.distributed.tensor" not in sys.modules:
            return actual, expected
        return original(actual, expected)  # type: ignore[no-any-return]

    unwrap._disttest_lazy = True  # type: ignore[attr-defined]
    comparison._unwrap_dtensor_for_comparison = unwrap

    def undo() -> None:
        if comparison._unwrap_dtensor_for_comparison is unwrap:
            comparison._unwrap_dtensor_for_comparison = original

    return undo


def comparison() -> Any:
    """torch's comparison framework, on which ``torch.testing.assert_close`` is
    built (``torch.testing._comparison``: ``Pair`` and its ``BooleanPair``,
    ``NumberPair``, ``TensorLikePair``, ``NonePair``; ``originate_pairs``;
    ``ErrorMeta``; ``UnsupportedInputs``)."""
    from torch.testing import _comparison as module

    return module


def unwrap_dtensors(actual: Any, expected: Any) -> tuple[Any, Any]:
    """Two DTensors as their local tensors (an ``AssertionError`` where their
    placements or meshes differ, a ``TypeError`` for one DTensor against
    anything else), as ``assert_close`` does; other inputs unchanged.
    Through the module attribute, so :func:`lazy_dtensor_comparison`'s
    wrapper is honoured; a torch without the function returns the inputs."""
    unwrap = getattr(comparison(), "_unwrap_dtensor_for_comparison", None)
    return (actual, expected) if unwrap is None else unwrap(actual, expected)


def script_containers() -> tuple[type, type]:
    """TorchScript's list and dict types (``torch._C.ScriptList``, ``ScriptDict``)."""
    import torch

    return torch._C.ScriptList, torch._C.ScriptDict


def typed_storage_bytes(storage: Any) -> Any:
    """A ``TypedStorage``'s untyped storage, without the deprecation warning
    ``TypedStorage.untyped()`` gives (``TypedStorage._untyped_storage``)."""
    return storage._untyped_storage


#: torch's fp32 precision settings (``torch.backends.<flag>.fp32_precision``),
#: in the order upstream's ``TestCase`` reports them (torch 2.14 on).
FP32_PRECISION_FLAGS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


_fp32_flags: dict[str, Any] = {}  # flag -> the object that holds it (torch's singletons)


def _fp32_flag(flag: str) -> Any:
    obj = _fp32_flags.get(flag)
    if obj is None:
        import torch.backends

        obj = torch.backends
        for part in flag.split("."):
            obj = getattr(obj, part)
        _fp32_flags[flag] = obj
    return obj


def fp32_precision() -> dict[str, Any]:
    """``{"torch.backends.cuda.matmul.fp32_precision": "none", ...}``: the
    fp32 precision settings this torch has (none before torch 2.9)."""
    found = {}
    for flag in FP32_PRECISION_FLAGS:
        try:
            found[f"torch.backends.{flag}.fp32_precision"] = _fp32_flag(flag).fp32_precision
        except (AttributeError, RuntimeError):
            continue
    return found


def set_fp32_precision(values: dict[str, Any]) -> None:
    """Put back settings :func:`fp32_precision` read."""
    prefix, suffix = "torch.backends.", ".fp32_precision"
    for name, value in values.items():
        _fp32_flag(name[len(prefix):-len(suffix)]).fp32_precision = value


def function_mode_depth() -> int:
    """How many torch function modes are on this thread's stack
    (``torch._C._len_torch_function_stack``; ``set_default_device`` pushes one)."""
    import torch

    return int(torch._C._len_torch_function_stack())


def drop_function_modes(count: int) -> None:
    """Pop ``count`` torch function modes off this thread's stack."""
    import torch

    for _ in range(count):
        torch._C._pop_torch_function_stack()


def function_state() -> Any:
    """Whether ``__torch_function__`` is on, off or off for subclasses only
    on this thread (``torch._C._get_torch_function_state``); None where the
    installed torch cannot tell."""
    import torch

    get = getattr(torch._C, "_get_torch_function_state", None)
    return get() if get is not None else None


def function_state_enabled() -> Any:
    """The torch function state "enabled" (``torch._C._TorchFunctionState.ENABLED``);
    None where the installed torch has no such state."""
    import torch

    states = getattr(torch._C, "_TorchFunctionState", None)
    return getattr(states, "ENABLED", None)


def restore_function_state(state: Any) -> None:
    """Put back a :func:`function_state` (nothing for None)."""
    import torch

    if state is not None:
        torch._C._set_torch_function_state(state)  # type: ignore[attr-defined]  # not in torch's stubs


def dispatch_modes() -> list[Any]:
    """This thread's torch dispatch modes, innermost last
    (``torch.utils._python_dispatch._get_current_dispatch_mode_stack``)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())
