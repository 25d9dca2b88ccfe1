"""FSDP test bases: the harness of upstream's ``common_fsdp`` on disttest's runners.

The names of ``torch.testing._internal.common_fsdp``, so an FSDP suite ports
by changing one import:

- :class:`FSDPTest`: fresh rank processes per test, the default group made
  in each rank before the test (``self.process_group``) and destroyed after.
- :class:`FSDPTestMultiThread`: ranks as threads over the threaded group.
- :class:`FSDPTestContinuous`: one pool of rank processes per class, a
  barrier around every test.
- :func:`check_sharded_parity`, the ``patch_*`` context managers, and the
  reference models (:mod:`disttest.bases.fsdp_models`,
  :mod:`disttest.bases.fsdp_models_more`) and helpers
  (:mod:`disttest.bases.fsdp_helpers`).

Unlike upstream, which skips every ``FSDPTest`` on a host without
accelerators, the bases run on CPU with gloo there (2 ranks by default); a
test that needs more accelerators than the host has is skipped in the parent,
before any rank starts. Importing this module does no tensor work and changes
nothing in torch.
"""

from __future__ import annotations

import contextlib
import os
import unittest
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest.bases import fsdp_models, fsdp_parity
from disttest.bases.dtensor_bases import _DTensorProcesses
from disttest.bases.fsdp_helpers import (
    DummyProcessGroup,
    compiled_fsdp_test,
    get_full_params,
    subtest_name,
)
from disttest.bases.fsdp_models import (
    MLP,
    DEVICEInitMode,
    DoubleLinear,
    FSDPInitMode,
    FSDPTestModel,
    MLPStack,
    NestedWrappedModule,
    TransformerWithSharedParams,
    get_devtype,
)
from disttest.bases.fsdp_models_more import (
    AlwaysWrapNestedWrappedModule,
    DummyDDP,
    MixtureOfExperts,
    ModuleWithDelay,
    NestedLinear,
    NestedWrappedModuleWithDelay,
    NonUniformReqGradNWM,
    SkipModel,
    SkipModule,
)
from disttest.runners.case import set_rng_seed
from disttest.runners.continuous import MultiProcContinousTest
from disttest.runners.multithread import MultiThreadedTestCase
from disttest.support.devices import accelerator_count
from disttest.support.helpers import run_subtests, set_environ
from disttest.support.skips import TEST_SKIPS, DistSkip, _gpu_skip

__unittest = True

__all__ = [
    "DEVICE_COUNT",
    "DEVICE_TYPE",
    "DISTRIBUTED_BACKEND",
    "MLP",
    "AlwaysWrapNestedWrappedModule",
    "DEVICEInitMode",
    "DoubleLinear",
    "DummyDDP",
    "DummyProcessGroup",
    "FSDPInitMode",
    "FSDPTest",
    "FSDPTestContinuous",
    "FSDPTestMixin",
    "FSDPTestModel",
    "FSDPTestMultiThread",
    "MLPStack",
    "MixtureOfExperts",
    "ModuleWithDelay",
    "NestedLinear",
    "NestedWrappedModule",
    "NestedWrappedModuleWithDelay",
    "NonUniformReqGradNWM",
    "SkipModel",
    "SkipModule",
    "TransformerWithSharedParams",
    "check_sharded_parity",
    "compiled_fsdp_test",
    "get_devtype",
    "get_full_params",
    "patch_all_gather",
    "patch_all_reduce",
    "patch_foreach_all_gather",
    "patch_foreach_reduce",
    "patch_post_backward",
    "patch_reduce_scatter",
    "patch_register_post_backward_hook_backward",
    "patch_reshard",
    "patch_unshard",
    "reduce_scatter_with_assert",
    "subtest_name",
]

