"""Fake comms: a world without peers, in one process."""

from __future__ import annotations

import sys
import unittest

import torch
import torch.distributed as dist
from torch import nn

import disttest
from disttest import (
    AlreadyInitialized,
    MockProcessGroup,
    mock_init_dist,
    with_dist,
    with_fake_comms,
)

R = dist.ReduceOp


class QueriesTest(unittest.TestCase):
    @with_fake_comms(rank=3, world_size=8)
    def test_rank_and_world_size(self):
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (3, 8))
        self.assertIsInstance(dist.group.WORLD, MockProcessGroup)
        self.assertEqual(dist.get_backend(), "mock_process_group")

    def test_decorates_plain_functions_and_returns_their_value(self):
        @with_fake_comms(world_size=4)
        def sizes():
            return dist.get_world_size()

        self.assertEqual(sizes(), 4)
        self.assertFalse(dist.is_initialized())

    def test_an_async_function_runs_in_the_fake_world_while_awaited(self):
        import asyncio

        @with_fake_comms(rank=1, world_size=4)
        async def sizes():
            await asyncio.sleep(0)
            return dist.get_rank(), dist.get_world_size()

        self.assertEqual(asyncio.run(sizes()), (1, 4))
        self.assertFalse(dist.is_initialized())

    def test_bare_decorator(self):
        @with_fake_comms
        def size():
            return dist.get_world_size()

        self.assertEqual(size(), 2)

    def test_a_test_case_class_runs_each_test_in_a_fake_world(self):
        # (the class became a function: its tests vanished and the run said OK)
        @with_fake_comms(rank=1, world_size=4)
        class Whole(unittest.TestCase):
            def test_size(self):
                self.assertEqual((dist.get_rank(), dist.get_world_size()), (1, 4))

            def test_wrong(self):
                self.assertEqual(dist.get_world_size(), 3)

        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Whole).run(result)
        self.assertEqual((result.testsRun, len(result.failures), len(result.errors)), (2, 1, 0))
        self.assertIn("4 != 3", result.failures[0][1])
        self.assertFalse(dist.is_initialized())

    def test_a_test_case_class_runs_its_inherited_tests_in_a_fake_world(self):
        # (a mixin's test ran in no world: "Default process group has not been initialized")
        class Mixin:
            def test_inherited(self):
                self.assertEqual((dist.get_rank(), dist.get_world_size()), (2, 8))

        @with_fake_comms(rank=2, world_size=8)
        class Base(unittest.TestCase):
            def test_own(self):
                self.assertEqual(dist.get_world_size(), 8)

        @with_fake_comms(rank=2, world_size=8)
        class Both(Mixin, Base):  # (Base's test, wrapped already, is not put in a second world)
            pass

        for cls, count in ((Both, 2), (Base, 1)):
            result = unittest.TestResult()
            unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
            self.assertEqual((result.testsRun, result.failures, result.errors), (count, [], []))
        self.assertFalse(hasattr(Mixin.test_inherited, "__wrapped__"))  # the mixin itself is left alone
        self.assertFalse(dist.is_initialized())

    def test_monitored_barrier_is_refused_as_c10d_refuses_it(self):
        # (torch 2.14: an INTERNAL ASSERT, "getBackendName is not implemented",
        # from the placeholder C++ backend a Python group registers)
        with disttest.with_dist(rank=1, world_size=4):
            with self.assertRaisesRegex((ValueError, RuntimeError), "only .*GLOO") as caught:
                dist.monitored_barrier()
        self.assertNotIn("INTERNAL ASSERT", str(caught.exception))

    def test_a_generator_runs_in_the_fake_world_while_iterated(self):
        @with_fake_comms(world_size=4)
        def sizes():
            yield dist.get_world_size()
            yield dist.is_initialized()

        self.assertEqual(list(sizes()), [4, True])
        self.assertFalse(dist.is_initialized())

    def test_bad_arguments_to_the_decorator_are_named_when_it_decorates(self):
        with self.assertRaisesRegex(disttest.ConfigError, r"from with_fake_comms\(world_size=...\)"):
            with_fake_comms(world_size=0)
        with self.assertRaisesRegex(disttest.ConfigError, r"from with_fake_comms\(rank=...\)"):
            with_fake_comms(lambda: None, rank=4, world_size=4)
        with self.assertRaises(TypeError) as caught:
            with_fake_comms(4)  # (the size given by position: 'int' object is not callable, at import)
        self.assertEqual(str(caught.exception), disttest.pg.fake.NOT_DECORATABLE.format(what="4"))

    def test_bad_arguments_are_named(self):
        with self.assertRaisesRegex(disttest.ConfigError, r"mock_init_dist\(world_size=...\)"):
            mock_init_dist(0, 0)
        with self.assertRaisesRegex(disttest.ConfigError, r"mock_init_dist\(rank=...\)"):
            mock_init_dist(5, 4)
        with self.assertRaisesRegex(disttest.ConfigError, r"Invalid rank True from mock_init_dist\(rank=...\)"):
            mock_init_dist(True, 2)


