"""DTensor internals: a DTensor's spec and shard order, redistribution of
one rank's shard, the sharding propagator and its op strategies, the random
state tracker, mesh concatenation."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "clear_sharding_prop_cache",
    "concatenate_meshes",
    "dtensor_sharding_prop_lock",
    "dtensor_spec",
    "redistribute_local_tensor",
    "register_op_strategy",
    "reset_dtensor_rng_tracker",
    "set_dtensor_spec",
    "shard_order_entry",
    "sharding_propagator",
    "strategy_tables",
    "use_shard_order_spec",
]


def dtensor_sharding_prop_lock(lock: Any | None = None) -> Any:
    """DTensor's ``ShardingPropagator._fake_mode_lock`` (a no-op lock unless
    threads share the propagator); with ``lock``, set it and return the old one."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    old = ShardingPropagator._fake_mode_lock
    if lock is not None:
        ShardingPropagator._fake_mode_lock = lock
    return old


def reset_dtensor_rng_tracker() -> None:
    """Forget DTensor's random-state tracker (``tensor._random._rng_tracker``)."""
    from torch.distributed.tensor import _random

    _random._rng_tracker = None


def shard_order_entry() -> type:
    """DTensor's ``ShardOrderEntry(tensor_dim, mesh_dims)``
    (``torch.distributed.tensor._dtensor_spec``)."""
    from torch.distributed.tensor._dtensor_spec import ShardOrderEntry

    return ShardOrderEntry


def dtensor_spec(dt: Any) -> Any:
    """A DTensor's spec (``DTensor._spec``: mesh, placements, shard order)."""
    return dt._spec


def set_dtensor_spec(dt: Any, spec: Any) -> None:
    """Replace a DTensor's spec (``DTensor._spec``)."""
    dt._spec = spec


def use_shard_order_spec(dt: Any) -> None:
    """Make a DTensor's spec keep an explicit shard order instead of reading
    one from ``_StridedShard`` placements (``DTensorSpec.__post_init__``)."""
    spec = dt._spec
    spec.use_strided_shard_as_shard_order = False
    spec.__post_init__()


def redistribute_local_tensor(local: Any, current_spec: Any, target_spec: Any,
                              use_graph_based_transform: bool | None = None) -> Any:
    """One rank's shard moved from ``current_spec`` to ``target_spec``
    (``torch.distributed.tensor._redistribute.redistribute_local_tensor``)."""
    from torch.distributed.tensor._redistribute import redistribute_local_tensor as move

    return move(local, current_spec, target_spec, use_graph_based_transform=use_graph_based_transform)


def sharding_propagator() -> Any:
    """DTensor's sharding propagator (``DTensor._op_dispatcher.sharding_propagator``:
    ``op_strategy_funcs``, ``op_to_schema_info``)."""
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def strategy_tables() -> list[dict[Any, Any]]:
    """The sharding propagator's tables that say how an op shards: its
    strategy functions and their schema info, and, where torch has them
    (2.14), its single-mesh-dim strategies and theirs, which it looks up
    first (``op_single_dim_strategy_funcs``,
    ``op_to_schema_info_for_single_dim_strategy``)."""
    propagator = sharding_propagator()
    names = ("op_strategy_funcs", "op_to_schema_info", "op_single_dim_strategy_funcs",
             "op_to_schema_info_for_single_dim_strategy")
    return [getattr(propagator, name) for name in names if hasattr(propagator, name)]


def register_op_strategy(op: Any, strategy_func: Any, schema_info: Any = None) -> None:
    """Register ``strategy_func`` as DTensor's strategy for ``op``
    (``torch.distributed.tensor._ops.utils.register_op_strategy``)."""
    from torch.distributed.tensor._ops.utils import register_op_strategy as register

    register(op, schema_info=schema_info)(strategy_func)


def clear_sharding_prop_cache() -> None:
    """Clear DTensor's sharding-propagation caches
    (``torch.distributed.tensor.debug._clear_sharding_prop_cache``)."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # type: ignore[no-untyped-call]  # torch: unannotated


def concatenate_meshes(meshes: list[Any]) -> Any:
    """One DeviceMesh over the dimensions of ``meshes``, slices of one mesh
    (``DeviceMesh._concatenate``)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh._concatenate(meshes)
