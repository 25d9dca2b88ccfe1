"""RPC internals: the RRef leak check and counters, the faulty agent."""

from __future__ import annotations

__unittest = True

__all__ = [
    "load_faulty_rpc_agent",
    "rpc_agent_running",
    "rref_debug_info",
    "set_rref_leak_check",
]


def rpc_agent_running() -> bool:
    """Whether this process has an RPC agent (``rpc.api._is_current_rpc_agent_set``):
    not before ``init_rpc``, nor after ``shutdown``."""
    import torch.distributed.rpc.api as api

    return bool(api._is_current_rpc_agent_set())


def set_rref_leak_check(enabled: bool) -> None:
    """Whether RPC reports leaked RRefs at shutdown (``rpc.api._ignore_rref_leak``)."""
    import torch.distributed.rpc.api as api

    api._ignore_rref_leak = not enabled


def rref_debug_info() -> dict[str, str]:
    """This node's RRef context counters (``rpc._rref_context_get_debug_info``)."""
    from torch.distributed.rpc import _rref_context_get_debug_info

    return dict(_rref_context_get_debug_info())


def load_faulty_rpc_agent() -> None:
    """Register the FAULTY_TENSORPIPE RPC backend (``rpc._testing``)."""
    import torch.distributed.rpc._testing  # noqa: F401
