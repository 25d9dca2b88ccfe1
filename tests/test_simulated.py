"""disttest.SimulatedTestCase: worlds of thousands of ranks in the test's
thread (issue 26), and the speedups it installs for a test's duration, each
proved against torch's own code (same local values, ints and RNG streams per
rank) and shown to be in effect."""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import time
import unittest
import warnings
from unittest import mock

import simulated_cases as cases
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import disttest
from disttest import _compat
from disttest.bases import simulated
from disttest.bases.dtensor import map_local_tensor_for_rank

lt = _compat.local_tensor()
needs_mode = unittest.skipIf(lt is None, "this torch has no LocalTensorMode")
ALL = _compat.LOCAL_TENSOR_SPEEDUPS


def run(cls: type, *names: str) -> unittest.TestResult:
    result = unittest.TestResult()
    loader = unittest.defaultTestLoader
    suite = unittest.TestSuite([cls(n) for n in names]) if names else loader.loadTestsFromTestCase(cls)
    suite.run(result)
    return result


def problems(result: unittest.TestResult) -> list[str]:
    return [text for _, text in result.errors + result.failures]


def per_rank(value):
    """``value`` as plain data: {rank: tensor} for a LocalTensor, {rank: int}
    for a per-rank int, a list for a list; call with the mode disabled."""
    if isinstance(value, (list, tuple)):
        return [per_rank(v) for v in value]
    shards = _compat.local_tensor_shards(value)
    if shards is not None:
        return {r: t.clone() for r, t in shards.items()}
    ints = _compat.local_int_values(value)
    if ints is not None:
        return list(ints.items())  # in order: upstream's dicts keep the ranks' order
    return value.clone() if isinstance(value, torch.Tensor) else value


def workload(case) -> dict:
    """What a simulated test does, with the RNG in every role: distribute,
    redistribute (uneven shards), full_tensor, submesh and flattened-mesh
    coordinates, views, in-place ops, split, random ops on the ranks' shared
    and per-rank streams, a per-rank Python function that draws random
    numbers, and ops LocalTensor dispatches itself (a nested mode)."""
    out = {}
    mesh = case.mesh(2, 3, 2, names=("a", "b", "c"))
    x = torch.arange(35.0).reshape(7, 5)
    d = distribute_tensor(x, mesh, [Shard(0), Shard(1), Replicate()])
    moved = d.redistribute(mesh, [Replicate(), Shard(0), Shard(1)])
    out["distributed"], out["redistributed"], out["full"] = d.to_local(), moved.to_local(), moved.full_tensor()
    # NB: submeshes held: upstream caches coordinates by id(), and a dead
    # mesh's id may be reused (see test_a_cached_mesh_outlives_its_last_use)
    sub_b, sub_ac, flat_ab = mesh["b"], mesh["a", "c"], mesh["a", "b"]._flatten()
    out["local_rank_b"] = sub_b.get_local_rank()
    out["coordinate_ac"] = sub_ac.get_coordinate()
    out["local_rank_flat"] = flat_ab.get_local_rank()
    out["noise"] = torch.rand(3)  # every rank from the same state
    torch.manual_seed(case.rank * 3 + 1)  # per-rank streams from here
    out["seeded"] = torch.randn(2)
    local = moved.to_local().clone()
    local.view(-1)[:2].add_(1.0)
    out["viewed"] = local
    out["split"] = list(torch.split(local, 1))
    out["dropout"] = torch.nn.functional.dropout(torch.ones(4, 4) + case.rank, p=0.5)
    out["per_rank_fn"] = map_local_tensor_for_rank(local, case.rank, lambda t, r: t * r + torch.rand(1))
    out["ints"] = case.rank * 3 + 1
    # ranks whose shards share a shape but not strides
    out["strides"] = list(case.mode.rank_map(lambda r: torch.zeros(2, 3) if r % 2 else torch.zeros(3, 2).t()).stride())
    # metadata asked of a LocalTensor whose ranks differ: offsets, sizes, counts
    ragged = case.mode.rank_map(lambda r: torch.arange(8.0)[r % 3:r % 3 + 2 + r % 2])
    out["offset"], out["size"], out["numel"] = ragged.storage_offset(), list(ragged.size()), ragged.numel()
    # upstream leaves the generator at the last rank's state after every op,
    # also one that draws nothing: a draw outside the mode sees that
    with case.mode.disable():
        torch.rand(5)
    local * 2
    with case.mode.disable():
        out["outside"] = torch.rand(2)
        torch.rand(5)
    ragged.stride()  # (a metadata op, too)
    with case.mode.disable():
        out["outside_metadata"] = torch.rand(2)
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # LocalTensor's own dispatch enters a mode per op
        out["nested_random"] = torch.rand_like(local)
        out["nested_add"] = local + 1
    out["after"] = torch.randn(3)
    with case.mode.disable():
        result = {k: per_rank(v) for k, v in out.items()}
        result["rng_states"] = {r: s[0].clone() for r, s in case.mode._per_rank_rng_states.items()}
        result["global_rng"] = torch.get_rng_state()
    return result


def run_workload(speedups: tuple[str, ...], world_size: int = 12) -> dict:
    found: dict = {}

    class Workload(disttest.SimulatedTestCase):
        def test_it(self):
            found.update(workload(self))

    Workload.world_size, Workload.speedups = world_size, speedups
    result = run(Workload)
    if not result.wasSuccessful():
        raise AssertionError(problems(result))
    return found


@needs_mode
class SpeedupsGiveUpstreamsResultsTest(unittest.TestCase):
    """Each part alone, and all together, against torch's own code."""

    upstream: dict

    @classmethod
    def setUpClass(cls):
        cls.upstream = run_workload(())

    def check(self, parts):
        got = run_workload(parts)
        self.assertEqual(sorted(got), sorted(self.upstream))
        for key in self.upstream:
            with self.subTest(parts=parts, key=key):
                disttest.assert_equal(got[key], self.upstream[key], rtol=0, atol=0)

    def test_every_part_alone(self):
        for part in ALL:
            self.check((part,))

    def test_all_parts(self):
        self.check(ALL)

    def test_the_workload_sees_per_rank_values(self):
        # a check that could not tell ranks apart would prove nothing
        seeded = self.upstream["seeded"]
        self.assertEqual(len(seeded), 12)
        self.assertFalse(torch.equal(seeded[0], seeded[1]))
        self.assertEqual(len({tuple(t.shape) for t in self.upstream["redistributed"].values()}), 4)
        self.assertNotEqual(self.upstream["local_rank_b"][:3], [(0, 0), (1, 0), (2, 0)])


