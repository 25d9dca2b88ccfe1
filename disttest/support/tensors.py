"""Tensor builders the upstream collective tests use.

Nothing here runs at import: every tensor is built when asked for.
"""

from __future__ import annotations

import functools
import operator

import torch

from disttest import _compat

__unittest = True

__all__ = ["build_multidim_tensor", "build_tensor", "simple_sparse_reduce_tests"]


def build_tensor(
    size: int,
    value: float | None = None,
    dtype: torch.dtype = torch.float,
    device_id: int | None = None,
) -> torch.Tensor:
    """A ``size``x``size``x``size`` tensor filled with ``value`` (default ``size``),
    on accelerator ``device_id`` if given."""
    t = torch.full((size, size, size), size if value is None else value, dtype=dtype)
    return t if device_id is None else t.to(torch.device(_accelerator(), device_id))


def build_multidim_tensor(
    dim: int, dim_size: int, value: float | None = None, dtype: torch.dtype = torch.float
) -> torch.Tensor:
    """A ``dim``-dimensional tensor of side ``dim_size`` filled with ``value``
    (default ``dim``)."""
    return torch.full([dim_size] * dim, dim if value is None else value, dtype=dtype)


def _accelerator() -> str:
    return _compat.accelerator_type() or "cuda"


def _sparse(rank: int, world_size: int, sparse_dims: int = 1, dense_dims: int = 0) -> torch.Tensor:
    # First sparse dimension is [0..rank]; later ones are all 0, so any two
    # ranks' tensors intersect.
    indices = torch.arange(rank + 1).reshape(1, rank + 1)
    shape = [world_size] + [2] * dense_dims
    for _ in range(sparse_dims - 1):
        indices = torch.cat((indices, torch.zeros(1, rank + 1, dtype=indices.dtype)))
        shape.append(world_size)
    values = torch.ones([rank + 1] + [2] * dense_dims)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


def simple_sparse_reduce_tests(
    rank: int, world_size: int, num_inputs: int = 1
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Cases for sparse sum-reduction: ``[(inputs of this rank, expected outputs)]``
    over 1-3 sparse and 1-3 dense dimensions."""
    makers = [
        functools.partial(_sparse, sparse_dims=1),
        functools.partial(_sparse, sparse_dims=2),
        functools.partial(_sparse, sparse_dims=3),
        functools.partial(_sparse, dense_dims=1),
        functools.partial(_sparse, dense_dims=2),
        functools.partial(_sparse, dense_dims=3),
    ]
    total = num_inputs * world_size
    cases = []
    for make in makers:
        expected = functools.reduce(operator.add, [make(r, total) for r in range(total)])
        inputs = [make(num_inputs * rank + i, total) for i in range(num_inputs)]
        cases.append((inputs, [expected] * num_inputs))
    return cases