class CollectivesTest(unittest.TestCase):
    @with_fake_comms(rank=1, world_size=4)
    def test_every_collective_completes_with_the_right_shapes(self):
        n, me = 4, 1
        t = torch.arange(3.0) + 1
        for op, expected in ((R.SUM, t * n), (R.AVG, t), (R.MAX, t), (R.PRODUCT, t ** n)):
            x = t.clone()
            dist.all_reduce(x, op=op)
            torch.testing.assert_close(x, expected)
        x = t.clone()
        dist.broadcast(x, src=0)
        torch.testing.assert_close(x, t)
        outs = [torch.zeros(3) for _ in range(n)]
        dist.all_gather(outs, t)
        torch.testing.assert_close(outs, [t] * n)
        out = torch.zeros(3)
        dist.reduce_scatter(out, [t + i for i in range(n)])
        torch.testing.assert_close(out, (t + me) * n)
        a2a = [torch.zeros(2) for _ in range(n)]
        dist.all_to_all(a2a, [torch.full((2,), float(i)) for i in range(n)])
        torch.testing.assert_close(a2a, [torch.full((2,), float(me))] * n)
        single = torch.zeros(n)
        dist.all_to_all_single(single, torch.arange(float(n)))
        torch.testing.assert_close(single, torch.full((n,), float(me)))
        scattered = torch.zeros(2)
        dist.scatter(scattered, [torch.full((2,), float(i)) for i in range(n)], src=me)
        torch.testing.assert_close(scattered, torch.full((2,), float(me)))
        gathered = [torch.zeros(3) for _ in range(n)]
        dist.gather(t, gathered, dst=me)
        torch.testing.assert_close(gathered, [t] * n)
        dist.barrier()
        dist.send(t, dst=2)
        got = torch.zeros(3)
        self.assertEqual(dist.recv(got, src=0), 0)
        work = dist.all_reduce(torch.ones(2), async_op=True)
        work.wait()
        self.assertTrue(work.is_completed())
        torch.testing.assert_close(work.get_future().value()[0], torch.full((2,), 4.0))

    @disttest.requires_torch_feature("dist.all_gather_single")
    @disttest.requires_torch_feature("dist.reduce_scatter_single")
    @with_fake_comms(rank=1, world_size=4)
    def test_single_tensor_forms(self):
        n, t = 4, torch.arange(3.0) + 1
        flat = torch.zeros(3 * n)
        dist.all_gather_single(flat, t)
        torch.testing.assert_close(flat, t.repeat(n))
        small = torch.zeros(2)
        dist.reduce_scatter_single(small, torch.arange(8.0))
        torch.testing.assert_close(small, torch.tensor([2.0, 3.0]) * n)

    @with_fake_comms(rank=0, world_size=2)
    def test_batch_isend_irecv(self):
        # torch 2.14 asks the group for its CPU backend here (coalescing check).
        got = torch.zeros(2)
        ops = [dist.P2POp(dist.isend, torch.ones(2), 1), dist.P2POp(dist.irecv, got, 1)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.assertEqual(got.shape, (2,))

    @with_fake_comms(rank=2, world_size=4)
    def test_object_collectives(self):
        objs = [None] * 4
        dist.all_gather_object(objs, {"me": 2})
        self.assertEqual(objs, [{"me": 2}] * 4)
        box = ["mine", 1]
        dist.broadcast_object_list(box, src=0)  # data from rank 0: none here
        self.assertEqual(box, ["mine", 1])
        dist.broadcast_object_list(box, src=2)
        self.assertEqual(box, ["mine", 1])
        at_root = [None] * 4
        dist.gather_object("x", at_root, dst=2)
        self.assertEqual(at_root, ["x"] * 4)
        out = [None]
        dist.scatter_object_list(out, ["a", "b", "c", "d"], src=2)
        self.assertEqual(out, ["c"])
        kept = ["before"]
        dist.scatter_object_list(kept, None, src=0)
        self.assertEqual(kept, ["before"])
        # with the source left to its default (rank 0), as torch reads it
        dist.broadcast_object_list(box)
        self.assertEqual(box, ["mine", 1])
        dist.scatter_object_list(kept, None)
        self.assertEqual(kept, ["before"])

    @with_fake_comms(rank=2, world_size=4)
    def test_object_collectives_on_a_subgroup_by_group_src(self):
        # (group_src is a rank of the group; it was compared with the global
        # rank: this rank's own scatter was dropped, another's unpickled garbage)
        g = dist.new_group([0, 2, 3])  # global 2 is the group's rank 1
        out = [None]
        dist.scatter_object_list(out, ["a", "b", "c"], group_src=1, group=g)
        self.assertEqual(out, ["b"])
        box = ["keep"]
        dist.broadcast_object_list(box, group_src=2, group=g)  # (global 3: no data here)
        self.assertEqual(box, ["keep"])
        dist.broadcast_object_list(box, src=3, group=g)
        self.assertEqual(box, ["keep"])

    def test_a_group_the_block_made_in_place_of_the_fake_one_is_destroyed(self):
        with disttest.with_dist(0, 1):
            dist.destroy_process_group()
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.assertFalse(dist.is_initialized())

    @with_fake_comms(rank=0, world_size=8)
    def test_ddp_in_a_fake_world_of_eight(self):
        model = nn.parallel.DistributedDataParallel(disttest.Net())
        loss = model(torch.randn(4, 2)).sum()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        self.assertTrue(grads and all(g is not None for g in grads))

    @with_fake_comms(world_size=2)
    def test_subgroups(self):
        g = dist.new_group([0, 1])
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        self.assertEqual(t.item(), 2.0)


class InvalidCallsTest(unittest.TestCase):
    """What gloo refuses, fake comms refuse too (they filled what fitted and went on)."""

    @with_fake_comms(rank=1, world_size=4)
    def test_lists_sizes_and_ranks_that_do_not_fit_the_world(self):
        t = torch.ones(2)
        calls = {
            "all_gather": lambda: dist.all_gather([torch.zeros(2) for _ in range(3)], t),
            "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(3)]),
            "all_to_all": lambda: dist.all_to_all([torch.zeros(2)] * 3, [torch.ones(2)] * 3),
            "scatter": lambda: dist.scatter(torch.zeros(2), [torch.ones(2)] * 2, src=1),
            "gather": lambda: dist.gather(t, [torch.zeros(2)] * 2, dst=1),
            "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(7)),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(7), t),
            "broadcast": lambda: dist.broadcast(t, src=9),
            "send": lambda: dist.send(t, dst=7),
        }
        for name, call in calls.items():
            with self.subTest(name), self.assertRaisesRegex(RuntimeError, rf"^{name}: .*\(disttest\)$"):
                call()
        with self.assertRaisesRegex(ValueError, "all_gather: tensor_list holds 3 tensor"):
            calls["all_gather"]()  # (a ValueError too, as the fake group's own refusals are)

    @with_fake_comms(rank=1, world_size=2)
    def test_dtypes_shapes_and_ops_that_gloo_refuses(self):
        # (each passed in silence: cast, reshaped, skipped, or left as zeros; gloo and the threaded group refuse them)
        calls = {
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(4, dtype=torch.int32),
                                                                          torch.ones(2)),
            "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(2, dtype=torch.int32),
                                                                        torch.ones(4)),
            "all_to_all": lambda: dist.all_to_all([torch.zeros(3, 2)] * 2, [torch.ones(2, 3)] * 2),
            "all_reduce": lambda: dist.all_reduce(torch.ones(2), op=R.BAND),
            "all_to_all_single": lambda: dist.all_to_all_single(torch.zeros(5), torch.arange(5.0), [2, 3], [3, 2]),
            "gather": lambda: dist.gather(torch.ones(2), [torch.zeros(3)] * 2, dst=1),
            "scatter": lambda: dist.scatter(torch.zeros(2), [torch.ones(3)] * 2, src=1),
            "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(2), [torch.ones(3)] * 2),
            "reduce": lambda: dist.reduce(torch.ones(2, dtype=torch.int64), dst=0, op=R.AVG),
            "all_gather": lambda: dist.all_gather([torch.zeros(3, 2)] * 2, torch.ones(2, 3)),
        }
        for name, call in calls.items():
            with self.subTest(name), self.assertRaisesRegex(RuntimeError, rf"^{name}: .*\(disttest\)$"):
                call()

    @with_fake_comms(rank=0, world_size=1)
    def test_a_receive_from_any_rank_in_a_world_of_one(self):
        # (it reported rank 1, which does not exist, as the sender)
        with self.assertRaisesRegex(RuntimeError, "no other rank could send it"):
            dist.recv(torch.zeros(1))


