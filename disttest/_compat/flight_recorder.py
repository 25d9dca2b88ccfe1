"""What c10d's flight recorder knows of this process's groups: the
collectives each has enqueued and completed (desync reports read it)."""

from __future__ import annotations

from typing import Any

__unittest = True

__all__ = [
    "flight_status",
]


def flight_status() -> dict[str, list[Any]] | None:
    """What c10d's flight recorder knows of this process's groups, per group:
    ``{key: [enqueued, completed, op of the enqueued one, ranks or None]}``,
    ``key`` "default" for the default group, else the group's id; None when
    this torch has no recorder or it is off (``TORCH_FR_BUFFER_SIZE``).

    Reads ``torch._C._distributed_c10d._dump_fr_trace_json`` (private): the
    recorder sees every collective a backend runs, also those issued from
    C++ (DDP's reducer) and functional collectives.
    """
    import json

    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        # Counts first (cheap); the entries only when a collective is pending.
        dump = json.loads(_dump_fr_trace_json(False, True))
        pending = any(int(v.get("last_enqueued_collective", 0)) > int(v.get("last_completed_collective", 0))
                      for v in (dump.get("pg_status") or {}).values())
        if pending:
            dump = json.loads(_dump_fr_trace_json(True, True))
    except Exception:  # noqa: BLE001 (no recorder: nothing known)
        return None
    ops: dict[str, tuple[int, str, str]] = {}
    for entry in dump.get("entries") or ():
        if entry.get("is_p2p") or entry.get("retired"):
            continue
        pg = str(entry.get("pg_id"))
        seq = int(entry.get("collective_seq_id", 0))
        name, desc = (list(entry.get("process_group") or ["", ""]) + ["", ""])[:2]
        if seq >= ops.get(pg, (0, "", ""))[0]:
            op = str(entry.get("profiling_name", "")).split(":")[-1]
            ops[pg] = (seq, op, desc if desc == "default_pg" else name)
    configs = dump.get("pg_config") or {}
    status: dict[str, list[Any]] = {}
    for pg, state in (dump.get("pg_status") or {}).items():
        enqueued = int(state.get("last_enqueued_collective", 0))
        completed = int(state.get("last_completed_collective", 0))
        _, op, name = ops.get(pg, (0, "", ""))
        ranks: Any = None
        if name != "default_pg":
            config = configs.get(name)
            if config is None:
                continue  # a group whose ranks are unknown is not judged
            ranks = json.loads(config.get("ranks", "null"))
        status["default" if name == "default_pg" or pg == "0" else pg] = [enqueued, completed, op, ranks]
    return status
