"""FSDP internals (FSDP1's runtime and hybrid strategies, FSDP2's param
group) and the composable activation checkpoint."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "activation_checkpoint",
    "assert_fsdp_idle",
    "fsdp_param_group",
    "fsdp_runtime_utils",
    "hybrid_sharding_strategies",
    "no_reshard_after_forward_strategies",
]


def hybrid_sharding_strategies() -> set[Any]:
    """FSDP1's hybrid strategies (``ShardingStrategy._HYBRID_SHARD_ZERO2`` is private)."""
    from torch.distributed.fsdp import ShardingStrategy

    found = {ShardingStrategy.HYBRID_SHARD}
    zero2 = getattr(ShardingStrategy, "_HYBRID_SHARD_ZERO2", None)
    if zero2 is not None:
        found.add(zero2)
    return found


def activation_checkpoint() -> Any:
    """The composable ``checkpoint`` (``torch.distributed._composable``)."""
    from torch.distributed._composable import checkpoint

    return checkpoint


def fsdp_param_group() -> Any:
    """FSDP2's private param-group module
    (``torch.distributed.fsdp._fully_shard._fsdp_param_group``: ``FSDPParamGroup``,
    ``RegisterPostBackwardFunction``, ``foreach_all_gather``, ``foreach_reduce``)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as module

    return module


def fsdp_runtime_utils() -> Any:
    """FSDP1's private runtime module (``torch.distributed.fsdp._runtime_utils``:
    ``_reshard``)."""
    import torch.distributed.fsdp._runtime_utils as module

    return module


def no_reshard_after_forward_strategies() -> tuple[Any, ...]:
    """FSDP1's sharding strategies that keep parameters unsharded after the
    forward pass (``torch.distributed.fsdp._init_utils.NO_RESHARD_AFTER_FORWARD_STRATEGIES``)."""
    from torch.distributed.fsdp._init_utils import NO_RESHARD_AFTER_FORWARD_STRATEGIES

    return tuple(NO_RESHARD_AFTER_FORWARD_STRATEGIES)


def assert_fsdp_idle(model: Any) -> None:
    """Raise unless the FSDP1 module ``model`` is idle (between passes:
    ``_assert_state(TrainingState.IDLE)``, both private)."""
    from torch.distributed.fsdp._common_utils import TrainingState

    model._assert_state(TrainingState.IDLE)
