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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from disttest._ops import COLLECTIVES, P2P_OPS

__unittest = True

__all__ = [
    "Board", "InFlight", "MemoryBoard", "ProgressBoard", "find_desync", "install_tracking",
    "restart_counts", "set_collective_hook", "track_into",
]

SLOT = 4096  # bytes per rank at least; more for wide worlds (slot_size)
_HEADER = struct.Struct("<IIB")  # seqlock version, payload length, state


def slot_size(world_size: int) -> int:
    """Bytes per rank: a record names up to every peer and counts sends and
    receives per peer (all-pairs point-to-point), so it grows with the world."""
    return max(SLOT, 64 * world_size + 1024)


def _runs(ranks: Sequence[int]) -> list[list[int]]:
    """``[0, 1, 2, 5]`` as ``[[0, 2], [5, 5]]``: 256 peers in a few bytes
    (a ``range``, a whole group, at no cost per rank)."""
    if isinstance(ranks, range) and ranks.step == 1:
        return [[ranks.start, ranks.stop - 1]] if ranks else []
    out: list[list[int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _unruns(runs: list[list[int]]) -> Sequence[int]:
    """The ranks of ``runs``: one run (a whole group) as a ``range``, which
    answers ``in`` at once however wide the world."""
    if len(runs) == 1:
        return range(runs[0][0], runs[0][1] + 1)
    return tuple(r for a, b in runs for r in range(a, b + 1))

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
    peers: Sequence[int]  # a range for a whole group

    def describe(self) -> str:
        if self.group.startswith(("send>", "recv<")):
            peer = self.group[5:]
            other = "any rank" if peer == ANY else f"rank {peer}"
            return f"{self.op} #{self.seq} {'to' if self.group[0] == 's' else 'from'} {other}"
        if self.group == WORLD_GROUP:
            return f"{self.op} #{self.seq} of the default group (counted by the threaded backend)"
        if self.group.startswith(RECORDER):
            key = self.group[len(RECORDER):]
            where = "the default group" if key == DEFAULT_GROUP else f"group {key}"
            return f"{self.op} #{self.seq} of {where} (seen by c10d's flight recorder)"
        where = {DEFAULT_GROUP: "the default group", RENDEZVOUS_GROUP: "the rendezvous"}.get(
            self.group, f"group {self.group}")
        return f"{self.op} #{self.seq} of {where}"


IDLE, WAITING, FAILED = 0, 1, 2  # a slot's state
RECORDER = "fr:"  # groups as the flight recorder counts them: "fr:default", "fr:<id>"
#: The default group as the threaded world counts its collectives (all of
#: them, also those issued from C++).
WORLD_GROUP = "threaded:default"


#: A collective seen only by the flight recorder counts as waited in once
#: the watcher has seen it pending this long, and saw it within FR_FRESH
#: seconds (the record of a live rank may lag behind the rank by a tick).
FR_SETTLE = 0.3
FR_FRESH = 1.0


def _recorded_flight(rank: int, record: dict[str, Any], world_size: int,
                     ended: bool = False) -> InFlight | None:
    """The collective the flight recorder says ``rank`` has enqueued and not
    completed, if any (the one with the lowest number: the one it waits in)."""
    import time

    waiting = [(v[0], key, v) for key, v in (record.get("fr") or {}).items() if v[0] > v[1] and v[2]]
    since, confirmed = record.get("fr_at") or (0.0, 0.0)
    if not waiting or confirmed - since < FR_SETTLE or (not ended and time.time() - confirmed > FR_FRESH):
        return None
    seq, key, (_, _, op, ranks) = min(waiting)
    peers = tuple(range(world_size)) if ranks is None else tuple(ranks)
    return InFlight(rank, op, seq, RECORDER + key, peers)


class _Reads:
    """What the parent asks of a board (both kinds)."""

    world_size: int

    def read(self, rank: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def in_flight(self, rank: int, include_failed: bool = False) -> InFlight | None:
        """The collective ``rank`` waits in; with ``include_failed``, also one
        that raised (for a rank that has ended). A collective disttest did
        not see called from Python (DDP's reducer, functional collectives)
        is found in the flight recorder's part of the record."""
        record = self.read(rank)
        if not record:
            return None
        state = record.get("state", IDLE)
        if state == IDLE or (state == FAILED and not include_failed) or "op" not in record:
            return _recorded_flight(rank, record, self.world_size, ended=include_failed)
        return InFlight(rank, record["op"], record["seq"], record["group"], _unruns(record["peers"]))

    def counts(self, rank: int) -> dict[str, int] | None:
        """How many collectives ``rank`` entered, per group (None: unknown)."""
        record = self.read(rank)
        if record is None:
            return {}
        if record.get("overflow"):
            return None
        counts = dict(record.get("counts", {}))
        for key, (enqueued, *_rest) in (record.get("fr") or {}).items():
            counts[RECORDER + key] = enqueued
        return counts


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


def _record_encoder() -> Callable[[Any], str]:
    """A record's JSON text, compact, as ``json.dumps(separators=(",", ":"))``
    gives it, at half its cost: one encoder for every write (``dumps`` makes
    a new one per call), and its C scanner made once (``encode`` remakes it
    per call). A record has no cycles, so no cycle check. Where the C
    encoder is missing or differs, the public one."""
    encoder = json.JSONEncoder(separators=(",", ":"))
    try:
        scan = json.encoder.c_make_encoder(  # type: ignore[attr-defined]  # C accelerator, untyped
            None, encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)

        def encode(record: Any) -> str:
            return "".join(scan(record, 0))

        sample = {"op": "all_reduce", "peers": [[0, 4]], "fr": None, "x": 1.5, "ok": True, "s": "\u00e9"}
        if encode(sample) == encoder.encode(sample):
            return encode
    except (AttributeError, TypeError):
        pass
    return encoder.encode


_encode = _record_encoder()


class ProgressBoard(_Reads):
    """A board in a file shared by rank processes: one fixed-size slot per
    rank (JSON record), written under a seqlock; the state has its own byte
    so that leaving a collective is a one-byte write."""

    def __init__(self, path: str, world_size: int, create: bool = False) -> None:
        self.path = path
        self.world_size = world_size
        self.slot = slot_size(world_size)
        if create:
            with open(path, "wb") as f:
                f.truncate(self.slot * world_size)
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, self.slot * world_size)
        finally:
            os.close(fd)

    def _publish(self, rank: int, state: int, payload: bytes | None) -> None:
        base = rank * self.slot
        version, length, _ = _HEADER.unpack_from(self._map, base)
        _HEADER.pack_into(self._map, base, version + 1, length, state)  # odd: being written
        if payload is not None:
            length = len(payload)
            self._map[base + _HEADER.size : base + _HEADER.size + length] = payload
        _HEADER.pack_into(self._map, base, version + 2, length, state)

    def write(self, rank: int, record: dict[str, Any]) -> None:
        payload = _encode(record).encode()
        if len(payload) > self.slot - _HEADER.size:
            # NB: never a cut JSON text. Without its counts the record still
            # says where the rank waits; desync judgements that need the
            # counts are not made for it (a hang is still caught).
            slim = {k: v for k, v in record.items() if k != "counts"}
            slim["overflow"] = True
            payload = _encode(slim).encode()[: self.slot - _HEADER.size]
        self._publish(rank, record.get("state", IDLE), payload)

    def set_state(self, rank: int, state: int) -> None:
        self._publish(rank, state, None)

    def read(self, rank: int) -> dict[str, Any] | None:
        base = rank * self.slot
        for _ in range(50):
            v1, length, state = _HEADER.unpack_from(self._map, base)
            if v1 % 2:
                continue
            raw = bytes(self._map[base + _HEADER.size : base + _HEADER.size + length])
            if _HEADER.unpack_from(self._map, base)[0] == v1:
                if not length:
                    return None
                try:
                    record: dict[str, Any] = json.loads(raw)
                except ValueError:
                    return None  # a rank that died mid-write: nothing known
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
    absent: dict[tuple[str, int, Sequence[int]], list[int]] = {}
    counts: dict[int, dict[str, int] | None] = {}
    for rank in ranks if finished else ():
        flight = board.in_flight(rank, include_failed=ended)
        if flight is None:
            continue
        if flight.group.startswith(("send>", "recv<")):
            peer = _p2p_abandoned(board, rank, flight, finished)
            if peer is not None:
                found.append((peer, flight))
            continue
        if flight.group.startswith(RECORDER):
            peer = _recorded_abandoned(board, rank, flight, finished, entered_counts)
            if peer is not None:
                found.append((peer, flight))
            continue
        # Ranks waiting in one collective share the answer: asked once per
        # collective, not once per rank (O(world), not O(world^2), a poll).
        key = (flight.group, flight.seq, flight.peers)
        if key not in absent:
            absent[key] = [peer for peer in finished if peer in flight.peers and _never_entered(
                counts, board, peer, flight, entered_counts)]
        peer = next((p for p in absent[key] if p != rank), None)
        if peer is not None:
            found.append((peer, flight))
    return found


def _never_entered(counts: dict[int, dict[str, int] | None], board: Board, peer: int, flight: InFlight,
                   entered_counts: bool) -> bool:
    """Whether ``peer`` never entered ``flight`` (without ``entered_counts``:
    whether it is known at all); ``counts`` caches what the board says."""
    if not entered_counts:
        return True
    if peer not in counts:
        counts[peer] = board.counts(peer)
    entered = counts[peer]
    return entered is not None and entered.get(flight.group, 0) < flight.seq


def _recorded_abandoned(board: _Reads, rank: int, flight: InFlight, finished: list[int],
                        entered_counts: bool) -> int | None:
    """The finished peer of a collective seen only by the flight recorder
    that leaves it waiting: the collective was still pending FR_SETTLE
    seconds after the peer's test ended. (The recorder's counters are not
    compared across ranks: point-to-point traffic can move them apart.)"""
    record = board.read(rank) or {}
    since, confirmed = record.get("fr_at") or (0.0, 0.0)
    for peer in finished:
        if peer == rank or peer not in flight.peers:
            continue
        if not entered_counts:
            return peer
        done = (board.read(peer) or {}).get("done_at", 0.0)
        if done and confirmed - max(since, done) >= FR_SETTLE:
            return peer
    return None


def _p2p_abandoned(board: _Reads, rank: int, flight: InFlight, finished: list[int]) -> int | None:
    """The finished peer that leaves a waiting send/recv unmatched, or None
    (also when a count it needs is unknown)."""
    direction, peer = flight.group[:5], flight.group[5:]
    if direction == "send>":
        dst = int(peer)
        got = board.counts(dst) if dst in finished else None
        if got is None:
            return None
        return dst if got.get(f"recv<{rank}", 0) + got.get(f"recv<{ANY}", 0) < flight.seq else None
    if peer != ANY:
        src = int(peer)
        sent_by = board.counts(src) if src in finished else None
        if sent_by is None:
            return None
        # Messages from src may also have gone to this rank's any-source recvs.
        return src if sent_by.get(f"send>{rank}", 0) < flight.seq else None
    others = [p for p in range(board.world_size) if p != rank]
    if not all(p in finished for p in others):
        return None
    counts = [board.counts(p) for p in [rank, *others]]
    if any(c is None for c in counts):
        return None
    mine, *theirs = counts
    sent = sum(c.get(f"send>{rank}", 0) for c in theirs if c is not None)
    received = sum(v for k, v in (mine or {}).items() if k.startswith("recv<"))
    return others[0] if sent < received else None


# --- rank side ----------------------------------------------------------------


class _Tracker:
    def __init__(self, board: Board, rank: int) -> None:
        self.board = board
        self.rank = rank
        self.counts: dict[str, int] = {}
        self._local = threading.local()  # each thread of a rank its own depth
        self._lock = threading.Lock()  # the rank's threads and its watcher write
        self.record: dict[str, Any] = {"counts": {}, "state": IDLE}
        self._pending: list[tuple[str, int]] = []  # flight-recorder collectives pending
        self._since = 0.0

    @property
    def depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @depth.setter
    def depth(self, value: int) -> None:
        self._local.depth = value

    def enter(self, op: str, group: str, peers: Sequence[int], waits: bool) -> None:
        self.counts[group] = self.counts.get(group, 0) + 1
        with self._lock:
            self.record = {"op": op, "seq": self.counts[group], "group": group, "peers": _runs(peers),
                           "counts": dict(self.counts), "state": WAITING if waits else IDLE,
                           "fr": self.record.get("fr"), "fr_at": self.record.get("fr_at")}
            self.board.write(self.rank, self.record)

    def leave(self, failed: bool) -> None:
        # A failed collective keeps its record: the parent tells a desync
        # from a plain error by the collective a rank died in.
        with self._lock:
            self.record["state"] = FAILED if failed else IDLE
            self.board.set_state(self.rank, self.record["state"])

    def reset(self) -> None:
        with self._lock:
            self.counts = {}
            self.record = {"counts": {}, "state": IDLE, "fr": self.record.get("fr"),
                           "fr_at": self.record.get("fr_at")}
            self.board.write(self.rank, self.record)

    def done(self) -> None:
        """The rank's test ended (its peers' desync judgement needs when)."""
        import time

        with self._lock:
            self.record["done_at"] = time.time()
            self.board.write(self.rank, self.record)

    def recorded(self, status: dict[str, list[Any]]) -> None:
        """Publish what the flight recorder says (from the watcher thread),
        with since when the same collectives are pending and when last seen."""
        import time

        now = time.time()
        pending = sorted((k, v[0]) for k, v in status.items() if v[0] > v[1])
        with self._lock:
            if pending != self._pending:
                self._pending, self._since = pending, now
            self.record["fr"] = status
            self.record["fr_at"] = [self._since, now]
            self.board.write(self.rank, self.record)


_TRACKED = (*COLLECTIVES, *P2P_OPS, *_RENDEZVOUS)

#: What the tracking wrapper asks as a rank enters a collective: ``(op,
#: rank) -> after or None``, where ``after(args, kwargs, result)`` runs once
#: the collective returned. Fault injection (:mod:`disttest.faults.rank`, a
#: layer above this core) sets it with :func:`set_collective_hook`.
CollectiveHook = Callable[[str, int], Callable[[tuple[Any, ...], dict[str, Any], Any], None] | None]
_hook: list[CollectiveHook] = []


def set_collective_hook(hook: CollectiveHook | None) -> None:
    """Make ``hook`` the one the tracking wrapper calls (None: no hook)."""
    _hook[:] = [hook] if hook is not None else []

_local = threading.local()
_process_tracker: list[_Tracker] = []


def _current() -> _Tracker | None:
    tracker: _Tracker | None = getattr(_local, "tracker", None)
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
    board.write(rank, tracker.record)


def untrack_thread() -> None:
    """Stop recording this thread's collectives (a rank thread whose test ended)."""
    _local.tracker = None


def restart_counts() -> None:
    """Count this rank's collectives from zero again (every rank of a pool
    does it at the start of each test, so numbers read per test)."""
    tracker = _current()
    if tracker is not None:
        tracker.reset()


def _group_of(dist: Any, group: Any) -> tuple[str, list[int] | None]:
    if group is None or group is dist.GroupMember.WORLD:
        return DEFAULT_GROUP, None
    from disttest import _compat

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
        if tracker is None:
            return func(*args, **kwargs)
        local = tracker._local  # this thread's depth (not the property: this runs per collective)
        depth = getattr(local, "depth", 0)
        if depth or not (dist.is_initialized() or name in _RENDEZVOUS):
            return func(*args, **kwargs)
        # Injected faults and schedule fuzzing (disttest.faults); before the
        # record, so that an injected raise is not counted as entered.
        after = _hook[0](name, tracker.rank) if _hook else None
        try:
            ranks: Sequence[int] | None
            # NB: a whole group is a range (O(1) to record): a list of every
            # rank would cost each rank O(world) per call.
            if name in _RENDEZVOUS:
                group, ranks = RENDEZVOUS_GROUP, range(tracker.board.world_size)
            elif name == "batch_isend_irecv":
                group, ranks = P2P_GROUP, []
            else:
                group, ranks = _group_of(dist, get_group(args, kwargs))
            if ranks is None:
                ranks = range(dist.get_world_size())
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
        local.depth = depth + 1
        failed = True
        try:
            result = func(*args, **kwargs)
            if after is not None:
                after(args, kwargs, result)
            failed = False
            return result
        finally:
            local.depth = depth
            tracker.leave(failed)

    tracked.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return tracked


_installed: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []  # (module, wrappers, originals)
_users = [0]
_wrappers: dict[str, tuple[Any, Any]] = {}  # name -> (c10d's function, its wrapper)
_plans: dict[int, tuple[Any, tuple[dict[str, Any], dict[str, Any]]]] = {}  # id(module) -> (key, plan)


def install_tracking() -> Callable[[], None]:
    """Wrap the collectives of ``torch.distributed``; return the undo.

    Counted: the wrappers stay until every install is undone. Pure Python,
    no tensor work: safe in a fork server before it forks.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _users[0] += 1
    if _users[0] == 1:
        plans = [(module, _plan(c10d, module)) for module in (c10d, dist)]
        for module, (wrappers, originals) in plans:
            vars(module).update(wrappers)
            _installed.append((module, wrappers, originals))
    done = [False]

    def undo() -> None:
        if done[0]:
            return
        done[0] = True
        _users[0] -= 1
        if _users[0] == 0:
            while _installed:
                module, wrappers, originals = _installed.pop()
                namespace = vars(module)
                if tuple(map(namespace.get, wrappers)) == tuple(wrappers.values()):
                    namespace.update(originals)
                    continue
                for name, tracked in wrappers.items():
                    if namespace.get(name) is tracked:  # not if someone replaced it since
                        setattr(module, name, originals[name])

    return undo


def _plan(c10d: Any, module: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The functions of ``module`` to wrap (those it holds as c10d does):
    ``({name: wrapper}, {name: function})``. NB: a threaded test installs
    and removes tracking every time: wrappers are made once per function
    (inspect.signature is slow) and the plan is reused while c10d and the
    module hold the same functions."""
    import torch.distributed as dist

    originals = tuple(map(vars(c10d).get, _TRACKED))
    now = tuple(map(vars(module).get, _TRACKED))
    cached = _plans.get(id(module))
    if cached is not None and cached[0] == (originals, now):
        return cached[1]
    wrappers, funcs = {}, {}
    for name, func, c10d_func in zip(_TRACKED, now, originals, strict=True):
        if func is None or func is not c10d_func or getattr(func, "__disttest_tracked__", False):
            continue
        wrapper = _wrappers.get(name)
        if wrapper is None or wrapper[0] is not func:
            wrapper = _wrappers[name] = (func, _wrap(dist, name, func))
        wrappers[name], funcs[name] = wrapper[1], func
    _plans[id(module)] = ((originals, now), (wrappers, funcs))
    return wrappers, funcs


#: Seconds between the flight-recorder watcher's looks (a rank waiting in a
#: collective issued from C++ is seen within this).
WATCH_INTERVAL = 0.05


def watch_flight_recorder() -> Callable[[], None]:
    """In a rank process: a daemon thread publishes what c10d's flight
    recorder knows (collectives issued from C++ too) into this process's
    record, every :data:`WATCH_INTERVAL` while a group exists. Returns
    ``publish``, to call with ``done=True`` when the rank's test ends (and
    ``look=False`` when it passed: peers are judged by their own record and
    by when this rank ended, never by a finished rank's recorder counts, so
    a passing rank skips the recorder's dump)."""
    from disttest import _compat

    last: list[Any] = [None]

    def publish(done: bool = False, look: bool = True) -> None:
        tracker = _process_tracker[0] if _process_tracker else None
        if done and tracker is not None:
            tracker.done()
        import torch.distributed as dist

        if tracker is None or not look or not dist.is_initialized():
            return
        status = _compat.flight_status()
        # While a collective is pending, every look is published: its time
        # tells the parent the record is fresh.
        if status is not None and (status != last[0] or any(v[0] > v[1] for v in status.values())):
            last[0] = status
            tracker.recorded(status)

    def loop() -> None:
        import time

        while True:
            time.sleep(WATCH_INTERVAL)
            try:
                publish()
            except Exception:  # noqa: BLE001,S110 (bookkeeping never breaks a rank)
                pass

    threading.Thread(target=loop, name="disttest flight watcher", daemon=True).start()
    return publish
