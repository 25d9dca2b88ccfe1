"""The conformance tests: collective semantics any backend must keep.

``CollectiveConformance`` is a mixin of test methods that run in every rank
with the default group already made (by the runner class it is mixed
into), for any backend. Each test is named ``test_<collective>_<aspect>``;
the CLI groups results by collective. An operation a backend genuinely
lacks is reported as unsupported (:class:`Unsupported`, a skip), from the
feature table :data:`UNSUPPORTED` or from the backend's own "not supported"
error, never as a failure.
"""

from __future__ import annotations

import functools
import re
import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from disttest import _compat
from disttest.skips import TestSkip

__unittest = True

__all__ = ["UNSUPPORTED", "CollectiveConformance", "Unsupported", "rank_data", "reference_reduce"]

F = TypeVar("F", bound=Callable[..., Any])
R = dist.ReduceOp

#: (collective, detail) pairs a backend lacks by design, as DistTestCases does.
UNSUPPORTED: dict[str, set[tuple[str, str]]] = {
    # Checked against torch 2.13's gloo: "Cannot use ReduceOp.PREMUL_SUM with Gloo".
    "gloo": {("all_reduce", "PREMUL_SUM")},
    "threaded": set(),
}
_NOT_SUPPORTED = re.compile(r"not supported|does not support|unsupported|cannot use|not implemented", re.I)


