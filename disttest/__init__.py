"""disttest: fast, hang-proof unittest base classes for torch.distributed.

Public API only: everything a test suite imports comes from here. Names
that upstream spells with a leading underscore (``_lock``, ``_FC2``...) are
kept as aliases of their public spelling so ported imports resolve.
"""

# ruff: noqa: F405  (__all__ names arrive by the star imports and __getattr__)
from __future__ import annotations

from typing import Any

from disttest import _moved
from disttest._runner.report import RankError, RankFailure, RankReport
from disttest.bases import backend
from disttest.bases.backend import *  # noqa: F403  (backend.__all__)
from disttest.bases.backend import _create_autograd_profiler, _create_torch_profiler
from disttest.config import DEFAULT_WORLD_SIZE, TIMEOUT_OVERRIDE, ConfigError, get_timeout
from disttest.faults import InjectedFault, inject_fault
from disttest.pg.fake import (
    AlreadyInitialized,
    FakeStore,
    MockProcessGroup,
    _create_fake_pg,
    create_mock_pg,
    mock_init_dist,
    register_fake_backend,
    with_dist,
    with_fake_comms,
)
from disttest.pg.threaded import (
    CollectiveAborted,
    CollectiveMismatch,
    CollectiveTimeout,
    InvalidArgument,
    ProcessLocalGroup,
    ThreadedWorld,
    _install_threaded_pg,
    _uninstall_threaded_pg,
    binop_reduce,
    bitwise_reduce,
)
from disttest.runners.case import TestCase, assert_equal, set_rng_seed
from disttest.runners.continuous import MultiProcContinousTest, MultiProcContinuousTest
from disttest.runners.main import run_tests
from disttest.runners.modes import MODE_ENV, MODES, run_in
from disttest.runners.multiprocess import DistributedTestBase, MultiProcessTestCase
from disttest.runners.multithread import MultiThreadedTestCase, spawn_threads_and_init_comms
from disttest.support import skips
from disttest.support.barrier import Barrier, BarrierTimeout, lock
from disttest.support.devices import (
    ACCELERATOR_DIST_BACKENDS,
    at_least_x_gpu,
    create_device,
    has_efa,
    init_multigpu_helper,
    tp_transports,
)
from disttest.support.helpers import (
    captured_output,
    run_subtests,
    verify_ddp_error_logged,
    with_dist_debug_levels,
    with_nccl_blocking_wait,
)
from disttest.support.models import (
    EXPECTED_FIELDS,
    FC2,
    BatchNormNet,
    ControlFlowToyModel,
    DDPUnevenTestInput,
    DictOutputModule,
    EmbeddingNetDifferentParams,
    Foo,
    LargeNet,
    Net,
    NetWithBuffers,
    SaveForwardInputsModel,
    SaveForwardInputsModule,
    Task,
    TestNamedTupleInput_0,
    TestNamedTupleInput_1,
    TwoLinLayerNet,
    UnusedParamTwoLinLayerNet,
    create_collectives_object_test_list,
)
from disttest.support.platform import (
    DDP_RANK_DEVICES,
    evaluate_platform_supports_symm_mem,
    logger,
    requires_ddp_rank,
    requires_multicast_support,
    requires_nccl_shrink,
    retrieve_result_from_completion_queue,
    skip_if_rocm_arch_multiprocess,
    skip_if_rocm_ver_atleast_multiprocess,
    skip_if_rocm_ver_lessthan_multiprocess,
    sm_is_or_higher_than,
)
from disttest.support.skips import *  # noqa: F403  (skips.__all__)
from disttest.support.stores import create_tcp_store, find_free_port, retry_on_connect_failures
from disttest.support.tempdirs import cleanup_temp_dir, initialize_temp_directories, rank_temp_file
from disttest.support.tensors import build_multidim_tensor, build_tensor, simple_sparse_reduce_tests

# Upstream's underscored spellings.
_FC2 = FC2
_build_multidim_tensor = build_multidim_tensor
_build_tensor = build_tensor
_lock = lock
_rank_temp_file = rank_temp_file

