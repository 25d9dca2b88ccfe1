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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from disttest._faults_rank import before_collective

__unittest = True

__all__ = [
    "Board", "InFlight", "MemoryBoard", "ProgressBoard", "find_desync", "install_tracking",
    "restart_counts", "track_into",
]

SLOT = 1024
_HEADER = struct.Struct("<IIB")  # seqlock version, payload length, state

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
# Point-to-point ops are not matched by a group's sequence: each direction is
# counted apart ("send>3": sends to rank 3, "recv<1": receives from rank 1,
# "recv<*": from any rank), so that a finished peer's counts tell whether it
# sent (or received) what a waiting rank needs.
P2P_GROUP = "p2p"
ANY = "*"


@dataclass(frozen=True)
class InFlight:
    """A collective a rank is waiting in."""

    rank: int
    op: str
    seq: int
    group: str
    peers: tuple[int, ...]

    def describe(self) -> str:
        if self.group.startswith(("send>", "recv<")):
            peer = self.group[5:]
            other = "any rank" if peer == ANY else f"rank {peer}"
            return f"{self.op} #{self.seq} {'to' if self.group[0] == 's' else 'from'} {other}"
        where = {DEFAULT_GROUP: "the default group", RENDEZVOUS_GROUP: "the rendezvous"}.get(
            self.group, f"group {self.group}")
        return f"{self.op} #{self.seq} of {where}"


IDLE, WAITING, FAILED = 0, 1, 2  # a slot's state


class _Reads:
    """What the parent asks of a board (both kinds)."""

    world_size: int

    def read(self, rank: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def in_flight(self, rank: int, include_failed: bool = False) -> InFlight | None:
        """The collective ``rank`` waits in; with ``include_failed``, also one
        that raised (for a rank that has ended)."""
        record = self.read(rank)
        if not record:
            return None
        state = record.get("state", IDLE)
        if state == IDLE or (state == FAILED and not include_failed):
            return None
        return InFlight(rank, record["op"], record["seq"], record["group"], tuple(record["peers"]))

    def counts(self, rank: int) -> dict[str, int]:
        record = self.read(rank)
        return dict(record.get("counts", {})) if record else {}


class MemoryBoard(_Reads):
    """A board for ranks that are threads: one record (a dict) per rank."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[dict[str, Any] | None] = [None] * world_size

    def write(self, rank: int, record: dict[str, Any]) -> None:
        self._slots[rank] = record

    def set_state(self, rank: int, state: int) -> None:
        record = self._slots[rank]
        if record is not None:
            record["state"] = state

    def read(self, rank: int) -> dict[str, Any] | None:
        return self._slots[rank]

    def close(self) -> None:
        pass


class ProgressBoard(_Reads):
    """A board in a file shared by rank processes: one fixed-size slot per
    rank (JSON record), written under a seqlock; the state has its own byte
    so that leaving a collective is a one-byte write."""

    def __init__(self, path: str, world_size: int, create: bool = False) -> None:
        self.path = path
        self.world_size = world_size
        if create:
            with open(path, "wb") as f:
                f.truncate(SLOT * world_size)
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SLOT * world_size)
        finally:
            os.close(fd)

    def _publish(self, rank: int, state: int, payload: bytes | None) -> None:
        base = rank * SLOT
        version, length, _ = _HEADER.unpack_from(self._map, base)
        _HEADER.pack_into(self._map, base, version + 1, length, state)  # odd: being written
        if payload is not None:
            length = len(payload)
            self._map[base + _HEADER.size : base + _HEADER.size + length] = payload
        _HEADER.pack_into(self._map, base, version + 2, length, state)

    def write(self, rank: int, record: dict[str, Any]) -> None:
        payload = json.dumps(record, separators=(",", ":")).encode()[: SLOT - _HEADER.size]
        self._publish(rank, record.get("state", IDLE), payload)

    def set_state(self, rank: int, state: int) -> None:
        self._publish(rank, state, None)

    def read(self, rank: int) -> dict[str, Any] | None:
        base = rank * SLOT
        for _ in range(50):
            v1, length, state = _HEADER.unpack_from(self._map, base)
            if v1 % 2:
                continue
            raw = bytes(self._map[base + _HEADER.size : base + _HEADER.size + length])
            if _HEADER.unpack_from(self._map, base)[0] == v1:
                if not length:
                    return None
                record: dict[str, Any] = json.loads(raw)
                record["state"] = state
                return record
        return None

    def close(self) -> None:
        self._map.close()


Board = ProgressBoard | MemoryBoard


def find_desync(board: Board, ranks: Iterable[int], finished: Iterable[int],
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
        if flight.group.startswith(("send>", "recv<")):
            peer = _p2p_abandoned(board, rank, flight, finished)
            if peer is not None:
                found.append((peer, flight))
            continue
        for peer in finished:
            if peer in flight.peers and peer != rank and (
                not entered_counts or board.counts(peer).get(flight.group, 0) < flight.seq
            ):
                found.append((peer, flight))
                break
    return found


def _p2p_abandoned(board: _Reads, rank: int, flight: InFlight, finished: list[int]) -> int | None:
    """The finished peer that leaves a waiting send/recv unmatched, or None."""
    direction, peer = flight.group[:5], flight.group[5:]
    if direction == "send>":
        dst = int(peer)
        if dst not in finished:
            return None
        got = board.counts(dst)
        return dst if got.get(f"recv<{rank}", 0) + got.get(f"recv<{ANY}", 0) < flight.seq else None
    mine = board.counts(rank)
    if peer != ANY:
        src = int(peer)
        if src not in finished:
            return None
        sent = board.counts(src).get(f"send>{rank}", 0)
        # Messages from src may also have gone to this rank's any-source recvs.
        return src if sent < flight.seq else None
    others = [p for p in range(board.world_size) if p != rank]
    if not all(p in finished for p in others):
        return None
    sent = sum(board.counts(p).get(f"send>{rank}", 0) for p in others)
    received = sum(v for k, v in mine.items() if k.startswith("recv<"))
    return others[0] if sent < received else None


# --- rank side ----------------------------------------------------------------


class _Tracker:
    def __init__(self, board: Board, rank: int) -> None:
        self.board = board
        self.rank = rank
        self.counts: dict[str, int] = {}
        self.depth = 0

    def enter(self, op: str, group: str, peers: list[int], waits: bool) -> None:
        self.counts[group] = self.counts.get(group, 0) + 1
        record = {"op": op, "seq": self.counts[group], "group": group, "peers": peers,
                  "counts": dict(self.counts), "state": WAITING if waits else IDLE}
        self.board.write(self.rank, record)

    def leave(self, failed: bool) -> None:
        # A failed collective keeps its record: the parent tells a desync
        # from a plain error by the collective a rank died in.
        self.board.set_state(self.rank, FAILED if failed else IDLE)


_local = threading.local()
_process_tracker: list[_Tracker] = []


def _current() -> _Tracker | None:
    tracker = getattr(_local, "tracker", None)
    if tracker is not None:
        return tracker
    return _process_tracker[0] if _process_tracker else None


def track_into(board: Board, rank: int, per_thread: bool = False) -> None:
    """Record this process's (or, with ``per_thread``, this thread's)
    collectives into ``board`` as ``rank``."""
    tracker = _Tracker(board, rank)
    if per_thread:
        _local.tracker = tracker
    else:
        _process_tracker[:] = [tracker]
    board.write(rank, {"counts": {}, "state": IDLE})


def restart_counts() -> None:
    """Count this rank's collectives from zero again (every rank of a pool
    does it at the start of each test, so numbers read per test)."""
    tracker = _current()
    if tracker is not None:
        tracker.counts = {}
        tracker.board.write(tracker.rank, {"counts": {}, "state": IDLE})


def _group_of(dist: Any, group: Any) -> tuple[str, list[int] | None]:
    from disttest import _compat

    if group is None or group is dist.GroupMember.WORLD:
        return DEFAULT_GROUP, None
    return _compat.group_name(group), dist.get_process_group_ranks(group)


def _getter(sig: inspect.Signature, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A fast reader of argument ``name`` (bind_partial costs ~10 us a call)."""
    params = list(sig.parameters)
    if name not in params:
        return lambda args, kwargs: None
    index = params.index(name)
    default = sig.parameters[name].default
    default = None if default is inspect.Parameter.empty else default

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if index < len(args) else default

    return get


