"""torch's local-tensor mode (``torch.distributed._local_tensor``), which
simulates every rank in one thread: the module, where torch has it, and the
per-rank values of its tensors and ints."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "LOCAL_TENSOR_MISSING",
    "local_int_values",
    "local_tensor",
    "local_tensor_shards",
]


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


def local_tensor_shards(t: Any) -> dict[int, Any] | None:
    """A LocalTensor's per-rank tensors (``LocalTensor._local_tensors``), or
    None when ``t`` is not a LocalTensor (or torch lacks the mode)."""
    lt = _local_tensor()
    if lt is None or not isinstance(t, lt.LocalTensor):
        return None
    return dict(t._local_tensors)


def local_int_values(value: Any) -> dict[int, int] | None:
    """A per-rank int's values (``LocalIntNode._local_ints`` of a SymInt), or
    None when ``value`` is not one."""
    lt = _local_tensor()
    node = getattr(value, "node", None)
    if lt is None or not isinstance(node, lt.LocalIntNode):
        return None
    return dict(node._local_ints)


def _local_tensor() -> Any:
    """``local_tensor()``, looked up on the ``disttest._compat`` package at
    each call: a test that patches ``_compat.local_tensor`` (to run as on a
    torch without the mode) reaches the readers inside the package too, as
    when ``_compat`` was one module."""
    from disttest import _compat

    return _compat.local_tensor()
