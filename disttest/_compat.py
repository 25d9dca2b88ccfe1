"""Every touch of private torch API in disttest goes through this module.

Each function names the private API it uses, so that a torch upgrade that
moves one breaks here, in one place, and ``tests/test_compat.py`` says which.
"""

from __future__ import annotations

import sys
from typing import Any

__unittest = True

__all__ = [
    "dynamo_config_patch",
    "ensure_fake_backend",
    "group_name",
    "remove_dynamo_trace_handler",
    "reset_dynamo",
    "silence_dynamo_trace_log",
]


def reset_dynamo() -> None:
    """``torch._dynamo.reset()`` and clear its counters, if dynamo is loaded.

    Does nothing when no code imported ``torch._dynamo`` (importing it only
    to reset it would cost seconds).
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    dynamo.reset()
    dynamo.utils.counters.clear()


def group_name(group: object) -> str:
    """The name c10d gives a process group (``ProcessGroup.group_name``,
    else ``distributed_c10d._get_process_group_name``)."""
    name = getattr(group, "group_name", None)
    if name is None:
        from torch.distributed import distributed_c10d

        name = distributed_c10d._get_process_group_name(group)  # type: ignore[arg-type]
    return str(name)


def ensure_fake_backend() -> None:
    """Register c10d's ``fake`` backend (``FakeProcessGroup``), once.

    torch names the backend (``Backend.FAKE``) but only its private test
    utilities register it; this does the same through the private
    ``FakeProcessGroup._create_internal``.
    """
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    if dist.Backend.FAKE.upper() in dist.Backend._plugins:
        return

    def create(common_opts: Any, backend_opts: Any) -> Any:
        return FakeProcessGroup._create_internal(  # type: ignore[call-arg]
            common_opts.group_rank, common_opts.group_size, backend_opts
        )

    dist.Backend.register_backend(
        dist.Backend.FAKE, create, extended_api=True, devices=["cpu", "cuda", "hpu", "xpu"]
    )


def dynamo_config_patch(**changes: Any) -> Any:
    """``torch._dynamo.config.patch(**changes)`` (a context manager)."""
    import torch._dynamo

    return torch._dynamo.config.patch(**changes)


def silence_dynamo_trace_log() -> Any:
    """Add a NullHandler to torch's trace log (as dynamo's TestCase does);
    return the handler so the caller can remove it."""
    import logging

    from torch._logging._internal import trace_log

    handler = logging.NullHandler()
    trace_log.addHandler(handler)
    return handler


def remove_dynamo_trace_handler(handler: Any) -> None:
    from torch._logging._internal import trace_log

    trace_log.removeHandler(handler)
