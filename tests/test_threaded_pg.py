"""The threaded process group: every collective against the result computed
directly, over world sizes, dtypes and reduce ops; async work, subgroups,
object and functional collectives; argument errors; aborts."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import threading
import time
import unittest
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import disttest
from disttest import CollectiveAborted, CollectiveMismatch, spawn_threads_and_init_comms
from disttest.conformance.reference import expected_reduce
from disttest.pg.threaded import install_threaded_pg

SIZES = (1, 2, 3, 4)
R = dist.ReduceOp
OP_NAMES = {R.SUM: "SUM", R.PRODUCT: "PRODUCT", R.MIN: "MIN", R.MAX: "MAX", R.AVG: "AVG",
            R.BAND: "BAND", R.BOR: "BOR", R.BXOR: "BXOR"}


def data(rank: int, dtype: torch.dtype, n: int = 4) -> torch.Tensor:
    """Rank ``rank``'s input: distinct and nonzero per rank."""
    return (torch.arange(n) + 3 * rank + 1).to(dtype)


def direct(op, tensors: list[torch.Tensor]) -> torch.Tensor:
    """``tensors`` reduced under ``op`` by numpy: independent of the
    backend's own reduction code (disttest/pg/_local.py)."""
    name = str(tensors[0].dtype).removeprefix("torch.")
    result = expected_reduce(OP_NAMES[op], [t.numpy() for t in tensors], name)
    return torch.from_numpy(result).to(tensors[0].dtype)


def on_ranks(test: unittest.TestCase, world_size: int, fn):
    """Run ``fn(rank, world_size)`` in every rank thread; return the results
    by rank."""
    results: dict[int, object] = {}

    @spawn_threads_and_init_comms(world_size=world_size, timeout=30)
    def body(self):
        rank = dist.get_rank()
        results[rank] = fn(rank, world_size)

    body(test)
    return [results[r] for r in range(world_size)]


FLOAT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)
INT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
CASES = [(n, torch.float32, op) for n in SIZES for op in FLOAT_OPS] + \
        [(n, torch.float64, R.SUM) for n in SIZES] + \
        [(n, torch.int64, op) for n in SIZES for op in INT_OPS] + \
        [(n, torch.int32, R.BXOR) for n in SIZES]


class RefusedCallsTest(unittest.TestCase):
    def test_an_argument_the_group_refuses_is_the_calling_ranks_own_error(self):
        # (a root outside the group, refused as the call was made, was taken
        # for communication: a desync without the skip, hidden by rank 0's skip)
        class Case(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_beside_a_skip(self):
                if self.rank == 0:
                    self.skipTest("rank 0 skips")
                dist.broadcast(torch.ones(1), src=7)

            def test_alone(self):
                if self.rank == 1:
                    dist.broadcast(torch.ones(1), src=7)

            def test_a_shape_beside_a_skip(self):
                if self.rank == 0:
                    self.skipTest("rank 0 skips")
                dist.all_gather([torch.zeros(3, 2) for _ in range(2)], torch.ones(2, 3))

        for name in ("test_beside_a_skip", "test_alone", "test_a_shape_beside_a_skip"):
            with self.subTest(name):
                result = unittest.TestResult()
                Case(name).run(result)
                self.assertEqual((len(result.errors), len(result.skipped)), (1, 0), result.skipped)
                self.assertRegex(result.errors[0][1], "rank 1/2 raised (InvalidArgument|CollectiveMismatch)")
                self.assertNotIn("desync", result.errors[0][1])


class ReductionsTest(unittest.TestCase):
    def test_all_reduce(self):
        for n, dtype, op in CASES:
            with self.subTest(world_size=n, dtype=dtype, op=op):
                def fn(rank, n, dtype=dtype, op=op):
                    t = data(rank, dtype)
                    dist.all_reduce(t, op=op)
                    return t

                expected = direct(op, [data(r, dtype) for r in range(n)])
                for got in on_ranks(self, n, fn):
                    torch.testing.assert_close(got, expected)

    def test_premul_sum(self):
        for n in SIZES:
            def fn(rank, n):
                t = data(rank, torch.float32)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.5))
                return t

            expected = 2.5 * sum(data(r, torch.float32) for r in range(n))
            for got in on_ranks(self, n, fn):
                torch.testing.assert_close(got, expected)

    def test_reduce_to_each_root(self):
        for n in SIZES:
            for root, op in itertools.product(range(n), (R.SUM, R.MAX)):
                with self.subTest(world_size=n, root=root, op=op):
                    def fn(rank, n, root=root, op=op):
                        t = data(rank, torch.float32)
                        dist.reduce(t, dst=root, op=op)
                        return t

                    got = on_ranks(self, n, fn)
                    expected = direct(op, [data(r, torch.float32) for r in range(n)])
                    torch.testing.assert_close(got[root], expected)
                    for r in set(range(n)) - {root}:
                        torch.testing.assert_close(got[r], data(r, torch.float32))

    def test_reduce_scatter_variants(self):
        for n, op in itertools.product(SIZES, (R.SUM, R.MIN, R.AVG)):
            with self.subTest(world_size=n, op=op):
                def fn(rank, n, op=op):
                    inputs = [data(rank * n + j, torch.float32) for j in range(n)]
                    out_list = torch.zeros(4)
                    dist.reduce_scatter(out_list, inputs, op=op)
                    out_tensor = torch.zeros(4)
                    with warnings.catch_warnings():  # deprecated in 2.13, still used
                        warnings.simplefilter("ignore", FutureWarning)
                        dist.reduce_scatter_tensor(out_tensor, torch.cat(inputs), op=op)
                    return out_list, out_tensor

                got = on_ranks(self, n, fn)
                for dst in range(n):
                    expected = direct(op, [data(src * n + dst, torch.float32) for src in range(n)])
                    torch.testing.assert_close(got[dst][0], expected)
                    torch.testing.assert_close(got[dst][1], expected)

    @disttest.requires_torch_feature("dist.reduce_scatter_single")
    def test_reduce_scatter_single(self):
        for n, op in itertools.product(SIZES, (R.SUM, R.MIN, R.AVG)):
            with self.subTest(world_size=n, op=op):
                def fn(rank, n, op=op):
                    out = torch.zeros(4)
                    dist.reduce_scatter_single(out, torch.cat([data(rank * n + j, torch.float32)
                                                               for j in range(n)]), op=op)
                    return out

                for dst, got in enumerate(on_ranks(self, n, fn)):
                    torch.testing.assert_close(got, direct(op, [data(src * n + dst, torch.float32)
                                                                for src in range(n)]))