# The names of backend.py and skips.py are listed once, in their own __all__,
# and added below (the form type checkers read, as in asyncio/__init__.py).
__all__ = [
    "ACCELERATOR_DIST_BACKENDS",
    "AlreadyInitialized",
    "BN_NET",
    "BN_NET_NO_AFFINE",
    "Barrier",
    "BarrierTimeout",
    "BatchNormNet",
    "COLLECTIVES_OBJECT_TEST_LIST",
    "C10dTorchCommsTestBase",
    "CollectiveAborted",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConfigError",
    "ControlFlowToyModel",
    "DDPUnevenTestInput",
    "DDP_NET",
    "DDP_RANK_DEVICES",
    "DEFAULT_WORLD_SIZE",
    "DictOutputModule",
    "DistributedTestBase",
    "DynamoDistributedMultiProcTestCase",
    "DynamoDistributedSingleProcTestCase",
    "EFA_PROBE_RESULT",
    "EXPECTED_FIELDS",
    "EmbeddingNetDifferentParams",
    "FC2",
    "FakeProcessGroup",
    "FakeStore",
    "FaultyRpcAgentTestFixture",
    "FaultyRpcTestCase",
    "Foo",
    "HAS_ACCELERATOR",
    "INIT_METHOD_TEMPLATE",
    "InjectedFault",
    "InvalidArgument",
    "LargeNet",
    "MODES",
    "MODE_ENV",
    "MockProcessGroup",
    "MultiProcContinousTest",
    "MultiProcContinuousTest",
    "MultiProcessTestCase",
    "MultiThreadedTestCase",
    "Net",
    "NetWithBuffers",
    "ONLY_SBN_NET",
    "PLATFORM_SUPPORTS_SYMM_MEM",
    "ProcessLocalGroup",
    "RankError",
    "RankFailure",
    "RankReport",
    "RpcAgentTestFixture",
    "RpcTestCase",
    "SaveForwardInputsModel",
    "SaveForwardInputsModule",
    "SimulatedTestCase",
    "SpmdMixin",
    "TIMEOUT_DEFAULT",
    "TIMEOUT_OVERRIDE",
    "TORCHCOMM_HAS_GLOO",
    "TORCHCOMM_HAS_NCCL",
    "TORCHCOMM_HAS_NCCLX",
    "TORCHCOMM_HAS_RCCL",
    "TORCHCOMM_HAS_RCCLX",
    "TORCHCOMM_HAS_XCCL",
    "Task",
    "TensorPipeRpcAgentTestFixture",
    "TestCase",
    "TestNamedTupleInput_0",
    "TestNamedTupleInput_1",
    "ThreadedWorld",
    "TwoLinLayerNet",
    "UnusedParamTwoLinLayerNet",
    "WaitTimeout",
    "_FC2",
    "_build_multidim_tensor",
    "_build_tensor",
    "_create_autograd_profiler",
    "_create_fake_pg",
    "_create_torch_profiler",
    "_dynamo_dist_per_rank_init",
    "_install_threaded_pg",
    "_lock",
    "_rank_temp_file",
    "_uninstall_threaded_pg",
    "assert_equal",
    "at_least_x_gpu",
    "binop_reduce",
    "bitwise_reduce",
    "build_multidim_tensor",
    "build_tensor",
    "captured_output",
    "cleanup_temp_dir",
    "create_collectives_object_test_list",
    "create_device",
    "create_mock_pg",
    "create_tcp_store",
    "dist_init",
    "dynamo_dist_per_rank_init",
    "evaluate_platform_supports_symm_mem",
    "find_free_port",
    "get_function_event",
    "get_num_owners_and_forks",
    "get_timeout",
    "has_efa",
    "init_multigpu_helper",
    "initialize_pg",
    "initialize_temp_directories",
    "inject_fault",
    "lock",
    "logger",
    "mock_init_dist",
    "noop",
    "rank_temp_file",
    "register_fake_backend",
    "requires_ddp_rank",
    "requires_multicast_support",
    "requires_nccl_shrink",
    "retrieve_result_from_completion_queue",
    "retry_on_connect_failures",
    "run_in",
    "run_simulated",
    "run_subtests",
    "run_tests",
    "set_rng_seed",
    "setup_torchcomms_pg",
    "simple_sparse_reduce_tests",
    "skip_if_rocm_arch_multiprocess",
    "skip_if_rocm_ver_atleast_multiprocess",
    "skip_if_rocm_ver_lessthan_multiprocess",
    "sm_is_or_higher_than",
    "spawn_threads_and_init_comms",
    "tmp_dir",
    "tp_transports",
    "verify_ddp_error_logged",
    "wait_until_node_failure",
    "wait_until_owners_and_forks_on_rank",
    "wait_until_pending_futures_and_users_flushed",
    "with_dist",
    "with_dist_debug_levels",
    "with_fake_comms",
    "with_nccl_blocking_wait",
    "worker_name",
]
__all__ += backend.__all__
__all__ += skips.__all__
__all__.sort()

