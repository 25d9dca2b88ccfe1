"""Sharded tensors (``torch.distributed._shard``) and distributed
checkpoint internals (its extensions, gathering a state dict)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__unittest = True

__all__ = [
    "checkpoint_extension",
    "gather_state_dict",
    "shard_api",
    "shard_chunk_sizes",
]


def shard_api() -> Any:
    """torch's sharded-tensor package (``torch.distributed._shard``), with its
    ``sharded_tensor`` (``ShardedTensor``, ``rand``...) and ``sharding_spec``
    (``ChunkShardingSpec``, ``EnumerableShardingSpec``, ``ShardMetadata``)
    modules imported."""
    import torch.distributed._shard as module
    import torch.distributed._shard.sharded_tensor
    import torch.distributed._shard.sharding_spec  # noqa: F401  (loads the attribute)

    return module


def shard_chunk_sizes() -> tuple[Callable[[int, int], int], Callable[[int, int, int], int]]:
    """``(get_split_size, get_chunked_dim_size)`` of
    ``torch.distributed._shard.sharding_spec._internals``: how
    ``ChunkShardingSpec`` sizes its chunks."""
    from torch.distributed._shard.sharding_spec._internals import (
        get_chunked_dim_size,
        get_split_size,
    )

    return get_split_size, get_chunked_dim_size


def checkpoint_extension() -> Any:
    """Distributed checkpoint's private extension module
    (``torch.distributed.checkpoint._extension``: ``ExtensionRegistry``,
    ``StreamTransformExtension``)."""
    import torch.distributed.checkpoint._extension as module

    return module


def gather_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``torch.distributed._state_dict_utils._gather_state_dict``: the state dict
    with every DTensor and ShardedTensor gathered into a full tensor
    (collective over their groups)."""
    from torch.distributed._state_dict_utils import _gather_state_dict

    return _gather_state_dict(state_dict)
