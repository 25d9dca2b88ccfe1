"""The rest of upstream's ``common_dtensor`` in disttest.bases.dtensor: shard
orders, sharding-rule checks, op strategies (dtensor_ops), the expert models
and styles (dtensor_models, dtensor_experts), LocalDTensorContinuousTestBase.

Each helper is compared with upstream's on the same input. The ranks are
simulated in this process by torch's local-tensor mode over the fake group,
so every collective really runs (per simulated rank) and nothing forks."""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import subprocess
import sys
import types
import unittest
import warnings
from unittest import mock

import torch
import torch.distributed as dist
import torch.testing._internal.distributed._tensor.common_dtensor as up
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

import disttest.bases.dtensor as dt
from disttest import _compat
from disttest.bases import dtensor_experts, dtensor_models, dtensor_ops
from disttest.pg.fake import FakeStore

lt = _compat.local_tensor()
NEW_NAMES = [
    "ExpertLayer", "ExpertParallel", "ExpertParallelWithTP", "Experts", "LocalDTensorContinuousTestBase",
    "TensorParallelForExpert", "TestFunc", "generate_shard_orders", "make_full_tensor", "make_wrapped",
    "op_strategy_context", "patched_distribute_tensor", "redistribute", "shard_order_to_placement",
    "validate_sharding_rule_sample", "validate_sharding_rule_sample_backward",
]


def run_class(cls: type) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    return result


