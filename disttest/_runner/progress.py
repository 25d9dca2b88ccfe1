"""Which collective each rank is in: the record behind desync reports.

A rank records, for each ``torch.distributed`` collective it enters, the
operation, its sequence number within the group and the group's ranks; and
per group, how many collectives it has entered. The record lives in a small
shared file (one fixed-size slot per rank, written under a seqlock) so that
the parent reads it at any time without the rank's help, also after the
rank has exited.

The parent's rule (:func:`find_desync`): a live rank that waits in
collective #k of group G, whose peer in G has exited having entered fewer
than k collectives of G, waits for a peer that will never come.

Only the outermost call is recorded (``all_gather_object`` calls
``all_gather``); ``async_op=True`` calls and ``isend``/``irecv`` count but do
not wait.
"""

from __future__ import annotations

import functools
import inspect
import json
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__unittest = True

__all__ = ["InFlight", "ProgressBoard", "find_desync", "install_tracking", "track_into"]

SLOT = 1024
_HEADER = struct.Struct("<II")  # seqlock version, payload length

# Collectives that wait for peers, with how their peers are found.
_COLLECTIVES = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "scatter", "gather", "barrier", "monitored_barrier", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list",
    "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base",
    "_reduce_scatter_base", "all_gather_single", "reduce_scatter_single",
)
_P2P = {"send": "dst", "recv": "src", "isend": "dst", "irecv": "src"}
_ASYNC_ONLY = {"isend", "irecv", "batch_isend_irecv"}
# Collective set-up: every rank must take part, so a peer that leaves breaks
# it; counted apart, so collective numbers read as the user counts them.
_RENDEZVOUS = ("init_process_group", "new_group")
DEFAULT_GROUP = "default"
RENDEZVOUS_GROUP = "rendezvous"


@dataclass(frozen=True)
class InFlight:
    """A collective a rank is waiting in."""

    rank: int
    op: str
    seq: int
    group: str
    peers: tuple[int, ...]

    def describe(self) -> str:
        where = {DEFAULT_GROUP: "the default group", RENDEZVOUS_GROUP: "the rendezvous"}.get(
            self.group, f"group {self.group}")
        return f"{self.op} #{self.seq} of {where}"


class ProgressBoard:
    """The shared slot file: one slot per rank. Both sides use it."""

    def __init__(self, path: str | None, world_size: int, create: bool = False) -> None:
        """A board in the file ``path`` (shared by processes), or in memory
        when ``path`` is None (shared by threads)."""
        self.path = path
        self.world_size = world_size
        if path is None:
            self._map = mmap.mmap(-1, SLOT * world_size)
            return
        if create:
            with open(path, "wb") as f:
                f.truncate(SLOT * world_size)
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SLOT * world_size)
        finally:
            os.close(fd)

    def write(self, rank: int, record: Mapping[str, Any]) -> None:
        payload = json.dumps(record, separators=(",", ":")).encode()[: SLOT - _HEADER.size]
        base = rank * SLOT
        version = _HEADER.unpack_from(self._map, base)[0]
        _HEADER.pack_into(self._map, base, version + 1, 0)  # odd: being written
        self._map[base + _HEADER.size : base + _HEADER.size + len(payload)] = payload
        _HEADER.pack_into(self._map, base, version + 2, len(payload))

    def read(self, rank: int) -> dict[str, Any] | None:
        base = rank * SLOT
        for _ in range(50):
            v1, length = _HEADER.unpack_from(self._map, base)
            if v1 % 2:
                continue
            raw = bytes(self._map[base + _HEADER.size : base + _HEADER.size + length])
            if _HEADER.unpack_from(self._map, base)[0] == v1:
                return json.loads(raw) if length else None
        return None

    def in_flight(self, rank: int, include_failed: bool = False) -> InFlight | None:
        """The collective ``rank`` waits in; with ``include_failed``, also one
        that raised (for a rank that has ended)."""
        record = self.read(rank)
        if not record or not record.get("op") or (record.get("failed") and not include_failed):
            return None
        return InFlight(rank, record["op"], record["seq"], record["group"], tuple(record["peers"]))

    def counts(self, rank: int) -> dict[str, int]:
        record = self.read(rank)
        return dict(record.get("counts", {})) if record else {}

    def close(self) -> None:
        self._map.close()


