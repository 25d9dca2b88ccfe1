"""torch's local-tensor mode (``torch.distributed._local_tensor``), which
simulates every rank in one thread: the module, where torch has it, and the
per-rank values of its tensors and ints."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__unittest = True

__all__ = [
    "LOCAL_TENSOR_MISSING",
    "PLAIN_WITH_RANK",
    "install_rank_answers",
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


def install_rank_answers(split: Callable[[dict[int, Any]], BaseException],
                         per_rank_int: Callable[[dict[int, int]], Any]) -> Callable[[], None]:
    """Make the mode's per-rank Python answers say when the ranks disagree;
    return the undo (install after the speedups, which replace the same
    function, and undo before them).

    torch made one answer of differing per-rank results: a bool became a
    per-rank int whose ``bool()`` was True whenever the ranks differed
    (``torch.equal``, ``allclose``, ``.item()`` of a comparison passed where
    one rank was right), a float an ``AssertionError`` without a rank named.
    Now such bools and floats raise ``split(results)``, and ``.item()`` of
    an int tensor gives ``per_rank_int(values)`` (a per-rank int whose
    comparisons say when they disagree). torch's own per-rank ints (shapes
    of uneven shards) keep torch's answers.

    Private API: ``torch.distributed._local_tensor``'s
    ``_combine_any_rank_results`` and ``_for_each_rank_run_func``.
    """
    import torch

    lt = _local_tensor()
    combine, run = lt._combine_any_rank_results, lt._for_each_rank_run_func
    item = torch.ops.aten._local_scalar_dense.default

    def one_answer(rank_results: dict[int, Any]) -> Any:
        values = list(rank_results.values())
        first = values[0]
        if type(first) is bool or type(first) is float:
            if not all(_same_answer(v, first) for v in values):
                raise split(dict(rank_results))
            return first  # (NaN on every rank too: torch's check asked NaN == NaN)
        return combine(rank_results)

    def for_each_rank(func: Any, *args: Any, **kwargs: Any) -> Any:
        ret = run(func, *args, **kwargs)
        if func is item and isinstance(ret, torch.SymInt) and type(ret.node) is lt.LocalIntNode:
            return per_rank_int(dict(ret.node._local_ints))
        return ret

    mode_class = lt.LocalTensorMode
    dispatch_before = mode_class.__dict__["__torch_dispatch__"]
    local_tensor_class, local_int = lt.LocalTensor, lt.LocalIntNode

    plain = (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.nn.Parameter))

    def dispatch(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A per-rank int (self.rank) with plain tensors and no LocalTensor:
        # torch ran the op once, on a placeholder of the int (7777777), and
        # every rank got that (torch.tensor(1.0) * self.rank). Run it per
        # rank: the plain tensors as every rank's.
        # (asked of every op of the mode: the cheap tests first, none where a LocalTensor is given)
        if types or mode._disable:
            return dispatch_before(mode, func, types, args, kwargs)
        values = (*args, *kwargs.values()) if kwargs else args
        schema = getattr(func, "_schema", None)  # (an aten op; a higher-order op has none)
        if schema is not None and any(type(a) is torch.SymInt and isinstance(a.node, local_int) for a in values) \
                and any(type(a) in plain for a in values):
            if schema.is_mutable:
                raise RuntimeError(PLAIN_WITH_RANK.format(op=func, why="in place: one tensor cannot hold every "
                                                                      "rank's result"))
            if any(type(a) in plain and a.requires_grad for a in values):
                raise RuntimeError(PLAIN_WITH_RANK.format(op=func, why="it requires grad"))
            # (a view, t[self.rank]: a write through it would reach no rank's
            # tensor; torch's path refuses the rank as an index)
            if not any(r.alias_info is not None for r in schema.returns):
                ranks = mode.ranks

                def each(a: Any) -> Any:
                    return local_tensor_class(dict.fromkeys(ranks, a)) if type(a) in plain else a

                return func(*map(each, args), **{k: each(v) for k, v in (kwargs or {}).items()})
        return dispatch_before(mode, func, types, args, kwargs)

    lt._combine_any_rank_results, lt._for_each_rank_run_func = one_answer, for_each_rank
    mode_class.__torch_dispatch__ = dispatch

    def undo() -> None:
        # (only what is still ours: a later install, undone out of order, keeps its own)
        if lt._combine_any_rank_results is one_answer:
            lt._combine_any_rank_results = combine
        if lt._for_each_rank_run_func is for_each_rank:
            lt._for_each_rank_run_func = run
        if mode_class.__dict__.get("__torch_dispatch__") is dispatch:
            mode_class.__torch_dispatch__ = dispatch_before

    return undo


#: An op of a plain tensor and a per-rank int that cannot run per rank (in
#: place: one tensor cannot hold each rank's result; a tensor that requires
#: grad: torch's per-rank tensor cannot hold one).
PLAIN_WITH_RANK = ("{op} of a plain tensor ({why}) with a per-rank int (self.rank, or an int made from it) cannot "
                   "run per rank (disttest): make the tensor per rank (self.mode.rank_map(lambda rank: ...), or "
                   "torch.ones(...) rather than torch.tensor(...))")


def _same_answer(a: Any, b: Any) -> bool:
    """Whether two ranks' answers are one (NaN is NaN's)."""
    return type(a) is type(b) and (a == b or isinstance(a, float) and math.isnan(a) and math.isnan(b))
