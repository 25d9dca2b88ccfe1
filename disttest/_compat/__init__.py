"""Every touch of private torch API in disttest goes through this package,
and so does every public torch API that only newer releases have.

Each function names the private API it uses, so that a torch upgrade that
moves one breaks here, in one place, and ``tests/test_compat.py`` says which.
``TORCH_FEATURES`` names each version-dependent API with the first torch
release that has it; ``missing_feature`` turns a missing one into the reason
a test skips ("needs torch >= 2.10").

The rest of disttest imports the package only (``from disttest import
_compat``; ``_compat.name(...)``), which re-exports every name of its modules,
one per concern:

- :mod:`.versions`: the installed torch's version and version-dependent API;
- :mod:`.devices`: the accelerator, the current device, CUDA internals;
- :mod:`.backends`: c10d backend registration (with its undo), the ``fake``
  backend, torchcomms;
- :mod:`.c10d`: the default group, c10d's registry of groups, thread
  isolation, reduce ops, functional collectives;
- :mod:`.flight_recorder`: what c10d's flight recorder knows;
- :mod:`.dynamo`: dynamo, inductor, Triton;
- :mod:`.dtensor`: DTensor's specs, redistribution, sharding propagation;
- :mod:`.fsdp`, :mod:`.checkpoint`, :mod:`.rpc`: those subsystems' internals;
- :mod:`.tensors`: pytree, functional and sparse tensors, tolerances;
- :mod:`.local_mode`: torch's local-tensor mode;
- :mod:`.local_speedups`: faster equivalents of parts of it, installed per test.

NB: a test patches a name on this package (``mock.patch.object(_compat,
"local_tensor", ...)``); the modules here that read ``local_tensor`` and
``_SPEEDUP_FINGERPRINTS`` look them up on the package, so such a patch
reaches them as well.
"""

from __future__ import annotations

from disttest._compat.backends import (
    backend_creator,
    ensure_fake_backend,
    fake_process_group,
    future_class,
    install_fake_backend,
    register_backend,
    register_python_group_backend,
    registered_backend_names,
    torchcomms_process_group,
    use_torchcomms,
    work_base,
)
from disttest._compat.c10d import (
    adopt_thread_world_state,
    c10d_logger,
    c10d_world,
    default_group,
    default_store,
    functional_collectives,
    functional_group,
    group_name,
    group_timeout,
    new_c10d_world,
    premul_sum,
    reduce_op_parts,
    set_c10d_world,
    set_group_timeout,
    set_thread_isolation,
    skip_store_barriers,
    thread_local_modes,
    thread_world_state,
    wait_tensor,
)
from disttest._compat.checkpoint import (
    checkpoint_extension,
    gather_state_dict,
    shard_api,
    shard_chunk_sizes,
)
from disttest._compat.devices import (
    accelerator_count,
    accelerator_type,
    clear_cublas_workspaces,
    cuda_multicast_support,
    cuda_sleep,
    default_backend_for_device,
    nvml_device_count,
    privateuse1_backend_name,
    set_device_index,
)
from disttest._compat.dtensor import (
    clear_sharding_prop_cache,
    concatenate_meshes,
    dtensor_sharding_prop_lock,
    dtensor_spec,
    redistribute_local_tensor,
    register_op_strategy,
    reset_dtensor_rng_tracker,
    set_dtensor_spec,
    shard_order_entry,
    sharding_propagator,
    strategy_tables,
    use_shard_order_spec,
)
from disttest._compat.dynamo import (
    dynamo_config_patch,
    dynamo_test_config,
    dynamo_test_state,
    enable_saved_tensors_hooks,
    has_triton,
    inductor_config,
    preload_dynamo,
    remove_dynamo_trace_handler,
    reset_dynamo,
    silence_dynamo_trace_log,
)
from disttest._compat.flight_recorder import (
    flight_status,
)
from disttest._compat.fsdp import (
    activation_checkpoint,
    assert_fsdp_idle,
    fsdp_param_group,
    fsdp_runtime_utils,
    hybrid_sharding_strategies,
    no_reshard_after_forward_strategies,
)
from disttest._compat.local_mode import (
    LOCAL_TENSOR_MISSING,
    PLAIN_WITH_RANK,
    install_rank_answers,
    local_int_values,
    local_tensor,
    local_tensor_shards,
)
from disttest._compat.local_speedups import _SPEEDUP_FINGERPRINTS as _SPEEDUP_FINGERPRINTS
from disttest._compat.local_speedups import (
    LOCAL_TENSOR_SPEEDUPS,
    SIMULATED_RANK,
    UNKNOWN_SPEEDUP,
    install_local_tensor_speedups,
    local_tensor_speedups_available,
)
from disttest._compat.local_speedups import _closed_form_coordinate as _closed_form_coordinate
from disttest._compat.local_speedups import _compile_unflatten as _compile_unflatten
from disttest._compat.local_speedups import (
    _coordinates_cached_by_value as _coordinates_cached_by_value,
)
from disttest._compat.local_speedups import _one_pass_tensor_meta as _one_pass_tensor_meta
from disttest._compat.rpc import (
    load_faulty_rpc_agent,
    rpc_agent_running,
    rref_debug_info,
    set_rref_leak_check,
)
from disttest._compat.tensors import (
    comparison,
    default_tolerances,
    dispatch_modes,
    drop_function_modes,
    enable_record_function,
    fp32_precision,
    function_mode_depth,
    function_state,
    function_state_enabled,
    is_functional_tensor,
    lazy_dtensor_comparison,
    mark_uncoalesced,
    pytree,
    restore_function_state,
    script_containers,
    set_fp32_precision,
    sparse_coo_raw,
    typed_storage_bytes,
    unwrap_dtensors,
)
from disttest._compat.versions import FEATURE_MISSING as FEATURE_MISSING
from disttest._compat.versions import (
    TORCH_FEATURES,
    has_feature,
    missing_feature,
    torch_at_least,
    torch_version,
)

