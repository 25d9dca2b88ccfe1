"""A rank's record: what a rank writes to its slot of the progress board
(:mod:`~disttest._runner.board`) as it enters, waits in and leaves each
collective. The wrappers of :mod:`~disttest._runner.tracking` drive it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from disttest._runner.board import DEFAULT_GROUP, FAILED, IDLE, WAITING, Board, _runs

__unittest = True

__all__ = ["Tracker"]

_T = TypeVar("_T")


def _once(memo: weakref.WeakKeyDictionary[Any, _T], key: Any, ask: Callable[..., _T],
          unkept: Callable[..., _T], *before: Any) -> _T:
    """``ask(*before, key)``, asked once per ``key`` while ``key`` lives;
    ``unkept(*before, key)`` for a key that takes no weak reference."""
    try:
        return memo[key]
    except KeyError:
        pass
    except TypeError:
        return unkept(*before, key)
    value = memo[key] = ask(*before, key)
    return value


def _unknown(key: Any) -> None:
    return None


class Tracker:
    """A rank's record of the collectives it enters: what it writes to its
    slot of the progress board as it enters, waits in and leaves each call,
    and its counts per group. One per rank (a thread rank's lives for one
    test); the rank's threads and its flight-recorder watcher share it."""

    def __init__(self, board: Board, rank: int, threads: bool = False) -> None:
        self.board = board
        self.rank = rank
        self.threads = threads  # a rank thread of the threaded group
        self.home = threading.get_ident()  # the rank's own thread (the one that runs its test)
        self.counts: dict[str, int] = {}
        self._local = threading.local()  # each thread of a rank its own depth
        self._lock = threading.Lock()  # the rank's threads and its watcher write
        self.record: dict[str, Any] = {"counts": {}, "state": IDLE}
        self._pending: list[tuple[str, int]] = []  # flight-recorder collectives pending
        self._since = 0.0
        # NB: both made on first use (a thread rank's tracker lives for one test).
        self._limits: weakref.WeakKeyDictionary[Any, float | None] | None = None
        self._groups: weakref.WeakKeyDictionary[Any, tuple[str, list[int] | None]] | None = None
        #: The Work of each asynchronous call not yet waited on -> the call
        #: (what the record says while a wait on it blocks).
        self.pending: weakref.WeakKeyDictionary[Any, dict[str, Any]] | None = None

    @property
    def depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @depth.setter
    def depth(self, value: int) -> None:
        self._local.depth = value

    def limit(self, dist: Any, group: Any) -> float | None:
        """Seconds after which a call of ``group`` (None: the default group)
        raises by itself; asked of each group once."""
        pg = dist.GroupMember.WORLD if group is None else group
        if pg is None:
            return None
        if self._limits is None:
            self._limits = weakref.WeakKeyDictionary()
        from disttest import _compat

        return _once(self._limits, pg, _compat.group_timeout, _unknown)  # (no weak reference: no limit known)

    def group_of(self, dist: Any, group: Any) -> tuple[str, list[int] | None]:
        """A group's name as records give it and its ranks (None: the
        default group's, every rank), asked of each group once: its ranks
        are a list c10d builds at every call."""
        if group is None or group is dist.GroupMember.WORLD:
            return DEFAULT_GROUP, None
        if self._groups is None:
            self._groups = weakref.WeakKeyDictionary()
        return _once(self._groups, group, _group_of, _group_of, dist)

    def enter(self, op: str, group: str, peers: Sequence[int], waits: bool, also: Sequence[str] = (),
              extra: dict[str, Any] | None = None) -> None:
        """Record the call of ``op`` on ``group``; ``also``: the groups of
        calls it makes that are counted but not waited in (the sends and
        receives of a ``batch_isend_irecv``); ``extra``: more of the call
        (``limit``, its group's timeout; ``root``, a broadcast's source)."""
        for other in also:
            self.counts[other] = self.counts.get(other, 0) + 1
        self.counts[group] = self.counts.get(group, 0) + 1
        self._publish({"op": op, "seq": self.counts[group], "group": group, "peers": _runs(peers), **(extra or {})},
                      waits)

    def remember(self, work: Any, call: dict[str, Any]) -> None:
        """``work`` (returned by an asynchronous call) is ``call``: a wait on
        it is recorded as waiting in the call."""
        if self.pending is None:
            self.pending = weakref.WeakKeyDictionary()
        try:
            self.pending[work] = call
        except TypeError:  # (a Work that takes no weak reference)
            pass

    def wait_in(self, call: dict[str, Any], limit: float | None) -> None:
        """Record that the rank waits on the Work of ``call`` (``limit``: the
        wait's own timeout, if it has one)."""
        self._publish(call if limit is None else {**call, "limit": limit}, True)

    def _publish(self, call: dict[str, Any], waits: bool) -> None:
        """Make ``call`` (op, seq, group, peers and more) the rank's record,
        waited in or not, with the counts so far."""
        with self._lock:
            self.record = {**call, "counts": dict(self.counts), "state": WAITING if waits else IDLE, "at": time.time(),
                           "fr": self.record.get("fr"), "fr_at": self.record.get("fr_at")}
            if waits and threading.get_ident() != self.home:
                self.record["aside"] = True  # (its own thread may still act: see find_deadlocks)
            self.board.write(self.rank, self.record)

    def leave(self, failed: bool) -> None:
        # A failed collective keeps its record: the parent tells a desync
        # from a plain error by the collective a rank died in.
        with self._lock:
            self.record["state"] = FAILED if failed else IDLE
            self.board.set_state(self.rank, self.record["state"])

    def refused(self, groups: Sequence[str]) -> None:
        """The call just counted on ``groups`` raised a ``TypeError`` or
        ``ValueError``: c10d's checks of its arguments (a list of the wrong
        length, a rank out of range) refused it before it reached the group,
        as a test may check on one rank. Not counted: its peers' next call is
        this rank's next, and the group holds nothing of it (a pool's next
        test would have been given fresh ranks, and a peer that finished
        first was taken for one that never entered the next call)."""
        with self._lock:
            for group in groups:
                if self.counts.get(group):
                    self.counts[group] -= 1
            self.record["counts"] = dict(self.counts)
            self.board.write(self.rank, self.record)

    def reset(self) -> None:
        with self._lock:
            self.counts = {}
            self.record = {"counts": {}, "state": IDLE, "fr": self.record.get("fr"),
                           "fr_at": self.record.get("fr_at")}
            self.board.write(self.rank, self.record)

    def done(self) -> None:
        """The rank's test ended (its peers' desync judgement needs when)."""
        with self._lock:
            self.record["done_at"] = time.time()
            self.board.write(self.rank, self.record)

    def recorded(self, status: dict[str, list[Any]]) -> None:
        """Publish what the flight recorder says (from the watcher thread),
        with since when the same collectives are pending and when last seen."""
        now = time.time()
        pending = sorted((k, v[0]) for k, v in status.items() if v[0] > v[1])
        with self._lock:
            if pending != self._pending:
                self._pending, self._since = pending, now
            self.record["fr"] = status
            self.record["fr_at"] = [self._since, now]
            self.board.write(self.rank, self.record)


def _group_of(dist: Any, group: Any) -> tuple[str, list[int] | None]:
    if group is None or group is dist.GroupMember.WORLD:
        return DEFAULT_GROUP, None
    from disttest import _compat

    return _compat.group_name(group), dist.get_process_group_ranks(group)
