"""The sparse-tensor generators of upstream's ``common_utils.TestCase``.

:class:`SparseTensorsMixin` gives :class:`disttest.TestCase` upstream's
``genSparseTensor`` (COO), ``genSparseCompressedTensor`` and its CSR, CSC, BSR
and BSC shorthands, ``generate_simple_inputs`` and ``safeToDense``, drawing
from torch's random state in the same order as upstream, so that after the
same seed they return the same tensors. The methods run in whichever process
or thread calls them; they touch no global state but the random generators.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import reduce
from operator import mul
from typing import TYPE_CHECKING, Any

import torch
from torch.testing import make_tensor

from disttest import _compat

if TYPE_CHECKING:
    import unittest

    _Base = unittest.TestCase
else:
    _Base = object

__unittest = True

__all__ = ["SparseTensorsMixin"]

_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)

#: The sparsity patterns ``generate_simple_inputs`` uses by default: (pattern,
#: block sizes, dense sizes); a pattern deeper than 2 makes batched inputs.
_DEFAULT_PATTERNS: list[tuple[Any, list[tuple[int, int]], list[tuple[int, ...]]]] = [
    ([[1, 2, 0], [1, 0, 3]], [(2, 1), (1, 3)], [(), (2,), (4, 5)]),
    ([[[[1, 2, 0], [1, 0, 3]], [[1, 2, 3], [1, 0, 0]], [[1, 0, 0], [1, 2, 3]]],
      [[[0, 2, 0], [1, 2, 3]], [[1, 0, 3], [1, 2, 0]], [[1, 2, 3], [0, 2, 0]]]], [(2, 1), (2, 3)], [(), (2,)]),
    ([[0, 1, 0, 2, 0, 2], [0, 1, 0, 0, 2, 0], [3, 3, 3, 0, 0, 0], [0, 0, 0, 0, 0, 0],
      [0, 5, 0, 6, 6, 6], [5, 0, 5, 6, 6, 6], [0, 0, 0, 0, 8, 8], [7, 7, 7, 0, 8, 8]], [(2, 3)], [(), (4, 5)]),
]
#: A batch whose members have different numbers of specified elements.
_VARIABLE_NSE_PATTERN: tuple[Any, list[tuple[int, int]]] = ([[[1, 2], [3, 4]], [[1, 0], [0, 0]]], [(1, 1)])


class SparseTensorsMixin(_Base):
    """Upstream ``TestCase``'s sparse-tensor generators (a mixin of
    :class:`disttest.TestCase`)."""

    @staticmethod
    def _make_crow_indices(n_rows: int, n_cols: int, nnz: int, *, device: Any, dtype: torch.dtype,
                           random: bool = True) -> torch.Tensor:
        """The crow_indices of an ``n_rows`` x ``n_cols`` CSR tensor with
        ``nnz`` specified elements: full, empty and partly filled rows, by
        upstream's sawteeth sampling (https://pearu.github.io/csr_sampling.html);
        with ``random``, the rows in random order."""
        if not (0 <= nnz <= n_rows * n_cols):
            raise AssertionError(
                "nnz out of bounds: expected 0 <= nnz <= n_rows * n_cols, "
                f"got nnz={nnz}, n_rows={n_rows}, n_cols={n_cols}")

        def sawteeth(n: int, m: int) -> int:
            big = (n_cols - m) * (n_cols - m + 1) // 2
            k = (n_rows - n) % (n_cols - m + 1)
            return big * ((n_rows - n) // (n_cols - m + 1)) + k * (k - 1) // 2

        # Unlike the method's description, counts has the leading 0 of crow_indices.
        counts = torch.zeros(n_rows + 1, dtype=dtype, device=torch.device("cpu"))
        n = m = 0
        total = sawteeth(n, m)
        if total and nnz >= max(total, n_cols):
            # the width of the sawteeth window, by bisection
            n_left, n_right = n, n_rows - 1
            total_right = sawteeth(n_right, m)
            while n_right - n_left > 1:
                n_middle = (n_left + n_right) // 2
                total_middle = sawteeth(n_middle, m)
                if total_middle == 0 or nnz - n_middle * n_cols < max(total_middle, n_cols):
                    n_right, total_right = n_middle, total_middle
                else:
                    n_left = n_middle
            n, total = n_right, total_right
            if not n:
                raise AssertionError("n must be non-zero")
            counts[-n:].fill_(n_cols)  # the right rectangle
        if total and nnz - n * n_cols >= max(total, n_rows - n):
            # the height of the sawteeth window, by bisection
            m_left, m_right = m, n_cols - 1
            total_right = sawteeth(n, m_right)
            while m_right - m_left > 1:
                m_middle = (m_left + m_right) // 2
                total_middle = sawteeth(n, m_middle)
                if total_middle == 0 or nnz - n * n_cols - m_middle * (n_rows - n) < max(total_middle, n_rows - n):
                    m_right, total_right = m_middle, total_middle
                else:
                    m_left = m_middle
            m, total = m_right, total_right
            if not m:
                raise AssertionError("m must be non-zero")
            counts[1:n_rows - n + 1].fill_(m)  # the bottom rectangle
        if total:
            q, r = divmod(nnz - n * n_cols - m * (n_rows - n), (n_cols - m) * (n_cols - m + 1) // 2)
            p = 1 + q * (n_cols - m + 1)
            k = math.isqrt(2 * r)
            if k * (k + 1) > 2 * r:
                k -= 1
            corr = r - k * (k + 1) // 2
            if (p > 1) and (m > 0):
                raise AssertionError(f"full sawteeth are never on top of a bottom rectangle: p={p}, m={m}")
            counts[1:p] = torch.arange(p - 1, dtype=dtype, device=counts.device) % (n_cols - m + 1)
            counts[p:p + k + 1] += torch.arange(k + 1, dtype=dtype, device=counts.device)
        else:
            p = 1
            corr = nnz - n * n_cols - m * (n_rows - n)
        counts[p] += corr  # so that counts.sum() == nnz
        if random:
            perm = torch.randperm(n_rows, device=counts.device)
            counts[1:] = counts[1:][perm]
        counts.cumsum_(dim=0)
        return counts.to(device=device)

    def genSparseCompressedTensor(self, size: Sequence[int], nnz: int, *, layout: torch.layout, device: Any,
                                  dtype: torch.dtype, index_dtype: torch.dtype, blocksize: Sequence[int] = (),
                                  dense_dims: int = 0) -> torch.Tensor:
        """A random sparse compressed tensor (``layout``: CSR, CSC, BSR or
        BSC) of ``size`` with ``nnz`` specified elements, values in [-1, 1)
        ([0, 2) for uint8); leading dimensions beyond the sparse and
        ``dense_dims`` ones are batch dimensions."""
        sparse_dim = 2
        if not (all(size[d] > 0 for d in range(len(size))) or nnz == 0):
            raise AssertionError(f"invalid arguments: size={size}, nnz={nnz}")
        if len(size) < sparse_dim:
            raise AssertionError(f"expected len(size) >= {sparse_dim}, got {len(size)}")
        if blocksize:
            if len(blocksize) != 2:
                raise AssertionError(f"expected len(blocksize) == 2, got size={size}, blocksize={blocksize}")
            if size[-2 - dense_dims] % blocksize[0] != 0:
                raise AssertionError(
                    f"size[-2 - dense_dims] must be divisible by blocksize[0]: size={size}, blocksize={blocksize}")
            if size[-1 - dense_dims] % blocksize[1] != 0:
                raise AssertionError(
                    f"size[-1 - dense_dims] must be divisible by blocksize[1]: size={size}, blocksize={blocksize}")
            blocksize0, blocksize1 = blocksize
        else:
            blocksize0 = blocksize1 = 1
        size = tuple(size)
        blocks = tuple(blocksize)
        dense_size = size[(len(size) - dense_dims):]

        def random_sparse_compressed(n_compressed: int, n_plain: int, nnz: int) -> tuple[torch.Tensor, ...]:
            compressed = self._make_crow_indices(n_compressed, n_plain, nnz, device=device, dtype=index_dtype)
            plain = torch.zeros(nnz, dtype=index_dtype, device=device)
            for i in range(n_compressed):
                count = compressed[i + 1] - compressed[i]
                plain[compressed[i]:compressed[i + 1]], _ = torch.sort(
                    torch.randperm(n_plain, dtype=index_dtype, device=device)[:count])
            low, high = (-1, 1) if dtype != torch.uint8 else (0, 2)
            values = make_tensor((nnz, *blocks, *dense_size), device=device, dtype=dtype, low=low, high=high)
            return values, compressed, plain

        batch_shape = size[:-2 - dense_dims]
        n_batch = reduce(mul, batch_shape, 1)
        if layout in {torch.sparse_csr, torch.sparse_bsr}:
            n_compressed, n_plain = size[-2 - dense_dims] // blocksize0, size[-1 - dense_dims] // blocksize1
        else:
            n_compressed, n_plain = size[-1 - dense_dims] // blocksize1, size[-2 - dense_dims] // blocksize0
        blocknnz = nnz // (blocksize0 * blocksize1)
        parts = [random_sparse_compressed(n_compressed, n_plain, blocknnz) for _ in range(n_batch)]
        values_l, compressed_l, plain_l = (list(p) for p in zip(*parts, strict=True)) if parts else ([], [], [])
        values = torch.stack(values_l).reshape(*batch_shape, blocknnz, *blocks, *dense_size)
        compressed_indices = torch.stack(compressed_l).reshape(*batch_shape, -1)
        plain_indices = torch.stack(plain_l).reshape(*batch_shape, -1)
        return torch.sparse_compressed_tensor(compressed_indices, plain_indices, values, size=size,
                                              dtype=dtype, layout=layout, device=device)

    def genSparseCSRTensor(self, size: Sequence[int], nnz: int, *, device: Any, dtype: torch.dtype,
                           index_dtype: torch.dtype, dense_dims: int = 0) -> torch.Tensor:
        """A random CSR tensor (see :meth:`genSparseCompressedTensor`)."""
        return self.genSparseCompressedTensor(size, nnz, layout=torch.sparse_csr, device=device, dtype=dtype,
                                              index_dtype=index_dtype, blocksize=(), dense_dims=dense_dims)

    def genSparseCSCTensor(self, size: Sequence[int], nnz: int, *, device: Any, dtype: torch.dtype,
                           index_dtype: torch.dtype, dense_dims: int = 0) -> torch.Tensor:
        """A random CSC tensor (see :meth:`genSparseCompressedTensor`); as
        upstream, ``dense_dims`` is ignored (always 0)."""
        return self.genSparseCompressedTensor(size, nnz, layout=torch.sparse_csc, device=device, dtype=dtype,
                                              index_dtype=index_dtype, blocksize=(), dense_dims=0)

    def genSparseBSRTensor(self, size: Sequence[int], blocksize: Sequence[int], nnz: int, *, device: Any,
                           dtype: torch.dtype, index_dtype: torch.dtype, dense_dims: int = 0) -> torch.Tensor:
        """A random BSR tensor of 2-D ``blocksize`` (see :meth:`genSparseCompressedTensor`)."""
        if len(blocksize) != 2:
            raise AssertionError(f"expected len(blocksize) == 2, got {len(blocksize)}")
        return self.genSparseCompressedTensor(size, nnz, layout=torch.sparse_bsr, device=device, dtype=dtype,
                                              index_dtype=index_dtype, blocksize=blocksize, dense_dims=dense_dims)

    def genSparseBSCTensor(self, size: Sequence[int], blocksize: Sequence[int], nnz: int, *, device: Any,
                           dtype: torch.dtype, index_dtype: torch.dtype, dense_dims: int = 0) -> torch.Tensor:
        """A random BSC tensor of 2-D ``blocksize`` (see :meth:`genSparseCompressedTensor`)."""
        if len(blocksize) != 2:
            raise AssertionError(f"expected len(blocksize) == 2, got {len(blocksize)}")
        return self.genSparseCompressedTensor(size, nnz, layout=torch.sparse_bsc, device=device, dtype=dtype,
                                              index_dtype=index_dtype, blocksize=blocksize, dense_dims=dense_dims)

    def genSparseTensor(self, size: Sequence[int], sparse_dim: int, nnz: int, is_uncoalesced: bool, device: Any,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A random sparse COO tensor of ``size`` with ``nnz`` entries over
        its first ``sparse_dim`` dimensions, and copies of its indices and
        values: ``(x, indices, values)``. With ``is_uncoalesced`` the indices
        repeat (the first half of them twice) and ``x`` is not coalesced."""
        if not (all(size[d] > 0 for d in range(sparse_dim)) or nnz == 0):
            raise AssertionError(f"invalid arguments: size={size}, sparse_dim={sparse_dim}, nnz={nnz}")
        v = make_tensor([nnz, *size[sparse_dim:]], device=device, dtype=dtype, low=-1, high=1)
        i = torch.rand(sparse_dim, nnz, device=device)
        i.mul_(torch.tensor(size[:sparse_dim]).unsqueeze(1).to(i))
        i = i.to(torch.long)
        if is_uncoalesced:
            i = torch.cat([i[:, :(nnz // 2), ...], i[:, :((nnz + 1) // 2), ...]], 1)
        x = torch.sparse_coo_tensor(i, v, torch.Size(size), dtype=dtype, device=device)
        if not is_uncoalesced:
            x = x.coalesce()
        else:
            # NB: x is a sparse view of v; a detached clone can change size and storage later.
            x = _compat.mark_uncoalesced(x.detach().clone())
        indices, values = _compat.sparse_coo_raw(x)
        return x, indices.clone(), values.clone()

    def safeToDense(self, t: torch.Tensor) -> torch.Tensor:
        """``t.to_dense()``, coalescing a COO tensor first."""
        if t.layout == torch.sparse_coo:
            t = t.coalesce()
        return t.to_dense()

    def generate_simple_inputs(self, layout: torch.layout, device: Any = None, dtype: torch.dtype | None = None,
                               index_dtype: torch.dtype | None = None, pin_memory: bool | None = None,
                               members_pin_memory: bool | None = None, enable_batch: bool = True,
                               enable_hybrid: bool = True, enable_zero_sized: bool = True,
                               enable_non_contiguous_indices: bool = True, enable_non_contiguous_values: bool = True,
                               enable_batch_variable_nse: bool = False, output_tensor: bool = True,
                               patterns: Any = None) -> Iterator[Any]:
        """Yield small inputs of ``layout`` (strided, COO, CSR, CSC, BSR,
        BSC) that all represent the same tensors: regular, batched, hybrid,
        zero-sized, with contiguous and non-contiguous indices and values.

        With ``output_tensor`` (the default) each is a tensor; otherwise the
        constructor's arguments ``(args, kwargs)``: ``(indices..., values)``
        and ``size``, ``device``, ``dtype`` (and ``pin_memory``).
        """
        if index_dtype is None:
            index_dtype = torch.int64
        if output_tensor:
            for args, kwargs in self.generate_simple_inputs(
                    layout, device=device, dtype=dtype, index_dtype=index_dtype, pin_memory=pin_memory,
                    enable_batch=enable_batch, enable_hybrid=enable_hybrid, enable_zero_sized=enable_zero_sized,
                    enable_non_contiguous_indices=enable_non_contiguous_indices,
                    enable_non_contiguous_values=enable_non_contiguous_values,
                    enable_batch_variable_nse=enable_batch_variable_nse, output_tensor=False, patterns=patterns):
                if members_pin_memory:
                    args = tuple(a.pin_memory() for a in args)
                if layout is torch.strided:
                    if len(args) != 1:
                        raise AssertionError(f"expected len(args) == 1 for strided layout, got {len(args)}")
                    size = kwargs.pop("size", None)  # a zero-sized tensor keeps its shape
                    if size is None:
                        raise AssertionError("size must not be None for strided layout")
                    yield args[0].reshape(size).pin_memory() if pin_memory else args[0].reshape(size)
                elif layout is torch.sparse_coo:
                    yield torch.sparse_coo_tensor(*args, **kwargs)
                elif layout in _COMPRESSED:
                    kwargs.update(layout=layout)
                    yield torch.sparse_compressed_tensor(*args, **kwargs)
                else:
                    raise AssertionError(f"unreachable: unexpected layout {layout}")
            return
        if patterns is None:
            nse = [()] if enable_batch_variable_nse else []
            patterns = [*_DEFAULT_PATTERNS, (*_VARIABLE_NSE_PATTERN, nse)]
        yield from self._pattern_inputs(layout, device, dtype, index_dtype, pin_memory, patterns, enable_batch,
                                        enable_hybrid, enable_non_contiguous_indices, enable_non_contiguous_values)
        if enable_zero_sized:
            yield from _zero_sized_inputs(layout, device, dtype, index_dtype, pin_memory, enable_hybrid)

    def _pattern_inputs(self, layout: torch.layout, device: Any, dtype: Any, index_dtype: torch.dtype,
                        pin_memory: bool | None, patterns: Any, enable_batch: bool, enable_hybrid: bool,
                        non_contiguous_indices: bool, non_contiguous_values: bool) -> Iterator[Any]:
        def non_contiguous_copy(t: torch.Tensor, dim: int = -1, offset: int = 0) -> torch.Tensor:
            # a copy of t, non-contiguous along dim, at the given storage offset
            self.assertTrue(t.is_contiguous())
            if dim < 0:
                dim = dim + t.ndim
            if not (dim >= 0 and dim < t.ndim):
                raise AssertionError(f"dim out of range: expected 0 <= dim < {t.ndim}, got dim={dim}")
            step = max(2, offset + 1)
            tmp = torch.zeros((*t.shape[:dim], t.shape[dim] * step, *t.shape[dim + 1:]), dtype=t.dtype,
                              device=t.device)
            r = tmp[(*((slice(None),) * dim), slice(offset, None, step))].copy_(t)
            self.assertFalse(r.is_contiguous())
            self.assertEqual(t, r)
            return r

        for pattern, blocksizes, densesizes in patterns:
            if not enable_hybrid:
                densesizes = [s for s in densesizes if not s]
            if not (densesizes and blocksizes):
                continue
            pattern = torch.tensor(pattern, dtype=torch.int64)
            if not enable_batch and pattern.ndim > 2:
                continue
            for blocksize in blocksizes:
                data = _batch_sparse_data(pattern, blocksize)[layout]
                for densesize in densesizes:
                    indices = [a.to(device=device, dtype=index_dtype) for a in data[:-1]]
                    values = _generate_values(data[-1], densesize).to(device=device, dtype=dtype)
                    kwargs: dict[str, Any] = dict(device=device, dtype=dtype, size=pattern.shape + densesize)
                    if pin_memory is not None:
                        kwargs.update(pin_memory=pin_memory)
                    yield (*indices, values), kwargs.copy()
                    if non_contiguous_indices and pattern.ndim > 2:
                        # sparse compressed indices can be sliced only along batch dimensions
                        for (dim, offset) in ((-2, 0), (0, 1)):  # upstream iterates a set, in this order
                            indices_copy = [non_contiguous_copy(a, dim=dim, offset=offset) for a in indices]
                            yield (*indices_copy, values), kwargs.copy()
                            if non_contiguous_values:
                                yield (*indices_copy, non_contiguous_copy(values, dim=-1, offset=1)), kwargs.copy()
                    if non_contiguous_values:
                        yield (*indices, non_contiguous_copy(values, dim=-1, offset=1)), kwargs.copy()


def _zero_sized_inputs(layout: torch.layout, device: Any, dtype: Any, index_dtype: torch.dtype,
                       pin_memory: bool | None, enable_hybrid: bool) -> Iterator[Any]:
    for basesize, blocksizes, densesizes in [
            ((2, 0), [(1, 2)], [(), (2,), (2, 3)] if enable_hybrid else [()]),
            ((0, 2), [(1, 2), (2, 1), (3, 2)], [()]),
            ((0, 0), [(1, 2)], [()]),
    ]:
        for blocksize in blocksizes:
            for densesize in densesizes:
                indices: tuple[torch.Tensor, ...]
                if layout == torch.strided:
                    indices = ()
                    values = torch.empty((basesize + densesize), device=device, dtype=dtype)
                elif layout == torch.sparse_coo:
                    indices = (torch.empty(len(basesize), 0, device=device, dtype=index_dtype),)
                    values = torch.empty((0, *densesize), device=device, dtype=dtype)
                elif layout in _COMPRESSED:
                    row_major = layout in (torch.sparse_csr, torch.sparse_bsr)
                    blocked = layout in (torch.sparse_bsr, torch.sparse_bsc)
                    axis = 0 if row_major else 1
                    n = basesize[axis] // blocksize[axis] if blocked else basesize[axis]
                    indices = (torch.tensor([0] * (n + 1), device=device, dtype=index_dtype),
                               torch.empty(0, device=device, dtype=index_dtype))
                    values = torch.empty((0, *(blocksize if blocked else ()), *densesize), device=device, dtype=dtype)
                else:
                    raise AssertionError(f"unreachable: unexpected layout {layout}")
                kwargs: dict[str, Any] = dict(device=device, dtype=dtype, size=basesize + densesize)
                if pin_memory is not None:
                    kwargs.update(pin_memory=pin_memory)
                yield (*indices, values), kwargs


def _blockpattern(pattern: torch.Tensor, blocksize: Sequence[int]) -> torch.Tensor:
    basesize = pattern.shape
    if basesize[0] % blocksize[0] != 0:
        raise AssertionError(f"basesize[0] must be divisible by blocksize[0]: basesize={basesize}, blocksize={blocksize}")
    if basesize[1] % blocksize[1] != 0:
        raise AssertionError(f"basesize[1] must be divisible by blocksize[1]: basesize={basesize}, blocksize={blocksize}")
    blockpattern = pattern.reshape(-1, blocksize[0], basesize[1] // blocksize[1],
                                   blocksize[1]).transpose(-3, -2).any(-1).any(-1)
    block_ids = torch.arange(1, blockpattern.numel() + 1).reshape(blockpattern.shape)
    return (blockpattern != 0) * block_ids


def _sparse_data(pattern: torch.Tensor) -> dict[torch.layout, tuple[torch.Tensor, ...]]:
    # NB: computed without the sparse factories, which these inputs test.
    basesize = pattern.shape
    if len(basesize) != 2:
        raise AssertionError(f"pattern is expected to be a matrix, got shape {basesize}")
    indices = torch.where(pattern != 0)
    coo_indices = torch.stack(indices)
    crow_indices = torch.zeros(basesize[0] + 1, dtype=torch.int64)
    crow_indices[1:] = torch.cumsum(coo_indices[0].bincount(minlength=basesize[0]), 0)
    strided_values = torch.zeros(basesize, dtype=torch.int64)
    # _sparse_data_with_block relies on values == range(1, 1 + nnz)
    values = torch.arange(1, 1 + len(indices[0]), dtype=torch.int64)
    strided_values[indices] = values
    indices_t = torch.where(pattern.transpose(0, 1) != 0)
    coo_indices_t = torch.stack(indices_t)
    ccol_indices = torch.zeros(basesize[1] + 1, dtype=torch.int64)
    ccol_indices[1:] = torch.cumsum(coo_indices_t[0].bincount(minlength=basesize[1]), 0)
    csc_values = strided_values.transpose(0, 1)[indices_t]
    return {torch.sparse_coo: (coo_indices, values),
            torch.sparse_csr: (crow_indices, coo_indices[1], values),
            torch.sparse_csc: (ccol_indices, coo_indices_t[1], csc_values),
            torch.strided: (strided_values,)}


def _sparse_data_with_block(pattern: torch.Tensor, blocksize: Sequence[int]) -> dict[torch.layout, Any]:
    nonblock_data = _sparse_data(pattern)
    block_data = _sparse_data(_blockpattern(pattern, blocksize))
    strided_values = nonblock_data[torch.strided][0]
    block_indices = block_data[torch.sparse_coo][0]
    bsr_values = torch.stack([strided_values[bi * blocksize[0]:(bi + 1) * blocksize[0],
                                             bj * blocksize[1]:(bj + 1) * blocksize[1]]
                              for bi, bj in block_indices.transpose(0, 1)])
    # BSC blocks are the BSR blocks reordered, through values == range(1, 1 + nnz)
    bsc_values = bsr_values[block_data[torch.sparse_csc][2] - 1]
    return {torch.sparse_bsr: (*block_data[torch.sparse_csr][:2], bsr_values),
            torch.sparse_bsc: (*block_data[torch.sparse_csc][:2], bsc_values),
            **nonblock_data}


def _batch_sparse_data(pattern: torch.Tensor, blocksize: Sequence[int]) -> dict[torch.layout, Any]:
    if pattern.ndim <= 2:
        return _sparse_data_with_block(pattern, blocksize)
    batch_data: dict[torch.layout, Any] = {}
    for i, item in enumerate(pattern):
        for layout, d in _batch_sparse_data(item, blocksize).items():
            target = batch_data.get(layout)
            if layout is torch.sparse_coo:
                # a batch COO: the leading sparse dimensions are the batch ones
                ext = torch.cat((torch.full((1, len(d[1])), i, dtype=torch.int64), d[0]))
                if target is None:
                    batch_data[layout] = (ext, d[1])
                else:
                    target[0].set_(torch.cat((target[0], ext), 1))
                    target[1].set_(torch.cat((target[1], d[1])))
            elif target is None:
                batch_data[layout] = tuple(d[j].unsqueeze(0) for j in range(len(d)))
            else:
                for j in range(len(d)):
                    target[j].set_(torch.cat((target[j], d[j].unsqueeze(0))))
    return batch_data


def _generate_values(base: Any, densesize: Sequence[int]) -> Any:
    """A tensor of shape ``densesize`` holding ``base + i_1 * 10^0 + ... +
    i_d * 10^(d-1)`` at index ``(i_1, ..., i_d)`` (unique while every size < 10)."""
    if not densesize:
        return base
    if not isinstance(base, int) and base.ndim > 0:
        return torch.stack([_generate_values(b, densesize) for b in base])
    if base == 0:
        return torch.zeros(densesize, dtype=torch.int64)
    r = torch.arange(densesize[0], dtype=torch.int64)
    for i, d in enumerate(densesize[1:]):
        y = torch.arange(d, dtype=torch.int64) * (10 ** (i + 1))
        r = r[..., None] + y[None, ...]
    r.add_(base)
    return r