class DataMovementTest(unittest.TestCase):
    def test_broadcast_from_each_source(self):
        for n in SIZES:
            for src in range(n):
                def fn(rank, n, src=src):
                    t = data(rank, torch.float32)
                    dist.broadcast(t, src=src)
                    return t

                for got in on_ranks(self, n, fn):
                    torch.testing.assert_close(got, data(src, torch.float32))

    def test_all_gather_forms(self):
        for n in SIZES:
            def fn(rank, n):
                mine = data(rank, torch.float64, 3)
                listed = [torch.zeros(3, dtype=torch.float64) for _ in range(n)]
                dist.all_gather(listed, mine)
                stacked = torch.zeros(n, 3, dtype=torch.float64)
                with warnings.catch_warnings():  # deprecated in 2.13, still used
                    warnings.simplefilter("ignore", FutureWarning)
                    dist.all_gather_into_tensor(stacked, mine)
                return listed, stacked

            expected = [data(r, torch.float64, 3) for r in range(n)]
            for listed, stacked in on_ranks(self, n, fn):
                torch.testing.assert_close(listed, expected)
                torch.testing.assert_close(stacked, torch.stack(expected))

    @disttest.requires_torch_feature("dist.all_gather_single")
    def test_all_gather_single(self):
        for n in SIZES:
            def fn(rank, n):
                concat = torch.zeros(3 * n, dtype=torch.float64)
                dist.all_gather_single(concat, data(rank, torch.float64, 3))
                return concat

            for concat in on_ranks(self, n, fn):
                torch.testing.assert_close(concat, torch.cat([data(r, torch.float64, 3) for r in range(n)]))

    def test_gather_and_scatter_at_each_root(self):
        for n in SIZES:
            for root in range(n):
                def fn(rank, n, root=root):
                    gathered = [torch.zeros(4) for _ in range(n)] if rank == root else None
                    dist.gather(data(rank, torch.float32), gathered, dst=root)
                    out = torch.zeros(4)
                    pieces = [data(10 + r, torch.float32) for r in range(n)] if rank == root else None
                    dist.scatter(out, pieces, src=root)
                    return gathered, out

                got = on_ranks(self, n, fn)
                torch.testing.assert_close(got[root][0], [data(r, torch.float32) for r in range(n)])
                for r in range(n):
                    torch.testing.assert_close(got[r][1], data(10 + r, torch.float32))

    def test_all_to_all(self):
        for n in SIZES:
            def fn(rank, n):
                outs = [torch.zeros(2) for _ in range(n)]
                dist.all_to_all(outs, [torch.full((2,), 10.0 * rank + d) for d in range(n)])
                return outs

            for dst, outs in enumerate(on_ranks(self, n, fn)):
                torch.testing.assert_close(outs, [torch.full((2,), 10.0 * src + dst) for src in range(n)])

    def test_all_to_all_single_even_and_uneven(self):
        for n in SIZES:
            def fn(rank, n):
                even_out = torch.zeros(n)
                dist.all_to_all_single(even_out, torch.arange(n, dtype=torch.float32) + 100 * rank)
                # Rank r sends r + 1 + d elements to rank d.
                in_splits = [rank + 1 + d for d in range(n)]
                out_splits = [src + 1 + rank for src in range(n)]
                inp = torch.cat([torch.full((k,), float(rank * 10 + d)) for d, k in enumerate(in_splits)])
                uneven_out = torch.zeros(sum(out_splits))
                dist.all_to_all_single(uneven_out, inp, out_splits, in_splits)
                return even_out, uneven_out

            for dst, (even, uneven) in enumerate(on_ranks(self, n, fn)):
                torch.testing.assert_close(even, torch.tensor([100.0 * src + dst for src in range(n)]))
                expected = torch.cat([torch.full((src + 1 + dst,), float(src * 10 + dst)) for src in range(n)])
                torch.testing.assert_close(uneven, expected)


