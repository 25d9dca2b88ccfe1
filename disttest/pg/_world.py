"""The per-test state of a threaded world: collectives waiting for ranks,
messages in flight, aborts and injected deaths (:class:`ThreadedWorld`), and
the Work its groups return (:class:`ThreadedWork`).

A rank's call registers its tensors and returns at once; the last rank of
the group to arrive checks every rank's arguments, computes the result and
completes every rank's future. The process group that calls into it is
:class:`disttest.pg.threaded.ProcessLocalGroup`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch.futures import Future

from disttest.pg._baton import Baton
from disttest.pg._local import (
    CollectiveMismatch,
    FutureWork,
    _copyable,
    check_agree,
    check_rank,
    each_rank,
    rank_runs,
    seconds,
)

__unittest = True

ABORTED = "{op} on group {group} was released by disttest: {reason}"
MISMATCH = "collective #{seq} on group {group} does not match across ranks (disttest): {calls}"
#: Ranks that made the group of one name with different ranks met in it.
MEMBERS_DIFFER = ("{op} #{seq} on group {group} joined ranks that made that group with different ranks "
                  "(disttest): {views}; c10d names a group by the order of new_group calls, so every rank must "
                  "call new_group in the same order with the same ranks, members or not")

#: The world each rank thread's threaded groups join (bound by the runner).
_thread_world = threading.local()


class _Group(Protocol):
    """What the world reads of one rank's group
    (:class:`disttest.pg.threaded.ProcessLocalGroup`)."""

    timeout: float | None

    @property
    def group_name(self) -> str: ...

    def rank(self) -> int: ...

    def size(self) -> int: ...


class CollectiveAborted(RuntimeError):
    """A rank was released from a collective because the test is ending.

    Field: ``reason`` (why the world was aborted).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ThreadedWork(FutureWork):
    """A threaded group's Work: in a rank thread of a world with turns
    (:mod:`disttest.pg._baton`), ``wait()`` hands the turn on while it waits
    (if it holds it), and goes on in its turn."""

    def wait(self, timeout: Any = None) -> bool:
        world = getattr(_thread_world, "world", None)
        if world is not None and not self._future.done() and not world.baton.free:
            own = seconds(timeout)
            limit = own or self._limit
            if not world.baton.wait_for(self._future, limit):
                assert limit is not None  # only a limited wait ends undone
                raise self._timed_out(limit, own=own is not None)
        return super().wait(timeout)


class _SendWork(ThreadedWork):
    """A buffered send's Work: notes that the sender waited for it (a
    blocking ``send`` does), which gloo's sender would do until received."""

    def __init__(self, future: Future[Any], waited: list[bool]) -> None:
        super().__init__(future, "send")
        self._waited = waited

    def wait(self, timeout: Any = None) -> bool:
        self._waited[0] = True
        return super().wait(timeout)


class _Call:
    __slots__ = ("op", "payload", "future", "agree", "members", "thread", "since")

    def __init__(self, op: str, payload: Any, future: Future[Any], agree: dict[str, Any] | None,
                 members: Sequence[int] | None = None) -> None:
        self.op = op
        self.payload = payload
        self.future = future
        self.agree = agree
        self.members = members  # the global ranks the caller made its group with
        self.thread = threading.get_ident()  # who joined (the harness maps it to a rank)
        self.since = time.time()


def _global_rank(call: _Call, group_rank: int) -> int:
    members = call.members
    return members[group_rank] if members is not None and group_rank < len(members) else group_rank