#: The device type the FSDP bases and their models use, the accelerator's
#: ("cuda", "xpu"...) else "cpu" (the same value as ``disttest.fsdp_models``).
DEVICE_TYPE: str = fsdp_models.DEVICE_TYPE
#: Accelerator devices on this host; 1 without any (upstream's value).
DEVICE_COUNT: int = accelerator_count() or 1
#: The backend of the FSDP bases' group, the device's default (gloo on CPU).
DISTRIBUTED_BACKEND: str = dist.Backend.default_device_backend_map.get(DEVICE_TYPE, "gloo")
#: Default world size of the FSDP bases: every accelerator, else 2 CPU ranks.
FSDP_WORLD_SIZE: int = accelerator_count() or 2

NO_OUTPUT = "reduce_scatter_with_assert: no output tensor in args {args!r} or kwargs {kwargs!r} (disttest)"
NOT_DTENSOR = "check_sharded_parity: {what} of {name!r} is a {type}, not a DTensor (disttest)"
SHARD_SHARD = (
    "check_sharded_parity: {name!r} is laid out (Shard(0), Shard(0)), which differs from "
    "distribute_tensor()'s layout, so it cannot be compared (disttest)"
)


def _accelerator_skip(world_size: int) -> DistSkip | None:
    if DEVICE_TYPE != "cpu" and accelerator_count() < world_size:
        return DistSkip(_gpu_skip(world_size))
    return None


class FSDPTestMixin:
    """What the FSDP bases share: ``run_subtests`` and upstream's checks."""

    def _check_cpu_offload(self, fsdp_model: Any, cpu_offload: Any) -> None:
        self.assertEqual(cpu_offload, fsdp_model.cpu_offload)  # type: ignore[attr-defined]

    def _check_backward_prefetch(self, fsdp_model: Any, backward_prefetch: Any) -> None:
        self.assertEqual(backward_prefetch, fsdp_model.backward_prefetch)  # type: ignore[attr-defined]

    def _check_forward_prefetch(self, fsdp_model: Any, forward_prefetch: Any) -> None:
        self.assertEqual(forward_prefetch, fsdp_model.forward_prefetch)  # type: ignore[attr-defined]

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        """:func:`disttest.run_subtests` on this test: one ``subTest`` per
        combination, dynamo reset around each, a barrier between them."""
        run_subtests(self, *args, **kwargs)  # type: ignore[arg-type]

    # FSDP1's parity check against DDP, under upstream's names (see fsdp_parity).
    _train_for_several_steps = fsdp_parity.train_for_several_steps
    _test_fsdp_parity = fsdp_parity.test_fsdp_parity


class FSDPTest(FSDPTestMixin, _DTensorProcesses):
    """FSDP tests in ``world_size`` fresh rank processes per test.

    In each rank the default group (``DISTRIBUTED_BACKEND``, through the
    test's rendezvous file; ``fake`` with ``fake_pg = True``) exists before
    the test body, and the ranks meet at a barrier before and after it.
    """

    @property
    def world_size(self) -> int:
        return FSDP_WORLD_SIZE

    @property
    def process_group(self) -> Any:
        return dist.group.WORLD

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False  # _run destroys it after the closing barrier

    @property
    def init_method(self) -> str:
        return f"file://{self.file_name}"

    def setUp(self) -> None:
        super().setUp()
        # NCCL's workCleanupLoop makes tests flaky (pytorch#90848).
        self.addCleanup(set_environ, set_environ({"TORCH_NCCL_DESYNC_DEBUG": "0"}))
        skip = _accelerator_skip(self._effective_world_size())
        if skip is not None:
            raise skip
        self._spawn_processes()

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
        """Hook, in the rank: make the group, barrier, run the test, barrier,
        destroy the group."""
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        world_size = int(self.world_size)
        try:
            if kwargs.get("fake_pg", False):
                from disttest.pg.fake import FakeStore

                _compat.ensure_fake_backend()
                dist.init_process_group("fake", world_size=world_size, rank=rank, store=FakeStore())
            else:
                dist.init_process_group(init_method=self.init_method, backend=DISTRIBUTED_BACKEND,
                                        world_size=world_size, rank=rank)
        except RuntimeError as e:
            if e.args and "recompile" in str(e.args[0]):
                raise DistSkip(TEST_SKIPS["backend_unavailable"]) from e
            raise
        device_ids = None
        if DEVICE_TYPE != "cpu":
            device_ids = [rank % DEVICE_COUNT]
            torch.accelerator.set_device_index(device_ids[0])
        # Every rank has its group before any test body (or skip) starts.
        dist.barrier(device_ids=device_ids)
        _compat.reset_dynamo()
        set_rng_seed()
        self.run_test(test_name, parent_pipe)
        _compat.reset_dynamo()
        dist.barrier(device_ids=device_ids)
        dist.destroy_process_group()


