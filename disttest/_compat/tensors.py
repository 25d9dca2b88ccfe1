"""Tensor internals: pytree, functional and sparse tensors, profiler
ranges, ``assert_close``'s default tolerances."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "default_tolerances",
    "enable_record_function",
    "is_functional_tensor",
    "mark_uncoalesced",
    "pytree",
    "sparse_coo_raw",
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
