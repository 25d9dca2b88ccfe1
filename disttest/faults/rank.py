"""The rank side of fault injection: count collectives, fire faults, fuzz.

Runs inside a rank (a process, a pool worker, a thread). The runner arms the
rank for one test (:func:`armed`, a context manager around the test body);
the collective-tracking wrapper calls :func:`before_collective` as the rank
enters each collective. Unarmed (no fault declared, no ``DISTTEST_CHAOS``),
that call returns at once and nothing else happens.

Which faults fired is written as the rank goes, before a fault acts (a
killed rank cannot report afterwards): to a JSON-lines file
``rank<r>.faults`` in the run directory of a rank process, or to an
in-memory list of the threaded world for a rank thread. The parent reads it
(:func:`read_fired`). Depends on the standard library,
:mod:`disttest.faults` and the core's collective tracking (it sets
:func:`before_collective` there while a rank is armed, and unsets it
after); torch is imported only when a fault
corrupts values.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from disttest import faults as faults_mod
from disttest._runner import tracking
from disttest._runner.functional import wrap_functional
from disttest.config import ConfigError
from disttest.faults import (
    ANY,
    CANNOT_CORRUPT,
    CHAOS_ENV,
    SAME_CALL,
    UNJUDGED,
    Fault,
    InjectedFault,
    chaos_seed,
    test_faults,
)

__unittest = True

__all__ = [
    "CHAOS_LONG", "CHAOS_LONG_ODDS", "CHAOS_NOTE", "CHAOS_SHORT", "RankKilled", "armed", "before_collective",
    "chaos_delay", "chaos_delays", "corrupt_", "forget_fired",
    "read_fired",
]

#: Schedule fuzzing: before each collective a rank waits up to
#: CHAOS_SHORT seconds, or (odds CHAOS_LONG_ODDS) up to CHAOS_LONG: enough to
#: reorder ranks that run a few milliseconds apart, about 4 ms a call on average.
CHAOS_SHORT = 0.002
CHAOS_LONG = 0.05
CHAOS_LONG_ODDS = 0.125
#: A rank writes how long its schedule-fuzzing delays took each time they
#: add up to this many seconds more (and when its test ends): a rank that
#: times out is stopped before it writes again, and the report says what
#: the delays took of the limit.
CHAOS_NOTE = 0.1
HANG_TICK = 0.05  # a hang sleeps in ticks, so a thread rank can still be stopped
RAISED = "injected fault (disttest): rank {rank} raised at {op} #{nth}, declared {fault}"
KILLED = "rank {rank} was killed by an injected fault at {op} #{nth} (disttest)"
#: Not counted: collective set-up, where the test's ranks are not yet a group.
_IGNORED = ("init_process_group", "new_group")


class RankKilled(BaseException):
    """Ends a rank thread killed by an injected fault (a BaseException, so an
    ``except Exception`` in the test does not survive its own death)."""


@dataclass
class _State:
    rank: int
    faults: list[tuple[int, Fault]]
    write: Callable[[dict[str, Any]], None]
    thread_world: Any = None
    rng: random.Random | None = None
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    #: Why this rank thread was killed (its RankKilled, if the test caught it).
    killed: str | None = None
    #: Seconds of schedule-fuzzing delays this rank has begun, and as last written.
    delayed: float = 0.0
    delayed_written: float = 0.0


_local = threading.local()
_armed_count = 0  # ranks armed in this process (rank threads share it)
_count_lock = threading.Lock()
_unwrap: list[Callable[[], None]] = []  # the undo of the functional collectives' wrappers, while armed
_process: list[_State] = []
#: Records of rank threads, per threaded world: {rank: [record, ...]}.
_thread_records: weakref.WeakKeyDictionary[Any, dict[int, list[dict[str, Any]]]] = (
    weakref.WeakKeyDictionary())


def chaos_delays(seed: int, test: str, rank: int) -> random.Random:
    """The seeded source of one rank's schedule-fuzzing delays in one test:
    the same seed, test and rank give the same delays."""
    return random.Random(f"{seed}/{test}/{rank}")


def chaos_delay(rng: random.Random) -> float:
    """The next schedule-fuzzing delay, in seconds, from ``rng``."""
    longer = rng.random() < CHAOS_LONG_ODDS
    return rng.uniform(0, CHAOS_LONG if longer else CHAOS_SHORT)


def _bound_world() -> Any:
    try:
        from disttest.pg._world import _thread_world
    except ImportError:  # pragma: no cover
        return None
    return getattr(_thread_world, "world", None)


def records_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}.faults")


def forget_fired(run_dir: str) -> None:
    """Remove every rank's records from ``run_dir`` (before a pool's next
    test: a rank whose setUp fails is never armed, and would leave the
    previous test's records to be read as this one's)."""
    with os.scandir(run_dir) as entries:
        for entry in entries:
            if entry.name.startswith("rank") and entry.name.endswith(".faults"):
                os.unlink(entry.path)


def _file_writer(path: str) -> Callable[[dict[str, Any]], None]:
    # One unbuffered write per record: in the kernel before the fault acts.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def write(record: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(record) + "\n").encode())

    write.close = lambda: os.close(fd)  # type: ignore[attr-defined]
    return write


@contextmanager
def armed(cls: object, test_name: str, rank: int, run_dir: str | None = None) -> Iterator[None]:
    """Arm this rank for one test of ``cls`` (its declared faults, those of
    ``DISTTEST_FAULT``, and ``DISTTEST_CHAOS``); disarm after. ``cls``: what
    holds the test as attribute ``test_name`` (a class; for a plain function,
    any object).

    A rank thread records what fired in its threaded world; a rank process in
    ``run_dir`` (the run directory of its launcher), where the parent reads
    it; with neither (``run_rank`` under an external launcher) nothing reads
    the records."""
    declared = test_faults(getattr(cls, test_name, None))
    # What the test's own check reads (a fault a decorator hid is not here).
    outer, faults_mod._running.faults = getattr(faults_mod._running, "faults", None), declared
    try:
        with _armed(declared, test_name, rank, run_dir):
            yield
    finally:
        faults_mod._running.faults = outer


@contextmanager
def _armed(declared: tuple[Fault, ...], test_name: str, rank: int, run_dir: str | None) -> Iterator[None]:
    faults = list(enumerate(declared))
    seed = chaos_seed()
    if not faults and seed is None:
        yield
        return
    world = _bound_world()
    close: Callable[[], None] | None = None
    if world is not None:
        records = _thread_records.setdefault(world, {}).setdefault(rank, [])
        records.clear()
        write: Callable[[dict[str, Any]], None] = records.append
    elif run_dir is not None:
        write = _file_writer(records_path(run_dir, rank))
        close = write.close  # type: ignore[attr-defined]
    elif faults:
        # run_rank under an external launcher: no parent reads the records.
        fault = faults[0][1]
        raise ConfigError("fault", fault.describe(), fault.where, UNJUDGED)
    else:
        unread: list[dict[str, Any]] = []
        write = unread.append  # the chaos seed alone: nothing to judge
    state = _State(rank, [(i, f) for i, f in faults if rank in f.ranks], write, world,
                   chaos_delays(seed, test_name, rank) if seed is not None else None)
    if seed is not None:
        write({"chaos": seed, "where": CHAOS_ENV})
    global _armed_count
    previous = _swap(state, world is not None)
    with _count_lock:
        _armed_count += 1
        if _armed_count == 1:
            # The core's collective tracking asks this module while a rank is
            # armed (the core sits below fault injection and never imports it),
            # the functional collectives too (DTensor's, which reach the group
            # from C++).
            tracking.set_collective_hook(before_collective)
            _unwrap[:] = [wrap_functional()]
    try:
        yield
    finally:
        with _count_lock:
            _armed_count -= 1
            if not _armed_count:
                tracking.set_collective_hook(None)
                while _unwrap:
                    _unwrap.pop()()
        write({"counts": state.counts, **({"delayed": state.delayed} if state.rng is not None else {})})
        _swap(previous, world is not None)
        if close is not None:
            close()


def _swap(state: _State | None, per_thread: bool) -> _State | None:
    if per_thread:
        previous = getattr(_local, "state", None)
        _local.state = state
        return previous
    previous_p = _process[0] if _process else None
    _process[:] = [state] if state is not None else []
    return previous_p


def before_collective(op: str, rank: int) -> Callable[[tuple[Any, ...], dict[str, Any], Any], Any] | None:
    """Called by the tracking wrapper as ``rank`` enters collective ``op``
    (outermost calls only). Fires the fault declared there, if any; returns
    a callable to run on ``(args, kwargs, result)`` after the collective
    (a ``corrupt`` fault), or None."""
    if not _armed_count:  # the common case: nothing armed anywhere
        return None
    state = getattr(_local, "state", None) or (_process[0] if _process else None)
    if state is None or op in _IGNORED:
        return None
    if state.killed is not None:
        # A killed rank thread whose test caught RankKilled (``except
        # BaseException``): a dead process makes no more calls either.
        raise RankKilled(state.killed)
    nth = state.counts[op] = state.counts.get(op, 0) + 1
    state.total += 1
    if state.rng is not None:
        delay = chaos_delay(state.rng)
        state.delayed += delay
        if state.delayed - state.delayed_written >= CHAOS_NOTE:
            state.delayed_written = state.delayed
            state.write({"delayed": state.delayed})
        _sleep(state, delay)
    here = [(i, f) for i, f in state.faults
            if (f.at == op and f.nth == nth) or (f.at == ANY and f.nth == state.total)]
    acting = [(i, f) for i, f in here if f.action != "delay"]
    if len(acting) > 1:
        # Declared apart (at="any" and a named collective) but met on one
        # call: the first would leave the second nothing to act on.
        _refuse_together(state, acting, op, nth)
    after = None
    for index, fault in here:
        after = _fire(state, index, fault, op, nth) or after
    return after


def _refuse_together(state: _State, acting: list[tuple[int, Fault]], op: str, nth: int) -> None:
    """An error of the test: faults that landed on one call of this rank
    (recorded as met, so none reads as never fired)."""
    first, second = acting[0][1], acting[1][1]
    for index, fault in acting:  # NB: no "action": a kill that never acted is no death
        state.write({"fault": index, "t": time.time(),
                     "what": f"rank {state.rank} could not {fault.action} at {op} #{nth}: another fault is there"})
    raise ConfigError("fault", second.what(state.rank), second.where,
                      SAME_CALL.format(first=first.describe(state.rank)) + f" (both landed on {op} #{nth})")


def _fire(state: _State, index: int, fault: Fault, op: str, nth: int) -> Any:
    rank = state.rank
    action = fault.action
    if action == "corrupt":  # recorded once it has acted (or could not)
        return _corrupt_after(state, index, fault, op, nth)
    state.write({"fault": index, "action": fault.action, "what": fault.fired_text(rank, op, nth),
                 "t": time.time()})
    if action in ("kill", "exit"):
        if state.thread_world is not None:
            reason = state.killed = KILLED.format(rank=rank, op=op, nth=nth)
            state.thread_world.kill(rank, reason)
            raise RankKilled(reason)
        if action == "exit":
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)
        while True:  # pragma: no cover (the signal is on its way)
            time.sleep(HANG_TICK)
    if action == "raise":
        raise InjectedFault(RAISED.format(rank=rank, op=op, nth=nth, fault=fault.describe(rank)),
                            rank, op, nth)
    if action == "hang":
        while True:
            _sleep(state, HANG_TICK)
    _sleep(state, fault.seconds or 0)  # delay
    return None


def _sleep(state: _State, seconds: float) -> None:
    """An injected wait. Thread ranks first go free (the rest of the test
    runs without turns, :mod:`disttest.pg._baton`): a delay is there to let
    the other ranks run meanwhile, in whatever order."""
    if state.thread_world is not None and seconds > 0:
        state.thread_world.baton.go_free()
    # In ticks, as a hang: a rank thread stopped at the test's limit is
    # stopped here (an exception raised into it waits for the sleep's end).
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, HANG_TICK))


def _corrupt_after(state: _State, index: int, fault: Fault, op: str,
                   nth: int) -> Callable[[tuple[Any, ...], dict[str, Any], Any], Any]:
    def corrupt_now(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        changed = corrupt_(_received(op, args, kwargs))
        if changed:
            state.write({"fault": index, "action": "corrupt", "what": fault.fired_text(state.rank, op, nth),
                         "t": time.time()})
            return
        # It landed where nothing can change (a barrier, under at="any", a
        # gather on a rank that receives nothing, an empty tensor): an error of
        # the test, never a fault recorded as fired that did nothing.
        state.write({"fault": index, "action": "corrupt", "t": time.time(),
                     "what": f"rank {state.rank} could not corrupt {op} #{nth}"})
        raise ConfigError("fault", f"{fault.action} at {fault.at_text()}", fault.where,
                          CANNOT_CORRUPT.format(op=op, nth=nth, rank=state.rank))

    def after(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> Any:
        works = result if isinstance(result, (list, tuple)) else [result]
        if not any(w is not None and hasattr(w, "wait") for w in works):
            corrupt_now(args, kwargs)  # it returned with its values
            return None
        # Asynchronous (one work, or batch_isend_irecv's list): the values
        # change as the test waits for them, not here. NB: waiting here made
        # the test's own wait a second one, which a gloo p2p work never
        # returns from; and an irecv posted before a send would deadlock.
        batch = _WaitedBatch(len(works), functools.partial(corrupt_now, args, kwargs))
        wrapped = [_corrupting_work()(w, batch, i) for i, w in enumerate(works)]
        return wrapped if isinstance(result, (list, tuple)) else wrapped[0]

    return after


class _WaitedBatch:
    """The works of one call: once the test has waited for each, the values
    are corrupted (once)."""

    def __init__(self, size: int, corrupt: Callable[[], None]) -> None:
        self._left = set(range(size))
        self._corrupt: Callable[[], None] | None = corrupt

    def waited(self, position: int) -> None:
        self._left.discard(position)
        if not self._left and self._corrupt is not None:
            corrupt, self._corrupt = self._corrupt, None
            corrupt()


@functools.cache
def _corrupting_work() -> Any:
    """A ``Work`` that stands for the call's own until the test waits on it
    (or on its future), then has the received values corrupted."""
    import torch.distributed as dist

    class CorruptingWork(dist.distributed_c10d.Work):
        def __init__(self, inner: Any, batch: _WaitedBatch, position: int) -> None:
            super().__init__()
            self._inner, self._batch, self._position = inner, batch, position

        def wait(self, *args: Any, **kwargs: Any) -> bool:
            ok = self._inner.wait(*args, **kwargs)
            self._batch.waited(self._position)
            return bool(ok) if ok is not None else True

        def get_future(self) -> Any:
            def then(fut: Any) -> Any:
                self._batch.waited(self._position)
                return fut.value()

            return self._inner.get_future().then(then)

        def is_completed(self) -> bool:
            return bool(self._inner.is_completed())

        def is_success(self) -> bool:
            return bool(self._inner.is_success())

        def exception(self) -> Any:
            return self._inner.exception()

        def source_rank(self) -> int:
            return int(self._inner.source_rank())

        def result(self) -> Any:
            return self._inner.result()

        def synchronize(self) -> None:
            self._inner.synchronize()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    return CorruptingWork


#: The argument that receives each collective's values (else the first).
_OUTPUT_ARG = {"gather": "gather_list", "gather_object": "object_gather_list",
               "scatter_object_list": "scatter_object_output_list", "batch_isend_irecv": "p2p_op_list"}


#: Collectives with a root whose tensor argument is not received by every
#: rank: a broadcast's source sends it; a reduce's other ranks only send theirs.
_ROOT_SENDS = ("broadcast", "reduce")


def _is_root(arguments: dict[str, Any]) -> bool:
    """Whether this rank is the call's root (``src``/``dst`` are global
    ranks; ``group_src``/``group_dst`` ranks in ``group``)."""
    import torch.distributed as dist

    group = arguments.get("group")
    for name in ("src", "dst"):
        if arguments.get(name) is not None:
            return bool(arguments[name] == dist.get_rank())
    for name in ("group_src", "group_dst"):
        if arguments.get(name) is not None:
            return bool(arguments[name] == dist.get_rank(group))
    return dist.get_rank(group) == 0  # torch's default root


def _received(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import inspect

    import torch.distributed as dist

    func = getattr(dist, op)
    bound = inspect.signature(func).bind_partial(*args, **kwargs)
    name = _OUTPUT_ARG.get(op) or next(iter(inspect.signature(func).parameters))
    value = bound.arguments.get(name)
    if op in _ROOT_SENDS and _is_root(bound.arguments) == (op == "broadcast"):
        return None  # a broadcast's source, a reduce's non-destination: it receives nothing
    if op == "batch_isend_irecv":
        return [p.tensor for p in value or () if getattr(p.op, "__name__", "") in ("irecv", "recv")]
    return value


def corrupt_(value: Any) -> int:
    """Change every element of every tensor in ``value`` (a tensor or a
    list of them), in place: integers and floats get their bits inverted
    (bitwise not of the element's bit pattern, which never equals the old
    value: a float may become NaN), bools are negated. Returns how many
    elements changed."""
    import torch

    if isinstance(value, (list, tuple)):
        return sum(corrupt_(item) for item in value)
    if not isinstance(value, torch.Tensor):
        return 0
    t = value
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t.logical_not_()
    elif t.is_floating_point():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        t.view(bits).bitwise_not_()
    else:
        t.bitwise_not_()
    return t.numel()


def read_fired(source: Any, world_size: int) -> dict[int, list[dict[str, Any]]]:
    """The records each rank wrote in the test: ``source`` is the run
    directory of rank processes, or the threaded world of rank threads."""
    if source is None:
        return {}
    if not isinstance(source, str):
        # NB: list(...items()) copies in one step under the GIL: rank threads that
        # are still arming add their entries meanwhile (a thousand ranks, one of
        # them killed while others start), which a loop over the live view would
        # meet as "dictionary changed size during iteration".
        return {r: list(recs) for r, recs in list(_thread_records.get(source, {}).items())}
    fired: dict[int, list[dict[str, Any]]] = {}
    for rank in range(world_size):
        try:
            with open(records_path(source, rank)) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        fired[rank] = [json.loads(line) for line in lines if line.strip()]
    return fired
