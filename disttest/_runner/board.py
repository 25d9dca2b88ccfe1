"""The progress board: where each rank records the collective it is in.

One slot per rank holds a small record (the operation, its number within its
group, the group's ranks, the rank's counts per group, what c10d's flight
recorder saw): a dict for ranks that are threads (:class:`MemoryBoard`), a
fixed-size slot of a shared file written under a seqlock for ranks that are
processes (:class:`ProgressBoard`), which the parent reads at any time
without the rank's help, also after the rank has exited. The rank writes it
(:mod:`~disttest._runner.tracking`); the parent judges it
(:mod:`~disttest._runner.progress`).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__unittest = True

__all__ = ["ANY", "DEFAULT_GROUP", "FAILED", "IDLE", "RECORDER", "RENDEZVOUS_GROUP", "WAITING", "WORLD_GROUP", "Board",
           "InFlight", "MemoryBoard", "ProgressBoard", "p2p_key", "slot_size"]

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


DEFAULT_GROUP = "default"
RENDEZVOUS_GROUP = "rendezvous"
# Point-to-point ops are not matched by a group's sequence: each direction is
# counted apart ("send>3": sends to rank 3, "recv<1": receives from rank 1,
# "recv<*": from any rank), so that a finished peer's counts tell whether it
# sent (or received) what a waiting rank needs.
P2P_GROUP = "p2p"
ANY = "*"


def p2p_key(direction: str, peer: str, tag: Any) -> str:
    """The count key of a point-to-point call: ``send>3`` (to rank 3, tag
    0), ``recv<1#7`` (from rank 1, tag 7), ``recv<*`` (from any rank):
    only calls with the same tag match."""
    return f"{direction}{peer}#{tag}" if tag else f"{direction}{peer}"


def _p2p_parts(group: str) -> tuple[str, str, str]:
    """``recv<1#7`` as ``("recv<", "1", "#7")`` (direction, peer, tag suffix)."""
    peer, _, tag = group[5:].partition("#")
    return group[:5], peer, "#" + tag if tag else ""


@dataclass(frozen=True)
class InFlight:
    """A collective a rank is waiting in."""

    rank: int
    op: str
    seq: int
    group: str
    peers: Sequence[int]  # a range for a whole group
    against: str = ""  # a deadlock: what the peer waits in (find_deadlocks)
    #: A deadlock: every rank of the cycle (sorted) and what it waits in.
    cycle: tuple[tuple[int, str], ...] = ()
    #: When the call raises by itself (its group's timeout; ``time.time()``),
    #: None if it does not; of a deadlock, the cycle's first call's.
    ends: float | None = None

    def describe(self) -> str:
        if self.group.startswith(("send>", "recv<")):
            _, peer, tag = _p2p_parts(self.group)
            other = "any rank" if peer == ANY else f"rank {peer}"
            return (f"{self.op} #{self.seq} {'to' if self.group[0] == 's' else 'from'} {other}"
                    + (f" (tag {tag[1:]})" if tag else ""))
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

    def state(self, rank: int) -> int | None:
        """The rank's state (:data:`IDLE`, :data:`WAITING`, :data:`FAILED`);
        None where it has published nothing."""
        record = self.read(rank)
        return None if not record else record.get("state", IDLE)

    def names_p2p(self, rank: int) -> bool:
        """Whether the rank's record may name a point-to-point call (False:
        it certainly names none)."""
        record = self.read(rank)
        if not record:
            return False
        return any(str(key).startswith(("send>", "recv<")) for key in (*record.get("counts", {}), record.get("group", "")))

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
            flight = _recorded_flight(rank, record, self.world_size, ended=include_failed)
            # A collective that raised stays pending in the recorder (gloo's
            # all_reduce of another size): the rank does not wait in it, it
            # reports its error.
            if flight is not None and state == FAILED and (flight.op, flight.seq, flight.group) == (
                    record.get("op"), record.get("seq"), RECORDER + str(record.get("group"))):
                return None
            return flight
        at, limit = record.get("at"), record.get("limit")
        ends = at + limit if isinstance(at, (int, float)) and isinstance(limit, (int, float)) else None
        return InFlight(rank, record["op"], record["seq"], record["group"], _unruns(record["peers"]), ends=ends)

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

        # (a literal, not encoder.encode's text: that goes through the same scanner)
        sample = {"op": "all_reduce", "peers": [[0, 4]], "fr": None, "x": 1.5, "ok": True, "s": "\u00e9"}
        if encode(sample) == '{"op":"all_reduce","peers":[[0,4]],"fr":null,"x":1.5,"ok":true,"s":"\\u00e9"}':
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

    def _raw(self, rank: int, payload: bool = True) -> tuple[int, bytes] | None:
        """(state, the record's JSON text) as one consistent read; None
        where the rank has published nothing (or is always mid-write)."""
        base = rank * self.slot
        for _ in range(50):
            v1, length, state = _HEADER.unpack_from(self._map, base)
            if v1 % 2:
                continue
            raw = bytes(self._map[base + _HEADER.size : base + _HEADER.size + length]) if payload else b""
            if _HEADER.unpack_from(self._map, base)[0] == v1:
                return None if not length else (state, raw)
        return None

    def read(self, rank: int) -> dict[str, Any] | None:
        got = self._raw(rank)
        if got is None:
            return None
        try:
            record: dict[str, Any] = json.loads(got[1])
        except ValueError:
            return None  # a rank that died mid-write: nothing known
        record["state"] = got[0]
        return record

    # The two questions the join loop asks of every rank at every poll, from
    # the header or the bytes, without decoding the record (a pool's test
    # asked them eight times: a tenth of its time in the test process).

    def state(self, rank: int) -> int | None:
        got = self._raw(rank, payload=False)
        return None if got is None else got[0]

    def names_p2p(self, rank: int) -> bool:
        got = self._raw(rank)
        return got is not None and (b'"send>' in got[1] or b'"recv<' in got[1])

    def close(self) -> None:
        self._map.close()


Board = ProgressBoard | MemoryBoard