def _wrap(dist: Any, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    get_group = _getter(sig, "group")
    get_async = _getter(sig, "async_op")
    peer_name = _P2P.get(name)
    get_peer = _getter(sig, peer_name) if peer_name else None
    get_group_peer = _getter(sig, "group_" + peer_name) if peer_name else None

    @functools.wraps(func)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        tracker = _current()
        if tracker is None or tracker.depth or not (dist.is_initialized() or name in _RENDEZVOUS):
            return func(*args, **kwargs)
        # Injected faults and schedule fuzzing (disttest.faults); before the
        # record, so that an injected raise is not counted as entered.
        after = before_collective(name, tracker.rank)
        try:
            ranks: list[int] | None
            if name in _RENDEZVOUS:
                group, ranks = RENDEZVOUS_GROUP, list(range(tracker.board.world_size))
            elif name == "batch_isend_irecv":
                group, ranks = P2P_GROUP, []
            else:
                group, ranks = _group_of(dist, get_group(args, kwargs))
            if ranks is None:
                ranks = list(range(dist.get_world_size()))
            if get_peer is not None and get_group_peer is not None:
                peer = get_peer(args, kwargs)
                peer = get_group_peer(args, kwargs) if peer is None else peer
                arrow = "send>" if peer_name == "dst" else "recv<"
                group = arrow + (ANY if peer is None else str(peer))
                ranks = ranks if peer is None else [peer]
            waits = name not in _ASYNC_ONLY and not get_async(args, kwargs)
            tracker.enter(name, group, ranks, waits)
        except Exception:  # never let bookkeeping break the user's call
            return func(*args, **kwargs)
        tracker.depth += 1
        failed = True
        try:
            result = func(*args, **kwargs)
            if after is not None:
                after(args, kwargs, result)
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
