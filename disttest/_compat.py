"""Every touch of private torch API in disttest goes through this module.

Each function names the private API it uses, so that a torch upgrade that
moves one breaks here, in one place, and ``tests/test_compat.py`` says which.
"""

from __future__ import annotations

import sys

__unittest = True

__all__ = ["group_name", "reset_dynamo"]


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
