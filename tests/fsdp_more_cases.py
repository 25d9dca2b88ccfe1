"""FSDP test classes that tests/test_fsdp_more.py runs: the models and
helpers of disttest.bases.fsdp_models_more and fsdp_helpers inside ranks. At
module level so that the fork server can import them by name. The assertions
run in the ranks."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import enable_wrap

from disttest.bases.fsdp import (
    MLP,
    AlwaysWrapNestedWrappedModule,
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTest,
    MixtureOfExperts,
    NestedWrappedModule,
    NonUniformReqGradNWM,
    SkipModel,
    compiled_fsdp_test,
    get_full_params,
)
from disttest.bases.fsdp_helpers import NO_TRITON

NEVER = DEVICEInitMode.DEVICE_NEVER

#: What the compiled_fsdp_test case saw, per call of its body.
SEEN_FULLY_SHARD: list[object] = []


class FsdpMoreProcesses(FSDPTest):
    def test_always_wrap(self):
        model = AlwaysWrapNestedWrappedModule.init(self.process_group, FSDPInitMode.RECURSIVE, NEVER,
                                                   deterministic=True)
        assert isinstance(model, FSDP), type(model)
        # always_wrap_policy: every Linear is its own FSDP unit below the root.
        linears = [m for m in model.modules() if isinstance(m, FSDP) and isinstance(m.module, torch.nn.Linear)]
        self.assertEqual(len(linears), 5)
        out = model(*model.module.get_input("cpu"))
        self.assertEqual(out.shape, (4, 8))

    def test_get_full_params(self):
        ref = NestedWrappedModule.init(self.process_group, FSDPInitMode.NO_FSDP, NEVER, deterministic=True)
        model = AlwaysWrapNestedWrappedModule.init(self.process_group, FSDPInitMode.RECURSIVE, NEVER,
                                                   deterministic=True)
        full = get_full_params(model)
        self.assertEqual([p.shape for p in full], [p.shape for p in ref.parameters()])
        for got, want in zip(full, ref.parameters(), strict=True):
            self.assertEqual(got, want)
        # Copies: the sharded model is back to its shards afterwards.
        local = sum(p.numel() for p in model.parameters())
        self.assertLess(local, sum(p.numel() for p in full))
        # recurse=False: only the root's own unit, which holds no parameter here.
        self.assertEqual(sum(p.numel() for p in get_full_params(model, recurse=False)), local)

    def test_nonuniform_req_grad(self):
        model = NonUniformReqGradNWM.init(self.process_group, FSDPInitMode.RECURSIVE, NEVER,
                                          fsdp_kwargs={"use_orig_params": True}, deterministic=True)
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.assertEqual(trainable, ["module.2._fsdp_wrapped_module.1.weight",
                                     "module.2._fsdp_wrapped_module.1.bias"])
        out = model(*model.get_input("cpu"))
        model.run_backward(model.get_loss(None, out))

    def test_mixture_of_experts_recursive(self):
        model = MixtureOfExperts.init(self.process_group, FSDPInitMode.RECURSIVE, NEVER, deterministic=True,
                                      delay_before_free_ms=5)
        shared, expert = model.module[1], model.module[2]
        assert isinstance(shared, FSDP) and isinstance(expert, FSDP)
        self.assertEqual(shared.process_group.size(), 2)
        self.assertEqual(expert.process_group.size(), 1)
        out = model(*model.get_input("cpu"))
        model.run_backward(model.get_loss(None, out))
        self.assertEqual(out.shape, (4, 8))

    def test_mixture_of_experts_reduces_shared_grads_by_hand(self):
        model = MixtureOfExperts.init(self.process_group, FSDPInitMode.NO_FSDP, NEVER, deterministic=True)
        out = model(*model.get_input("cpu"))
        model.run_backward(model.get_loss(None, out))
        for name, p in model.named_parameters():
            gathered = [torch.empty_like(p.grad) for _ in range(self.world_size)]
            dist.all_gather(gathered, p.grad)
            same = torch.equal(gathered[0], gathered[1])
            # Expert gradients stay local (the weight's differs per rank; the
            # bias's is the same by construction); the rest are averaged.
            if hasattr(p, "expert"):
                self.assertEqual(same, name.endswith("bias"), name)
            else:
                self.assertTrue(same, name)

    def test_skip_model_under_enable_wrap(self):
        with enable_wrap(wrapper_cls=FSDP, process_group=self.process_group):
            model = SkipModel(double_nest=True)
        assert isinstance(model.nested_linear, FSDP)
        assert isinstance(model.nested_linear.module.nested_linear, FSDP)
        assert not isinstance(model.linear_skip, FSDP)
        self.assertEqual(model(torch.ones(2, 10)).shape, (2, 10))

    @compiled_fsdp_test()
    def test_compiled_fsdp_eager_only_on_cpu(self):
        SEEN_FULLY_SHARD.append(fully_shard)
        model = MLP(8)
        fully_shard(model)
        model(torch.ones(2, 8)).sum().backward()

    def test_compiled_fsdp_warns_and_runs_eager(self):
        SEEN_FULLY_SHARD.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.test_compiled_fsdp_eager_only_on_cpu()
        self.assertEqual(SEEN_FULLY_SHARD, [fully_shard])
        self.assertEqual([str(w.message) for w in caught if "compiled_fsdp_test" in str(w.message)],
                         [NO_TRITON.format(test="FsdpMoreProcesses.test_compiled_fsdp_eager_only_on_cpu")])


class ComposableProcesses(FSDPTest):
    """tests/test_composable.py: a composable model under fully_shard."""

    def test_fully_shard_composite_param_model(self):
        import copy

        from disttest.bases.composable import CompositeParamModel
        from disttest.bases.fsdp import check_sharded_parity

        torch.manual_seed(0)
        model = CompositeParamModel(torch.device("cpu"))
        ref = copy.deepcopy(model)
        for unit in (model.u1, model.u2, model):
            fully_shard(unit)
        torch.manual_seed(self.rank + 1)
        x = torch.randn(4, 100)
        model(x).sum().backward()
        ref(x).sum().backward()
        for p in ref.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        check_sharded_parity(self, ref, model)


class FsdpParity(FSDPTest):
    """Upstream's FSDP1 parity check against DDP (FSDPTestMixin._test_fsdp_parity)."""

    def test_parity_recursive(self):
        self._test_fsdp_parity(NestedWrappedModule, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE)

    def test_parity_grad_op_with_original_params(self):
        # (CPU offload pins memory, which torch refuses on a host without accelerators)
        from torch.distributed.fsdp import ShardingStrategy

        self._test_fsdp_parity(NestedWrappedModule, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE,
                               num_iters=3, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=True)

    def test_parity_against_a_reference_that_differs(self):
        # A reference whose weights start doubled: the check must fail.
        from torch.nn.parallel import DistributedDataParallel

        def doubled(model):
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(2)
            return DistributedDataParallel(model)

        self._test_fsdp_parity(NestedWrappedModule, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE,
                               ref_init_fn=doubled)

    def test_a_mode_without_fsdp_is_refused(self):
        self._test_fsdp_parity(NestedWrappedModule, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE)