def _same_members(op: str, seq: int, group: str, calls: Sequence[_Call]) -> None:
    """Raise CollectiveMismatch where the callers made their group (of one
    name) with different ranks: their calls would pair ranks of different
    groups. Each compares by identity first: a group's members are one
    object per rank, equal in a correct test."""
    first = calls[0].members
    if first is None or all(c.members is first or c.members == first for c in calls[1:]):
        return
    views: dict[tuple[int, ...], list[int]] = {}
    for group_rank, c in enumerate(calls):
        views.setdefault(tuple(c.members or ()), []).append(_global_rank(c, group_rank))
    described = "; ".join(f"{'rank' if len(who) == 1 else 'ranks'} {rank_runs(who)} made it with ranks "
                          f"{rank_runs(members)}" for members, who in views.items())
    raise CollectiveMismatch(MEMBERS_DIFFER.format(op=op, seq=seq, group=group, views=described))


class PendingCall(NamedTuple):
    """A collective a rank joined that its group has not completed."""

    group: str
    seq: int
    group_rank: int
    group_size: int
    op: str
    thread: int
    since: float


class ThreadedWorld:
    """The shared state of one test's threaded ranks: collectives waiting
    for ranks, messages in flight, and whether the test is being aborted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, int], dict[int, _Call]] = {}
        self._seq: dict[tuple[str, int], int] = {}
        #: messages sent and not yet received: (sender, data, [whether its sender waited for it])
        self._mail: dict[tuple[str, int, int], deque[tuple[int, torch.Tensor, list[bool]]]] = {}
        self._recvs: list[tuple[str, int | None, int, int, torch.Tensor, Future[Any], ThreadedWork]] = []
        self._pending: set[Future[Any]] = set()
        self._sizes: dict[str, int] = {}  # group name -> size
        self._members: dict[str, range | frozenset[int]] = {}  # group name -> its global ranks
        self._shared_members: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}  # (see register)
        self._dead: dict[int, str] = {}  # global rank -> why (an injected kill)
        self.abort_reason: str | None = None
        self.store = dist.HashStore()
        #: Whose turn it is among the rank threads (:mod:`disttest.pg._baton`).
        self.baton = Baton()

    # -- what the harness asks (desync judgement) --
    def pending(self) -> list[PendingCall]:
        """Every collective joined and not completed, whoever issued it (a
        ``torch.distributed`` function, DDP's reducer from C++...)."""
        with self._lock:
            sizes = dict(self._sizes)
            return [PendingCall(group, seq, r, sizes.get(group, 0), c.op, c.thread, c.since)
                    for (group, seq), calls in self._waiting.items() for r, c in calls.items()]

    def entered(self, group: str, group_rank: int) -> int:
        """How many collectives of ``group`` its rank ``group_rank`` joined."""
        with self._lock:
            return self._seq.get((group, group_rank), 0)

    # -- aborting --
    def abort(self, reason: str) -> None:
        """Release every rank waiting in this world, now and later, with a
        :class:`CollectiveAborted` that gives ``reason``."""
        self.baton.go_free()  # before the waits are released: they must not wait for a turn
        with self._lock:
            if self.abort_reason is None:
                self.abort_reason = reason
            pending = list(self._pending)
            self._pending.clear()
            self._recvs.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(CollectiveAborted(
                    f"released by disttest: {self.abort_reason}", self.abort_reason))

    def register(self, group: str, members: Sequence[int]) -> Sequence[int]:
        """Note the global ranks of ``group`` (as each member makes it);
        return them as one object shared by every rank that gives the same
        (its collectives compare them by identity)."""
        with self._lock:
            # NB: a whole world stays a range: each of its ranks registers it
            # (a set of a thousand ranks, a thousand times, is O(world^2)).
            self._members[group] = members if isinstance(members, range) else frozenset(members)
            self._sizes[group] = len(members)
            if isinstance(members, range):
                return members
            listed = tuple(members)
            return self._shared_members.setdefault((group, listed), listed)

    def kill(self, rank: int, reason: str) -> None:
        """Global rank ``rank`` is dead (an injected kill): as a gloo group
        breaks when a peer process dies, every group that has it fails, now
        and later, with a :class:`CollectiveAborted` that gives ``reason``;
        groups without it go on."""
        self.baton.go_free()  # before the waits are released: they must not wait for a turn
        with self._lock:
            self._dead[rank] = reason
            # (each with what it waited in: the survivor's report names its call)
            doomed = [(c.future, c.op, group) for (group, _), calls in self._waiting.items() if self._broken(group)
                      for c in calls.values()]
            kept = [r for r in self._recvs if not self._broken(r[0])]
            doomed += [(r[5], "recv", r[0]) for r in self._recvs if self._broken(r[0])]
            self._recvs = kept
            for fut, _, _ in doomed:
                self._pending.discard(fut)
        for fut, op, group in doomed:
            if not fut.done():
                fut.set_exception(CollectiveAborted(ABORTED.format(op=op, group=group, reason=reason), reason))

    def _broken(self, group: str) -> str | None:
        """Why ``group`` can no longer communicate (a member died), or None. Under the lock."""
        if not self._dead:
            return None
        members = self._members.get(group)
        for rank, reason in self._dead.items():
            if members is None or rank in members:  # (a group not registered: assume the worst)
                return reason
        return None

    def _check_aborted(self, op: str, group: str) -> None:
        reason = self.abort_reason if self.abort_reason is not None else self._broken(group)
        if reason is not None:
            raise CollectiveAborted(ABORTED.format(op=op, group=group, reason=reason), reason)

    # -- collectives --
    def collective(
        self, pg: _Group, op: str, payload: Any,
        compute: Callable[[list[Any]], list[Any]], agree: dict[str, Any] | None = None,
    ) -> ThreadedWork:
        """Join collective ``op`` of ``pg`` with ``payload``. The last rank to
        join checks that every rank passed the same ``agree`` values (root,
        reduce op), then runs ``compute(payloads by group rank)``, which
        returns each rank's future value (or raises: every rank gets the
        error). The Work times out after the group's timeout."""
        fut: Future[Any] = Future()
        with self._lock:
            self._check_aborted(op, pg.group_name)
            key = (pg.group_name, pg.rank())
            self._sizes[pg.group_name] = pg.size()
            seq = self._seq.get(key, 0) + 1
            self._seq[key] = seq
            calls = self._waiting.setdefault((pg.group_name, seq), {})
            calls[pg.rank()] = _Call(op, payload, fut, agree, getattr(pg, "members", None))
            self._pending.add(fut)
            if len(calls) < pg.size():
                return self._work(fut, op, pg, lambda: self._absent(pg, seq, fut))
            del self._waiting[(pg.group_name, seq)]
        ordered = [calls[r] for r in range(pg.size())]
        try:
            _same_members(op, seq, pg.group_name, ordered)
            ops = {c.op for c in ordered}
            if len(ops) > 1:
                described = each_rank([c.op for c in ordered], "called {}")
                raise CollectiveMismatch(MISMATCH.format(seq=seq, group=pg.group_name, calls=described))
            check_agree(op, seq, pg.group_name, [c.agree for c in ordered])
            with torch.no_grad():
                results = compute([c.payload for c in ordered])
        except Exception as e:  # noqa: BLE001 (every rank gets it)
            self._finish(ordered, error=e)
        else:
            self._finish(ordered, results=results)
        return self._work(fut, op, pg, lambda: "")

    @staticmethod
    def _work(fut: Future[Any], op: str, pg: _Group, on_timeout: Callable[[], str]) -> ThreadedWork:
        return ThreadedWork(fut, op, timeout=pg.timeout, group=pg.group_name, on_timeout=on_timeout)

    def _absent(self, pg: _Group, seq: int, fut: Future[Any]) -> str:
        # Why a collective timed out: the ranks that never joined it.
        with self._lock:
            self._pending.discard(fut)
            joined = set(self._waiting.get((pg.group_name, seq), {}))
        missing = [r for r in range(pg.size()) if r not in joined]
        return f"collective #{seq}: {'rank' if len(missing) == 1 else 'ranks'} {rank_runs(missing)} of the group never called it"

    def _finish(self, calls: Sequence[_Call], results: list[Any] | None = None,
                error: BaseException | None = None) -> None:
        with self._lock:
            for c in calls:
                self._pending.discard(c.future)
        for i, c in enumerate(calls):
            if c.future.done():
                continue
            if error is not None:
                c.future.set_exception(type(error)(*error.args) if _copyable(error) else error)
            else:
                c.future.set_result(results[i] if results is not None else None)

    # -- point to point --
    def send(self, pg: _Group, tensor: torch.Tensor, dst: int, tag: int) -> ThreadedWork:
        check_rank(dst, pg.size(), "send", "dst", pg.group_name)
        fut: Future[Any] = Future()
        with self._lock:
            self._check_aborted("send", pg.group_name)
            me = pg.rank()
            match = next((i for i, (g, src, to, t, *_) in enumerate(self._recvs)
                          if g == pg.group_name and to == dst and t == tag and src in (None, me)), None)
            if match is None:
                waited = [False]
                self._mail.setdefault((pg.group_name, dst, tag), deque()).append((me, tensor.detach().clone(), waited))
                fut.set_result([tensor])
                return _SendWork(fut, waited)
            *_, out, rfut, work = self._recvs.pop(match)
            self._pending.discard(rfut)
        _deliver(out, tensor, work, me, rfut)
        fut.set_result([tensor])
        return ThreadedWork(fut, "send")

    def undelivered(self) -> list[tuple[str, int, int, int]]:
        """``(group, src, dst, tag)`` (group ranks) of every message sent in
        this world, waited for by its sender (a blocking ``send``, or an
        ``isend``'s ``wait()``), that no rank received: on gloo or NCCL that
        wait would not end. (An ``isend`` never waited for may go unreceived
        there too.)"""
        with self._lock:
            return [(group, src, dst, tag) for (group, dst, tag), box in self._mail.items()
                    for src, _, waited in box if waited[0]]

    def recv(self, pg: _Group, tensor: torch.Tensor, src: int | None, tag: int) -> ThreadedWork:
        if src is not None:
            check_rank(src, pg.size(), "recv", "src", pg.group_name)
        fut: Future[Any] = Future()
        work = ThreadedWork(fut, "recv", timeout=pg.timeout, group=pg.group_name,
                            on_timeout=lambda: self._unmatched(fut, src, tag))
        with self._lock:
            self._check_aborted("recv", pg.group_name)
            box = self._mail.get((pg.group_name, pg.rank(), tag))
            found = None
            if box:
                for i, (sender, data, _) in enumerate(box):
                    if src is None or sender == src:
                        found = (sender, data)
                        del box[i]
                        break
            if found is None:
                self._recvs.append((pg.group_name, src, pg.rank(), tag, tensor, fut, work))
                self._pending.add(fut)
                return work
        _deliver(tensor, found[1], work, found[0], fut)
        return work


    def _unmatched(self, fut: Future[Any], src: int | None, tag: int) -> str:
        # A timed-out recv leaves the queue: a later send must not land in it.
        with self._lock:
            self._pending.discard(fut)
            self._recvs = [r for r in self._recvs if r[5] is not fut]
        return f"no send from {'any rank' if src is None else f'rank {src}'} with tag {tag} arrived"


def _deliver(out: torch.Tensor, data: torch.Tensor, work: ThreadedWork, sender: int,
             fut: Future[Any]) -> None:
    if out.shape != data.shape or out.dtype != data.dtype:
        fut.set_exception(CollectiveMismatch(
            f"recv expected {out.dtype} {list(out.shape)} but rank {sender} sent "
            f"{data.dtype} {list(data.shape)} (disttest)"))
        return
    with torch.no_grad():
        out.detach().copy_(data)
    work.source = sender
    fut.set_result([out])