class PointToPointTest(unittest.TestCase):
    def test_send_recv_ring_and_any_source(self):
        for n in (2, 3, 4):
            def fn(rank, n):
                nxt, prev = (rank + 1) % n, (rank - 1) % n
                got = torch.zeros(2)
                if rank % 2 == 0:
                    dist.send(torch.full((2,), float(rank)), nxt)
                    dist.recv(got, prev)
                else:
                    dist.recv(got, prev)
                    dist.send(torch.full((2,), float(rank)), nxt)
                anywhere = torch.zeros(1)
                sender = None
                if rank == 0:
                    sender = dist.recv(anywhere)  # from any source
                elif rank == n - 1:
                    dist.send(torch.tensor([7.0]), 0)
                return got, sender, anywhere

            got = on_ranks(self, n, fn)
            for rank, (ring, _, _) in enumerate(got):
                torch.testing.assert_close(ring, torch.full((2,), float((rank - 1) % n)))
            self.assertEqual(got[0][1], n - 1)
            torch.testing.assert_close(got[0][2], torch.tensor([7.0]))

    def test_isend_irecv_and_batch(self):
        def fn(rank, n):
            peer = 1 - rank
            out = torch.zeros(3)
            works = [dist.isend(torch.full((3,), rank + 1.0), peer), dist.irecv(out, peer)]
            for w in works:
                w.wait()
            batched = torch.zeros(3)
            ops = [dist.P2POp(dist.isend, torch.full((3,), rank + 5.0), peer),
                   dist.P2POp(dist.irecv, batched, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return out, batched

        for rank, (out, batched) in enumerate(on_ranks(self, 2, fn)):
            torch.testing.assert_close(out, torch.full((3,), 2.0 - rank))
            torch.testing.assert_close(batched, torch.full((3,), 6.0 - rank))


class AsyncAndGroupsTest(unittest.TestCase):
    def test_async_work_completes_on_wait(self):
        def fn(rank, n):
            a, b = torch.ones(2) * rank, torch.ones(2)
            w1 = dist.all_reduce(a, async_op=True)
            w2 = dist.broadcast(b, src=0, async_op=True)
            w2.wait()
            w1.wait()
            return a, w1.is_completed(), w1.is_success(), w1.get_future().value()[0]

        for a, done, ok, value in on_ranks(self, 3, fn):
            torch.testing.assert_close(a, torch.full((2,), 3.0))
            self.assertTrue(done and ok)
            torch.testing.assert_close(value, a)

    def test_async_does_not_block_the_caller(self):
        def fn(rank, n):
            t = torch.ones(1)
            if rank == 0:
                # Must return before rank 1 joins: rank 1 joins only after
                # the send below, so a blocking call would deadlock here.
                w = dist.all_reduce(t, async_op=True)
                done_early = w.is_completed()
                dist.send(torch.ones(1), 1)
            else:
                done_early = None
                dist.recv(torch.zeros(1), 0)
                w = dist.all_reduce(t, async_op=True)
            w.wait()
            return done_early, t

        got = on_ranks(self, 2, fn)
        self.assertFalse(got[0][0])
        torch.testing.assert_close(got[1][1], torch.tensor([2.0]))

    def test_subgroups(self):
        def fn(rank, n):
            evens = dist.new_group([0, 2])
            t = torch.tensor([float(rank)])
            if rank in (0, 2):
                dist.all_reduce(t, group=evens)
            pairs, _ = dist.new_subgroups(group_size=2)
            u = torch.tensor([float(rank)])
            dist.all_reduce(u, group=pairs)
            return t, u, dist.get_world_size(pairs)

        got = on_ranks(self, 4, fn)
        self.assertEqual([g[0].item() for g in got], [2.0, 1.0, 2.0, 3.0])
        self.assertEqual([g[1].item() for g in got], [1.0, 1.0, 5.0, 5.0])
        self.assertEqual({g[2] for g in got}, {2})

    def test_object_collectives(self):
        def fn(rank, n):
            gathered = [None] * n
            dist.all_gather_object(gathered, {"rank": rank, "name": f"r{rank}"})
            box = [f"from {rank}", rank] if rank == 1 else [None, None]
            dist.broadcast_object_list(box, src=1)
            at_root = [None] * n if rank == 0 else None
            dist.gather_object(("g", rank), at_root, dst=0)
            mine = [None]
            dist.scatter_object_list(mine, [f"piece {r}" for r in range(n)] if rank == 2 else None, src=2)
            return gathered, box, at_root, mine[0]

        got = on_ranks(self, 3, fn)
        for rank, (gathered, box, _, mine) in enumerate(got):
            self.assertEqual(gathered, [{"rank": r, "name": f"r{r}"} for r in range(3)])
            self.assertEqual(box, ["from 1", 1])
            self.assertEqual(mine, f"piece {rank}")
        self.assertEqual(got[0][2], [("g", 0), ("g", 1), ("g", 2)])

    def test_functional_collectives(self):
        import torch.distributed._functional_collectives as funcol

        def fn(rank, n):
            reduced = funcol.all_reduce(torch.ones(2) * rank, "sum", dist.group.WORLD)
            with warnings.catch_warnings():  # deprecated in 2.13 for all_gather_single, still there
                warnings.simplefilter("ignore", FutureWarning)
                gathered = funcol.all_gather_tensor(torch.tensor([float(rank)]), 0, dist.group.WORLD)
            return funcol.wait_tensor(reduced), funcol.wait_tensor(gathered)

        for reduced, gathered in on_ranks(self, 3, fn):
            torch.testing.assert_close(reduced, torch.full((2,), 3.0))
            torch.testing.assert_close(gathered, torch.tensor([0.0, 1.0, 2.0]))

    @disttest.requires_torch_feature("funcol.all_gather_single")
    def test_functional_all_gather_single(self):
        import torch.distributed._functional_collectives as funcol

        def fn(rank, n):
            gathered = funcol.all_gather_single(torch.tensor([float(rank)]), 0, dist.group.WORLD)
            return funcol.wait_tensor(gathered)

        for gathered in on_ranks(self, 3, fn):
            torch.testing.assert_close(gathered, torch.tensor([0.0, 1.0, 2.0]))

    def test_barrier_and_queries(self):
        got = on_ranks(self, 3, lambda rank, n: (dist.barrier(), dist.get_backend(), dist.get_world_size())[1:])
        self.assertEqual(got, [("threaded", 3)] * 3)


class NewGroupOrderTest(unittest.TestCase):
    """c10d names a group by the order of new_group calls: ranks that call
    it in different orders hold groups of one name with different ranks.
    The threaded group paired the ranks that came first, and a test passed
    or failed on a wrong sum, or was reported as a desync."""

    def test_ranks_whose_groups_of_one_name_differ_are_named_when_they_meet(self):
        def fn(rank, n):
            order = [[0, 1], [1, 2]] if rank == 0 else [[1, 2], [0, 1]]
            groups = {tuple(r): dist.new_group(r) for r in order}
            if rank == 1:
                return None
            t = torch.tensor([float(10 ** rank)])
            try:  # rank 0 with its [0, 1], rank 2 with its [1, 2]: both named "1" (their sum was 101.0)
                dist.all_reduce(t, group=groups[(0, 1) if rank == 0 else (1, 2)])
            except CollectiveMismatch as e:
                return str(e)
            return t.item()

        got = on_ranks(self, 3, fn)
        for rank in (0, 2):
            self.assertIn("all_reduce #1 on group 1 joined ranks that made that group with different ranks "
                          "(disttest): rank 0 made it with ranks 0, 1; rank 2 made it with ranks 1, 2; c10d names "
                          "a group by the order of new_group calls", got[rank])

    def test_groups_each_made_by_their_own_members_stay_apart(self):
        # (torch's _find_or_create_pg_by_ranks_and_tag, which functional
        # collectives use for a list of ranks: disjoint groups of one name)
        def fn(rank, n):
            group = dist.distributed_c10d._find_or_create_pg_by_ranks_and_tag("tag", [0, 1, 2, 3], 2)
            t = torch.tensor([float(10 ** rank)])
            dist.all_reduce(t, group=group)
            return t.item()

        self.assertEqual(on_ranks(self, 4, fn), [11.0, 11.0, 1100.0, 1100.0])

    def test_names_used_again_after_the_world_is_made_again(self):
        # destroy_process_group starts c10d's names afresh: group 1 is new
        def fn(rank, n):
            first = dist.new_group([0, 1])
            if rank < 2:
                dist.all_reduce(torch.ones(1), group=first)
            store = dist.distributed_c10d._get_default_store()
            dist.destroy_process_group()
            dist.init_process_group("threaded", rank=rank, world_size=3, store=store)
            second = dist.new_group([1, 2])
            t = torch.ones(1)
            if rank > 0:
                dist.all_reduce(t, group=second)
            return t.item()

        self.assertEqual(on_ranks(self, 3, fn), [1.0, 2.0, 2.0])


class ArgumentErrorsTest(unittest.TestCase):
    def errors_on_every_rank(self, n, fn, error, fragment):
        def body(rank, n):
            try:
                fn(rank, n)
            except error as e:
                return str(e)
            return None

        for message in on_ranks(self, n, body):
            self.assertIsNotNone(message, f"expected {error.__name__}")
            self.assertIn(fragment, message)

    def test_shape_mismatch_names_the_ranks(self):
        self.errors_on_every_rank(
            2, lambda rank, n: dist.all_reduce(torch.ones(2 + rank)), CollectiveMismatch,
            "all_reduce: ranks passed tensors of different dtypes or shapes (rank 0 passed torch.float32 [2]; "
            "rank 1 passed torch.float32 [3]) (disttest)")
        # Every rank's, alike ones together (it named rank 1's against rank 0's alone).
        self.errors_on_every_rank(
            4, lambda rank, n: dist.all_reduce(torch.ones(2 + rank % 3)), CollectiveMismatch,
            "(ranks 0, 3 passed torch.float32 [2]; rank 1 passed torch.float32 [3]; rank 2 passed torch.float32 [4])")

    def test_coalesced_calls_of_different_lengths(self):
        self.errors_on_every_rank(
            2, lambda rank, n: dist.all_reduce_coalesced([torch.ones(1)] * (1 + rank)), CollectiveMismatch,
            "all_reduce_coalesced: ranks passed different numbers of tensors (rank 0 passed 1; rank 1 passed 2)")
        self.errors_on_every_rank(  # (the longer list on rank 0 was an IndexError)
            2, lambda rank, n: dist.all_reduce_coalesced([torch.ones(1)] * (2 - rank)), CollectiveMismatch,
            "(rank 0 passed 2; rank 1 passed 1)")
        # Ranks that passed alike are named together (every rank had its own words).
        self.errors_on_every_rank(
            6, lambda rank, n: dist.all_reduce_coalesced([torch.ones(1)] * (2 if rank == 3 else 3)),
            CollectiveMismatch, "(ranks 0, 1, 2, 4, 5 passed 3; rank 3 passed 2)")
        # And it is not an all_reduce: one rank's all_reduce with another's coalesced call is a mismatch.
        self.errors_on_every_rank(
            2, lambda rank, n: (dist.all_reduce(torch.ones(1)) if rank else dist.all_reduce_coalesced([torch.ones(1)])),
            CollectiveMismatch, "rank 0 called all_reduce_coalesced; rank 1 called all_reduce")

    def test_pieces_that_do_not_fit_are_not_cast_or_broadcast(self):
        # gloo refuses each of these; a copy would cast or broadcast in silence.
        def gather_shape(rank, n):
            dist.gather(torch.ones(1), [torch.zeros(3) for _ in range(n)] if rank == 0 else None, dst=0)

        def gather_dtype(rank, n):
            dt = torch.float64 if rank == 1 else torch.float32
            dist.gather(torch.ones(2, dtype=dt), [torch.zeros(2) for _ in range(n)] if rank == 0 else None, dst=0)

        def scatter_dtype(rank, n):
            out = torch.zeros(2, dtype=torch.int64 if rank == 1 else torch.float32)
            dist.scatter(out, [torch.ones(2) for _ in range(n)] if rank == 0 else None, src=0)

        def reduce_scatter_shape(rank, n):
            dist.reduce_scatter(torch.zeros(3), [torch.ones(1) for _ in range(n)])

        def all_gather_dtype(rank, n):
            dt = torch.float64 if rank == 1 else torch.float32
            dist.all_gather([torch.zeros(2, dtype=dt) for _ in range(n)], torch.ones(2, dtype=dt))

        def all_gather_shape(rank, n):  # (the same size, another shape: reshaped in silence)
            dist.all_gather([torch.zeros(3, 2) for _ in range(n)], torch.ones(2, 3))

        def all_to_all_dtype(rank, n):
            dt = torch.int64 if rank == 1 else torch.float32
            dist.all_to_all([torch.zeros(1, dtype=dt) for _ in range(n)], [torch.ones(1, dtype=dt) for _ in range(n)])

        for fn, fragment in (
                (gather_shape, "gather: rank 0 sends to the root's output 0: [1] torch.float32 into [3] torch.float32"),
                (gather_dtype, "gather: rank 1 sends to the root's output 1: [2] torch.float64 into [2] torch.float32"),
                (scatter_dtype, "scatter: the root's input 1 to rank 1's output: [2] torch.float32 into [2] torch.int64"),
                (reduce_scatter_shape, "reduce_scatter: the inputs 0 into rank 0's output: [1] torch.float32 into [3]"),
                (all_gather_dtype, "all_gather: rank 1 sends to rank 0's output 1: [2] torch.float64 into [2] torch."),
                (all_gather_shape, "'s input to its output 0: [2, 3] torch.float32 into [3, 2]"),
                (all_to_all_dtype, "all_to_all: rank 1 sends to rank 0's output 1: [1] torch.int64 into [1] torch.")):
            with self.subTest(fn.__name__):
                self.errors_on_every_rank(2, fn, CollectiveMismatch, fragment)

    def test_different_collectives_at_the_same_step(self):
        def fn(rank, n):
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.broadcast(torch.ones(1), src=0)

        self.errors_on_every_rank(2, fn, CollectiveMismatch,
                                  "rank 0 called all_reduce; rank 1 called broadcast")

    def test_a_mismatch_names_ranks_that_did_the_same_together(self):
        # Each rank named apart made a 60 KB report at 512 ranks, the odd one buried.
        def fn(rank, n):
            if rank == 5:
                dist.broadcast(torch.ones(1), src=0)
            else:
                dist.all_reduce(torch.ones(1))

        self.errors_on_every_rank(10, fn, CollectiveMismatch,
                                  "does not match across ranks (disttest): ranks 0-4, 6-9 called all_reduce; "
                                  "rank 5 called broadcast")
        # A few ranks are named one by one, as every report names them.
        self.errors_on_every_rank(10, lambda rank, n: dist.broadcast(torch.ones(1), src=int(rank in (2, 3))),
                                  CollectiveMismatch, "ranks pass different src (disttest): ranks 0, 1, 4, 5, 6, 7, "
                                                      "8, 9 passed src=0; ranks 2, 3 passed src=1")

    def test_values_equal_but_of_other_types_are_told_apart(self):
        from disttest.pg._local import each_rank

        # "1" and 1 print alike: grouped by their text, rank 0's string was
        # shown as the others' int. Values that print alike are shown as reprs.
        self.assertEqual(each_rank(["1", 1, 1, [2], True], "passed x={}"),
                         "rank 0 passed x='1'; ranks 1, 2 passed x=1; rank 3 passed x=[2]; rank 4 passed x=True")

    def test_scattered_ranks_are_named_in_a_line_that_does_not_grow_with_the_world(self):
        from disttest.pg._local import rank_runs

        # (every other rank of 1024 was 512 numbers)
        self.assertEqual(rank_runs(range(0, 1024, 2)), "0, 2, 4, ..., 1022 (512 ranks, every 2nd)")
        self.assertEqual(rank_runs(range(1, 4096, 11)), "1, 12, 23, ..., 4093 (373 ranks, every 11th)")
        self.assertEqual(rank_runs([r for r in range(1024) if r % 8 < 4]),
                         "0-3, 8-11, 16-19, 24-27, 32-35, 40-43, 48-51, 56-59, 64-67, 72-75, ..., 1016-1019 "
                         "(512 ranks)")
        self.assertEqual(rank_runs([*range(517), *range(518, 1024)]), "0-516, 518-1023")
        self.assertEqual(rank_runs([5, 1, 2]), "1, 2, 5")
        self.assertEqual(rank_runs(range(0, 24, 2)), "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22")

    def test_bitwise_op_on_floats(self):
        self.errors_on_every_rank(2, lambda rank, n: dist.all_reduce(torch.ones(1), op=R.BAND),
                                  ValueError, "BAND needs integer or bool tensors")
        # gloo's is a RuntimeError: a suite written against it must catch ours too
        self.errors_on_every_rank(2, lambda rank, n: dist.all_reduce(torch.ones(1), op=R.BAND),
                                  RuntimeError, "BAND needs integer or bool tensors")

    def test_average_of_integers(self):
        self.errors_on_every_rank(2, lambda rank, n: dist.all_reduce(torch.ones(1, dtype=torch.int64), op=R.AVG),
                                  ValueError, "AVG needs floating-point tensors")

    def test_bad_split_sizes(self):
        self.errors_on_every_rank(
            2, lambda rank, n: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [2, 2], [3, 3]),
            ValueError, "split sizes [3, 3] do not cover dim 0 of size 4")

    @disttest.requires_torch_feature("dist.all_gather_single")
    def test_all_gather_into_tensor_size(self):
        self.errors_on_every_rank(
            2, lambda rank, n: dist.all_gather_single(torch.zeros(3), torch.ones(2)),
            ValueError, "needs 2 x 2")

    def test_recv_of_the_wrong_shape(self):
        def fn(rank, n):
            if rank == 0:
                dist.send(torch.ones(3), 1)
            else:
                dist.recv(torch.zeros(2), 0)

        results = {}

        def body(rank, n):
            try:
                fn(rank, n)
            except CollectiveMismatch as e:
                results[rank] = str(e)

        on_ranks(self, 2, body)
        self.assertIn("recv expected torch.float32 [2] but rank 0 sent torch.float32 [3]", results[1])


class RankChecksTest(unittest.TestCase):
    """Out-of-range ranks raise at once; ranks that disagree on a root or an
    op are a mismatch naming every rank's value (issue 12, item 7)."""

    def raises_at_once(self, fn, error, fragment):
        def body(rank, n):
            start = time.monotonic()
            try:
                fn(rank, n)
            except error as e:
                return str(e), time.monotonic() - start
            return None, time.monotonic() - start

        for message, took in on_ranks(self, 2, body):
            self.assertIsNotNone(message, f"expected {error.__name__}")
            self.assertIn(fragment, message)
            self.assertLess(took, 5)

    def test_recv_from_a_rank_out_of_range(self):
        self.raises_at_once(lambda rank, n: dist.recv(torch.zeros(1), src=5), ValueError,
                            "recv: src=5 is not a rank of group")
        self.raises_at_once(lambda rank, n: dist.recv(torch.zeros(1), src=5), ValueError, "(valid: 0 to 1)")

    def test_send_to_a_rank_out_of_range(self):
        self.raises_at_once(lambda rank, n: dist.send(torch.zeros(1), dst=2), ValueError,
                            "send: dst=2 is not a rank of group")

    def test_roots_out_of_range(self):
        for call, fragment in (
            (lambda rank, n: dist.broadcast(torch.zeros(1), src=7), "broadcast: src=7 is not a rank"),
            (lambda rank, n: dist.reduce(torch.zeros(1), dst=-1), "reduce: dst=-1 is not a rank"),
            (lambda rank, n: dist.gather(torch.zeros(1), None, dst=3), "gather: dst=3 is not a rank"),
            (lambda rank, n: dist.scatter(torch.zeros(1), None, src=9), "scatter: src=9 is not a rank"),
        ):
            with self.subTest(fragment):
                self.raises_at_once(call, ValueError, fragment)

    def test_ranks_passing_different_sources(self):
        self.raises_at_once(lambda rank, n: dist.broadcast(torch.zeros(1), src=rank), CollectiveMismatch,
                            "broadcast #1 on group 0: ranks pass different src (disttest): "
                            "rank 0 passed src=0; rank 1 passed src=1")

    def test_ranks_passing_different_ops(self):
        self.raises_at_once(lambda rank, n: dist.all_reduce(torch.ones(1), op=(R.SUM, R.MAX)[rank]),
                            CollectiveMismatch, "rank 0 passed op=SUM; rank 1 passed op=MAX")
        self.raises_at_once(lambda rank, n: dist.reduce(torch.ones(1), dst=0, op=(R.MIN, R.MAX)[rank]),
                            CollectiveMismatch, "rank 0 passed op=MIN; rank 1 passed op=MAX")
        self.raises_at_once(
            lambda rank, n: dist.all_reduce(torch.ones(1), op=dist._make_nccl_premul_sum(1.0 + rank)),
            CollectiveMismatch, "rank 0 passed op=PREMUL_SUM(1.0); rank 1 passed op=PREMUL_SUM(2.0)")

    def test_split_sizes_in_every_form_torch_takes(self):
        forms = ([1, 3], (1, 3), torch.tensor([1, 3]), torch.tensor([1, 3], dtype=torch.int32))

        def fn(rank, n):
            got = []
            for form in forms:
                out = torch.zeros(2 if rank == 0 else 6)
                # every rank sends 1 element to rank 0 and 3 to rank 1
                dist.all_to_all_single(out, torch.arange(4.0) + 10 * rank,
                                       [1, 1] if rank == 0 else [3, 3], form)
                got.append(out)
            even = torch.zeros(4)
            dist.all_to_all_single(even, torch.arange(4.0) + 10 * rank, None, None)
            return got, even

        results = on_ranks(self, 2, fn)
        for got in results[0][0]:
            self.assertEqual(got.tolist(), [0.0, 10.0])
        for got in results[1][0]:
            self.assertEqual(got.tolist(), [1.0, 2.0, 3.0, 11.0, 12.0, 13.0])
        self.assertEqual(results[0][1].tolist(), [0.0, 1.0, 10.0, 11.0])

    def test_split_sizes_as_a_float_tensor(self):
        self.raises_at_once(
            lambda rank, n: dist.all_to_all_single(torch.zeros(2), torch.zeros(2), None, torch.tensor([1.0, 1.0])),
            ValueError, "split sizes must be a 1-D integer tensor, got torch.float32 [2]")


class GroupTimeoutTest(unittest.TestCase):
    """A Work waits no longer than its group's timeout, then says who is missing."""

    def test_missing_peer(self):
        def fn(rank, n):
            group = dist.new_group([0, 1], timeout=timedelta(seconds=0.5))
            outcome = None
            if rank == 0:
                start = time.monotonic()
                try:
                    dist.all_reduce(torch.ones(1), group=group)
                except disttest.pg.threaded.CollectiveTimeout as e:
                    outcome = (str(e), e.timeout, time.monotonic() - start)
                try:
                    dist.recv(torch.ones(1), 1, group=group)
                except disttest.pg.threaded.CollectiveTimeout as e:
                    outcome += (str(e),)
            dist.all_reduce(torch.ones(1))  # the others wait here, not finished
            return outcome

        message, limit, took, recv_message = on_ranks(self, 3, fn)[0]
        self.assertEqual(limit, 0.5)
        self.assertGreaterEqual(took, 0.5)
        self.assertLess(took, 5)
        self.assertIn("all_reduce on group", message)
        self.assertIn("did not complete within 0.5s, the group's timeout (disttest): "
                      "collective #1: rank 1 of the group never called it", message)
        self.assertIn("recv on group", recv_message)
        self.assertIn("no send from rank 1 with tag 0 arrived", recv_message)

    def test_a_wait_with_its_own_timeout_names_it(self):
        def fn(rank, n):
            group = dist.new_group([0, 1])  # no timeout of its own
            outcome = None
            if rank == 0:
                work = dist.all_reduce(torch.ones(1), group=group, async_op=True)
                try:
                    work.wait(timeout=timedelta(seconds=0.3))
                except disttest.pg.threaded.CollectiveTimeout as e:
                    outcome = (str(e), e.timeout)
            dist.all_reduce(torch.ones(1))  # the others wait here, not finished
            return outcome

        message, limit = on_ranks(self, 3, fn)[0]
        self.assertEqual(limit, 0.3)
        self.assertIn("did not complete within 0.3s, the timeout passed to wait() (disttest): ", message)


class WorldTest(unittest.TestCase):
    def test_abort_releases_waiting_ranks(self):
        world = install_threaded_pg()
        self.addCleanup(disttest._uninstall_threaded_pg)
        errors = []

        def rank0():
            from disttest.pg.threaded import _bind_thread

            _bind_thread(world)
            dist.init_process_group("threaded", rank=0, world_size=2, store=world.store)
            try:
                dist.all_reduce(torch.ones(1))
            except CollectiveAborted as e:
                errors.append(e)
            finally:
                dist.destroy_process_group()

        t = threading.Thread(target=rank0)
        t.start()
        time.sleep(0.2)
        start = time.monotonic()
        world.abort("rank 1 raised ValueError")
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - start, 1)
        self.assertEqual(errors[0].reason, "rank 1 raised ValueError")
        self.assertIn("released by disttest: rank 1 raised ValueError", str(errors[0]))

    def test_install_is_undone(self):
        before = disttest._compat.c10d_world()
        disttest._install_threaded_pg()
        self.assertIsNot(disttest._compat.c10d_world(), before)
        disttest._uninstall_threaded_pg()
        self.assertIs(disttest._compat.c10d_world(), before)
        self.assertFalse(dist.is_initialized())

    def test_upstream_s_install_returns_c10d_s_world_as_upstream_s(self):
        # Upstream's harness keeps it to ask whether its world is still the
        # installed one (world == c10d._world), and destroys its group only then.
        from torch.distributed import distributed_c10d

        self.assertTrue(torch.autograd.is_multithreading_enabled())
        self.addCleanup(torch.autograd.set_multithreading_enabled, True)
        before = distributed_c10d._world
        world = disttest._install_threaded_pg()
        try:
            self.assertIs(world, distributed_c10d._world)
            self.assertIsNot(world, before)
            self.assertFalse(torch.autograd.is_multithreading_enabled())  # upstream's does it too
        finally:
            disttest._uninstall_threaded_pg()
        self.assertIs(distributed_c10d._world, before)
        self.assertTrue(torch.autograd.is_multithreading_enabled())

    def test_a_group_made_in_the_installing_thread_is_undone_there(self):
        # The group turns autograd's device threads off in the thread that
        # makes it; the uninstall puts this thread's flag back.
        self.assertTrue(torch.autograd.is_multithreading_enabled())
        self.addCleanup(torch.autograd.set_multithreading_enabled, True)
        world = install_threaded_pg()
        try:
            from disttest.pg.threaded import _bind_thread

            _bind_thread(world)
            dist.init_process_group("threaded", rank=0, world_size=1, store=world.store)
            self.assertFalse(torch.autograd.is_multithreading_enabled())
            dist.destroy_process_group()
        finally:
            _bind_thread(None)
            disttest._uninstall_threaded_pg()
        self.assertTrue(torch.autograd.is_multithreading_enabled())

    def test_a_thread_stuck_in_c_does_not_keep_the_process_alive(self):
        code = textwrap.dedent("""
            import time, unittest, torch.distributed as dist
            import disttest

            class T(unittest.TestCase):
                @disttest.spawn_threads_and_init_comms(world_size=2, timeout=1)
                def test_stuck(self):
                    if dist.get_rank() == 1:
                        time.sleep(3600)
                    dist.barrier()

            unittest.main()
        """)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertLess(time.monotonic() - start, 60)
        self.assertIn("rank 1/2 did not finish 'test_stuck' within 1s", proc.stderr)
        self.assertIn("could not be stopped", proc.stderr)
        self.assertIn("FAILED (failures=1)", proc.stderr)