@unittest.skipIf(DEVICE_TYPE == "xpu", "the threaded FSDP base does not support XPU")
class FSDPTestMultiThread(MultiThreadedTestCase):
    """FSDP tests in ``world_size`` threads over the threaded group."""

    @property
    def world_size(self) -> int:
        return FSDP_WORLD_SIZE

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        """:func:`disttest.run_subtests` on this test."""
        run_subtests(self, *args, **kwargs)

    def perThreadSetUp(self) -> None:
        _compat.reset_dynamo()

    def perThreadTearDown(self) -> None:
        _compat.reset_dynamo()


class FSDPTestContinuous(FSDPTestMixin, MultiProcContinousTest):
    """FSDP tests in one pool of rank processes per class; the ranks meet at
    a barrier before and after every test (its group lives with the pool)."""

    world_size: int = FSDP_WORLD_SIZE

    @classmethod
    def backend_str(cls) -> str:
        return DISTRIBUTED_BACKEND

    # device_type() is inherited: MultiProcContinousTest's returns DEVICE_TYPE too.

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        os.environ["TORCH_NCCL_DESYNC_DEBUG"] = "0"  # a pool rank's own environment
        skip = _accelerator_skip(world_size)
        if skip is not None:
            raise skip
        if DEVICE_TYPE != "cpu":
            torch.accelerator.set_device_index(rank % DEVICE_COUNT)
        super()._init_pg(rank, world_size, rdvz_file)

    def setUp(self) -> None:
        super().setUp()
        if self.rank != self.MAIN_PROCESS_RANK and dist.is_initialized():
            dist.barrier()
        _compat.reset_dynamo()
        set_rng_seed()

    def tearDown(self) -> None:
        if self.rank != self.MAIN_PROCESS_RANK and dist.is_initialized():
            dist.barrier()
        super().tearDown()
        _compat.reset_dynamo()

    @property
    def process_group(self) -> Any:
        return type(self).pg


# --- patching collectives and FSDP2 internals -----------------------------------


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _patched(owner: Any, name: str, new: Callable[..., Any]) -> Iterator[None]:
    """Replace ``owner.name`` with ``new`` for the block. NB: with threaded
    ranks, a barrier after reading the original and one before restoring it
    keep every rank on the same function; the original is restored even when
    the closing barrier fails."""
    orig = getattr(owner, name)
    _barrier()
    setattr(owner, name, new)
    try:
        yield
    finally:
        try:
            _barrier()
        finally:
            setattr(owner, name, orig)


def patch_all_gather(new_all_gather_into_tensor: Callable[..., Any]) -> Any:
    """Replace ``dist.all_gather_single`` for the block."""
    return _patched(dist, "all_gather_single", new_all_gather_into_tensor)


def patch_reduce_scatter(new_reduce_scatter_tensor: Callable[..., Any]) -> Any:
    """Replace ``dist.reduce_scatter_single`` for the block."""
    return _patched(dist, "reduce_scatter_single", new_reduce_scatter_tensor)


def patch_all_reduce(new_all_reduce: Callable[..., Any]) -> Any:
    """Replace ``dist.all_reduce`` for the block."""
    return _patched(dist, "all_reduce", new_all_reduce)


def patch_foreach_all_gather(new_foreach_all_gather: Callable[..., Any]) -> Any:
    """Replace FSDP2's ``foreach_all_gather`` for the block."""
    return _patched(_compat.fsdp_param_group(), "foreach_all_gather", new_foreach_all_gather)