class SplitSizesTest(unittest.TestCase):
    @with_fake_comms(rank=1, world_size=2)
    def test_split_sizes_in_every_form_torch_takes(self):
        # rank 1's own piece (input split 1 of [1, 3]) lands in every slot of its size
        forms = (list, tuple, torch.tensor, lambda sizes: torch.tensor(sizes, dtype=torch.int32))
        for form in forms:
            with self.subTest(form=form):
                out = torch.zeros(6)
                dist.all_to_all_single(out, torch.arange(4.0), form([3, 3]), form([1, 3]))
                self.assertEqual(out.tolist(), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0])


class LifecycleTest(unittest.TestCase):
    def test_group_destroyed_when_the_body_raises(self):
        with self.assertRaises(ValueError), with_dist(rank=0, world_size=2):
            self.assertTrue(dist.is_initialized())
            raise ValueError("body fails")
        self.assertFalse(dist.is_initialized())

    def test_refuses_to_nest_with_a_clear_message(self):
        with with_dist(world_size=2):
            with self.assertRaises(AlreadyInitialized) as ctx, with_dist(world_size=4):
                pass
            # (an AssertionError too, as upstream's mock_init_dist raised)
            with self.assertRaises(AssertionError), with_dist(world_size=4):
                pass
            self.assertIn("a process group already exists (backend 'mock_process_group', rank 0 of 2)",
                          str(ctx.exception))
            self.assertTrue(dist.is_initialized())  # the outer world is untouched
        self.assertFalse(dist.is_initialized())

    def test_an_existing_real_group_is_a_clear_error(self):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            with self.assertRaisesRegex(AlreadyInitialized, "backend 'gloo', rank 0 of 1"):
                mock_init_dist(0, 2)
        finally:
            dist.destroy_process_group()

    def test_torch_fake_backend_and_fake_store(self):
        disttest.register_fake_backend()
        dist.init_process_group("fake", store=disttest.FakeStore(), rank=1, world_size=4)
        try:
            self.assertEqual(dist.get_world_size(), 4)
        finally:
            dist.destroy_process_group()
        store = disttest.FakeStore()
        store.set("k", "v")
        self.assertEqual(store.get("k"), b"v")

    def test_c10d_init_barrier_passes_at_once_and_a_failed_init_leaves_nothing(self):
        # (TORCH_DIST_INIT_BARRIER=1: each world waited 30 s for ranks that do
        # not exist, failed, and left its group to refuse every later world)
        import threading
        import time
        from unittest import mock

        from torch.distributed import distributed_c10d as c10d

        barrier = c10d._store_based_barrier
        with mock.patch.dict("os.environ", {"TORCH_DIST_INIT_BARRIER": "1"}):
            start = time.monotonic()
            with with_dist(rank=1, world_size=4):
                dist.new_group([0, 1])
            self.assertLess(time.monotonic() - start, 5)
        self.assertIs(c10d._store_based_barrier, barrier)  # (put back)
        hooks = sys.excepthook, threading.excepthook
        with mock.patch.object(dist, "init_process_group", side_effect=self._half_made), \
                self.assertRaisesRegex(RuntimeError, "half made"), with_dist(world_size=2):
            pass
        self.assertFalse(dist.is_initialized())
        self.assertEqual((sys.excepthook, threading.excepthook), hooks)
        self.assertNotIn("mock_process_group", dist.Backend._plugins)

    @staticmethod
    def _half_made(**kwargs):
        from torch.distributed import distributed_c10d as c10d  # (dist's is the mock)

        c10d.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        raise RuntimeError("half made")

    def test_the_excepthook_is_put_back(self):
        # (c10d wraps it in each init_process_group: '[rank2]: [rank1]: [rank0]: ' after three
        # worlds, a RecursionError after 1500)
        hook = sys.excepthook
        for r in range(3):
            with_fake_comms(rank=r, world_size=4)(lambda: None)()
        self.assertIs(sys.excepthook, hook)

    def test_worlds_in_two_rank_threads_at_once(self):
        # (the first world to end removed the backend and wrappers under the
        # other: EOFError in its broadcast_object_list)
        import threading
        import time

        inside, ended = threading.Event(), threading.Event()

        @disttest.spawn_threads_and_init_comms(world_size=2)
        def ranks():
            me = dist.get_rank()
            dist.destroy_process_group()  # (each rank thread has a default group of its own)
            if me == 1:
                self.assertTrue(inside.wait(10))
            with with_dist(rank=me, world_size=4):
                if me == 0:
                    inside.set()
                    time.sleep(0.2)
                else:
                    self.assertTrue(ended.wait(10))  # (rank 0's world has ended)
                    box = ["mine"]
                    dist.broadcast_object_list(box, src=0)
                    self.assertEqual(box, ["mine"])
            if me == 0:
                ended.set()

        ranks()
        self.assertNotIn("mock_process_group", dist.Backend._plugins)

    def test_a_fake_world_larger_than_the_largest_started_one(self):
        # (no rank starts: only c10d's 32-bit rank limits it, as upstream's)
        with with_dist(rank=70_000, world_size=131_072):
            self.assertEqual(dist.get_world_size(), 131_072)

    def test_a_group_of_a_rank_outside_its_world_is_refused(self):
        with self.assertRaisesRegex(disttest.ConfigError, r"Invalid rank 3 from MockProcessGroup\(rank=...\)"):
            MockProcessGroup(3, 2)
        with self.assertRaisesRegex(disttest.ConfigError, r"from MockProcessGroup\(world_size=...\)"):
            disttest.create_mock_pg(None, 0, 0, None)

    def test_upstream_creator_signature(self):
        from datetime import timedelta

        pg = disttest.create_mock_pg(None, 1, 3, timedelta(seconds=1))
        self.assertEqual((pg.rank(), pg.size(), pg.getBackendName()), (1, 3, "mock_process_group"))
