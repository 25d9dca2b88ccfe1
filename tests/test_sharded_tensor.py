"""disttest.bases.sharded_tensor: upstream's sharded-tensor harness and helpers,
name for name; ShardedTensorTestBase and with_comms on real gloo ranks; the
helpers give upstream's answers; GPU-only ones skip on CPU."""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
import types
import unittest
from unittest import mock

import sharded_tensor_cases as cases
import torch
import torch.distributed as dist
from torch import nn

import disttest.bases.sharded_tensor as st
from disttest import ConfigError, DistSkip, TestCase
from disttest.support.skips import TEST_SKIPS

UPSTREAM = "torch.testing._internal.distributed._shard"
UPSTREAM_MODULES = (
    f"{UPSTREAM}.sharded_tensor",
    f"{UPSTREAM}.sharded_tensor._test_st_common",
    f"{UPSTREAM}.sharded_tensor._test_ops_common",
    f"{UPSTREAM}.test_common",
)
# What upstream's modules import rather than define.
IMPORTED = {"partial", "wraps", "MultiProcessTestCase", "TEST_SKIPS", "tp_transports", "ChunkShardingSpec",
            "EnumerableShardingSpec", "ShardMetadata", "ShardedTensor", "get_chunked_dim_size",
            "get_split_size"}


def upstream(name: str) -> types.ModuleType:
    import importlib

    return importlib.import_module(name)