def patch_foreach_reduce(new_foreach_reduce: Callable[..., Any]) -> Any:
    """Replace FSDP2's ``foreach_reduce`` for the block."""
    return _patched(_compat.fsdp_param_group(), "foreach_reduce", new_foreach_reduce)


def patch_unshard(new_unshard: Callable[..., Any]) -> Any:
    """Replace ``FSDPParamGroup.unshard`` for the block."""
    return _patched(_compat.fsdp_param_group().FSDPParamGroup, "unshard", new_unshard)


def patch_reshard(new_reshard: Callable[..., Any]) -> Any:
    """Replace ``FSDPParamGroup.reshard`` for the block."""
    return _patched(_compat.fsdp_param_group().FSDPParamGroup, "reshard", new_reshard)


def patch_post_backward(new_post_backward: Callable[..., Any]) -> Any:
    """Replace ``FSDPParamGroup.post_backward`` for the block."""
    return _patched(_compat.fsdp_param_group().FSDPParamGroup, "post_backward", new_post_backward)


def patch_register_post_backward_hook_backward(new_backward: Callable[..., Any]) -> Any:
    """Replace ``RegisterPostBackwardFunction.backward`` for the block."""
    return _patched(_compat.fsdp_param_group().RegisterPostBackwardFunction, "backward", new_backward)


def reduce_scatter_with_assert(cls: Any, orig_reduce_scatter: Callable[..., Any],
                               assert_fn: Callable[[torch.Tensor], Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``assert_fn(output)`` on the reduce-scatter's output tensor, then
    the original reduce-scatter."""
    if args:
        output = args[0]
    elif "output" in kwargs:
        output = kwargs["output"]
    else:
        raise AssertionError(NO_OUTPUT.format(args=args, kwargs=kwargs))
    assert_fn(output)
    return orig_reduce_scatter(*args, **kwargs)


def check_sharded_parity(cls: Any, replicated_module: nn.Module, sharded_module: nn.Module,
                         prefixes_to_ignore: tuple[str, ...] = ()) -> None:
    """Assert that every parameter (and gradient) of ``sharded_module`` is the
    shard ``distribute_tensor`` makes of the same one of ``replicated_module``.

    ``cls`` is the test case. Parameter names are compared after removing
    ``prefixes_to_ignore``; a message names the parameter that differs.
    """
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    replicated = list(replicated_module.named_parameters())
    sharded = list(sharded_module.named_parameters())
    cls.assertEqual(len(sharded), len(replicated),
                    msg=f"check_sharded_parity: {len(replicated)} replicated parameters, "
                        f"{len(sharded)} sharded (disttest)")
    for (name, param), (sharded_name, sharded_param) in zip(replicated, sharded, strict=True):
        clean = sharded_name
        for prefix in prefixes_to_ignore:
            clean = clean.replace(prefix, "")
        cls.assertEqual(name, clean)
        if not isinstance(sharded_param, DTensor):
            raise AssertionError(NOT_DTENSOR.format(what="parameter", name=name,
                                                    type=type(sharded_param).__name__))
        mesh, placements = sharded_param.device_mesh, sharded_param.placements
        if tuple(placements) == (Shard(0), Shard(0)):
            raise AssertionError(SHARD_SHARD.format(name=name))
        ref = distribute_tensor(param, mesh, placements)
        cls.assertEqual(sharded_param.to_local(), ref.to_local(), msg=f"parameter {name!r} differs (disttest)")
        if param.grad is None:
            cls.assertIsNone(sharded_param.grad, msg=f"{name!r} has a gradient only when sharded (disttest)")
            continue
        cls.assertIsNotNone(sharded_param.grad, msg=f"{name!r} has no gradient when sharded (disttest)")
        if not isinstance(sharded_param.grad, DTensor):
            raise AssertionError(NOT_DTENSOR.format(what="gradient", name=name,
                                                    type=type(sharded_param.grad).__name__))
        ref_grad = distribute_tensor(param.grad, mesh, placements)
        cls.assertEqual(sharded_param.grad.to_local(), ref_grad.to_local(),
                        msg=f"gradient of {name!r} differs (disttest)")
