"""Which collective each rank is in: the record behind desync reports.

A rank records, for each ``torch.distributed`` collective it enters, the
operation, its sequence number within the group and the group's ranks; and
per group, how many collectives it has entered. The record lives in a small
shared file (one fixed-size slot per rank, written under a seqlock) so that
the parent reads it at any time without the rank's help, also after the
rank has exited.

The parent's rule (:func:`find_desync`): a live rank that waits in
collective #k of group G, whose peer in G has exited having entered fewer
than k collectives of G, waits for a peer that will never come. Two live
ranks that have waited, each for the other, in point-to-point calls that
cannot match (both receive, both send, a tag that differs) for :data:`P2P_SETTLE`
seconds are a deadlock.

Only the outermost call is recorded (``all_gather_object`` calls
``all_gather``); ``async_op=True`` calls and ``isend``/``irecv`` count but do
not wait. This module is the parent's judgement; the boards are
:mod:`~disttest._runner.board`, and the rank's side, which wraps the
collectives and writes the record, is :mod:`~disttest._runner.tracking`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from disttest._runner.board import (
    ANY,
    DEFAULT_GROUP,
    FR_SETTLE,
    P2P_GROUP,
    RECORDER,
    RENDEZVOUS_GROUP,
    WAITING,
    WORLD_GROUP,
    Board,
    InFlight,
    _p2p_parts,
    _Reads,
    _unruns,
)

__unittest = True

__all__ = ["find_deadlocks", "find_desync", "unmatched_collectives", "unmatched_p2p"]

#: Seconds two ranks must have waited for each other in point-to-point calls
#: that cannot match before they are a deadlock: a send that completes
#: without its receiver (small gloo sends) is gone well before, and a thread
#: of the rank other than the waiting one may still post the call that
#: matches (disttest records one call per rank).
P2P_SETTLE = 5.0


def find_desync(board: Board, ranks: Iterable[int], finished: Iterable[int],
                ended: bool = False, entered_counts: bool = True) -> list[tuple[int, InFlight]]:
    """(peer, what the rank waits in) for each of ``ranks`` that waits in
    (or, with ``ended``, died in) a collective that a peer of ``finished``
    never entered (or, without ``entered_counts``, merely takes part in);
    and, of live ``ranks`` that wait, each pair deadlocked in
    point-to-point calls (:func:`find_deadlocks`)."""
    finished, ranks = list(finished), list(ranks)
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
    if not ended and entered_counts:
        seen = {flight.rank for _, flight in found}
        found += find_deadlocks(board, [r for r in ranks if r not in seen], time.time())
    return found


def find_deadlocks(board: Board, ranks: Iterable[int], now: float) -> list[tuple[int, InFlight]]:
    """(peer, what the rank waits in) for each of the live ``ranks`` that
    belongs to a cycle of ranks that have each waited :data:`P2P_SETTLE`
    seconds for the next (a deadlock); the InFlight's ``against`` is what
    that peer waits in, its ``cycle`` every rank of the cycle and its call.

    A rank waits for a peer when it waits in a send to, or a receive from,
    that peer and the peer waits in a call that cannot match it (a call
    with another rank, a collective, the same direction, another tag) and
    posted none that matches before (an ``isend``/``irecv`` before its
    wait, ``batch_isend_irecv``: the counts say); or when it waits in a
    collective that the peer, a member of its group, never entered or
    waits in as another call (another operation or root: the ranks'
    collectives do not match; in a ``broadcast`` or ``scatter`` a rank
    other than the root waits for the root only, as gloo's do). ``ends``: when the cycle's first call raises
    by itself (its group's timeout), for the caller to leave it to. A
    receive from any rank waits for every other rank of its group, and
    only while each of them waits in a call that cannot send to it and no
    message it could take is on its way (a rank of the group that
    computes may still send); the rendezvous waits for no one; a peer
    whose counts overflowed is never waited for, nor a rank whose wait is
    in a thread other than its own (a communication thread: the rank may
    still act). Each rank's record is read once; the graph is O(world),
    but for receives from any rank."""
    waits: list[tuple[int, str, dict[str, Any]]] = []
    settled = False
    for rank in ranks:
        if board.state(rank) != WAITING:
            continue
        record = board.read(rank)
        if not record or record.get("state") != WAITING or "op" not in record or record.get("aside"):
            continue  # (aside: another thread of the rank waits; the rank's own may still act)
        group = str(record.get("group"))
        if group.startswith(("send>", "recv<")):
            if not (_p2p_parts(group)[1].isdigit() or group.startswith(f"recv<{ANY}")):
                continue
        elif group in (RENDEZVOUS_GROUP, P2P_GROUP, WORLD_GROUP) or group.startswith(RECORDER):
            continue
        waits.append((rank, group, record))
        settled = settled or now - record.get("at", now) >= P2P_SETTLE
    if not settled:
        return []  # no cycle without a settled rank (the usual case: checked every poll)
    nodes: dict[int, tuple[InFlight, dict[str, Any]]] = {}
    pending: dict[int, tuple[InFlight, dict[str, Any]]] = {}  # waiting, not yet settled
    for rank, group, record in waits:
        node = (InFlight(rank, record["op"], record["seq"], group, _unruns(record["peers"])), record)
        (pending if now - record.get("at", now) < P2P_SETTLE else nodes)[rank] = node
    edges = _wait_graph(nodes)
    cycles = _cycles(edges)
    if cycles and pending:
        # A rank that waits in the cycle but has not yet settled (it came a
        # moment later) is reported with it once it has, not left out.
        wider = {**nodes, **pending}
        later = [c for c in _cycles(_wait_graph(wider)) if any(r in pending for r in c)]
        cycles = [c for c in cycles if not any(c & w for w in later)]
    found = []
    for cycle in cycles:
        members = sorted(r for r in cycle if isinstance(r, int))
        if len(members) < 2:
            continue
        calls = tuple((r, _described(*nodes[r])) for r in members)
        ends = [nodes[r][1]["at"] + nodes[r][1]["limit"] for r in members
                if isinstance(nodes[r][1].get("limit"), (int, float)) and "at" in nodes[r][1]]
        for r in members:
            nxt = next(n for n in edges[r] if n in cycle)
            peer = nxt if isinstance(nxt, int) else next(m for m in edges[nxt] if m in cycle)
            found.append((peer, replace(nodes[r][0], against=_described(*nodes[peer]), cycle=calls,
                                        ends=min(ends) if ends else None)))
    found.sort(key=lambda f: f[1].rank)
    return found


def _wait_graph(nodes: dict[int, tuple[InFlight, dict[str, Any]]]) -> dict[Any, list[Any]]:
    """Who waits for whom among the waiting ``nodes`` (rank -> its call and
    record): each rank's successors (ranks, or the collective it waits in,
    whose successors are the members it waits for). A collective is a node
    of its own (one per group, number and call), so that the ranks waiting
    in it share its edges: O(world) edges, not O(world^2)."""
    edges: dict[Any, list[Any]] = {}
    any_of: set[int] = set()  # receives from any rank: they wait for all of their edges, not one
    for rank, (flight, record) in nodes.items():
        if flight.group.startswith(f"recv<{ANY}"):
            others = _any_source_waits(flight, record, nodes)
            if others:
                edges[rank] = others
                any_of.add(rank)
            continue
        if flight.group.startswith(("send>", "recv<")):
            peer = int(_p2p_parts(flight.group)[1])
            if peer in nodes and _cannot_match(flight, nodes[peer][0], nodes[peer][1]):
                edges[rank] = [peer]
            continue
        # gloo's broadcast and scatter: a rank other than the root needs the root only.
        root = record.get("root")
        needs = [root] if isinstance(root, int) and root != rank else flight.peers
        call = _call_of(flight, record)
        key = (flight.group, flight.seq, call, needs is not flight.peers)
        edges[rank] = [key]
        if key not in edges:
            edges[key] = [m for m in needs if m in nodes and m != rank and not nodes[m][1].get("overflow") and (
                nodes[m][1].get("counts", {}).get(flight.group, 0) < flight.seq
                or _other_call(call, flight, *nodes[m]))]
    return _blocked(edges, any_of) if any_of else edges


#: Two names of one collective: ranks may call either.
_SAME_CALL = {"_all_gather_base": "all_gather_into_tensor", "_reduce_scatter_base": "reduce_scatter_tensor"}


def _call_of(flight: InFlight, record: dict[str, Any]) -> tuple[str, Any]:
    """What must be the same on every rank that enters collective ``flight``:
    the operation and, of a broadcast or scatter, its root."""
    return _SAME_CALL.get(flight.op, flight.op), record.get("root")


def _any_source_waits(flight: InFlight, record: dict[str, Any],
                      nodes: dict[int, tuple[InFlight, dict[str, Any]]]) -> list[int]:
    """The ranks a receive from any rank waits for: every other rank of its
    group, if each waits in a call that is no send to it with its tag and
    the group has sent it no message it has not taken; else none."""
    _, _, tag = _p2p_parts(flight.group)
    others = [r for r in flight.peers if r != flight.rank]
    if not others or any(r not in nodes or nodes[r][1].get("overflow") for r in others):
        return []
    if any(nodes[r][0].group == f"send>{flight.rank}{tag}" for r in others):
        return []
    sent = sum(nodes[r][1].get("counts", {}).get(f"send>{flight.rank}{tag}", 0) for r in others)
    taken = sum(v for k, v in record.get("counts", {}).items() if k.startswith("recv<") and _p2p_parts(k)[2] == tag)
    return others if sent < taken else []


def _blocked(edges: dict[Any, list[Any]], any_of: set[int]) -> dict[Any, list[Any]]:
    """``edges`` restricted to the nodes that can never go on: a node that
    waits for all of its successors (a call, a collective) while one of
    them can never go on, a node of ``any_of`` (a receive from any rank)
    while all of them can never go on (the greatest such set: a node whose
    successors may go on is taken out until none is left to take)."""
    blocked = set(edges)
    changed = True
    while changed:
        changed = False
        for node in list(blocked):
            after = edges[node]
            if (all(n in blocked for n in after) if node in any_of else any(n in blocked for n in after)):
                continue
            blocked.discard(node)
            changed = True
    return {node: [n for n in edges[node] if n in blocked] for node in blocked}


def _described(flight: InFlight, record: dict[str, Any]) -> str:
    """``flight`` as a report names it, with a broadcast's or scatter's root."""
    root = record.get("root")
    return flight.describe() + (f" from rank {root}" if isinstance(root, int) else "")


def _other_call(call: tuple[str, Any], flight: InFlight, theirs: InFlight, record: dict[str, Any]) -> bool:
    """Whether the peer waits in collective ``flight`` (the same group and
    number) as another call: another operation, or another root (a
    mismatch: neither call can complete)."""
    if theirs.group != flight.group or theirs.seq != flight.seq:
        return False
    op, root = _call_of(theirs, record)
    return op != call[0] or (root is not None and call[1] is not None and root != call[1])


def _cannot_match(flight: InFlight, theirs: InFlight, record: dict[str, Any]) -> bool:
    """Whether the peer's call ``theirs`` (its record ``record``) can never
    complete the point-to-point ``flight``, nor has a call it posted before."""
    direction, _, tag = _p2p_parts(flight.group)
    if theirs.group.startswith(("send>", "recv<")):
        their_direction, their_peer, their_tag = _p2p_parts(theirs.group)
        if their_peer == str(flight.rank) and their_direction != direction and their_tag == tag:
            return False  # the two calls match
    if record.get("overflow"):  # (its counts are not known)
        return False
    return _posted(record.get("counts", {}), direction, flight.rank, tag) < flight.seq


def _cycles(edges: dict[Any, list[Any]]) -> list[set[Any]]:
    """The strongly connected components of more than one node of the graph
    ``edges`` (node -> successors; Tarjan's, iterative): every node of one
    lies on a cycle."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    stack: list[Any] = []
    on_stack: set[Any] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(component)
    return out


def _posted(counts: dict[str, int], direction: str, rank: int, tag: str) -> int:
    """How many calls that match ``rank``'s ``direction`` ("send>" or
    "recv<") with tag suffix ``tag`` the owner of ``counts`` posted to it."""
    if direction == "send>":
        return counts.get(f"recv<{rank}{tag}", 0) + counts.get(f"recv<{ANY}{tag}", 0)
    return counts.get(f"send>{rank}{tag}", 0)


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


def unmatched_p2p(board: _Reads) -> str | None:
    """After every rank's test ended: the point-to-point calls the ranks
    posted that nothing matched, as ``rank 0 sent rank 1 2 message(s) it did
    not receive`` (None: every call matched, or a count is unknown). Such a
    message, or a posted receive, stays in the group, where the next test's
    calls (a pool's) match it and then wait for ever."""
    if not any(board.names_p2p(r) for r in range(board.world_size)):
        return None
    read = [board.counts(r) for r in range(board.world_size)]
    if any(c is None for c in read):
        return None
    counts = [c or {} for c in read]
    pairs: set[tuple[int, str]] = set()  # (receiver, tag suffix)
    for rank, mine in enumerate(counts):
        for key in mine:
            if key.startswith("send>"):
                _, peer, tag = _p2p_parts(key)
                if peer.isdigit():
                    pairs.add((int(peer), tag))
            elif key.startswith("recv<"):
                pairs.add((rank, _p2p_parts(key)[2]))
    left = []
    for receiver, tag in sorted(pairs):
        if receiver >= len(counts):
            return None  # (a rank of a subgroup, numbered in it)
        got = counts[receiver]
        unnamed = got.get(f"recv<{ANY}{tag}", 0)
        extra: dict[int, int] = {}  # sender: messages no receive naming it took
        for sender, theirs in enumerate(counts):
            sent, named = theirs.get(f"send>{receiver}{tag}", 0), got.get(f"recv<{sender}{tag}", 0)
            if named > sent:
                left.append(f"rank {receiver} posted {named - sent} receive(s) from rank {sender}{_tagged(tag)} "
                            "it did not send")
            elif sent > named:
                extra[sender] = sent - named
        # The receives from any rank take what is left, from whoever sent it.
        over = sum(extra.values()) - unnamed
        if over > 0:
            senders = sorted(extra)
            who = f"rank {senders[0]}" if len(senders) == 1 else f"ranks {', '.join(map(str, senders))}"
            left.append(f"{who} sent rank {receiver} {over} message(s){_tagged(tag)} it did not receive")
        elif over < 0:
            left.append(f"rank {receiver} posted {-over} receive(s) from any rank{_tagged(tag)} that no rank sent")
    return "; ".join(left) or None


def unmatched_collectives(board: _Reads) -> str | None:
    """After every rank's test ended: the groups whose ranks entered
    different numbers of collectives, as ``in the default group rank 0
    entered 2 collective(s), rank 1 1`` (None: every group's counts agree, or
    a count is unknown). A collective that a rank started and a peer never
    entered (an ``async_op`` call never waited for, a peer that returned
    early) stays in the group, where the next test's (a pool's) matches it:
    that test gets the old values, or waits for ever.

    Every rank is a member of the default group (a rank that entered none of
    its collectives counts 0); of another group, only the ranks that
    entered one of its collectives are known to be members."""
    read = [board.counts(r) for r in range(board.world_size)]
    if any(c is None for c in read):
        return None
    counts = [c or {} for c in read]
    groups = sorted({key for c in counts for key in c if _collective_group(key)})
    found = []
    for group in groups:
        entered = {r: c.get(group, 0) for r, c in enumerate(counts) if group == DEFAULT_GROUP or group in c}
        if len(set(entered.values())) < 2:
            continue
        by_count: dict[int, list[int]] = {}
        for rank, n in entered.items():
            by_count.setdefault(n, []).append(rank)
        name = "the default group" if group == DEFAULT_GROUP else f"group {group}"
        parts = [f"{_ranks(ranks)} {n}" for n, ranks in sorted(by_count.items(), reverse=True)]
        found.append(f"in {name} {parts[0]} collective(s), " + ", ".join(parts[1:]))
    return "; ".join(found) or None


def _collective_group(key: str) -> bool:
    """Whether a counts key is a group's collectives (not point-to-point
    calls, the rendezvous, or the flight recorder's own counts)."""
    return not key.startswith(("send>", "recv<", RECORDER)) and key not in (RENDEZVOUS_GROUP, P2P_GROUP)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]} entered" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} entered"


def _tagged(tag: str) -> str:
    return f" (tag {tag[1:]})" if tag else ""


def _p2p_abandoned(board: _Reads, rank: int, flight: InFlight, finished: list[int]) -> int | None:
    """The finished peer that leaves a waiting send/recv unmatched, or None
    (also when a count it needs is unknown). Only calls with the same tag
    match."""
    direction, peer, tag = _p2p_parts(flight.group)
    if peer != ANY:
        if not peer.isdigit():
            return None
        other = int(peer)
        posted = board.counts(other) if other in finished else None
        if posted is None:
            return None
        # (Messages from a sender may also have gone to this rank's any-source recvs.)
        return other if _posted(posted, direction, rank, tag) < flight.seq else None
    others = [p for p in range(board.world_size) if p != rank]
    if not all(p in finished for p in others):
        return None
    counts = [board.counts(p) for p in [rank, *others]]
    if any(c is None for c in counts):
        return None
    mine, *theirs = counts
    sent = sum(c.get(f"send>{rank}{tag}", 0) for c in theirs if c is not None)
    received = sum(v for k, v in (mine or {}).items() if k.startswith("recv<") and _p2p_parts(k)[2] == tag)
    return others[0] if sent < received else None