def upstream_public_names() -> set[str]:
    tree = ast.parse(inspect.getsource(up))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.If):  # DEVICE_TYPE, NUM_DEVICES...
            names.update(t.id for n in ast.walk(node) if isinstance(n, ast.Assign)
                         for t in n.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_") and n != "T"}


class NamesTest(unittest.TestCase):
    def test_every_public_name_of_upstream_is_here(self):
        self.assertEqual(sorted(upstream_public_names() - set(dt.__all__)), [])
        for name in NEW_NAMES:
            self.assertIn(name, dt.__all__)
            self.assertIsNotNone(getattr(dt, name), name)

    def test_homes(self):
        self.assertIs(dt.redistribute, dtensor_ops.redistribute)
        self.assertIs(dt.Experts, dtensor_models.Experts)
        for name in ("ExpertParallel", "ExpertParallelWithTP", "TensorParallelForExpert"):
            self.assertIs(getattr(dt, name), getattr(dtensor_experts, name))
        with self.assertRaisesRegex(AttributeError, "has no attribute 'Nope'"):
            dt.Nope  # noqa: B018

    def test_the_expert_styles_pickle(self):
        import pickle

        for name in ("ExpertParallel", "ExpertParallelWithTP", "TensorParallelForExpert"):
            with self.subTest(name):
                cls = getattr(dtensor_experts, name)
                self.assertIs(pickle.loads(pickle.dumps(cls)), cls)

    def test_the_expert_styles_load_on_first_use(self):
        code = ("import sys, disttest.bases.dtensor as dt\n"
                "before = 'torch.distributed.tensor.parallel' in sys.modules\n"
                "from disttest.bases.dtensor import ExpertParallel\n"
                "print(before, 'torch.distributed.tensor.parallel' in sys.modules, ExpertParallel.__name__)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.split(), ["False", "True", "ExpertParallel"], out.stderr[-2000:])

    def test_test_func_is_a_callable_alias(self):
        self.assertIs(getattr(dt.TestFunc, "__origin__", None), getattr(up.TestFunc, "__origin__", None))


class ShardOrderTest(unittest.TestCase):
    """Only ``mesh.ndim`` matters: a stand-in mesh, no group."""

    def test_generate_shard_orders_as_upstream(self):
        for ndim, rank in itertools.product((1, 2, 3), (1, 2, 3)):
            mesh = types.SimpleNamespace(ndim=ndim)
            with self.subTest(ndim=ndim, rank=rank):
                ours = list(dt.generate_shard_orders(mesh, rank))
                self.assertEqual(ours, list(up.generate_shard_orders(mesh, rank)))
                self.assertTrue(ours)
                for order in ours:
                    self.assertIsInstance(order[0], _compat.shard_order_entry())
                    self.assertEqual(sorted(d for e in order for d in e.mesh_dims), list(range(ndim)))

    def test_shard_order_to_placement_as_upstream(self):
        mesh = types.SimpleNamespace(ndim=3)
        for order in [*dt.generate_shard_orders(mesh, 2), (), None]:
            self.assertEqual(dt.shard_order_to_placement(order, mesh), up.shard_order_to_placement(order, mesh))
        entry = _compat.shard_order_entry()
        self.assertEqual(dt.shard_order_to_placement((entry(1, (2, 0)),), mesh), (Shard(1), Replicate(), Shard(1)))


class _LocalWorld(unittest.TestCase):
    """Four simulated ranks: the fake group, and local-tensor mode in the test."""

    world = 4

    def setUp(self):
        if lt is None:
            self.skipTest(_compat.LOCAL_TENSOR_MISSING.format(version=torch.__version__))
        _compat.ensure_fake_backend()
        dist.init_process_group("fake", rank=0, world_size=self.world, store=FakeStore())
        self.addCleanup(dist.destroy_process_group)
        self.mode = lt.LocalTensorMode(self.world)

    def per_rank(self, full, rows):
        """Each rank's own ``rows`` rows of ``full`` (a LocalTensor)."""
        return lt.LocalTensor({r: full[r * rows:(r + 1) * rows].clone() for r in range(self.world)})


class RedistributeTest(_LocalWorld):
    def test_distribute_and_redistribute_in_a_shard_order_as_upstream(self):
        with self.mode:
            mesh = init_device_mesh("cpu", (2, 2))
            x = torch.arange(48.0).reshape(4, 4, 3)
            orders = list(dt.generate_shard_orders(mesh, 3))
            for order in orders[::3]:
                ours = dt.patched_distribute_tensor(x, mesh, None, order)
                theirs = up.patched_distribute_tensor(x, mesh, None, order)
                self.assertEqual(_compat.dtensor_spec(ours), _compat.dtensor_spec(theirs))
                self.assertEqual(_compat.dtensor_spec(ours).shard_order, order)
                self.assertTrue(torch.equal(ours.to_local(), theirs.to_local()))
                self.assertTrue(torch.equal(dt.make_full_tensor(ours), x))
                moved = dt.redistribute(ours, mesh, None, orders[-1])
                self.assertEqual(_compat.dtensor_spec(moved),
                                 _compat.dtensor_spec(up.redistribute(theirs, mesh, None, orders[-1])))
                self.assertTrue(torch.equal(dt.make_full_tensor(moved), x))

    def test_redistribute_to_where_it_is_returns_the_input(self):
        with self.mode:
            mesh = init_device_mesh("cpu", (2, 2))
            order = (_compat.shard_order_entry()(0, (0,)),)
            d = dt.patched_distribute_tensor(torch.ones(4, 4), mesh, None, order)
            self.assertEqual(d.placements, (Shard(0), Replicate()))
            self.assertIs(dt.redistribute(d, mesh, None, order), d)
            self.assertIsNot(dt.redistribute(d, mesh, [Replicate(), Replicate()], None), d)


class ShardingRuleTest(_LocalWorld):
    def test_forward_rule_as_upstream(self):
        args = (torch.randn(8, 4), torch.randn(8, 4))
        cases = [((Shard(0), Shard(0)), (Shard(0),), True), ((Shard(0), Shard(0)), (Shard(1),), False),
                 ((Shard(1), Shard(1)), (Replicate(),), False), ((Replicate(), Replicate()), (Replicate(),), True),
                 ((Shard(1), Shard(1)), (Shard(1),), True)]
        with self.mode:
            mesh = init_device_mesh("cpu", (4,))
            for ins, outs, expected in cases:
                with self.subTest(ins=ins, outs=outs):
                    self.assertIs(dt.validate_sharding_rule_sample(torch.add, args, {}, ins, outs, mesh), expected)
                    self.assertIs(up.validate_sharding_rule_sample(torch.add, args, {}, ins, outs, mesh), expected)
            # kwargs count after args; a Partial output is summed back.
            self.assertTrue(dt.validate_sharding_rule_sample(
                torch.mm, (torch.randn(4, 8),), {"mat2": torch.randn(8, 4)}, (Shard(1), Shard(0)), (Partial(),), mesh))
            with self.assertRaises(AssertionError) as cm:
                dt.validate_sharding_rule_sample(torch.add, args, {}, (Shard(0),), (Shard(0),), mesh)
        self.assertEqual(str(cm.exception), dtensor_ops.PLACEMENT_COUNT.format(
            func="validate_sharding_rule_sample", placements=1, tensors=2, op=torch.add))

    def test_backward_rule(self):
        args = (torch.randn(8, 4), torch.randn(8, 4))

        def doubles_on_dtensors(a):
            return a * 2 if isinstance(a, DTensor) else a * 1

        with self.mode:
            mesh = init_device_mesh("cpu", (4,))
            for op, a, ins, expected in [
                (torch.mul, args, (Shard(0), Shard(0)), True),
                (torch.mul, args, (Replicate(), Shard(1)), True),
                (doubles_on_dtensors, args[:1], (Shard(0),), False),  # gradients differ
                (torch.add, (torch.arange(4), torch.arange(4)), (Shard(0), Shard(0)), None),  # not floating
                (torch.argmax, args[:1], (Shard(0),), None),  # no differentiable output
            ]:
                with self.subTest(op=op, ins=ins):
                    self.assertIs(dt.validate_sharding_rule_sample_backward(op, a, {}, ins, mesh), expected)
                    self.assertIs(up.validate_sharding_rule_sample_backward(op, a, {}, ins, mesh), expected)
            with self.assertRaisesRegex(AssertionError, "1 input placements for 2 tensor arguments"):
                dt.validate_sharding_rule_sample_backward(torch.mul, args, {}, (Shard(0),), mesh)


class OpStrategyTest(_LocalWorld):
    def test_the_strategy_is_used_inside_and_restored_after(self):
        # NB: torch 2.14 gives sum a single-mesh-dim strategy, which it looks
        # up first: upstream's context leaves it there, and ours is never used
        from torch.distributed.tensor._ops._math_ops import common_reduction_strategy

        op = torch.ops.aten.sum.default
        tables = _compat.strategy_tables()
        before = [table.get(op) for table in tables]
        self.assertTrue(any(before))
        calls = []

        def strategy(op_schema):
            calls.append(op_schema.op)
            return common_reduction_strategy(op_schema.args_schema[0], [0, 1])

        with self.mode:
            mesh = init_device_mesh("cpu", (4,))
            a = distribute_tensor(torch.ones(8, 2), mesh, [Shard(0)])
            _compat.clear_sharding_prop_cache()
            with dt.op_strategy_context(op, strategy):
                self.assertEqual([table.get(op) for table in tables], [strategy] + [None] * (len(tables) - 1))
                self.assertEqual(a.sum().full_tensor().item(), 16.0)
            self.assertEqual(calls, [op])
            self.assertEqual([table.get(op) for table in tables], before)
            a.sum()  # the cache was cleared: the own strategy runs again, not ours
            self.assertEqual(calls, [op])

    def test_an_op_without_a_strategy_has_none_again_after(self):
        propagator = _compat.sharding_propagator()
        op = torch.ops.aten._foobar.default  # no DTensor strategy
        self.assertNotIn(op, propagator.op_strategy_funcs)
        schema = object()
        with self.assertRaises(KeyError), dt.op_strategy_context(op, lambda s: None, schema_info=schema):
            self.assertIs(propagator.op_to_schema_info[op], schema)
            raise KeyError("the block fails")
        self.assertNotIn(op, propagator.op_strategy_funcs)
        self.assertNotIn(op, propagator.op_to_schema_info)


class MakeWrappedTest(unittest.TestCase):
    def test_contexts_in_order_around_the_test_after_a_dynamo_reset(self):
        events = []

        class Ctx:
            def __init__(self, name):
                self.name = name

            def __enter__(self):
                events.append(f"enter {self.name}")

            def __exit__(self, *exc):
                events.append(f"exit {self.name}")

        def test_x(case):
            """doc"""
            events.append(f"test {case}")
            return 7

        wrapped = dt.make_wrapped(test_x, [Ctx("a"), lambda case: Ctx(f"b for {case}")])
        with mock.patch.object(_compat, "reset_dynamo", side_effect=lambda: events.append("reset")):
            self.assertEqual(wrapped("T"), 7)
        self.assertEqual(events, ["reset", "enter a", "enter b for T", "test T", "exit b for T", "exit a"])
        self.assertEqual((wrapped.__name__, wrapped.__doc__), ("test_x", "doc"))


class ModelsTest(unittest.TestCase):
    def test_expert_models_compute_as_upstream(self):
        torch.manual_seed(0)
        x = torch.randn(2, 3, 8)
        for ours, theirs in [(dt.Experts(8, 16, 4), up.Experts(8, 16, 4)),
                             (dt.ExpertLayer(4, 8, 16), up.ExpertLayer(4, 8, 16))]:
            ours.load_state_dict(theirs.state_dict())
            arg = x if isinstance(ours, dt.ExpertLayer) else x[0]
            self.assertTrue(torch.equal(ours(arg), theirs(arg)))
        self.assertEqual(dt.Experts(8, 16, 4).w1.std().item() < 0.05, True)  # N(0, 0.02)

    def test_transformer_with_experts_as_upstream(self):
        args = dt.ModelArgs(dropout_p=0.0, num_experts=4)
        ours, theirs = dt.Transformer(args), up.Transformer(up.ModelArgs(dropout_p=0.0, num_experts=4))
        self.assertEqual(list(ours.state_dict()), list(theirs.state_dict()))
        ours.load_state_dict(theirs.state_dict())
        tokens = torch.randint(0, 8, (2, 8))
        self.assertTrue(torch.equal(ours(tokens), theirs(tokens)))
        self.assertTrue(all(layer.has_experts for layer in ours.layers))

    def test_rms_norm_has_upstreams_norm(self):
        # (a test that called ._norm got an AttributeError)
        x = torch.randn(3, 8)
        ours, theirs = dt.RMSNormPython(8), up.RMSNormPython(8)
        self.assertTrue(torch.equal(ours._norm(x), theirs._norm(x)))
        self.assertTrue(torch.equal(ours(x), theirs(x)))

    def test_parallelize_refuses_what_cannot_work(self):
        model = dt.Transformer(dt.ModelArgs(num_experts=2))
        with self.assertRaises(ValueError) as cm:
            dt.Transformer.parallelize(model, None, False)
        self.assertEqual(str(cm.exception), dtensor_models.NO_MESH)
        with self.assertRaises(ValueError) as cm:
            dt.Transformer.parallelize(model, object(), True)
        self.assertEqual(str(cm.exception), dtensor_models.SEQ_EXPERTS.format(n=2))


class ExpertStylesTest(_LocalWorld):
    """Each rank owns its own tokens; the parallel module gives every rank
    what the whole module gives for them, and backward runs."""

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        self.ref = dt.Experts(8, 16, 4)
        self.full = torch.randn(8, 8)
        with torch.no_grad():
            self.want = self.per_rank(self.ref(self.full), 2)

    def check(self, model, x, want):
        out = model(x)
        self.assertTrue(torch.allclose(out, want, atol=1e-6))
        out.sum().backward()
        return out

    def test_expert_parallel_and_tensor_parallel(self):
        with self.mode:
            mesh = init_device_mesh("cpu", (4,))
            for style in (dt.ExpertParallel(), dt.TensorParallelForExpert(input_layouts=Shard(0),
                                                                           output_layouts=Shard(0))):
                with self.subTest(style=type(style).__name__):
                    model = copy.deepcopy(self.ref)
                    parallelize_module(model, mesh, style)
                    self.assertIsInstance(model.w1, DTensor)
                    self.check(model, self.per_rank(self.full, 2), self.want)
                    self.assertIsInstance(model.w1.grad, DTensor)
            model = copy.deepcopy(self.ref)
            parallelize_module(model, mesh, dt.TensorParallelForExpert())  # replicated tokens
            self.assertEqual(model.w1.placements, (Shard(1),))
            self.assertEqual(model.w2.placements, (Shard(2),))
            with torch.no_grad():
                whole = self.ref(self.full)
            self.check(model, self.full, whole)

    def test_expert_parallel_with_tp_on_a_2d_mesh(self):
        layer = dt.ExpertLayer(4, 8, 16)
        x = torch.randn(2, 4, 8)
        with torch.no_grad():
            whole = layer(x)
        with self.mode:
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
            parallelize_module(layer, mesh["ep"], dt.ExpertParallelWithTP(mesh["ep"], mesh["tp"]))
            self.assertEqual(layer.experts.w1.placements, (Shard(0), Shard(1)))
            self.assertEqual(layer.experts.w2.placements, (Shard(0), Shard(2)))
            self.check(layer, x, whole)

    def test_transformer_parallelize_with_experts_matches_upstream_and_the_whole_model(self):
        with self.mode:
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
            for ep, tp in [(None, "tp"), ("ep", None), ("ep", "tp")]:
                with self.subTest(ep=ep, tp=tp):
                    torch.manual_seed(0)
                    theirs = up.Transformer(up.ModelArgs(dropout_p=0.0, num_experts=4))
                    ours = dt.Transformer(dt.ModelArgs(dropout_p=0.0, num_experts=4))
                    ours.load_state_dict(theirs.state_dict())
                    tokens = torch.randint(0, 8, (4, 8))
                    whole = ours(tokens)
                    meshes = (mesh[tp] if tp else None, mesh[ep] if ep else None)
                    dt.Transformer.parallelize(ours, meshes[0], False, local_output_for_attn=True, ep_mesh=meshes[1])
                    up.Transformer.parallelize(theirs, meshes[0], False, local_output_for_attn=True,
                                               ep_mesh=meshes[1])
                    self.assertEqual({k: type(v) for k, v in ours.state_dict().items()},
                                     {k: type(v) for k, v in theirs.state_dict().items()})
                    self.assertTrue(torch.allclose(ours(tokens), whole, atol=1e-5))
                    self.assertTrue(torch.allclose(ours(tokens), theirs(tokens), atol=1e-6))


class _Continuous(dt.LocalDTensorContinuousTestBase):
    __test__ = False
    seen: list = []

    @dt.with_comms
    def test_group_and_mesh(self):
        self.seen.append(("pg", id(type(self).pg), dist.get_world_size(), dist.get_backend()))
        with self._get_local_tensor_mode():
            mesh = self.build_device_mesh()
            d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
            self.assertEqual(d.to_local().shape, (8 // self.world_size,))
            self.seen.append(("ranks", dt.reduce_local_int(dt.map_local_for_rank(self.rank, lambda r: r), dict)))

    def test_same_group(self):
        self.seen.append(("pg", id(type(self).pg), dist.get_world_size(), dist.get_backend()))

    def test_fails_alone(self):
        self.assertEqual(1, 2, "boom")


class ContinuousTest(unittest.TestCase):
    def tearDown(self):
        self.assertFalse(dist.is_initialized(), "tearDownClass left the group")

    def test_one_group_per_class_in_this_process(self):
        _Continuous.seen = []
        with mock.patch.object(dt.MultiProcContinousTest, "_ensure_pool", side_effect=AssertionError("pool")):
            result = run_class(_Continuous)
        self.assertEqual(result.testsRun, 3)
        self.assertEqual([str(t) for t, _ in result.failures], [str(_Continuous("test_fails_alone"))])
        self.assertIn("boom", result.failures[0][1])
        self.assertEqual(result.errors, [])
        pgs = [s for s in _Continuous.seen if s[0] == "pg"]
        self.assertEqual(len(pgs), 2)
        self.assertEqual(len({p[1] for p in pgs}), 1, "the class's tests share one group")
        self.assertEqual({p[2:] for p in pgs}, {(dt.NUM_DEVICES, "fake")})
        self.assertIn(("ranks", {r: r for r in range(dt.NUM_DEVICES)}), _Continuous.seen)
        self.assertIsNone(_Continuous.pg)

    def test_world_size_of_the_class(self):
        class Two(_Continuous):
            world_size = 2

        Two.seen = []
        result = run_class(Two)
        self.assertEqual(len(result.failures), 1, result.errors)
        self.assertIn(("ranks", {0: 0, 1: 1}), Two.seen)

    def test_create_local_tensor_test_class_with_this_base(self):
        class Plain(dt.DTensorContinuousTestBase):
            world_size = 2
            seen: list = []

            def test_in_mode(self):
                self.seen.append(type(torch.ones(2) + 1).__name__)

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            local = dt.create_local_tensor_test_class(Plain, base_class=dt.LocalDTensorContinuousTestBase)
        result = run_class(local)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(Plain.seen, ["LocalTensor"])

    def test_torch_without_local_tensor_skips(self):
        with mock.patch.object(_compat, "local_tensor", return_value=None):
            result = run_class(_Continuous)
        self.assertEqual(len(result.skipped), 3, result.errors)
        self.assertIn(f"which torch {torch.__version__} lacks", result.skipped[0][1])


if __name__ == "__main__":
    unittest.main()