class Unsupported(unittest.SkipTest):
    """The backend lacks this operation (a skip the CLI reports apart)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"unsupported: {what} ({why})")


def _backend(test: Any = None) -> str | None:
    # The parent knows the backend from the class (if it says); a rank knows
    # it from its group; else it is not known yet.
    named = getattr(test, "conformance_backend", None)
    if named:
        return str(named)
    return str(dist.get_backend()) if dist.is_initialized() else None


def supports(collective: str, detail: str = "") -> Callable[[F], F]:
    """Mark a test as exercising ``collective`` (with ``detail``, e.g. an op):
    skipped as unsupported on backends whose table lacks it, and turned into
    unsupported when the backend itself says it does not support it."""

    what = f"{collective} {detail}".strip()

    def lacking(args: Any) -> TestSkip | None:
        feature = f"dist.{collective}"
        too_old = _compat.missing_feature(feature) if feature in _compat.TORCH_FEATURES else None
        if too_old is not None:  # the torch API itself is missing: not the backend's fault
            return TestSkip(86, f"unsupported by this torch: {what} ({too_old})")
        backend = _backend(args[0] if args else None)
        if backend is not None and (collective, detail) in UNSUPPORTED.get(backend, set()):
            return TestSkip(86, f"unsupported: {what} ({backend} lacks it)")
        return None

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            skip = lacking((self,))
            if skip is not None:
                raise unittest.SkipTest(skip.message)
            try:
                return func(self, *args, **kwargs)
            except (RuntimeError, NotImplementedError, ValueError) as e:
                if _NOT_SUPPORTED.search(str(e)):
                    raise Unsupported(what, str(e).splitlines()[0][:200]) from None
                raise

        wrapper.__conformance__ = (collective, detail)  # type: ignore[attr-defined]
        # Decided in the parent too, before any rank starts.
        wrapper.__disttest_skip_checks__ = (lacking,)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def rank_data(rank: int, dtype: torch.dtype, n: int = 4) -> torch.Tensor:
    """Rank ``rank``'s input: distinct and nonzero per rank, so that every
    reduce op (PRODUCT, MIN, MAX, bitwise) gives a telling result."""
    return (torch.arange(n) + 3 * rank + 1).to(dtype)


def _all_ranks(dtype: torch.dtype, world: int, n: int = 4) -> list[torch.Tensor]:
    return [rank_data(r, dtype, n) for r in range(world)]


def reference_reduce(op: Any, tensors: list[torch.Tensor]) -> torch.Tensor:
    """``tensors`` reduced under ``op``, computed directly (the expected value)."""
    stacked = torch.stack(tensors)
    if op == R.SUM:
        return stacked.sum(0).to(tensors[0].dtype)
    if op == R.PRODUCT:
        return stacked.prod(0).to(tensors[0].dtype)
    if op == R.MIN:
        return stacked.amin(0)
    if op == R.MAX:
        return stacked.amax(0)
    if op == R.AVG:
        return stacked.mean(0)
    bitwise = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
    return functools.reduce(bitwise, tensors)


class CollectiveConformance:
    """Collective semantics, checked against values computed directly.

    Mix into a runner class whose ranks have a default group (see
    :mod:`disttest.conformance`); ``self.rank`` is the rank.
    """

    rank: int
    assertEqual: Callable[..., None]
    assertRaises: Callable[..., Any]
    assertIn: Callable[..., None]

    @property
    def world(self) -> int:
        return dist.get_world_size()

    def _all_reduce(self, op: Any, dtype: torch.dtype) -> None:
        t = rank_data(self.rank, dtype)
        dist.all_reduce(t, op=op)
        self.assertEqual(t, reference_reduce(op, _all_ranks(dtype, self.world)))

    @supports("all_reduce", "SUM")
    def test_all_reduce_sum(self) -> None:
        for dtype in (torch.float32, torch.float64, torch.int64):
            self._all_reduce(R.SUM, dtype)

    @supports("all_reduce", "PRODUCT")
    def test_all_reduce_product(self) -> None:
        self._all_reduce(R.PRODUCT, torch.float64)

    @supports("all_reduce", "MIN")
    def test_all_reduce_min(self) -> None:
        self._all_reduce(R.MIN, torch.int64)

    @supports("all_reduce", "MAX")
    def test_all_reduce_max(self) -> None:
        self._all_reduce(R.MAX, torch.float32)

    @supports("all_reduce", "AVG")
    def test_all_reduce_avg(self) -> None:
        self._all_reduce(R.AVG, torch.float32)

    @supports("all_reduce", "PREMUL_SUM")
    def test_all_reduce_premul_sum(self) -> None:
        t = rank_data(self.rank, torch.float32)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
        self.assertEqual(t, 2.0 * reference_reduce(R.SUM, _all_ranks(torch.float32, self.world)))

    @supports("all_reduce", "BAND")
    def test_all_reduce_band(self) -> None:
        self._all_reduce(R.BAND, torch.int64)

    @supports("all_reduce", "BOR")
    def test_all_reduce_bor(self) -> None:
        self._all_reduce(R.BOR, torch.int64)

    @supports("all_reduce", "BXOR")
    def test_all_reduce_bxor(self) -> None:
        self._all_reduce(R.BXOR, torch.int64)

    @supports("all_reduce", "async")
    def test_all_reduce_async(self) -> None:
        t = rank_data(self.rank, torch.float32)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        self.assertEqual(t, reference_reduce(R.SUM, _all_ranks(torch.float32, self.world)))

    @supports("broadcast")
    def test_broadcast_each_source(self) -> None:
        for src in range(self.world):
            t = rank_data(self.rank, torch.float32)
            dist.broadcast(t, src=src)
            self.assertEqual(t, rank_data(src, torch.float32))

    @supports("reduce")
    def test_reduce_to_each_root(self) -> None:
        for root in range(self.world):
            t = rank_data(self.rank, torch.float32)
            dist.reduce(t, dst=root, op=R.SUM)
            if self.rank == root:
                self.assertEqual(t, reference_reduce(R.SUM, _all_ranks(torch.float32, self.world)))

    @supports("all_gather")
    def test_all_gather_list(self) -> None:
        out = [torch.zeros(4) for _ in range(self.world)]
        dist.all_gather(out, rank_data(self.rank, torch.float32))
        self.assertEqual(out, _all_ranks(torch.float32, self.world))

    @supports("all_gather_single")
    def test_all_gather_single_concat(self) -> None:
        out = torch.zeros(4 * self.world)
        dist.all_gather_single(out, rank_data(self.rank, torch.float32))
        self.assertEqual(out, torch.cat(_all_ranks(torch.float32, self.world)))

    @supports("reduce_scatter", "SUM")
    def test_reduce_scatter_sum(self) -> None:
        out = torch.zeros(4)
        dist.reduce_scatter(out, [rank_data(self.rank * self.world + d, torch.float32) for d in range(self.world)])
        expected = reference_reduce(R.SUM, [rank_data(s * self.world + self.rank, torch.float32) for s in range(self.world)])
        self.assertEqual(out, expected)

    @supports("reduce_scatter", "AVG")
    def test_reduce_scatter_avg(self) -> None:
        out = torch.zeros(4)
        dist.reduce_scatter(out, [rank_data(self.rank * self.world + d, torch.float32) for d in range(self.world)],
                            op=R.AVG)
        expected = reference_reduce(R.AVG, [rank_data(s * self.world + self.rank, torch.float32) for s in range(self.world)])
        self.assertEqual(out, expected)

    @supports("reduce_scatter_single")
    def test_reduce_scatter_single(self) -> None:
        out = torch.zeros(4)
        inp = torch.cat([rank_data(self.rank * self.world + d, torch.float32) for d in range(self.world)])
        dist.reduce_scatter_single(out, inp)
        expected = reference_reduce(R.SUM, [rank_data(s * self.world + self.rank, torch.float32) for s in range(self.world)])
        self.assertEqual(out, expected)

    @supports("all_to_all")
    def test_all_to_all_list(self) -> None:
        out = [torch.zeros(2) for _ in range(self.world)]
        dist.all_to_all(out, [torch.full((2,), 10.0 * self.rank + d) for d in range(self.world)])
        self.assertEqual(out, [torch.full((2,), 10.0 * s + self.rank) for s in range(self.world)])

    @supports("all_to_all_single", "uneven")
    def test_all_to_all_single_uneven(self) -> None:
        n, me = self.world, self.rank
        in_splits = [me + 1 + d for d in range(n)]
        out_splits = [s + 1 + me for s in range(n)]
        inp = torch.cat([torch.full((k,), float(me * 10 + d)) for d, k in enumerate(in_splits)])
        out = torch.zeros(sum(out_splits))
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        self.assertEqual(out, torch.cat([torch.full((s + 1 + me,), float(s * 10 + me)) for s in range(n)]))

    @supports("scatter")
    def test_scatter_from_rank_0(self) -> None:
        out = torch.zeros(3)
        pieces = [torch.full((3,), float(r)) for r in range(self.world)] if self.rank == 0 else None
        dist.scatter(out, pieces, src=0)
        self.assertEqual(out, torch.full((3,), float(self.rank)))

    @supports("gather")
    def test_gather_to_rank_0(self) -> None:
        got = [torch.zeros(4) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(rank_data(self.rank, torch.float32), got, dst=0)
        if self.rank == 0:
            self.assertEqual(got, _all_ranks(torch.float32, self.world))

    @supports("barrier")
    def test_barrier(self) -> None:
        dist.barrier()
        dist.barrier()

    @supports("send_recv")
    def test_send_recv_ring(self) -> None:
        n, me = self.world, self.rank
        if n < 2:
            raise unittest.SkipTest("needs two ranks")
        got = torch.zeros(2)
        if me % 2 == 0:
            dist.send(torch.full((2,), float(me)), (me + 1) % n)
            dist.recv(got, (me - 1) % n)
        else:
            dist.recv(got, (me - 1) % n)
            dist.send(torch.full((2,), float(me)), (me + 1) % n)
        self.assertEqual(got, torch.full((2,), float((me - 1) % n)))

    @supports("isend_irecv")
    def test_batch_isend_irecv(self) -> None:
        n, me = self.world, self.rank
        if n < 2:
            raise unittest.SkipTest("needs two ranks")
        got = torch.zeros(2)
        ops = [dist.P2POp(dist.isend, torch.full((2,), float(me)), (me + 1) % n),
               dist.P2POp(dist.irecv, got, (me - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.assertEqual(got, torch.full((2,), float((me - 1) % n)))

    @supports("object_collectives")
    def test_object_collectives(self) -> None:
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, {"rank": self.rank})
        self.assertEqual(gathered, [{"rank": r} for r in range(self.world)])
        box: list[Any] = ["hello", self.rank] if self.rank == 0 else [None, None]
        dist.broadcast_object_list(box, src=0)
        self.assertEqual(box, ["hello", 0])

    @supports("subgroups")
    def test_subgroup_all_reduce(self) -> None:
        ranks = list(range(0, self.world, 2))
        group = dist.new_group(ranks)
        t = torch.tensor([float(self.rank)])
        if self.rank in ranks:
            dist.all_reduce(t, group=group)
            self.assertEqual(t.item(), float(sum(ranks)))

    @supports("argument_errors")
    def test_argument_errors_all_gather_list_length(self) -> None:
        with self.assertRaises((ValueError, RuntimeError)):
            dist.all_gather([torch.zeros(1)] * (self.world + 1), torch.ones(1))