def gpus(n: int):
    """Pretend this host has ``n`` CUDA devices."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(st, "accelerator_type", return_value="cuda"))
    stack.enter_context(mock.patch.object(st, "accelerator_count", return_value=n))
    return stack


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


def passed(result: unittest.TestResult) -> bool:
    return result.wasSuccessful() and not result.skipped


class NamesTest(unittest.TestCase):
    def test_every_upstream_name_is_offered(self):
        # Upstream suites import private names too (_chunk_sharding_specs_list_for_test).
        for module_name in UPSTREAM_MODULES:
            module = upstream(module_name)
            names = {n for n, v in vars(module).items()
                     if not n.startswith("__") and not isinstance(v, types.ModuleType) and n not in IMPORTED}
            with self.subTest(module_name):
                self.assertTrue(names)
                self.assertEqual(sorted(names - set(st.__all__)), [])
                for name in names:
                    self.assertTrue(hasattr(st, name), name)

    def test_constants_are_upstreams(self):
        base = upstream(UPSTREAM_MODULES[0])
        common = upstream(UPSTREAM_MODULES[1])
        self.assertEqual(st.TEST_GPU_NUM, base.TEST_GPU_NUM)
        self.assertEqual(st.DEFAULT_GPU_NUM, common.DEFAULT_GPU_NUM)
        self.assertEqual(sorted(st.PLACEMENTS), sorted(common.PLACEMENTS))

    def test_import_loads_no_sharded_tensor_code(self):
        code = ("import sys, disttest.bases.sharded_tensor; "
                "print([m for m in sys.modules if m.startswith('torch.distributed._shard')])")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        self.assertEqual(out.stdout.strip(), "[]")


class SpecsTest(TestCase):
    def test_chunk_specs_are_upstreams(self):
        ref = upstream(UPSTREAM_MODULES[2])
        for dim in (0, 1, -1):
            self.assertEqual(st.generate_chunk_sharding_specs_for_test(dim),
                             ref.generate_chunk_sharding_specs_for_test(dim))

    def test_enumerable_spec_is_upstreams(self):
        ref = upstream(UPSTREAM_MODULES[2])
        self.assertEqual(st.generate_enumerable_sharding_specs_for_test(),
                         ref.generate_enumerable_sharding_specs_for_test())

    def test_device_keyword_places_the_same_ranks_elsewhere(self):
        (cpu,) = st.generate_enumerable_sharding_specs_for_test(device="cpu")
        self.assertEqual([str(m.placement) for m in cpu.shards],
                         ["rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"])
        spec = st.generate_chunk_sharding_specs_for_test(0, device="cpu")[1]
        self.assertEqual([p.rank() for p in spec.placements], [2, 3, 0, 1])
        self.assertEqual({p.device() for p in spec.placements}, {torch.device("cpu")})
        self.assertEqual(st.placement(3, "xpu"), "rank:3/xpu:3")

    def test_device_type_places_the_ranks_on_the_hosts_device(self):
        # torch 2.14's device_type: its specs place the ranks on it.
        self.assertEqual(st.device_type, st.accelerator_type() or "cpu")
        spec = st.generate_chunk_sharding_specs_for_test(0, device=st.device_type)[0]
        self.assertEqual({p.device().type for p in spec.placements}, {st.device_type})
        self.assertEqual([p.rank() for p in spec.placements], [0, 1, 2, 3])

    def test_shuffled_specs_are_upstreams_from_a_fresh_process(self):
        common = upstream(UPSTREAM_MODULES[1])
        for dims, seed in (([0], 0), ([0, 1, 0], 5), ([1, 1], 11)):
            # Upstream shuffles its module-level list in place: start it fresh.
            with mock.patch.object(common, "PLACEMENTS", [f"rank:{r}/cuda:{r}" for r in range(4)]):
                expected = common._chunk_sharding_specs_list_for_test(dims, seed=seed)
            with self.subTest(dims=dims, seed=seed):
                self.assertEqual(st._chunk_sharding_specs_list_for_test(dims, seed=seed), expected)

    def test_shuffled_specs_do_not_depend_on_earlier_calls(self):
        first = st._chunk_sharding_specs_list_for_test([0], seed=1)
        st._chunk_sharding_specs_list_for_test([0, 1, 0], seed=2)
        self.assertEqual(st._chunk_sharding_specs_list_for_test([0], seed=1), first)
        self.assertEqual(st.PLACEMENTS, [f"rank:{r}/cuda:{r}" for r in range(4)])  # a list, as upstream's

    def test_local_weight_params_are_upstreams(self):
        ref = upstream(UPSTREAM_MODULES[2])
        for size, dim in (((17, 9), 0), ((8, 10), 1), ((3, 5), 0)):
            weight = torch.empty(size)
            for spec in st.generate_chunk_sharding_specs_for_test(dim):
                for rank in range(4):
                    with self.subTest(size=size, spec=spec, rank=rank):
                        self.assertEqual(
                            st.generate_local_weight_sharding_params_for_test(weight, dim, 4, spec, rank),
                            ref.generate_local_weight_sharding_params_for_test(weight, dim, 4, spec, rank))

    def test_local_weight_params_of_an_unplaced_rank_raise(self):
        spec = st.generate_chunk_sharding_specs_for_test(0)[0]
        message = st.RANK_NOT_PLACED.format(rank=7, placements=[str(p) for p in spec.placements])
        with self.assertRaises(ValueError) as caught:
            st.generate_local_weight_sharding_params_for_test(torch.empty(8, 2), 0, 4, spec, 7)
        self.assertEqual(str(caught.exception), message)


class OpHelpersTest(TestCase):
    def test_binary_op_funcs_are_upstreams(self):
        ref = upstream(UPSTREAM_MODULES[2])
        for op in ("+", "-", "*", "/", "torch.add", "torch.sub", "torch.mul", "torch.div", "torch.Tensor.add"):
            for inplace in (False, True):
                lhs, rhs = torch.arange(1.0, 7.0).reshape(2, 3), torch.full((2, 3), 2.0)
                expected = ref.gen_binary_op_func(op, inplace)(lhs.clone(), rhs)
                with self.subTest(op=op, inplace=inplace):
                    self.assertEqual(st.gen_binary_op_func(op, inplace)(lhs.clone(), rhs), expected)

    def test_inplace_op_updates_and_returns_lhs(self):
        lhs = torch.ones(3)
        out = st.gen_binary_op_func("*", inplace=True)(lhs, torch.full((3,), 4.0))
        self.assertIs(out, lhs)
        self.assertEqual(lhs, torch.full((3,), 4.0))
        self.assertEqual(st.gen_binary_op_func("==")(torch.ones(2), torch.ones(2)), torch.tensor([True, True]))
        # Python's word operators, as upstream's source text takes them
        ref = upstream(UPSTREAM_MODULES[2])
        for op, lhs, rhs in (("and", 0, 5), ("or", 0, 5), ("is", None, None), ("is not", 1, None),
                             ("in", 2, [1, 2]), ("not in", 3, [1, 2])):
            with self.subTest(op=op):
                self.assertEqual(st.gen_binary_op_func(op)(lhs, rhs), ref.gen_binary_op_func(op)(lhs, rhs))

    def test_unknown_op_raises_at_once_naming_it(self):
        for op, inplace, extra in (("<>", False, ""), ("==", True, " with an in-place form"),
                                   ("torch.no_such_op", False, "")):
            with self.subTest(op=op), self.assertRaises(ValueError) as caught:
                st.gen_binary_op_func(op, inplace)
            self.assertEqual(str(caught.exception),
                             st.UNKNOWN_BINARY_OP.format(op=op, inplace=inplace, extra=extra))

    def test_clone_module_parameter(self):
        module = nn.Linear(3, 2)
        clone = st.clone_module_parameter(module, "weight")
        self.assertIsInstance(clone, nn.Parameter)
        self.assertEqual(clone, module.weight)
        self.assertNotEqual(clone.data_ptr(), module.weight.data_ptr())
        self.assertTrue(clone.requires_grad)


class ModelsTest(TestCase):
    def test_megatron_matches_upstream(self):
        ref = upstream(UPSTREAM_MODULES[3])
        sizes = [[5, 7], [7, 3]]
        torch.manual_seed(0)
        theirs = ref.SimpleMegatronLM(sizes, dtype=torch.float64)
        torch.manual_seed(0)
        ours = st.SimpleMegatronLM(sizes, dtype=torch.float64)
        inp = torch.randn(4, 5, dtype=torch.float64)
        self.assertEqual(ours(inp), theirs(inp))
        ours(inp).sum().backward()
        theirs(inp).sum().backward()
        for name in ("get_weights", "get_biases", "get_weight_grads", "get_bias_grads"):
            with self.subTest(name):
                self.assertEqual(getattr(ours, name)(), getattr(theirs, name)())
        self.assertEqual([n for n, _ in ours.named_modules()], [n for n, _ in theirs.named_modules()])

    def test_megatron_on_a_missing_gpu_skips(self):
        with self.assertRaises(DistSkip) as caught:
            st.SimpleMegatronLM([[2, 2], [2, 2]], rank=1)
        self.assertEqual(caught.exception.exit_code, TEST_SKIPS["multi-gpu-2"].exit_code)
        self.assertEqual(str(caught.exception), "Need at least 2 CUDA devices")

    def test_models_without_a_spec_are_upstreams(self):
        ref = upstream(UPSTREAM_MODULES[1])
        ours, theirs = st.MyShardedModel1(), ref.MyShardedModel1()
        self.assertEqual(list(ours.state_dict()), list(theirs.state_dict()))
        self.assertIsNone(ours.sharded_tensor1)
        self.assertIsNone(ours.submodule.sharded_tensor2)

    def test_models_on_missing_gpus_skip_before_any_collective(self):
        spec = st.generate_chunk_sharding_specs_for_test(0)[0]
        with self.assertRaisesRegex(DistSkip, "Need at least 4 CUDA devices"):
            st.MyShardedModel2(spec)


class BaseTest(TestCase):
    def test_world_size_and_backend(self):
        case = st.ShardedTensorTestBase()
        self.assertEqual(case.world_size, 4)
        self.assertEqual(case.backend, "gloo")  # this host has no GPU

    def test_signatures_are_upstreams(self):
        base = upstream(UPSTREAM_MODULES[0])
        for name in ("init_pg", "init_comms", "destroy_comms", "assert_sharded_tensor_equal"):
            theirs = inspect.signature(getattr(base.ShardedTensorTestBase, name))
            ours = inspect.signature(getattr(st.ShardedTensorTestBase, name))
            with self.subTest(name):
                self.assertEqual(list(ours.parameters), list(theirs.parameters))
                self.assertEqual([p.default for p in ours.parameters.values()],
                                 [p.default for p in theirs.parameters.values()])
        self.assertEqual(list(inspect.signature(st.with_comms).parameters),
                         list(inspect.signature(base.with_comms).parameters))

    def test_init_pg_names_a_bad_backend_and_its_source(self):
        case = st.ShardedTensorTestBase()
        with self.assertRaisesRegex(ConfigError, r"'ucc'.*init_pg\(backend=\.\.\.\)"):
            case.init_pg("ucc")
        with self.assertRaises(RuntimeError):  # as upstream's "Backend ucc not supported!"
            case.init_pg("ucc")

    def test_init_pg_with_nccl_on_cpu_skips_in_the_rank(self):
        case = st.ShardedTensorTestBase()
        with mock.patch.object(dist, "init_process_group") as init:
            with self.assertRaisesRegex(DistSkip, "Need at least 4 CUDA devices"):
                case.init_pg()
        init.assert_not_called()

    def test_with_comms_arguments_name_themselves(self):
        with self.assertRaisesRegex(ConfigError, r"with_comms\(init_rpc=\.\.\.\)"):
            st.with_comms(init_rpc="yes")
        with self.assertRaisesRegex(ConfigError, r"with_comms\(backend=\.\.\.\)"):
            st.with_comms(backend=4)
        # A name it does not take: refused here, where it is written (it was
        # refused in every rank, after RPC had started, as init_pg's).
        for bad in ("glooo", "GLOO", "ucc"):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(RuntimeError, f"Invalid backend {bad!r} from with_comms\\(backend=\\.\\.\\.\\)"):
                    st.with_comms(backend=bad)

    def test_with_comms_order(self):
        calls = []

        class Stub:
            world_size = 2
            backend = "gloo"

            def init_comms(self, init_rpc, backend):
                calls.append(("init", init_rpc, backend))

            def destroy_comms(self, destroy_rpc):
                calls.append(("destroy", destroy_rpc))

        with gpus(2):  # nccl, the default, needs a GPU per rank
            self.assertEqual(st.with_comms(lambda self: calls.append("body") or 5)(Stub()), 5)
        st.with_comms(init_rpc=False, backend="gloo")(lambda self: calls.append("body"))(Stub())
        self.assertEqual(calls, [("init", True, "nccl"), "body", ("destroy", True),
                                 ("init", False, "gloo"), "body", ("destroy", False)])
        with gpus(1), self.assertRaisesRegex(DistSkip, "Need at least 2 CUDA devices"):
            st.with_comms(lambda self: calls.append("body"))(Stub())
        with gpus(2), self.assertRaisesRegex(DistSkip, "Need at least 2 CUDA devices"):
            st.with_comms(backend="xccl")(lambda self: calls.append("body"))(Stub())  # not CUDA's
        self.assertEqual(len(calls), 6)

    def test_failing_test_abandons_rpc_and_group_without_the_barrier(self):
        calls = []

        class Stub:
            world_size = 2

            def init_comms(self, init_rpc, backend):
                calls.append("init")

            def destroy_comms(self, destroy_rpc):
                calls.append("destroy")

        def body(self):
            raise KeyError("boom")

        from torch.distributed import rpc

        with mock.patch.object(rpc, "shutdown") as shutdown, \
                mock.patch.object(dist, "is_initialized", return_value=True), \
                mock.patch.object(dist, "destroy_process_group") as destroy, \
                self.assertRaises(KeyError):
            st.with_comms(backend="gloo")(body)(Stub())
        shutdown.assert_called_once_with(graceful=False)
        destroy.assert_called_once_with()
        self.assertEqual(calls, ["init"])

    def test_backend_is_nccl_where_every_rank_has_a_gpu(self):
        case = st.ShardedTensorTestBase()
        with gpus(4):
            self.assertEqual(case.backend, "nccl")
        with gpus(3):
            self.assertEqual(case.backend, "gloo")


class RanksTest(unittest.TestCase):
    def test_gloo_ranks_with_rpc_and_without(self):
        for name in ("test_rpc_and_gloo", "test_host_backend_without_rpc", "test_models",
                     "test_megatron_column_sharded"):
            with self.subTest(name):
                result = run(cases.TwoRanks(name))
                self.assertTrue(passed(result), result.errors + result.failures + result.skipped)

    def test_upstream_world_size_and_specs_on_cpu(self):
        result = run(cases.FourRanks("test_upstream_specs_on_cpu"))
        self.assertTrue(passed(result), result.errors + result.failures + result.skipped)

    def test_unequal_sharded_tensors_fail_on_the_rank_that_differs(self):
        result = run(cases.TwoRanks("test_unequal_sharded_tensors_fail"))
        self.assertEqual(len(result.failures), 1, result.errors)
        text = result.failures[0][1]
        self.assertIn("rank 1/2 raised AssertionError", text)
        self.assertNotIn("rank 0/2 raised", text)

    def test_nccl_default_skips_in_the_parent(self):
        case = cases.TwoRanks("test_nccl_default")
        with mock.patch.object(cases.TwoRanks, "_start_processes") as start:
            result = run(case)
        start.assert_not_called()
        self.assertEqual([reason for _, reason in result.skipped], ["Need at least 2 CUDA devices"])

    def test_a_model_on_missing_gpus_skips_in_the_ranks(self):
        result = run(cases.TwoRanks("test_model_on_missing_gpus_skips"))
        self.assertEqual([reason for _, reason in result.skipped], ["Need at least 4 CUDA devices"])


if __name__ == "__main__":
    unittest.main()