# Read on access, not at import: a bad DISTTEST_TIMEOUT fails the first test
# that needs it, the shared models are built only when asked for, and
# torch._dynamo (seconds to import) loads only for the dynamo test cases,
# torch.distributed.rpc only for the RPC helpers, and the simulated base
# only for simulated tests.
_LAZY_FROM = {
    "C10dTorchCommsTestBase": "disttest.bases.torchcomms",
    "EFA_PROBE_RESULT": "disttest.support.devices",
    "HAS_ACCELERATOR": "disttest.support.devices",
    "setup_torchcomms_pg": "disttest.bases.torchcomms",
    "PLATFORM_SUPPORTS_SYMM_MEM": "disttest.support.platform",
    "TORCHCOMM_HAS_GLOO": "disttest.support.platform",
    "TORCHCOMM_HAS_NCCL": "disttest.support.platform",
    "TORCHCOMM_HAS_NCCLX": "disttest.support.platform",
    "TORCHCOMM_HAS_RCCL": "disttest.support.platform",
    "TORCHCOMM_HAS_RCCLX": "disttest.support.platform",
    "TORCHCOMM_HAS_XCCL": "disttest.support.platform",
    "tmp_dir": "disttest.support.platform",
    "FakeProcessGroup": "disttest.pg.fake",
    "FaultyRpcAgentTestFixture": "disttest.bases.rpc",
    "FaultyRpcTestCase": "disttest.bases.rpc",
    "INIT_METHOD_TEMPLATE": "disttest.bases.rpc",
    "RpcAgentTestFixture": "disttest.bases.rpc",
    "RpcTestCase": "disttest.bases.rpc",
    "TensorPipeRpcAgentTestFixture": "disttest.bases.rpc",
    "WaitTimeout": "disttest.bases.rpc",
    "dist_init": "disttest.bases.rpc",
    "get_function_event": "disttest.bases.rpc",
    "get_num_owners_and_forks": "disttest.bases.rpc",
    "initialize_pg": "disttest.bases.rpc",
    "noop": "disttest.bases.rpc",
    "wait_until_node_failure": "disttest.bases.rpc",
    "wait_until_owners_and_forks_on_rank": "disttest.bases.rpc",
    "wait_until_pending_futures_and_users_flushed": "disttest.bases.rpc",
    "worker_name": "disttest.bases.rpc",
    "DynamoDistributedMultiProcTestCase": "disttest.bases.dynamo",
    "DynamoDistributedSingleProcTestCase": "disttest.bases.dynamo",
    "_dynamo_dist_per_rank_init": "disttest.bases.dynamo",
    "dynamo_dist_per_rank_init": "disttest.bases.dynamo",
    "TIMEOUT_DEFAULT": "disttest.config",
    "SimulatedTestCase": "disttest.bases.simulated",
    "SpmdMixin": "disttest.bases.simulated",
    "run_simulated": "disttest.bases.simulated",
    "BN_NET": "disttest.support.models",
    "BN_NET_NO_AFFINE": "disttest.support.models",
    "COLLECTIVES_OBJECT_TEST_LIST": "disttest.support.models",
    "DDP_NET": "disttest.support.models",
    "ONLY_SBN_NET": "disttest.support.models",
}


# The flat module paths of 0.1 (``disttest.fake``, ``disttest.multiprocess``...)
# import as the modules that moved into packages (see disttest/_moved.py).
_moved.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY_FROM:
        import importlib

        return getattr(importlib.import_module(_LAZY_FROM[name]), name)
    if name in _moved.MOVED:
        import importlib

        return importlib.import_module(f"disttest.{name}")
    raise AttributeError(f"module 'disttest' has no attribute {name!r}")
