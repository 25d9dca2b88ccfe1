"""Helpers of upstream's DTensor op tests (``common_dtensor``): shard orders,
sharding-rule checks, op strategies.

- Shard orders: :func:`generate_shard_orders` enumerates every way a tensor
  can be sharded over a mesh, in every mesh-dimension order;
  :func:`shard_order_to_placement`, :func:`patched_distribute_tensor`,
  :func:`redistribute` and :func:`make_full_tensor` distribute and move
  DTensors to a given shard order (torch's own ``distribute_tensor`` and
  ``redistribute`` take no shard order yet).
- Sharding rules: :func:`validate_sharding_rule_sample` and
  :func:`validate_sharding_rule_sample_backward` check one input/output
  placement choice of an op against the op on whole tensors.
- :func:`op_strategy_context` swaps an op's sharding strategy for a block.
- :func:`make_wrapped` runs a test method inside context managers.

They run where they are called: in a rank (process or thread), or in the test
process under torch's local-tensor mode, where one call stands for every
rank. Importing this module does no tensor work and changes nothing in torch;
the DTensor internals they need are reached through ``disttest._compat``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from disttest import _compat

__unittest = True

__all__ = [
    "generate_shard_orders",
    "make_full_tensor",
    "make_wrapped",
    "op_strategy_context",
    "patched_distribute_tensor",
    "redistribute",
    "shard_order_to_placement",
    "validate_sharding_rule_sample",
    "validate_sharding_rule_sample_backward",
]

PLACEMENT_COUNT = (
    "{func}: {placements} input placements for {tensors} tensor arguments of {op}; "
    "give one placement per tensor argument, args then kwargs (disttest)"
)
# What DTensor raises for an op it cannot run backward: the check is skipped.
_NO_BACKWARD = ("does not have a sharding strategy registered", "got mixed torch.Tensor and DTensor")


def make_wrapped(fn: Callable[[Any], Any], ctxs: Sequence[Any]) -> Callable[[Any], Any]:
    """Wrap the test method ``fn`` so that it runs inside every context of
    ``ctxs``, entered in order and exited in reverse, after a dynamo reset.

    Each entry is a context manager, or a callable that takes the test case
    and returns one (``lambda test: test._get_local_tensor_mode()``).
    """

    @functools.wraps(fn)
    def wrapped(self: Any) -> Any:
        _compat.reset_dynamo()
        with contextlib.ExitStack() as stack:
            for ctx in ctxs:
                stack.enter_context(ctx(self) if callable(ctx) else ctx)
            return fn(self)

    return wrapped


# --- shard orders -------------------------------------------------------------


def _shard_order(entries: dict[int, Sequence[int]]) -> tuple[Any, ...]:
    entry = _compat.shard_order_entry()
    return tuple(entry(tensor_dim=dim, mesh_dims=tuple(mesh_dims)) for dim, mesh_dims in entries.items())


def shard_order_to_placement(shard_order: Sequence[Any] | None, mesh: Any) -> tuple[Any, ...]:
    """The placements of ``shard_order`` on ``mesh``: ``Shard(d)`` on each
    mesh dimension an entry shards tensor dimension ``d`` over, else
    ``Replicate()`` (the order itself is not expressed)."""
    from torch.distributed.tensor import Replicate, Shard

    placements: list[Any] = [Replicate() for _ in range(mesh.ndim)]
    for entry in shard_order or ():
        for mesh_dim in entry.mesh_dims:
            placements[mesh_dim] = Shard(entry.tensor_dim)
    return tuple(placements)


def _compositions(n: int, k: int) -> Iterator[list[int]]:
    # Lists of k positive ints that sum to n.
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield [b - a for a, b in itertools.pairwise((0, *cuts, n))]


def _splits(items: list[int], parts: int) -> Iterator[list[list[int]]]:
    # Every way to cut ``items`` into ``parts`` consecutive, non-empty runs.
    for sizes in _compositions(len(items), parts):
        out, start = [], 0
        for size in sizes:
            out.append(items[start:start + size])
            start += size
        yield out


def generate_shard_orders(mesh: Any, tensor_rank: int) -> Iterator[tuple[Any, ...]]:
    """Every shard order of a ``tensor_rank``-dimensional tensor over
    ``mesh`` in which each mesh dimension shards some tensor dimension, as
    upstream enumerates them (the same orders, in the same sequence; an
    order can repeat).

    Yields tuples of ``ShardOrderEntry(tensor_dim, mesh_dims)``.
    """
    dims = list(range(mesh.ndim))
    for device_order in itertools.permutations(dims):
        for parts in range(1, mesh.ndim + 1):
            for runs in _splits(dims, parts):
                for tensor_dims in itertools.combinations(range(tensor_rank), len(runs)):
                    yield _shard_order({
                        tensor_dim: device_order[run[0]:run[-1] + 1]
                        for tensor_dim, run in zip(tensor_dims, runs, strict=True)
                    })


def redistribute(dtensor_input: Any, device_mesh: Any, placements: Sequence[Any] | None,
                 shard_order: Sequence[Any] | None, use_graph_based_transform: bool = True) -> Any:
    """Move ``dtensor_input`` to ``placements`` in ``shard_order`` (forward
    only: no autograd through the move).

    With ``placements`` None they follow from ``shard_order``
    (:func:`shard_order_to_placement`); with ``shard_order`` None the target
    has no shard order. Returns the input itself when it is already there,
    else a new DTensor whose spec records the shard order. Each rank moves
    its own shard; the collectives need every rank of ``device_mesh``.
    """
    from torch.distributed.tensor import DTensor

    if placements is None:
        placements = shard_order_to_placement(shard_order, device_mesh)
    old_spec = _compat.dtensor_spec(dtensor_input)
    new_spec = copy.deepcopy(old_spec)
    new_spec.placements = tuple(placements)
    new_spec.shard_order = shard_order if shard_order is not None else ()
    if old_spec == new_spec:
        return dtensor_input
    local = _compat.redistribute_local_tensor(
        dtensor_input.to_local(), old_spec, new_spec, use_graph_based_transform=use_graph_based_transform)
    out = DTensor.from_local(local, device_mesh)
    _compat.set_dtensor_spec(out, copy.deepcopy(new_spec))
    return out


def patched_distribute_tensor(input_tensor: torch.Tensor, device_mesh: Any, placements: Sequence[Any] | None,
                              shard_order: Sequence[Any] | None, use_graph_based_transform: bool = True,
                              src_data_rank: int | None = 0) -> Any:
    """``distribute_tensor`` with a shard order: distribute ``input_tensor``
    to ``placements`` (None: from ``shard_order``), then move it to
    ``shard_order`` with :func:`redistribute`. Every rank of ``device_mesh``
    calls it; ``src_data_rank`` as in ``distribute_tensor``."""
    from torch.distributed.tensor import distribute_tensor

    if placements is None:
        placements = shard_order_to_placement(shard_order, device_mesh)
    placements = tuple(placements)
    dt = distribute_tensor(input_tensor, device_mesh, placements, src_data_rank=src_data_rank)
    _compat.use_shard_order_spec(dt)  # _StridedShard does not express the order here
    return redistribute(dt, device_mesh, placements, shard_order, use_graph_based_transform)


def make_full_tensor(dtensor_input: Any) -> torch.Tensor:
    """The whole tensor of ``dtensor_input`` (``full_tensor()`` that honours a
    shard order), on every rank."""
    full: torch.Tensor = redistribute(dtensor_input, dtensor_input.device_mesh, placements=None,
                                      shard_order=()).to_local()
    return full


# --- sharding rules -------------------------------------------------------------


def _tensors(*trees: Any) -> list[torch.Tensor]:
    tree = _compat.pytree()
    return [a for t in trees for a in tree.tree_leaves(t) if isinstance(a, torch.Tensor)]


def _replace_tensors(args: Any, kwargs: Any, replacements: Sequence[Any]) -> Any:
    # (args, kwargs) with their tensors, in order, replaced.
    it = iter(replacements)
    return _compat.pytree().tree_map(lambda a: next(it) if isinstance(a, torch.Tensor) else a, (args, kwargs))


def validate_sharding_rule_sample(op: Callable[..., Any], full_args: Any, full_kwargs: Any,
                                  input_placements: Sequence[Any], output_placements: Sequence[Any],
                                  device_mesh: Any) -> bool:
    """Whether one sharding rule holds for one sample of ``op``.

    Shards each tensor argument (args, then kwargs, in order) with its entry
    of ``input_placements`` on the 1-D ``device_mesh``, runs ``op`` on the
    local shards, puts each output tensor back together from its entry of
    ``output_placements``, and compares with ``op`` on the whole tensors
    (shape, then ``allclose`` at 1e-5, NaNs equal). Every rank calls it and
    gets the same answer.
    """
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    full = _tensors(full_args, full_kwargs)
    if len(input_placements) < len(full):
        raise AssertionError(PLACEMENT_COUNT.format(
            func="validate_sharding_rule_sample", placements=len(input_placements), tensors=len(full), op=op))
    locals_ = [distribute_tensor(t, device_mesh, (p,)).to_local() for t, p in zip(full, input_placements, strict=False)]
    local_args, local_kwargs = _replace_tensors(full_args, full_kwargs, locals_)
    refs = _tensors(op(*full_args, **full_kwargs))
    outs = _tensors(op(*local_args, **local_kwargs))
    for ref, local, placement in zip(refs, outs, output_placements, strict=False):
        whole = DTensor.from_local(local, device_mesh, (placement,)).redistribute(
            device_mesh, (Replicate(),)).to_local()
        if ref.shape != whole.shape or not torch.allclose(ref, whole, atol=1e-5, rtol=1e-5, equal_nan=True):
            return False
    return True


def _with_grad(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        c = t.detach().clone()
        if c.is_floating_point():
            c.requires_grad_(True)
        out.append(c)
    return out


def _backward(output: Any) -> bool:
    # Sum every differentiable output and run backward; False if there is none.
    outs = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not outs:
        return False
    loss: Any = sum(t.sum() for t in outs)
    loss.backward()
    return True


def validate_sharding_rule_sample_backward(op: Callable[..., Any], full_args: Any, full_kwargs: Any,
                                           input_placements: Sequence[Any], device_mesh: Any) -> bool | None:
    """Whether ``op``'s gradients on DTensors match those on whole tensors.

    Runs ``op`` and backward (on the sum of its floating-point outputs) once
    on whole tensors and once on DTensors placed by ``input_placements`` (one
    per tensor argument, args then kwargs) on the 1-D ``device_mesh``;
    compares each input's gradient (``allclose``, atol 1e-5, rtol 1.3e-6,
    NaNs equal). Returns True when they match, False when not, and None when
    the check does not apply: no floating-point input, no differentiable
    output, the op fails on whole tensors, or DTensor has no rule for it.
    Every rank calls it.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = _tensors(full_args, full_kwargs)
    if not any(t.is_floating_point() for t in full):
        return None
    ref = _with_grad(full)
    ref_args, ref_kwargs = _replace_tensors(full_args, full_kwargs, ref)
    try:
        if not _backward(op(*ref_args, **ref_kwargs)):
            return None
    except RuntimeError:
        return None
    if len(input_placements) != len(full):
        raise AssertionError(PLACEMENT_COUNT.format(
            func="validate_sharding_rule_sample_backward", placements=len(input_placements), tensors=len(full),
            op=op))
    dts = [distribute_tensor(c, device_mesh, (p,)) for c, p in zip(_with_grad(full), input_placements, strict=True)]
    dt_args, dt_kwargs = _replace_tensors(full_args, full_kwargs, dts)
    try:
        if not _backward(op(*dt_args, **dt_kwargs)):
            return None
    except Exception as e:
        if any(text in str(e) for text in _NO_BACKWARD):
            return None
        raise
    for r, d in zip(ref, dts, strict=True):
        if not r.is_floating_point() or r.grad is None:
            continue
        if d.grad is None:
            return False
        grad = d.grad.full_tensor() if isinstance(d.grad, DTensor) else d.grad
        if r.grad.shape != grad.shape or not torch.allclose(r.grad, grad, atol=1e-5, rtol=1.3e-6, equal_nan=True):
            return False
    return True


@contextlib.contextmanager
def op_strategy_context(op_overload: Any, strategy_func: Callable[..., Any],
                        schema_info: Any = None) -> Iterator[None]:
    """Make ``strategy_func`` DTensor's sharding strategy for ``op_overload``
    (with ``schema_info``, a ``RuntimeSchemaInfo``) inside the block; after
    it, put back the op's own strategy and schema info (or none) and clear the
    sharding-propagation caches.

    The strategy table is one per process: in rank threads, every thread
    sees the swap. NB: torch 2.14 looks up an op's single-mesh-dim strategy
    before its strategy function, so upstream's context is not used for such
    an op (``sum``, most ops there); this one sets that aside for the block
    as well.
    """
    missing = object()
    saved = [(table, table.pop(op_overload, missing)) for table in _compat.strategy_tables()]
    try:
        _compat.register_op_strategy(op_overload, strategy_func, schema_info)
        yield
    finally:
        for table, old in saved:
            if old is missing:
                table.pop(op_overload, None)
            else:
                table[op_overload] = old
        _compat.clear_sharding_prop_cache()