@needs_mode
class PartsAgainstUpstreamHelpersTest(unittest.TestCase):
    """The replaced helpers called directly, on the inputs the workload
    rarely makes."""

    def test_meta_gives_upstreams_result_and_errors(self):
        upstream = lt._compute_local_tensor_meta
        meta = _compat._one_pass_tensor_meta(upstream)
        z = torch.zeros(2, 3)
        cases = {
            "same": {0: z, 1: z.clone(), 2: z.clone()},
            "strides differ": {0: z, 1: torch.zeros(3, 2).t(), 2: z.clone()},
            "shapes differ": {0: z, 1: torch.zeros(1, 3), 2: torch.zeros(2, 2)},
            "ndim differs": {0: z, 1: torch.zeros(6)},
            "dtype": {0: z, 1: z.double()},
            "conj": {0: z.cfloat(), 1: z.cfloat().conj()},
            "neg": {0: z.cfloat(), 1: z.cfloat()._neg_view()},
        }

        def outcome(fn, tensors):
            try:
                shape, strides, device, dtype, layout, keys = fn(tensors)
            except Exception as e:  # noqa: BLE001 (the error is the result)
                return type(e), str(e)
            return [per_rank(s) for s in shape], [per_rank(s) for s in strides], device, dtype, layout, keys

        for name, tensors in cases.items():
            with self.subTest(name):
                self.assertEqual(outcome(meta, tensors), outcome(upstream, tensors))
        self.assertIs(outcome(meta, cases["conj"])[0], AssertionError)

    def test_compiled_unflatten_rebuilds_what_pytree_does(self):
        import collections

        pair = collections.namedtuple("pair", "a b")
        trees = [
            ((1, [2, 3], torch.Size([4, 5])), {"a": 6, "b": None}),
            ((), {}),
            (([[1, [2]], (3,)],), {"k": pair(4, [5])}),
            ((collections.OrderedDict(x=1, y=(2, 3)), collections.deque([4])), {}),
        ]
        for tree in trees:
            leaves, spec = lt.pytree.tree_flatten(tree)
            marked = [("leaf", i) for i in range(len(leaves))]
            got = _compat._compile_unflatten(spec)(marked)
            want = spec.unflatten(marked)
            self.assertEqual(repr(got), repr(want))
            self.assertEqual(type(got), type(want))

    def test_dispatch_still_refuses_an_unknown_subclass(self):
        class Sub(torch.Tensor):
            pass

        seen = {}
        for speedups in ((), ("dispatch",)):
            class Refuse(disttest.SimulatedTestCase):
                world_size = 4

                def test_it(self):
                    with self.mode.disable():
                        s = torch.ones(2).as_subclass(Sub)
                        with self.assertRaises(TypeError) as caught:
                            torch.stack((s, s))
                        seen[self.speedups] = str(caught.exception).replace(hex(id(self.mode)), "mode")

            Refuse.speedups = speedups
            result = run(Refuse)
            self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(seen[("dispatch",)], seen[()])
        self.assertIn("Multiple dispatch failed", seen[()])


@needs_mode
class ClosedFormCoordinatesTest(unittest.TestCase):
    """``coordinates``: every rank's coordinate in one pass, equal to
    upstream's get_coordinate for meshes, submeshes and flattened meshes,
    built outside the mode and inside it (a LocalTensor rank map)."""

    def compare_on(self, world_size: int, shape: tuple[int, ...], inside: bool) -> None:
        upstream = lt._LocalDeviceMesh.__dict__["get_coordinate"].__func__
        compared = []

        class Meshes(disttest.SimulatedTestCase):
            def test_meshes(self):
                names = tuple("abc"[: len(shape)])
                if inside:
                    from torch.distributed.device_mesh import init_device_mesh

                    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
                else:
                    mesh = self.mesh(*shape, names=names)
                meshes = {"mesh": mesh, **{n: mesh[n] for n in names}}
                if len(names) > 1:
                    meshes["flat"] = mesh[names[:2]]._flatten()
                    meshes["pair"] = mesh[names[0], names[-1]]
                cache = self.mode._coordinate_cache
                for name, m in meshes.items():
                    cache.clear()
                    want = [per_rank(c) for c in upstream(m)]
                    upstream_keys = list(cache)
                    cache.clear()
                    got = [per_rank(c) for c in _compat._closed_form_coordinate(m)]
                    self.assertEqual(got, want, name)
                    self.assertEqual(list(cache), upstream_keys, name)  # keyed as the installed torch keys it
                    self.assertIs(_compat._closed_form_coordinate(m), cache[upstream_keys[0]])
                    compared.append(name)

        Meshes.world_size, Meshes.speedups = world_size, ()
        result = run(Meshes)
        self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertGreaterEqual(len(compared), 2)

    def test_equal_to_upstream(self):
        for world_size, shape, inside in [(216, (6, 6, 6), False), (24, (2, 3, 4), True), (36, (4, 9), False),
                                          (30, (30,), True), (60, (3, 4, 5), False)]:
            with self.subTest(shape=shape, inside=inside):
                self.compare_on(world_size, shape, inside)

    def test_a_cached_mesh_outlives_its_last_use(self):
        # torch 2.13 keys its cache by id() and lets the mesh die: a mesh made
        # later at the same address would get the dead one's coordinates
        # (2.14 keys it by value, and a mesh may die under both)
        import gc
        import weakref

        alive = {}
        for speedups in (("coordinates",), ()):
            class Temporary(disttest.SimulatedTestCase):
                world_size = 12

                def test_it(self):
                    mesh = self.mesh(2, 3, 2, names=("a", "b", "c"))
                    sub = mesh["a", "c"]
                    sub.get_coordinate()
                    ref = weakref.ref(sub)
                    del sub
                    gc.collect()
                    alive[self.speedups] = ref() is not None

            Temporary.speedups = speedups
            result = run(Temporary)
            self.assertTrue(result.wasSuccessful(), problems(result))
        by_id = not _compat._coordinates_cached_by_value()
        self.assertEqual(alive, {("coordinates",): by_id, (): False})

    def test_a_rank_outside_the_mesh_fails_as_upstream(self):
        upstream = lt._LocalDeviceMesh.__dict__["get_coordinate"].__func__
        raised = []

        class Outside(disttest.SimulatedTestCase):
            world_size = 8

            def test_it(self):
                from torch.distributed.device_mesh import DeviceMesh

                with self.mode.disable():
                    mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
                for fn in (upstream, _compat._closed_form_coordinate):
                    self.mode._coordinate_cache.clear()
                    with self.assertRaises(AssertionError):
                        fn(mesh)
                    raised.append(fn)

        result = run(Outside)
        self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(len(raised), 2)

    def test_the_layout_is_computed_once_not_once_per_rank(self):
        from torch.distributed._mesh_layout import _MeshLayout

        counted: list[int] = []
        for speedups in (("coordinates",), ()):
            class Count(disttest.SimulatedTestCase):
                world_size = 64

                def test_it(self):
                    mesh = self.mesh(4, 16)
                    real = _MeshLayout.remap_to_tensor
                    with mock.patch.object(_MeshLayout, "remap_to_tensor", autospec=True, side_effect=real) as spy:
                        mesh.get_coordinate()
                    counted.append(spy.call_count)

            Count.speedups = speedups
            result = run(Count)
            self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(counted, [1, 64])