def find_desync(board: ProgressBoard, ranks: Iterable[int], finished: Iterable[int],
                ended: bool = False, entered_counts: bool = True) -> list[tuple[int, InFlight]]:
    """(peer, what the rank waits in) for each of ``ranks`` that waits in
    (or, with ``ended``, died in) a collective that a peer of ``finished``
    never entered (or, without ``entered_counts``, merely takes part in)."""
    finished = list(finished)
    found = []
    for rank in ranks if finished else ():
        flight = board.in_flight(rank, include_failed=ended)
        if flight is None:
            continue
        for peer in finished:
            if peer in flight.peers and peer != rank and (
                not entered_counts or board.counts(peer).get(flight.group, 0) < flight.seq
            ):
                found.append((peer, flight))
                break
    return found


# --- rank side ----------------------------------------------------------------


class _Tracker:
    def __init__(self, board: ProgressBoard, rank: int) -> None:
        self.board = board
        self.rank = rank
        self.counts: dict[str, int] = {}
        self.depth = 0

    def enter(self, op: str, group: str, peers: list[int], waits: bool) -> None:
        self.counts[group] = self.counts.get(group, 0) + 1
        record = {"op": op if waits else None, "seq": self.counts[group], "group": group,
                  "peers": peers, "counts": self.counts}
        self.board.write(self.rank, record)

    def leave(self, failed: bool) -> None:
        if failed:
            # Keep the record: the parent tells a desync from a plain error by
            # the collective a rank died in.
            record = self.board.read(self.rank) or {}
            self.board.write(self.rank, {**record, "failed": True, "counts": self.counts})
        else:
            self.board.write(self.rank, {"op": None, "counts": self.counts})


_local = threading.local()
_process_tracker: list[_Tracker] = []


def _current() -> _Tracker | None:
    tracker = getattr(_local, "tracker", None)
    if tracker is not None:
        return tracker
    return _process_tracker[0] if _process_tracker else None


def track_into(board: ProgressBoard, rank: int, per_thread: bool = False) -> None:
    """Record this process's (or, with ``per_thread``, this thread's)
    collectives into ``board`` as ``rank``."""
    tracker = _Tracker(board, rank)
    if per_thread:
        _local.tracker = tracker
    else:
        _process_tracker[:] = [tracker]
    board.write(rank, {"op": None, "counts": {}})


def _group_of(dist: Any, group: Any) -> tuple[str, list[int] | None]:
    from disttest import _compat

    if group is None or group is dist.GroupMember.WORLD:
        return DEFAULT_GROUP, None
    return _compat.group_name(group), dist.get_process_group_ranks(group)


def _wrap(dist: Any, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)

    @functools.wraps(func)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        tracker = _current()
        if tracker is None or tracker.depth or not (dist.is_initialized() or name in _RENDEZVOUS):
            return func(*args, **kwargs)
        try:
            bound = sig.bind_partial(*args, **kwargs).arguments
            ranks: list[int] | None
            if name in _RENDEZVOUS:
                group, ranks = RENDEZVOUS_GROUP, list(range(tracker.board.world_size))
            else:
                group, ranks = _group_of(dist, bound.get("group"))
            if ranks is None:
                ranks = list(range(dist.get_world_size()))
            if name in _P2P:
                peer = bound.get(_P2P[name], bound.get("group_" + _P2P[name]))
                ranks = ranks if peer is None else [peer]
            waits = name not in _ASYNC_ONLY and not bound.get("async_op", False)
            tracker.enter(name, group, ranks, waits)
        except Exception:  # never let bookkeeping break the user's call
            return func(*args, **kwargs)
        tracker.depth += 1
        failed = True
        try:
            result = func(*args, **kwargs)
            failed = False
            return result
        finally:
            tracker.depth -= 1
            tracker.leave(failed)

    tracked.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return tracked


def install_tracking() -> None:
    """Wrap the collectives of ``torch.distributed`` (idempotent).

    Pure Python, no tensor work: safe in a fork server before it forks.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in (*_COLLECTIVES, *_P2P, "batch_isend_irecv", *_RENDEZVOUS):
        func = getattr(c10d, name, None)
        if func is None or getattr(func, "__disttest_tracked__", False):
            continue
        tracked = _wrap(dist, name, func)
        setattr(c10d, name, tracked)
        if getattr(dist, name, None) is func:
            setattr(dist, name, tracked)