__unittest = True

__all__ = [
    "LOCAL_TENSOR_MISSING",
    "LOCAL_TENSOR_SPEEDUPS",
    "PLAIN_WITH_RANK",
    "SIMULATED_RANK",
    "TORCH_FEATURES",
    "UNKNOWN_SPEEDUP",
    "accelerator_count",
    "accelerator_type",
    "activation_checkpoint",
    "adopt_thread_world_state",
    "assert_fsdp_idle",
    "backend_creator",
    "c10d_logger",
    "c10d_world",
    "checkpoint_extension",
    "clear_cublas_workspaces",
    "clear_sharding_prop_cache",
    "comparison",
    "concatenate_meshes",
    "cuda_multicast_support",
    "cuda_sleep",
    "default_backend_for_device",
    "default_group",
    "default_store",
    "default_tolerances",
    "dispatch_modes",
    "drop_function_modes",
    "dtensor_sharding_prop_lock",
    "dtensor_spec",
    "dynamo_config_patch",
    "dynamo_test_config",
    "dynamo_test_state",
    "enable_record_function",
    "enable_saved_tensors_hooks",
    "ensure_fake_backend",
    "fake_process_group",
    "flight_status",
    "fp32_precision",
    "fsdp_param_group",
    "fsdp_runtime_utils",
    "function_mode_depth",
    "function_state",
    "function_state_enabled",
    "functional_collectives",
    "functional_group",
    "future_class",
    "gather_state_dict",
    "group_name",
    "group_timeout",
    "has_feature",
    "has_triton",
    "hybrid_sharding_strategies",
    "inductor_config",
    "install_fake_backend",
    "install_local_tensor_speedups",
    "install_rank_answers",
    "is_functional_tensor",
    "lazy_dtensor_comparison",
    "load_faulty_rpc_agent",
    "local_int_values",
    "local_tensor",
    "local_tensor_shards",
    "local_tensor_speedups_available",
    "mark_uncoalesced",
    "missing_feature",
    "new_c10d_world",
    "no_reshard_after_forward_strategies",
    "nvml_device_count",
    "preload_dynamo",
    "premul_sum",
    "privateuse1_backend_name",
    "pytree",
    "redistribute_local_tensor",
    "reduce_op_parts",
    "register_backend",
    "register_op_strategy",
    "register_python_group_backend",
    "registered_backend_names",
    "remove_dynamo_trace_handler",
    "reset_dtensor_rng_tracker",
    "reset_dynamo",
    "restore_function_state",
    "rpc_agent_running",
    "rref_debug_info",
    "script_containers",
    "set_c10d_world",
    "set_device_index",
    "set_dtensor_spec",
    "set_fp32_precision",
    "set_group_timeout",
    "set_rref_leak_check",
    "set_thread_isolation",
    "shard_api",
    "shard_chunk_sizes",
    "shard_order_entry",
    "sharding_propagator",
    "silence_dynamo_trace_log",
    "skip_store_barriers",
    "sparse_coo_raw",
    "strategy_tables",
    "thread_local_modes",
    "thread_world_state",
    "torch_at_least",
    "torch_version",
    "torchcomms_process_group",
    "typed_storage_bytes",
    "unwrap_dtensors",
    "use_shard_order_spec",
    "use_torchcomms",
    "wait_tensor",
    "work_base",
]