@needs_mode
class EachPartIsInEffectTest(unittest.TestCase):
    """Each part changes what runs (counted calls, not seconds): without it,
    the upstream work per rank is back."""

    def count(self, part: str, target, name: str, action) -> dict[bool, int]:
        seen: list[int] = []
        for on in (True, False):
            class Count(disttest.SimulatedTestCase):
                world_size = 16

                def test_it(self):
                    t = self.mode.rank_map(lambda r: torch.full((2,), float(r)))
                    real = getattr(target, name)
                    with mock.patch.object(target, name, side_effect=real) as spy:
                        action(self, t)
                    seen.append(spy.call_count)

            Count.speedups = (part,) if on else ()
            result = run(Count)
            self.assertTrue(result.wasSuccessful(), problems(result))
        return {True: seen[0], False: seen[1]}

    def test_rng_restores_the_generator_once_per_op(self):
        counts = self.count("rng", lt, "_set_rng_state", lambda case, t: t + 1)
        self.assertEqual(counts, {True: 1, False: 16})

    def test_args_needs_no_unflatten_per_rank(self):
        counts = self.count("args", lt.pytree, "tree_unflatten", lambda case, t: t + 1)
        self.assertEqual(counts, {True: 0, False: 16})

    def test_meta_reads_the_extra_keys_once(self):
        counts = self.count("meta", lt, "_get_extra_dispatch_keys", lambda case, t: t + 1)
        self.assertEqual(counts, {True: 1, False: 16})

    def test_dispatch_flattens_no_plain_op(self):
        def per_rank_op(case, t):
            map_local_tensor_for_rank(t, case.rank, lambda x, r: x * 2)

        counts = self.count("dispatch", lt.pytree, "tree_flatten", per_rank_op)
        self.assertEqual(counts[False] - counts[True], 16)

    def test_metadata_asks_each_ranks_tensor_not_the_dispatcher(self):
        asked: list[int] = []
        real = torch.Tensor.stride

        def stride(t, *args):  # a function: it binds as the method does
            asked.append(1)
            return real(t, *args)

        counts = {}
        for on in (True, False):
            class Strides(disttest.SimulatedTestCase):
                world_size = 16
                speedups = ("metadata",) if on else ()

                def test_it(self, on=on):
                    t = self.mode.rank_map(lambda r: torch.zeros(2, 3 + r % 2))
                    asked.clear()
                    with mock.patch.object(torch.Tensor, "stride", stride):
                        self.assertEqual(per_rank(t.stride()[0]), [(r, 3 + r % 2) for r in range(16)])
                    counts[on] = len(asked)

            result = run(Strides)
            self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(counts[True] - counts[False], 16, counts)  # once per rank, only with the part

    def test_enter_shares_one_state_among_the_ranks(self):
        shared = {}

        class Enter(disttest.SimulatedTestCase):
            world_size = 16

            def test_it(self):
                states = self.mode._per_rank_rng_states.values()
                shared[self.speedups] = len({id(s[0]) for s in states})

        for speedups in (("enter",), ()):
            Enter.speedups = speedups
            result = run(Enter)
            self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(shared, {("enter",): 1, (): 16})


@needs_mode
class InstallAndUndoTest(unittest.TestCase):
    def replaced(self):
        return (lt._LocalDeviceMesh.__dict__["get_coordinate"], lt._for_each_rank_run_func,
                lt._compute_local_tensor_meta, lt.LocalTensorMode.__dict__["__enter__"],
                lt.LocalTensorMode.__dict__["__torch_dispatch__"])

    def test_undo_puts_back_exactly_what_was_there(self):
        before = self.replaced()
        undo = _compat.install_local_tensor_speedups()
        during = self.replaced()
        self.assertTrue(all(a is not b for a, b in zip(before, during, strict=True)))
        undo()
        self.assertTrue(all(a is b for a, b in zip(before, self.replaced(), strict=True)))

    def test_every_part_matches_the_installed_torch(self):
        if not _compat.torch_version().startswith(("2.13", "2.14")):
            self.skipTest("the fingerprints are of torch 2.13's and 2.14's code; check the parts against this torch's")
        self.assertEqual(_compat.local_tensor_speedups_available(), ALL)

    def test_a_part_whose_upstream_code_changed_is_left_out(self):
        before = lt._compute_local_tensor_meta
        changed = dict(_compat._SPEEDUP_FINGERPRINTS, meta=frozenset({"0" * 16}))
        with mock.patch.object(_compat, "_SPEEDUP_FINGERPRINTS", changed):
            self.assertNotIn("meta", _compat.local_tensor_speedups_available())
            undo = _compat.install_local_tensor_speedups()
            self.assertIs(lt._compute_local_tensor_meta, before)
            undo()

    def test_an_unknown_part_is_named(self):
        with self.assertRaisesRegex(ValueError, r"unknown local-tensor speedup 'fast'"):
            _compat.install_local_tensor_speedups(("fast",))

    def test_a_mode_left_entered_fails_and_is_exited(self):
        class Leaves(disttest.SimulatedTestCase):
            world_size = 2

            def test_it(self):
                lt = _compat.local_tensor()
                lt.LocalTensorMode(frozenset(range(2))).__enter__()

        result = run(Leaves)
        self.assertEqual(len(result.failures), 1, problems(result))
        self.assertIn(simulated.MODES_LEFT.format(n=1, names="LocalTensorMode"), result.failures[0][1])
        self.assertEqual(_compat.dispatch_modes(), [])
        self.assertIsNone(_compat.local_tensor().local_tensor_mode())

    def test_a_test_leaves_torch_as_it_found_it(self):
        def state():
            return (self.replaced(), lt._combine_any_rank_results, dist.is_initialized(),
                    len(lt.get_local_tensor_mode_list()),
                    torch._C._len_torch_dispatch_stack(), sorted(_compat.registered_backend_names()),
                    {n: getattr(dist.DeviceMesh, n) for n in ("get_coordinate", "get_rank", "get_local_rank")})

        class Passes(disttest.SimulatedTestCase):
            def test_ok(self):
                self.assertEqual(torch.ones(2) * 2, torch.full((2,), 2.0))

            def test_fails(self):
                self.assertEqual(torch.ones(2), torch.zeros(2))

            def test_errors(self):
                raise RuntimeError("boom")

        before = state()
        result = run(Passes)
        self.assertEqual((result.testsRun, len(result.failures), len(result.errors)), (3, 1, 1))
        self.assertEqual(state(), before)

        class Interrupted(disttest.SimulatedTestCase):  # unittest runs no cleanups on Ctrl-C
            def test_it(self):
                raise KeyboardInterrupt

        with self.assertRaises(KeyboardInterrupt):
            Interrupted("test_it").run(unittest.TestResult())
        self.assertEqual(state(), before)


@needs_mode
class PlainTensorsWithTheRankTest(unittest.TestCase):
    """``torch.tensor(...)`` makes a plain tensor in a simulated test; with
    ``self.rank`` torch ran the op once on a placeholder of the per-rank int
    (7777777) and every rank got it: a check that is wrong on rank 0 passed."""

    def test_an_op_of_a_plain_tensor_and_the_rank_runs_per_rank(self):
        class Plain(disttest.SimulatedTestCase):
            world_size = 4

            def test_values(self):
                self.assertRanksEqual(torch.tensor([1.0]) * self.rank, lambda r: torch.tensor([float(r)]))
                self.assertRanksEqual(torch.tensor(1.0) + self.rank, lambda r: torch.tensor(1.0 + r))
                self.assertRanksEqual(torch.mul(torch.tensor([2.0]), self.rank), lambda r: torch.tensor([2.0 * r]))

            def test_wrong_on_rank_zero(self):
                self.assertGreater(torch.tensor(1.0) * self.rank, 0.5)

            def test_in_place(self):
                torch.tensor([1.0]).mul_(self.rank)

            def test_keyword(self):
                self.assertRanksEqual(torch.add(torch.tensor([1.0]), torch.tensor([1.0]), alpha=self.rank),
                                      lambda r: torch.tensor([1.0 + r]))

            def test_parameter(self):
                (torch.nn.Parameter(torch.tensor([1.0])) * self.rank).sum()

            def test_write_through_a_view(self):
                # (the write went to per-rank copies and reached no rank)
                t = torch.tensor([0.0, 0.0, 0.0, 0.0])
                t[self.rank] = 1.0

        result = run(Plain)
        errors = dict((t._testMethodName, text) for t, text in result.errors)
        self.assertEqual((result.testsRun, result.failures, sorted(errors)),
                         (6, [], ["test_in_place", "test_parameter", "test_write_through_a_view",
                                  "test_wrong_on_rank_zero"]))
        self.assertIn("RankSplit", errors["test_write_through_a_view"])
        self.assertIn("aten.mul.Tensor of a plain tensor (it requires grad) with a per-rank int", errors["test_parameter"])
        self.assertIn("their answers differ (rank 0: False; ranks 1, 2, 3: True)", errors["test_wrong_on_rank_zero"])
        self.assertIn("aten.mul_.Tensor of a plain tensor (in place: one tensor cannot hold every rank's result) "
                      "with a per-rank int", errors["test_in_place"])


