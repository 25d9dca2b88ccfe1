"""disttest.bases.fsdp_models_more and fsdp_helpers: every public name of
upstream's common_fsdp is offered by disttest.bases.fsdp; the new models
build as upstream's do (same parameters, same values) and run under FSDP in
ranks; the helpers behave as upstream's; the GPU-only parts skip on CPU."""

from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys
import unittest
import warnings
from unittest import mock

import fsdp_more_cases as cases
import torch
import torch.distributed as dist
import torch.testing._internal.common_fsdp as upstream
from test_fsdp import ok  # one copy of the helpers

import disttest.bases.fsdp as fsdp
from disttest import _compat
from disttest.bases import fsdp_helpers, fsdp_models_more

NEVER = fsdp.DEVICEInitMode.DEVICE_NEVER
NO_FSDP = fsdp.FSDPInitMode.NO_FSDP


def upstream_public_names() -> set[str]:
    tree = ast.parse(pathlib.Path(upstream.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_")}


def state(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], bool]]:
    return {n: (tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()}


def same_model(test: unittest.TestCase, ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    test.assertEqual(state(ours), state(theirs))
    test.assertEqual(ours.state_dict().keys(), theirs.state_dict().keys())
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        test.assertTrue(torch.equal(a, b), name)


class TestCase(unittest.TestCase):
    def assertEqual(self, first, second, msg=None):  # noqa: N802  # tensors too
        if isinstance(first, torch.Tensor):
            torch.testing.assert_close(first, second, rtol=0, atol=0, msg=msg)
        else:
            super().assertEqual(first, second, msg)


class PublicNamesTest(unittest.TestCase):
    def test_every_upstream_public_name_is_offered(self):
        names = upstream_public_names()
        self.assertGreater(len(names), 35)
        self.assertEqual(sorted(n for n in names if not hasattr(fsdp, n)), [])
        self.assertEqual(sorted(n for n in names if n not in fsdp.__all__), [])

    def test_import_builds_nothing_and_loads_no_fsdp(self):
        code = ("import sys, torch; import disttest.bases.fsdp, disttest.bases.fsdp_models_more, "
                "disttest.bases.fsdp_helpers; "
                "print('torch.distributed.fsdp' in sys.modules, 'torch._inductor.config' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.split(), ["False", "False"], out.stderr[-2000:])


class ModelsTest(TestCase):
    """The NO_FSDP builds match upstream's, parameter for parameter."""

    group = fsdp.DummyProcessGroup(rank=1, size=2)

    def test_always_wrap_no_fsdp_is_the_nested_wrapped_module(self):
        ours = fsdp.AlwaysWrapNestedWrappedModule.init(self.group, NO_FSDP, NEVER, deterministic=True)
        theirs = upstream.AlwaysWrapNestedWrappedModule.init(self.group, upstream.FSDPInitMode.NO_FSDP,
                                                             upstream.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
        self.assertIs(type(ours), fsdp.NestedWrappedModule)
        same_model(self, ours, theirs)

    def test_nonuniform_req_grad_freezes_all_but_the_last_linear(self):
        ours = fsdp.NonUniformReqGradNWM.init(self.group, NO_FSDP, NEVER, deterministic=True)
        theirs = upstream.NonUniformReqGradNWM.init(self.group, upstream.FSDPInitMode.NO_FSDP,
                                                    upstream.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
        same_model(self, ours, theirs)
        self.assertEqual([n for n, p in ours.named_parameters() if p.requires_grad],
                         ["module.2.1.weight", "module.2.1.bias"])
        x = ours.get_input("cpu")
        self.assertEqual(ours(*x), theirs(*x))

    def test_mixture_of_experts(self):
        ours = fsdp.MixtureOfExperts.init(self.group, NO_FSDP, NEVER, deterministic=True)
        theirs = upstream.MixtureOfExperts.init(self.group, upstream.FSDPInitMode.NO_FSDP,
                                                upstream.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
        same_model(self, ours, theirs)
        self.assertEqual(ours.num_expert_params, 23 * 12 + 12)
        self.assertEqual([n for n, p in ours.named_parameters() if hasattr(p, "expert")],
                         ["module.2.weight", "module.2.bias"])
        x = ours.get_input("cpu")
        self.assertEqual(ours(*x), theirs(*x))

    def test_unsupported_init_modes_are_named(self):
        for cls in (fsdp.AlwaysWrapNestedWrappedModule, fsdp.NonUniformReqGradNWM, fsdp.MixtureOfExperts):
            with self.subTest(cls=cls.__name__), self.assertRaisesRegex(ValueError, f"'bogus' for {cls.__name__}"):
                cls.init(self.group, "bogus", NEVER)

    def test_skip_model_and_nested_linear_outside_enable_wrap(self):
        for double_nest in (False, True):
            torch.manual_seed(0)
            ours = fsdp.SkipModel(double_nest)
            torch.manual_seed(0)
            theirs = upstream.SkipModel(double_nest)
            same_model(self, ours, theirs)
            self.assertIsInstance(ours.nested_linear, fsdp.NestedLinear)
            self.assertIsInstance(ours.linear_skip, fsdp.SkipModule)
            x = torch.randn(3, 10)
            self.assertEqual(ours(x), theirs(x))

    def test_cpu_hosts_get_a_cpu_device_id_unless_one_is_given(self):
        from disttest.bases import fsdp_models

        self.assertEqual(fsdp_models._device_kwargs({"sync_module_states": True}),
                         {"sync_module_states": True, "device_id": "cpu"})
        self.assertEqual(fsdp_models._device_kwargs({"device_id": 3}), {"device_id": 3})
        with mock.patch.object(fsdp_models, "DEVICE_TYPE", "cuda"):
            self.assertEqual(fsdp_models._device_kwargs({}), {})

    def test_dummy_ddp_forwards(self):
        inner = torch.nn.Linear(2, 2)
        ddp = fsdp.DummyDDP(inner)
        x = torch.ones(1, 2)
        self.assertIs(ddp.module, inner)
        self.assertEqual(ddp(x), inner(x))
        self.assertEqual(list(ddp.state_dict()), list(upstream.DummyDDP(inner).state_dict()))

    def test_module_with_delay_wraps_and_does_not_patch_on_cpu(self):
        model = fsdp.NestedWrappedModuleWithDelay.init(self.group, NO_FSDP, NEVER, deterministic=True,
                                                       delay_after_loss_ms=50, delay_before_reduction_ms=50)
        self.assertIsInstance(model, fsdp.ModuleWithDelay)
        self.assertIsInstance(model.module, fsdp.NestedWrappedModule)
        theirs = upstream.NestedWrappedModuleWithDelay.init(self.group, upstream.FSDPInitMode.NO_FSDP,
                                                            upstream.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
        same_model(self, model, theirs)
        x = model.get_input("cpu")
        orig = dist.reduce_scatter_single
        seen = []
        model.module.run_backward = lambda loss: seen.append(dist.reduce_scatter_single)
        with mock.patch.object(_compat, "cuda_sleep", side_effect=AssertionError("slept on CPU")):
            loss = model.get_loss(x, model(*x))
            model.run_backward(loss)
        self.assertEqual(seen, [orig])
        self.assertEqual(loss, model(*x).sum())


class Inner(fsdp.FSDPTestModel):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def get_input(self, device):
        return (torch.ones(1, 2),)

    def forward(self, x):
        return self.lin(x)

    def get_loss(self, input, output):
        return output.sum()

    def run_backward(self, loss):
        dist.reduce_scatter_single("out", "in")

    @staticmethod
    def init(*args, **kwargs):
        return Inner()


class DelaysOnCudaTest(TestCase):
    """On CUDA the delays hold the stream; faked here (no GPU needed)."""

    def setUp(self):
        for patch in (mock.patch.object(fsdp_models_more.fsdp_models, "DEVICE_TYPE", "cuda"),
                      mock.patch.object(fsdp_models_more, "_cuda_cycles_per_ms", return_value=1000.0)):
            patch.start()
            self.addCleanup(patch.stop)
        self.sleeps = []
        patch = mock.patch.object(_compat, "cuda_sleep", side_effect=self.sleeps.append)
        patch.start()
        self.addCleanup(patch.stop)

    def test_module_with_delay(self):
        model = fsdp.ModuleWithDelay.init(Inner, delay_after_loss_ms=3, delay_before_reduction_ms=7)
        loss = model.get_loss(None, model(torch.ones(1, 2)))
        self.assertEqual(self.sleeps, [3000])
        reduce_scatter = mock.Mock(return_value="done")
        with mock.patch.object(dist, "reduce_scatter_single", reduce_scatter):
            model.run_backward(loss)
            self.assertIs(dist.reduce_scatter_single, reduce_scatter, "not restored")
        self.assertEqual(self.sleeps, [3000, 7000])
        reduce_scatter.assert_called_once_with("out", "in")

    def test_mixture_of_experts_delays_the_reshard(self):
        model = fsdp.MixtureOfExperts.init(ModelsTest.group, NO_FSDP, NEVER, delay_before_free_ms=4)
        runtime = _compat.fsdp_runtime_utils()
        orig, reshard = runtime._reshard, mock.Mock(return_value=None)
        with mock.patch.object(runtime, "_reshard", reshard):
            with model._delayed_reshard():
                runtime._reshard("handle", True)
            self.assertIs(runtime._reshard, reshard)
        self.assertIs(runtime._reshard, orig)
        reshard.assert_called_once_with("handle", True)
        self.assertEqual(self.sleeps, [4000])
        # Without FSDP there is no reshard to delay.
        model(*model.get_input("cpu"))
        self.assertEqual(self.sleeps, [4000])


class HelpersTest(TestCase):
    def test_subtest_name_as_upstream(self):
        mapping = {"True": "on", "False": "off", "1": "one"}
        for args in [(True, None, 1), (False,), ()]:
            self.assertEqual(fsdp.subtest_name(mapping, *args), upstream.subtest_name(mapping, *args))
        self.assertEqual(fsdp.subtest_name(mapping, True, None, 1), "on_none_one")

    def test_subtest_name_names_the_missing_value(self):
        with self.assertRaises(KeyError) as cm:
            fsdp.subtest_name({"a": "b"}, 3)
        self.assertEqual(cm.exception.args[0],
                         fsdp_helpers.NO_SUBTEST_NAME.format(value=3, key="3", known=["a"]))

    def test_dummy_process_group_as_upstream(self):
        ours, theirs = fsdp.DummyProcessGroup(3, 8), upstream.DummyProcessGroup(3, 8)
        self.assertEqual((ours.rank(), ours.size()), (theirs.rank(), theirs.size()))
        t = torch.ones(2)
        work = ours.allreduce([t])
        self.assertEqual(work.get_future().wait(), theirs.allreduce([t]).get_future().wait())
        self.assertTrue(work.wait() and work.is_completed())
        self.assertEqual(t, torch.ones(2))


def _eager_and_compiled_body(record):
    config = _compat.inductor_config()
    record.append((_body_globals().get("fully_shard"), config.compile_threads))


def _body_globals():
    return globals()


class CompiledFsdpTestTest(unittest.TestCase):
    """The decorator outside ranks (no group: no barrier)."""

    def test_without_triton_eager_only_with_a_warning(self):
        record = []
        wrapped = fsdp.compiled_fsdp_test()(_eager_and_compiled_body)
        with mock.patch.object(_compat, "has_triton", return_value=False), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped(record)
        from torch.distributed.fsdp import fully_shard

        self.assertEqual(record, [(fully_shard, _compat.inductor_config().compile_threads)])
        self.assertEqual([str(w.message) for w in caught],
                         [fsdp_helpers.NO_TRITON.format(test="_eager_and_compiled_body")])
        self.assertNotIn("fully_shard", globals(), "the global was left behind")
        self.assertEqual(wrapped.__name__, "_eager_and_compiled_body")

    def test_with_triton_both_modes_then_restored(self):
        record = []
        config = _compat.inductor_config()
        threads = config.compile_threads
        with mock.patch.object(_compat, "has_triton", return_value=True):
            fsdp.compiled_fsdp_test(torch.nn.Linear)(_eager_and_compiled_body)(record)
        from torch.distributed.fsdp import fully_shard

        (eager, eager_threads), (compiled, compiled_threads) = record
        self.assertIs(eager, fully_shard)
        self.assertEqual((eager_threads, compiled_threads), (threads, 1))
        self.assertIsInstance(compiled, functools.partial)
        self.assertEqual(config.compile_threads, threads)
        self.assertNotIn("fully_shard", globals())
        # The compiled fully_shard shards, then compiles modules of the class given.
        calls = []
        with mock.patch("torch.distributed.fsdp.fully_shard", side_effect=lambda m, **k: calls.append(m) or m):
            lin, seq = torch.nn.Linear(2, 2), torch.nn.Sequential()
            with mock.patch.object(lin, "compile") as lin_compile, mock.patch.object(seq, "compile") as seq_compile:
                self.assertIs(compiled(lin, reshard_after_forward=False), lin)
                compiled(seq)
        self.assertEqual(calls, [lin, seq])
        lin_compile.assert_called_once_with()
        seq_compile.assert_not_called()

    def test_restored_when_the_test_fails(self):
        def body():
            _body_globals()["fully_shard"]  # noqa: B018  # present while it runs
            raise KeyError("body")

        body.__globals__["fully_shard"] = "before"
        self.addCleanup(body.__globals__.pop, "fully_shard")
        with mock.patch.object(_compat, "has_triton", return_value=True), self.assertRaises(KeyError):
            fsdp.compiled_fsdp_test()(body)()
        self.assertEqual(globals()["fully_shard"], "before")


class ProcessesTest(unittest.TestCase):
    """FSDP over gloo in two CPU rank processes."""

    def test_fsdp1_parity_against_ddp_in_ranks(self):
        # (FSDPTestMixin had no _test_fsdp_parity: every FSDP1 test that calls it errored)
        result = unittest.TestResult()
        names = ["test_parity_recursive", "test_parity_grad_op_with_original_params",
                 "test_parity_against_a_reference_that_differs", "test_a_mode_without_fsdp_is_refused"]
        unittest.TestSuite(cases.FsdpParity(n) for n in names).run(result)
        self.assertEqual(result.testsRun, len(names))
        failed = {test._testMethodName: text for test, text in result.failures + result.errors}
        self.assertEqual(sorted(failed), ["test_a_mode_without_fsdp_is_refused",
                                          "test_parity_against_a_reference_that_differs"], failed)
        self.assertIn("ranks 0, 1/2 raised AssertionError", failed["test_parity_against_a_reference_that_differs"])
        self.assertIn("Scalars are not close!", failed["test_parity_against_a_reference_that_differs"])
        self.assertIn("Expects an FSDP init mode that wraps with FSDP", failed["test_a_mode_without_fsdp_is_refused"])

    def test_models_and_helpers_in_ranks(self):
        result = unittest.TestResult()
        names = ["test_always_wrap", "test_get_full_params", "test_nonuniform_req_grad",
                 "test_mixture_of_experts_recursive", "test_mixture_of_experts_reduces_shared_grads_by_hand",
                 "test_skip_model_under_enable_wrap", "test_compiled_fsdp_warns_and_runs_eager"]
        unittest.TestSuite(cases.FsdpMoreProcesses(n) for n in names).run(result)
        self.assertEqual(result.testsRun, len(names))
        ok(self, result)
