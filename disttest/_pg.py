"""Pieces shared by disttest's Python process groups (threaded and fake):
a Work over a Future, reductions, argument checks and copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from disttest import _compat

__unittest = True

__all__ = ["CollectiveMismatch", "FutureWork", "ThreadedWork", "completed_work"]


class CollectiveMismatch(RuntimeError):
    """Ranks called different collectives, or passed incompatible arguments,
    at the same step of a group."""


class FutureWork(_compat.work_base()):  # type: ignore[misc]
    """A c10d Work over a ``torch.futures.Future`` whose value is the output
    tensors: ``wait()`` blocks until it completes, or raises its error (a
    threaded world's abort sets one)."""

    def __init__(self, future: Future[Any], op: str) -> None:
        super().__init__()
        self._future = future
        self.op = op
        self.source: int | None = None

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self) -> Any:
        try:
            self._future.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def get_future(self) -> Future[Any]:
        return self._future

    def result(self) -> Any:
        return self._future.value()

    def _source_rank(self) -> int:
        if self.source is None:
            raise RuntimeError("the source rank is known only once recv completes (disttest)")
        return self.source

    def synchronize(self) -> None:
        self.wait()


ThreadedWork = FutureWork


def completed_work(value: Any, op: str = "") -> FutureWork:
    """A Work that has already completed with ``value``."""
    fut: Future[Any] = Future()
    fut.set_result(value)
    return FutureWork(fut, op)


# --- reductions -------------------------------------------------------------------

R: Any = dist.ReduceOp.RedOpType  # (the stubs lack most members)
_BITWISE = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}


def _reduce(tensors: list[torch.Tensor], op: Any, what: str) -> torch.Tensor:
    kind, factor = _compat.reduce_op_parts(op)
    dtype = tensors[0].dtype
    if kind in _BITWISE:
        if dtype.is_floating_point or dtype.is_complex:
            raise ValueError(f"{what}: {kind.name} needs integer or bool tensors, got {dtype} (disttest)")
        out = tensors[0].clone()
        for t in tensors[1:]:
            out = _BITWISE[kind](out, t)
        return out
    stacked = torch.stack([t.detach() for t in tensors])
    if kind == R.SUM:
        return stacked.sum(0).to(dtype)
    if kind == R.PRODUCT:
        return stacked.prod(0).to(dtype)
    if kind == R.MIN:
        return stacked.amin(0)
    if kind == R.MAX:
        return stacked.amax(0)
    if kind == R.AVG:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"{what}: AVG needs floating-point tensors, got {dtype} (disttest)")
        return stacked.mean(0)
    if kind == R.PREMUL_SUM:
        scale = factor if not isinstance(factor, torch.Tensor) else factor.to(stacked.device)
        return (stacked * scale).sum(0).to(dtype)
    raise ValueError(f"{what}: reduce op {kind} is not supported (disttest)")


def _same(tensors: Sequence[torch.Tensor], what: str) -> None:
    first = tensors[0]
    for r, t in enumerate(tensors):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise CollectiveMismatch(
                f"{what}: rank {r} passed {t.dtype} {list(t.shape)}, rank 0 passed "
                f"{first.dtype} {list(first.shape)} (disttest)")


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.detach().copy_(src.to(dst.device))


def _splits(sizes: Sequence[int] | None, total: int, n: int, what: str) -> list[int]:
    if not sizes:
        if total % n:
            raise ValueError(f"{what}: dim 0 of size {total} does not split evenly over {n} ranks (disttest)")
        return [total // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != total:
        raise ValueError(f"{what}: split sizes {sizes} do not cover dim 0 of size {total} over {n} ranks (disttest)")
    return sizes