@needs_mode
class ExpectedFunctionTest(unittest.TestCase):
    def test_a_simulated_value_it_returns_is_taken_rank_by_rank(self):
        # (a RankSplit error where the test should pass; torch's "please file
        # an issue" where it should fail)
        class Made(disttest.SimulatedTestCase):
            world_size = 4

            def test_equal(self):
                e = torch.ones(2) * self.rank
                self.assertRanksEqual(torch.ones(2) * self.rank, lambda r: e)

            def test_differs(self):
                e = torch.ones(2) * self.rank
                self.assertRanksEqual(self.mode.rank_map(lambda r: torch.ones(2) * r + (r == 3)), lambda r: e)

        result = run(Made)
        self.assertEqual((result.testsRun, result.errors, len(result.failures)), (2, [], 1), problems(result))
        self.assertIn("1 of the 4 ranks checked differ (disttest):", result.failures[0][1])
        self.assertIn("rank 3: got [4.0, 4.0] expected [3.0, 3.0]", result.failures[0][1])


@needs_mode
class SetUpInterruptedTest(unittest.TestCase):
    def test_what_set_up_did_before_an_interruption_is_undone(self):
        # (each cleanup was registered after what it undoes: an interruption
        # between the two left the default group, or the mode, to the next test)
        from disttest.bases import simulated as module

        def then_interrupted(real):
            def call(*args, **kwargs):
                real(*args, **kwargs)
                raise RuntimeError("interrupted right after")
            return call

        class Interrupted(disttest.SimulatedTestCase):
            world_size = 4

            def test_it(self):
                pass

        for target, name in ((module.dist, "init_process_group"), (lt.LocalTensorMode, "__enter__")):
            with self.subTest(name=name):
                with mock.patch.object(target, name, then_interrupted(getattr(target, name))):
                    result = run(Interrupted)
                self.assertEqual(len(result.errors), 1, problems(result))
                self.assertIn("interrupted right after", result.errors[0][1])
                self.assertFalse(dist.is_initialized())
                self.assertEqual(_compat.dispatch_modes(), [])


@needs_mode
class MeshTest(unittest.TestCase):
    def test_a_shape_of_other_ranks_than_the_worlds_is_named(self):
        # (taken: its mesh then failed with a bare AssertionError, or torch's words)
        refused = []

        class Shapes(disttest.SimulatedTestCase):
            world_size = 8

            def test_it(self):
                for shape in ((2, 2), (0,), ("8",), (-1, -8), (True, 8), (2.0, 4)):
                    with self.subTest(shape=shape), self.assertRaises(disttest.ConfigError) as caught:
                        self.mesh(*shape)
                    refused.append(str(caught.exception))
                self.assertEqual(self.mesh(2, 4).shape, (2, 4))

        result = run(Shapes)
        self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertIn("Invalid mesh shape (2, 2) from Shapes.mesh(...)", refused[0])
        self.assertIn("expected positive ints whose product is the world size, 8", refused[0])

    def test_a_world_size_of_numpys_int_is_an_int(self):
        import numpy as np

        class NumpySize(disttest.SimulatedTestCase):
            world_size = np.int64(4)

            def test_it(self):
                self.assertIs(type(self.world_size), int)
                self.assertEqual(self.mesh().shape, (4,))

        result = run(NumpySize)
        self.assertTrue(result.wasSuccessful(), problems(result))


@needs_mode
class RankBranchTest(unittest.TestCase):
    """``self.rank`` compared where the ranks' answers differ: torch's
    per-rank int answered ``self.rank == 0`` with False for every rank, and
    a test's rank-0 checks silently never ran."""

    def test_the_refusal_is_not_taken_for_a_value_error(self):
        # (a ValueError: assertRaises(ValueError) around a branch one rank takes passed)
        class Parse(disttest.SimulatedTestCase):
            world_size = 4

            def test_it(self):
                def parse(n):
                    if n == 2:
                        raise ValueError("bad")
                    return n

                with self.assertRaises(ValueError):
                    parse(self.rank)

        result = run(Parse)
        self.assertEqual(len(result.errors), 1, problems(result))
        self.assertIn("RankSplit: a per-rank int == 2", result.errors[0][1])

    def test_not_equal_means_on_every_rank(self):
        # (the inverse of assertEqual: it passed where any one rank differed)
        class NotEqual(disttest.SimulatedTestCase):
            world_size = 4

            def test_rank_zero_equal(self):
                self.assertNotEqual(self.rank, 0)

            def test_tensors_equal_on_rank_zero(self):
                self.assertNotEqual(torch.ones(2) * self.rank, torch.zeros(2))

            def test_differ_everywhere(self):
                self.assertNotEqual(torch.ones(2) * self.rank, torch.full((2,), -1.0))
                self.assertNotEqual(self.rank, 9)
                self.assertNotEqual(1, 2)

        result = run(NotEqual)
        self.assertEqual((result.testsRun, len(result.failures), result.errors), (3, 2, []), problems(result))
        for _, text in result.failures:
            self.assertIn("1 of the 4 ranks checked are equal (disttest): rank 0, where each rank's values must differ",
                          text)

    def test_the_ranks_that_answer_otherwise_are_shown_whatever_their_number(self):
        # (the first five ranks were shown: at 4096 ranks, rank 4095's True never)
        class Last(disttest.SimulatedTestCase):
            world_size = 4096

            def test_it(self):
                if self.rank == 4095:
                    pass

        text = problems(run(Last))[0]
        self.assertIn("their answers differ (ranks 0-4094: False; rank 4095: True)", text)

    def test_a_branch_on_the_rank_is_refused_not_skipped(self):
        forms = {
            "== 0": lambda r: r == 0, "!= 0": lambda r: r != 0, "< 2": lambda r: r < 2,
            "in": lambda r: r in (0,), "bool": bool, "mod": lambda r: r % 2 == 0,
            "int": int, "index": lambda r: [10, 11, 12, 13][r], "sum": lambda r: (r + 1) * 2 > 4,
        }

        class Branch(disttest.SimulatedTestCase):
            world_size = 4

            def test_it(self):
                for name, form in forms.items():
                    with self.subTest(form=name), self.assertRaises(simulated.RankSplit) as caught:
                        form(self.rank)
                    self.assertIn("has no one answer in a simulated test (disttest)", str(caught.exception))

            def test_answers(self):
                with self.assertRaises(simulated.RankSplit) as caught:
                    if self.rank == 0:
                        self.fail("a branch for some ranks only was taken")
                self.assertEqual(caught.exception.answers, {0: True, 1: False, 2: False, 3: False})
                self.assertIn("(rank 0: True; ranks 1, 2, 3: False)", str(caught.exception))

            def test_agreed_answers_and_arithmetic_stay(self):
                self.assertTrue(self.rank >= 0)
                self.assertFalse(self.rank == 7)
                self.assertTrue(self.rank * 0 == 0)  # one value on every rank: a plain answer
                self.assertRanksEqual(torch.ones(2) * (self.rank + 1), lambda r: torch.full((2,), float(r + 1)))
                self.assertRanksEqual(self.rank % 2, {r: r % 2 for r in range(4)})

            def test_the_rest_of_int_arithmetic(self):
                # torch's per-rank int lacks these: an AttributeError from inside torch
                # ("'RankIntNode' object has no attribute 'pow_by_natural'").
                for name, value, want in (("**", self.rank ** 2, lambda r: r ** 2), (">>", self.rank >> 1, lambda r: r >> 1),
                                          ("<<", self.rank << 2, lambda r: r << 2), ("&", self.rank & 1, lambda r: r & 1),
                                          ("|", self.rank | 4, lambda r: r | 4), ("^", self.rank ^ 3, lambda r: r ^ 3),
                                          ("abs", abs(self.rank - 2), lambda r: abs(r - 2)),
                                          ("floor", math.floor(self.rank), lambda r: r),
                                          ("ceil", math.ceil(self.rank + 1), lambda r: r + 1),
                                          ("trunc", math.trunc(self.rank), lambda r: r)):
                    with self.subTest(op=name):
                        self.assertRanksEqual(value, {r: want(r) for r in range(4)})
                for name, form in (("/", lambda r: r / 2), ("float(), or ** by a negative number,", lambda r: r ** -1)):
                    with self.subTest(op=name), self.assertRaises(TypeError) as caught:
                        form(self.rank)
                    self.assertEqual(str(caught.exception), simulated.RANK_NOT_INT.format(op=name))
                with self.assertRaises(simulated.RankSplit):  # (guard_int: one int wanted)
                    torch.tensor(self.rank)
                # With the plain int on the left (torch's constant node had no such methods).
                for name, form in (("//", lambda r: 10 // (r + 1)), ("%", lambda r: 7 % (r + 1)),
                                   ("**", lambda r: 2 ** r), ("<<", lambda r: 1 << r), (">>", lambda r: 16 >> r),
                                   ("&", lambda r: 3 & r), ("|", lambda r: 5 | r), ("-", lambda r: 10 - r)):
                    with self.subTest(reflected=name):
                        self.assertRanksEqual(form(self.rank), {r: form(r) for r in range(4)})

            def test_a_python_value_made_of_per_rank_tensors(self):
                # torch made one answer of differing ranks' answers: torch.equal
                # and allclose were True where any rank was right, so a test
                # that checked one rank's value passed for all.
                out = torch.ones(3) * self.rank
                for name, form in (("equal", lambda: torch.equal(out, torch.zeros(3))),
                                   ("allclose", lambda: torch.allclose(out, torch.zeros(3))),
                                   ("bool", lambda: bool((out == 0).all())), ("float item", lambda: out.sum().item())):
                    with self.subTest(form=name), self.assertRaises(simulated.RankSplit) as caught:
                        form()
                    self.assertIn("a Python value made of per-rank tensors", str(caught.exception))
                self.assertEqual(caught.exception.answers, {0: 0.0, 1: 3.0, 2: 6.0, 3: 9.0})
                # An int's .item() is a per-rank int, as self.rank is.
                count = (torch.ones(3, dtype=torch.int64) * self.rank).sum().item()
                self.assertRanksEqual(count, lambda r: 3 * r)
                with self.assertRaises(simulated.RankSplit):
                    bool(count == 3)
                # Where every rank agrees, the plain answer (NaN included: torch's check asked NaN == NaN).
                same = torch.ones(3) * (self.rank * 0)
                self.assertTrue(torch.equal(same, torch.zeros(3)) and torch.allclose(same, torch.zeros(3)))
                self.assertTrue(math.isnan((same * float("nan")).sum().item()))

        result = run(Branch)
        self.assertEqual(result.testsRun, 5)
        self.assertEqual(problems(result), [])

    def test_one_rank_is_rank_zero(self):
        # A world of one made torch's constant node, which int() and torch.manual_seed refused.
        class One(disttest.SimulatedTestCase):
            world_size = 1

            def test_it(self):
                torch.manual_seed(self.rank)
                self.assertEqual(int(self.rank), 0)

        self.assertEqual(problems(run(One)), [])

    def test_a_declared_fault_is_refused_saying_why(self):
        class Faulty(disttest.SimulatedTestCase):
            world_size = 2

            @disttest.inject_fault(rank=1, action="kill", at="all_reduce")
            def test_it(self):
                pass

        text = problems(run(Faulty))[0]
        self.assertIn("ConfigError", text)
        self.assertIn("or a SimulatedTestCase, whose ranks are one thread", text)

    def test_many_ranks_show_the_first_answers(self):
        class Big(disttest.SimulatedTestCase):
            world_size = 64

            def test_it(self):
                if self.rank < 32:
                    pass

        result = run(Big)
        text = problems(result)[0]
        self.assertIn("RankSplit: a per-rank int < 32 (self.rank, or an int made from it) has no one answer", text)
        self.assertIn("their answers differ (ranks 0-31: True; ranks 32-63: False)", text)


class ReportsTest(unittest.TestCase):
    def test_a_mismatch_names_the_ranks_and_both_values(self):
        class Mismatch(disttest.SimulatedTestCase):
            world_size = 64

            def test_it(self):
                t = self.mode.rank_map(lambda r: torch.tensor([float(r), 1.0]))
                off = self.mode.tensor_map(t, lambda r, v: v + (r in (17, 18, 30, 31, 40, 41, 63)))
                self.assertEqual(off, t)

        result = run(Mismatch)
        self.assertEqual(len(result.failures), 1, problems(result))
        text = result.failures[0][1]
        self.assertIn("7 of the 64 ranks checked differ (disttest):", text)
        self.assertIn("rank 17: got [18.0, 2.0] expected [17.0, 1.0]", text)
        self.assertIn("rank 40: got [41.0, 2.0] expected [40.0, 1.0]", text)
        self.assertNotIn("rank 41:", text)  # the first SHOWN_RANKS only
        self.assertIn("... and 2 more", text)
        self.assertIn("Mismatched elements: 2 / 2", text)

    def test_dtensors_are_compared_rank_by_rank(self):
        # Two DTensors whose values differ raised torch's error from inside
        # the comparison, naming no rank; a DTensor against a plain tensor
        # raised "aten.equal.default got mixed torch.Tensor and DTensor".
        from torch.distributed.tensor import Shard, distribute_tensor

        class DTensors(disttest.SimulatedTestCase):
            world_size = 4

            def test_differ(self):
                mesh = self.mesh()
                a = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
                self.assertEqual(a, distribute_tensor(torch.arange(8.0), mesh, [Shard(0)]))
                b = distribute_tensor(torch.arange(8.0) + (torch.arange(8.0) == 5).float(), mesh, [Shard(0)])
                self.assertEqual(a, b)

            def test_in_a_list(self):
                mesh = self.mesh()
                a = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
                b = distribute_tensor(torch.arange(8.0) + (torch.arange(8.0) == 5).float(), mesh, [Shard(0)])
                self.assertEqual([a], [b])

            def test_against_a_plain_tensor(self):
                self.assertEqual(distribute_tensor(torch.arange(8.0), self.mesh(), [Shard(0)]), torch.arange(8.0))

        result = run(DTensors)
        self.assertEqual((len(result.failures), len(result.errors)), (2, 1), problems(result))
        for _, text in result.failures:  # (a DTensor in a list too)
            self.assertIn("1 of the 4 ranks checked differ (disttest):\nrank 2: got", text)
            self.assertRegex(text, r"4\.0*,\s*5\.")
        self.assertIn("TypeError: Comparing a DTensor to a non-DTensor is ambiguous", result.errors[0][1])

    def test_an_op_that_fails_on_one_rank_names_it(self):
        class OneRank(disttest.SimulatedTestCase):
            world_size = 4

            def test_it(self):
                self.mode.rank_map(lambda r: torch.ones(3 if r == 2 else 2)) + torch.ones(2)

        text = run(OneRank).errors[0][1]
        self.assertIn("must match the size of tensor b (2)", text)
        self.assertIn("(disttest: aten.add.Tensor raised on simulated rank 2 of 4)", text)

    def test_the_default_dtype_is_put_back(self):
        # (as the thread runner does: the same body leaves the same state in every mode)
        class SetsIt(disttest.SimulatedTestCase):
            world_size = 2

            def test_it(self):
                torch.set_default_dtype(torch.float64)

        before = torch.get_default_dtype()
        self.assertEqual(problems(run(SetsIt)), [])
        self.assertEqual(torch.get_default_dtype(), before)

    def test_expected_per_rank_and_plain_values(self):
        class PerRank(disttest.SimulatedTestCase):
            world_size = 8

            def test_function(self):
                t = self.mode.rank_map(lambda r: torch.full((2,), float(r)))
                self.assertRanksEqual(t, lambda r: torch.full((2,), float(r)))
                self.assertRanksEqual(self.rank * 2, {r: 2 * r for r in range(8)})
                self.assertEqual(torch.ones(3) + 1, torch.full((3,), 2.0))  # the same on every rank

            def test_mapping_mismatch(self):
                self.assertRanksEqual(self.rank, {r: 0 for r in range(8)})

            def test_mapping_of_numpy_ranks(self):
                import numpy as np

                self.assertRanksEqual(self.rank, {np.int64(r): r for r in range(8)})

            def test_mapping_outside_the_world(self):
                self.assertRanksEqual(self.rank, {**{r: r for r in range(8)}, 100: 0, "1": 1})

        result = run(PerRank)
        self.assertEqual(result.testsRun, 4)
        self.assertEqual(result.errors, [])
        failures = {case._testMethodName: text for case, text in result.failures}
        self.assertEqual(set(failures), {"test_mapping_mismatch", "test_mapping_outside_the_world"})
        self.assertIn("7 of the 8 ranks checked differ (disttest):\nrank 1: got 1 expected 0",
                      failures["test_mapping_mismatch"])
        self.assertIn(simulated.OUTSIDE_RANKS.format(keys="100, '1'", world=8), failures["test_mapping_outside_the_world"])

    def test_containers_of_simulated_values_compare_rank_by_rank(self):
        class Containers(disttest.SimulatedTestCase):
            world_size = 4

            def test_equal(self):
                t = self.mode.rank_map(lambda r: torch.full((2,), float(r)))
                self.assertEqual([t, {"n": self.rank}], [self.mode.rank_map(lambda r: torch.full((2,), float(r))),
                                                          {"n": self.rank * 1}])
                self.assertRanksEqual((t, 5), lambda r: (torch.full((2,), float(r)), 5))

            def test_differs(self):
                t = self.mode.rank_map(lambda r: torch.full((2,), float(r)))
                self.assertEqual({"w": [t, 1]}, {"w": [torch.zeros(2), 1]})

        result = run(Containers)
        self.assertEqual((result.testsRun, result.errors), (2, []), problems(result))
        self.assertEqual(len(result.failures), 1, problems(result))
        text = result.failures[0][1]
        self.assertIn("3 of the 4 ranks checked differ (disttest):", text)
        self.assertIn("rank 1: got {'w': [tensor([1., 1.]), 1]} expected {'w': [tensor([0., 0.]), 1]}", text)
        self.assertIn("The failure occurred for item ['w'][0]", text)

    def test_replicated_is_the_shared_value_or_names_who_differs(self):
        class Shared(disttest.SimulatedTestCase):
            world_size = 4

            def test_same(self):
                x = self.replicated(torch.arange(3.0))
                self.assertIsNone(_compat.local_tensor_shards(x))
                self.assertEqual(self.replicated(self.rank * 0 + 7), 7)

            def test_differs(self):
                self.replicated(self.mode.rank_map(lambda r: torch.tensor([float(r > 2)])))

        result = run(Shared)
        self.assertEqual((result.testsRun, len(result.failures), result.errors), (2, 1, []))
        self.assertIn("1 of the 4 ranks checked differ (disttest): not the same on every rank:\n"
                      "rank 3: got [1.0] expected [0.0]", result.failures[0][1])

    def test_a_large_value_is_shortened(self):
        self.assertEqual(simulated._show(torch.arange(40.0)),
                         "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, "
                         "...] (shape (40,))")


@needs_mode
class SimulatedTestCaseTest(unittest.TestCase):
    # A DTensor test at 4096 ranks on a 16x16x16 mesh (issue 26) is the
    # first example of docs/howto/scale.rst, which tests/test_docs.py runs
    # (12 s here: not run twice).

    def test_rank_and_group(self):
        seen = {}

        class Group(disttest.SimulatedTestCase):
            world_size = 6

            def test_it(self):
                seen["world"] = (dist.get_backend(), dist.get_world_size())
                seen["rank"] = _compat.local_int_values(self.rank)
                with self.mode.disable():
                    seen["plain"] = self.rank_values(3)
                t = torch.ones(2) * (self.rank + 1)
                dist.all_reduce(t)
                self.assertEqual(t, torch.full((2,), 21.0))

        result = run(Group)
        self.assertTrue(result.wasSuccessful(), problems(result))
        self.assertEqual(seen, {"world": ("fake", 6), "rank": {r: r for r in range(6)}, "plain": dict.fromkeys(range(6), 3)})

    def test_a_rank_split_shows_no_frame_of_disttest(self):
        # (unittest drops disttest's frames from failures only: a RankSplit,
        # a ValueError, showed _rank_int.py's raise as its last frame)
        class Branches(disttest.SimulatedTestCase):
            world_size = 2

            def test_it(self):
                if self.rank == 0:
                    pass

        text = "".join(problems(run(Branches)))
        self.assertIn("RankSplit", text)
        self.assertIn("if self.rank == 0:", text)
        self.assertNotIn("_rank_int.py", text)
        self.assertNotIn("disttest/", text.split("RankSplit")[0])

    def test_the_exception_hooks_are_put_back(self):
        # c10d's init_process_group wraps sys.excepthook in each test: after
        # five tests a traceback read "[rank0]: [rank0]: [rank0]: ...".
        import sys
        import threading

        class Plain(disttest.SimulatedTestCase):
            world_size = 2

            def test_it(self):
                pass

        before = (sys.excepthook, threading.excepthook)
        for _ in range(3):
            self.assertTrue(run(Plain).wasSuccessful())
            self.assertEqual((sys.excepthook, threading.excepthook), before)

    def test_skips_where_torch_lacks_the_mode(self):
        class Skipped(disttest.SimulatedTestCase):
            def test_it(self):
                pass

        with mock.patch.object(_compat, "local_tensor", return_value=None):
            result = run(Skipped)
        self.assertEqual(result.skipped[0][1], _compat.LOCAL_TENSOR_MISSING.format(version=torch.__version__))

    def test_a_bad_world_size_is_named(self):
        class Bad(disttest.SimulatedTestCase):
            world_size = 0

            def test_it(self):
                pass

        result = run(Bad)
        self.assertIn("Invalid world size 0 from Bad.world_size (disttest)", result.errors[0][1])

    def test_speedups_given_as_one_string_are_named(self):
        class Letters(disttest.SimulatedTestCase):
            world_size = 2
            speedups = "rng"  # would be read r, n, g

            def test_it(self):
                pass

        result = run(Letters)
        self.assertIn("Invalid local-tensor speedups 'rng' from Letters.speedups (disttest)", result.errors[0][1])
        Letters.speedups = None  # (a bare TypeError: 'NoneType' object is not iterable)
        result = run(Letters)
        self.assertIn("Invalid local-tensor speedups None from Letters.speedups (disttest)", result.errors[0][1])

    def test_an_install_cut_short_leaves_nothing_installed(self):
        # An interrupt (Ctrl-C, the deadline) part-way through the install left torch patched for good.
        from disttest._compat import local_speedups

        state = (lt._for_each_rank_run_func, lt._LocalDeviceMesh.__dict__["get_coordinate"])

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        with mock.patch.object(local_speedups, "_plain_dispatch", interrupted), self.assertRaises(KeyboardInterrupt):
            _compat.install_local_tensor_speedups()
        self.assertEqual((lt._for_each_rank_run_func, lt._LocalDeviceMesh.__dict__["get_coordinate"]), state)

    def test_an_unknown_speedup_is_named_with_its_source(self):
        class Unknown(disttest.SimulatedTestCase):
            world_size = 2
            speedups = ("rng", "warp_drive")

            def test_it(self):
                pass

        result = run(Unknown)
        self.assertIn("Invalid local-tensor speedups ('rng', 'warp_drive') from Unknown.speedups (disttest): "
                      "expected a tuple of names from", result.errors[0][1])

    def test_a_mapping_that_misses_ranks_names_them(self):
        class Missing(disttest.SimulatedTestCase):
            world_size = 4

            def test_it(self):
                self.assertRanksEqual(torch.ones(1) * self.rank, {0: torch.zeros(1), 1: torch.ones(1)})

        result = run(Missing)
        self.assertEqual(len(result.failures), 1, result.errors)
        self.assertIn(simulated.MISSING_RANKS.format(ranks="2, 3", n=2, world=4), result.failures[0][1])


def spin_forever():
    while True:
        try:
            time.sleep(0.01)
        except Exception:  # the limit is not an Exception: a test's own handler cannot swallow it
            pass


def spin_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@needs_mode
class SimulatedLimitsTest(unittest.TestCase):
    """A simulated test is held to its timeout (it ran on forever), and the
    run-wide fault variables, which cannot act on it, say so."""

    def test_a_test_past_its_timeout_is_stopped_with_its_stack(self):
        class Spins(disttest.SimulatedTestCase):
            world_size = 8
            timeout = 0.5

            def test_spin(self):
                spin_forever()

        start = time.monotonic()
        result = run(Spins)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(len(result.errors), 1, problems(result))
        error = result.errors[0][1]
        self.assertIn("TimeoutError: " + simulated.SIMULATED_TIMED_OUT.format(
            test="test_spin", timeout=0.5, n=8, stack="").rstrip(), error)
        stack = error.split("stopped where it was:")[1]
        self.assertRegex(stack, r"(?s)in test_spin.*in spin_forever")
        self.assertNotIn("unittest", stack)
        self.assertFalse(dist.is_initialized())  # the cleanups ran
        self.assertFalse(any(t.name == "disttest-deadline" for t in threading.enumerate()))

    def test_a_test_polling_in_a_context_manager_s_enter_is_stopped(self):
        # Not stopped inside a context manager's entry at first (it may be
        # switching a mode), but not waited for for ever either: the test
        # ran on past its limit.
        import contextlib

        @contextlib.contextmanager
        def joined():
            while True:
                time.sleep(0.01)
            yield

        class Polls(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 0.5

            def test_poll(self):
                with joined():
                    pass

        start = time.monotonic()
        result = run(Polls)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(len(result.errors), 1, problems(result))
        self.assertIn("'test_poll' did not finish within 0.5s", result.errors[0][1])

    def test_setup_and_test_share_the_limit_from_the_environment(self):
        calls = []

        class SlowSetUp(disttest.SimulatedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                time.sleep(0.6)

            def test_spin(self):
                calls.append("test")
                spin_forever()

        with mock.patch.dict(os.environ, {"DISTTEST_TIMEOUT": "1"}):
            start = time.monotonic()
            result = run(SlowSetUp)
        self.assertLess(time.monotonic() - start, 1.8)  # 1 s in all, not 1 s for each
        self.assertEqual((calls, len(result.errors)), (["test"], 1), problems(result))
        self.assertIn("'test_spin' did not finish within 1s", result.errors[0][1])

    def test_a_test_in_time_passes(self):
        # (A limit of 1 s: setUp counts too, and on a loaded machine it
        # took over 0.1 s of a 0.2 s limit in 2 runs of 5.)
        class Quick(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 1.0

            def test_quick(self):
                time.sleep(0.1)

        for _ in range(5):
            result = run(Quick)
            self.assertTrue(result.wasSuccessful(), problems(result))
        time.sleep(1.1)  # nothing lands later
        self.assertFalse(any(t.name == "disttest-deadline" for t in threading.enumerate()))

    def test_a_limit_caught_by_the_test_still_ends_it(self):
        # unittest's subTest (and a test's own `except BaseException`) caught
        # it: a raw DeadlinePassed for one subtest, and the test ran on or passed.
        class Caught(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 0.5

            def test_subtests(self):
                for i in range(5):
                    with self.subTest(i=i):
                        spin_for(1)

            def test_swallows(self):
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    try:
                        spin_for(0.01)
                    except BaseException:
                        pass

        for name, at_most in (("test_subtests", 2.5), ("test_swallows", 3)):
            with self.subTest(name=name):
                start = time.monotonic()
                result = run(Caught, name)
                self.assertLess(time.monotonic() - start, at_most)
                self.assertFalse(result.wasSuccessful())
                self.assertIn(f"TimeoutError: '{name}' did not finish within 0.5s", problems(result)[-1])

    def test_teardown_and_the_test_s_cleanups_are_held_to_the_timeout(self):
        # Only setUp and the test were: a tearDown or cleanup that hung kept
        # the test process forever ("every wait is bounded; teardown too").
        class Slow(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 0.5

            def tearDown(self):
                spin_for(30)
                super().tearDown()

            def test_teardown(self):
                pass

        class SlowCleanup(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 0.5

            def test_cleanup(self):
                self.addCleanup(spin_for, 30)

        for cls, name in ((Slow, "test_teardown"), (SlowCleanup, "test_cleanup")):
            with self.subTest(name=name):
                start = time.monotonic()
                result = run(cls, name)
                self.assertLess(time.monotonic() - start, 5)
                self.assertIn(f"TimeoutError: '{name}' did not finish within 0.5s", problems(result)[-1])
                self.assertIn("in spin_for", problems(result)[-1])
                self.assertIsNone(_compat.local_tensor().local_tensor_mode())  # disttest's cleanups still ran
                self.assertFalse(dist.is_initialized())

    def test_a_stop_leaves_no_lock_held_and_no_mode_entered(self):
        # Raised from another thread, the stop landed later than the look at
        # the stack: inside logging's handler lock (every later log call hung)
        # or torch's mode switch (LocalTensorMode stayed entered for the
        # process). A hostile pass saw each within 20 runs.
        import io
        import logging

        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        handler = logging.StreamHandler(io.StringIO())
        logger = logging.getLogger("disttest-test-stop")
        logger.addHandler(handler)
        logger.propagate = False
        self.addCleanup(logger.removeHandler, handler)

        class Busy(disttest.SimulatedTestCase):
            world_size = 2
            timeout = 0.05

            def test_busy(self):
                while True:
                    logger.warning("x %s", 1)
                    handler.stream.seek(0)
                    handler.stream.truncate()
                    self.assertEqual(1, 1)  # (through LocalTensorMode.disable())

        for _ in range(30):
            result = run(Busy)
            self.assertIn("did not finish within 0.05s", problems(result)[0])
            self.assertEqual(_get_current_dispatch_mode_stack(), [])
            other = threading.Thread(target=logger.warning, args=("from another thread",), daemon=True)
            other.start()
            other.join(5)
            self.assertFalse(other.is_alive(), "the handler's lock was left held")

    def test_run_wide_faults_say_they_do_not_act(self):
        class Plain(disttest.SimulatedTestCase):
            world_size = 2

            def test_it(self):
                pass

        for variable, value in (("DISTTEST_FAULT", "rank=1,action=kill"), ("DISTTEST_CHAOS", "7")):
            with self.subTest(variable=variable), mock.patch.dict(os.environ, {variable: value}), \
                    warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = run(Plain)
                self.assertTrue(result.wasSuccessful(), problems(result))
                self.assertIn(simulated.RUN_FAULTS_IDLE.format(variable=variable, test="test_it"),
                              [str(w.message) for w in caught])
        with mock.patch.dict(os.environ, {"DISTTEST_FAULT": "rank=1,action=explode"}):
            result = run(Plain)
        self.assertIn("'explode'", result.errors[0][1])
        self.assertIn("DISTTEST_FAULT", result.errors[0][1])


@needs_mode
class OneBodyThreeWaysTest(unittest.TestCase):
    """The same body (tests/simulated_cases.py) simulated, as threads and as
    processes: every rank computes the same values in each."""

    def test_the_three_runs_agree_rank_by_rank(self):
        modes = ("simulated", "threads", "processes")
        with tempfile.TemporaryDirectory() as out, mock.patch.dict(os.environ, {cases.OUT_ENV: out}):
            for mode in modes:
                with self.subTest(mode=mode):
                    cls = getattr(cases, f"Redistribute_{mode}")
                    result = run(cls)
                    self.assertEqual(result.testsRun, 2)
                    self.assertEqual(result.errors, [])
                    self.assertEqual(len(result.failures), 1)
                    self.assertIn("rank 5: got [[32.0, 33.0, 34.0, 35.0]", result.failures[0][1])
                    self.assertIn("1 of the ", result.failures[0][1])
            saved = {m: {r: torch.load(os.path.join(out, f"{m}-{r}.pt")) for r in range(8)} for m in modes}
        self.assertEqual(sorted(saved["simulated"][3]), ["distributed", "full", "redistributed"])
        disttest.assert_equal(saved["threads"], saved["simulated"], rtol=0, atol=0)
        disttest.assert_equal(saved["processes"], saved["simulated"], rtol=0, atol=0)

    def test_a_body_s_world_size_may_be_upstream_s_property(self):
        # It was refused: "Invalid world size <property object at ...> from Body.world_size".
        class Body:
            @property
            def world_size(self):
                return 3

            def test_it(self):
                pass

        disttest.run_simulated(Body)
        made = globals().pop("Body_simulated")
        self.assertEqual(made.world_size, 3)
        disttest.run_in("threads")(Body)
        self.assertEqual(globals().pop("Body_threads")(methodName="test_it").world_size, 3)

    def test_sparse_and_quantized_values_are_compared(self):
        # The fast path's torch.equal raised NotImplementedError on a sparse
        # tensor; a quantized one's report raised "load_scalar: invalid type".
        class Kinds(disttest.SimulatedTestCase):
            world_size = 2

            def test_sparse(self):
                self.assertRanksEqual(torch.eye(3).to_sparse(), lambda r: torch.eye(3).to_sparse())
                self.assertRanksEqual(torch.eye(3).to_sparse(), lambda r: (torch.eye(3) * 2).to_sparse())

            def test_quantized(self):
                ones = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)
                self.assertRanksEqual(ones, lambda r: torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.quint8))

        for name, shown in (("test_sparse", "expected [[2.0, 0.0, 0.0], "), ("test_quantized", "expected [0.0, 0.0, 0.0]")):
            with self.subTest(name=name):
                (text,) = problems(run(Kinds, name))
                self.assertIn("AssertionError: ", text)
                self.assertIn(shown, text)

    def test_a_dtensor_is_checked_by_its_shard_in_every_mode(self):
        # Simulated compared the local shards; threads raised "Comparing a
        # DTensor to a non-DTensor is ambiguous" (or torch's mixed-types error).
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        class Body(disttest.SpmdMixin):
            world_size = 4

            def test_it(self):
                d = distribute_tensor(torch.arange(8.0), self.mesh(), [Shard(0)])
                self.assertRanksEqual(d, lambda r: torch.arange(8.0)[2 * r:2 * r + 2])
                whole = distribute_tensor(torch.arange(4.0), self.mesh(), [Replicate()])
                self.assertRanksEqual(whole, torch.arange(4.0))
                self.assertIs(type(self.replicated(whole)), torch.Tensor)

        disttest.run_simulated(Body)
        disttest.run_in("threads")(Body)
        for made in (globals().pop("Body_simulated"), globals().pop("Body_threads")):
            with self.subTest(mode=made.__name__):
                self.assertEqual(problems(run(made, "test_it")), [])

    def test_a_forced_mode_skips_the_simulated_class(self):
        class Body:
            def test_it(self):
                pass

        with mock.patch.dict(os.environ, {disttest.MODE_ENV: "threads"}):
            disttest.run_simulated(Body)
        made = globals().pop("Body_simulated")
        self.assertTrue(made.__unittest_skip__)
        self.assertEqual(made.__unittest_skip_why__, "DISTTEST_MODE=threads runs the threads mode only")
        with mock.patch.dict(os.environ, {disttest.MODE_ENV: "simulated"}):
            disttest.run_simulated(Body)
        self.assertFalse(getattr(globals().pop("Body_simulated"), "__unittest_skip__", False))
        with mock.patch.dict(os.environ, {disttest.MODE_ENV: "simulate"}), \
                self.assertRaisesRegex(disttest.ConfigError,
                                       r"Invalid mode 'simulate' from environment variable DISTTEST_MODE"):
            disttest.run_simulated(Body)

    def test_world_size_override_and_bad_bodies(self):
        class Body:
            world_size = 8

            def test_it(self):
                pass

        disttest.run_simulated(world_size=512)(Body)
        self.assertEqual(globals()["Body_simulated"].world_size, 512)
        # Stacked for another size (the second took the first's place: 512 never ran).
        disttest.run_simulated(world_size=8)(Body)
        self.assertEqual((globals().pop("Body_simulated").world_size, globals().pop("Body_simulated_8").world_size),
                         (512, 8))
        disttest.run_simulated(world_size=8)(Body)
        with self.assertRaisesRegex(TypeError, "Body is simulated at world size 8 twice"):
            disttest.run_simulated(world_size=8)(Body)
        globals().pop("Body_simulated")
        with self.assertRaisesRegex(TypeError, "must be a plain class"):
            disttest.run_simulated(type("T", (unittest.TestCase,), {}))

    def test_the_expected_value_s_function_and_a_value_of_some_ranks(self):
        class Checks(disttest.SimulatedTestCase):
            world_size = 4

            def test_function_raises(self):
                self.assertRanksEqual(torch.ones(1) * self.rank, lambda r: [torch.zeros(1)][r])

            def test_some_ranks(self):  # (ranks 2 and 3 went unchecked)
                part = lt.LocalTensor({0: torch.zeros(1), 1: torch.zeros(1)})
                self.assertRanksEqual(part, torch.zeros(1))

        result = run(Checks, "test_function_raises")
        self.assertIn("IndexError", problems(result)[0])
        if sys.version_info >= (3, 11):
            self.assertIn("(disttest: raised by the expected value's function, asked for rank 1)", problems(result)[0])
        result = run(Checks, "test_some_ranks")
        self.assertIn("AssertionError: " + simulated.VALUE_MISSES_RANKS.format(ranks="2, 3", n=2, world=4),
                      problems(result)[0])


if __name__ == "__main__":
    unittest.main()
