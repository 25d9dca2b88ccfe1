"""The rank's side of :mod:`~disttest._runner.progress`: the collectives of
``torch.distributed`` wrapped (:func:`install_tracking`, with its undo), and
the record each rank writes as it enters and leaves one (its progress
board's slot), which the parent's desync and hang judgement reads; the
flight-recorder watcher; the hook fault injection sets.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from disttest._ops import COLLECTIVES, P2P_OPS, RENDEZVOUS_OPS
from disttest._runner.board import (
    ANY,
    P2P_GROUP,
    RENDEZVOUS_GROUP,
    Board,
    _p2p_parts,
    _runs,
    p2p_key,
)
from disttest._runner.record import Tracker
from disttest._runner.refusals import mark_refused, refused

__unittest = True

__all__ = [
    "CollectiveHook", "install_tracking", "restart_counts", "set_collective_hook", "track_into", "tracked",
    "untrack_thread", "watch_flight_recorder",
]

_P2P = {"send": "dst", "recv": "src", "isend": "dst", "irecv": "src"}
_ASYNC_ONLY = {"isend", "irecv", "batch_isend_irecv"}
_ROOTED = {"broadcast", "scatter"}


_TRACKED = (*COLLECTIVES, *P2P_OPS, *RENDEZVOUS_OPS)

#: What the tracking wrapper asks as a rank enters a collective: ``(op,
#: rank) -> after or None``, where ``after(args, kwargs, result)`` runs once
#: the collective returned, and returns what the call returns instead (None:
#: the result itself). Fault injection (:mod:`disttest.faults.rank`, a
#: layer above this core) sets it with :func:`set_collective_hook`.
CollectiveHook = Callable[[str, int], Callable[[tuple[Any, ...], dict[str, Any], Any], Any] | None]
_hook: list[CollectiveHook] = []


def set_collective_hook(hook: CollectiveHook | None) -> None:
    """Make ``hook`` the one the tracking wrapper calls (None: no hook)."""
    _hook[:] = [hook] if hook is not None else []

_local = threading.local()
_process_tracker: list[Tracker] = []


def _current() -> Tracker | None:
    tracker: Tracker | None = getattr(_local, "tracker", None)
    if tracker is not None:
        return tracker
    return _process_tracker[0] if _process_tracker else None


def track_into(board: Board, rank: int, per_thread: bool = False) -> None:
    """Record this process's (or, with ``per_thread``, this thread's)
    collectives into ``board`` as ``rank``."""
    tracker = Tracker(board, rank, threads=per_thread)
    if per_thread:
        _local.tracker = tracker
    else:
        _process_tracker[:] = [tracker]
    board.write(rank, tracker.record)


def untrack_thread() -> None:
    """Stop recording this thread's collectives (a rank thread whose test ended)."""
    _local.tracker = None


@contextlib.contextmanager
def tracked(op: str, group: str, peers: Sequence[int]) -> Iterator[None]:
    """Record ``op`` as a collective of ``group`` (named apart from c10d's
    groups) over ``peers`` while the block runs, in a rank that tracks: a
    call that waits for every rank and is not c10d's (RPC's graceful
    shutdown), so that a rank waiting in it is seen waiting for a peer that
    never came, not as hung itself."""
    tracker = _current()
    if tracker is None:
        yield
        return
    tracker.enter(op, group, peers, waits=True)
    failed = True
    try:
        yield
        failed = False
    finally:
        tracker.leave(failed)


def restart_counts() -> None:
    """Count this rank's collectives from zero again (every rank of a pool
    does it at the start of each test, so numbers read per test)."""
    tracker = _current()
    if tracker is not None:
        tracker.reset()


def _seconds(value: Any) -> float | None:
    """A call's own timeout in seconds (a ``timedelta`` or a number)."""
    seconds = getattr(value, "total_seconds", None)
    try:
        return float(seconds() if seconds is not None else value)
    except (TypeError, ValueError):
        return None


def _compiling() -> bool:
    """Whether dynamo is tracing the caller (``torch.compiler.is_compiling``)."""
    if not _is_compiling:
        import torch

        compiler = getattr(torch, "compiler", None)
        _is_compiling.append(getattr(compiler, "is_compiling", None) or (lambda: False))
    return bool(_is_compiling[0]())


_is_compiling: list[Callable[[], bool]] = []  # torch.compiler.is_compiling, looked up once


def _global_rank(dist: Any, group: Any, rank: Any, group_rank: Any) -> int | None:
    """A peer or root as the global rank the board names it by: ``rank`` as
    given, else rank ``group_rank`` of ``group``; None if neither is given."""
    if rank is None and group_rank is not None:
        rank = group_rank if group is None or group is dist.GroupMember.WORLD else dist.get_global_rank(
            group, group_rank)
    return None if rank is None else operator.index(rank)  # (a tensor or numpy rank reads as its int)


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


def _batch_keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """The count keys of a ``batch_isend_irecv``'s operations (``P2POp``:
    ``op``, ``peer``, the global rank, and ``tag``), as the single calls
    would count them."""
    return [p2p_key("send>" if getattr(op.op, "__name__", "") == "isend" else "recv<",
                    str(operator.index(op.peer)), getattr(op, "tag", 0))
            for op in (args[0] if args else kwargs.get("p2p_op_list", ()))]


def _wrap(dist: Any, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    get_group = _getter(sig, "group")
    get_async = _getter(sig, "async_op")
    peer_name = _P2P.get(name)
    get_peer = _getter(sig, peer_name) if peer_name else None
    get_group_peer = _getter(sig, "group_" + peer_name) if peer_name else None
    get_tag = _getter(sig, "tag") if peer_name else None
    # gloo's broadcast and scatter: a rank other than the root needs the root only.
    get_src, get_group_src = (_getter(sig, "src"), _getter(sig, "group_src")) if name in _ROOTED else (None, None)
    get_timeout = _getter(sig, "timeout")  # (monitored_barrier's own)

    @functools.wraps(func)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        tracker = _current()
        if tracker is None:
            return func(*args, **kwargs)
        local = tracker._local  # this thread's depth (not the property: this runs per collective)
        depth = getattr(local, "depth", 0)
        # NB: not while dynamo traces the call (torch.compile): it runs as a
        # functional collective, and tracing the bookkeeping is an error
        # (a process group is opaque to it).
        if depth:
            result = func(*args, **kwargs)
            local.inner = True  # (a collective inside completed: see `refused` below)
            return result
        if _compiling() or not (dist.is_initialized() or name in RENDEZVOUS_OPS):
            return func(*args, **kwargs)
        # Injected faults and schedule fuzzing (disttest.faults); before the
        # record, so that an injected raise is not counted as entered.
        after = _hook[0](name, tracker.rank) if _hook else None
        posted: list[str] = []
        try:
            ranks: Sequence[int] | None
            # NB: a whole group is a range (O(1) to record): a list of every
            # rank would cost each rank O(world) per call.
            if name in RENDEZVOUS_OPS:
                group, ranks = RENDEZVOUS_GROUP, range(tracker.board.world_size)
            elif name == "batch_isend_irecv":
                group, ranks = P2P_GROUP, []
                posted = _batch_keys(args, kwargs)
            else:
                group, ranks = tracker.group_of(dist, get_group(args, kwargs))
            if ranks is None:
                ranks = range(dist.get_world_size())
            if get_peer is not None and get_group_peer is not None:
                peer = _global_rank(dist, get_group(args, kwargs), get_peer(args, kwargs),
                                    get_group_peer(args, kwargs))
                arrow = "send>" if peer_name == "dst" else "recv<"
                group = p2p_key(arrow, ANY if peer is None else str(peer), get_tag(args, kwargs) if get_tag else 0)
                ranks = ranks if peer is None else [peer]
            waits = name not in _ASYNC_ONLY and not get_async(args, kwargs)
            # What the deadlock judgement needs of a call that blocks, or
            # of an asynchronous one once a wait on it does (its root here,
            # its limit when it is remembered).
            extra: dict[str, Any] = {}
            if waits:
                own = get_timeout(args, kwargs)
                extra["limit"] = tracker.limit(dist, get_group(args, kwargs)) if own is None else _seconds(own)
            # (The threaded group's broadcast completes once every rank joined it.)
            if get_src is not None and get_group_src is not None and not tracker.threads:
                extra["root"] = _global_rank(dist, get_group(args, kwargs), get_src(args, kwargs),
                                             get_group_src(args, kwargs))
            tracker.enter(name, group, ranks, waits, posted, extra)
        except Exception:  # never let bookkeeping break the user's call
            return func(*args, **kwargs)
        call = None
        if not waits:
            call = {k: tracker.record.get(k) for k in ("op", "seq", "group", "peers")}
            if "root" in tracker.record:  # (a broadcast from another root cannot match it)
                call["root"] = tracker.record["root"]
        local.depth = depth + 1
        local.inner = local.began = False
        failed = True
        try:
            result = func(*args, **kwargs)
            if after is not None:
                replaced = after(args, kwargs, result)
                result = result if replaced is None else replaced
            failed = False
            if call is not None and result is not None:
                _remember(dist, tracker, name, call, result, get_group(args, kwargs), posted, args, kwargs)
            return result
        except Exception as e:
            # Refused: by torch's checks, before any collective inside it
            # completed (an object collective's receivers unpickle after
            # its broadcast: the call is their peers' too). Not counted, and
            # not a collective the rank failed in: the error is its own.
            if not local.inner and refused(e, name, local.began):
                tracker.refused([group, *posted])
                mark_refused(e)
                failed = False
            raise
        finally:
            local.depth = depth
            tracker.leave(failed)

    tracked.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return tracked


def _remember(dist: Any, tracker: Tracker, name: str, call: dict[str, Any], result: Any, group: Any,
              posted: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Keep what an asynchronous call's Work (``result``) is, for a wait on
    it; a ``batch_isend_irecv`` returns one Work per operation, each its
    send or receive."""
    try:
        if name != "batch_isend_irecv":
            tracker.remember(result, {**call, "limit": tracker.limit(dist, group)})
            return
        ops = list(args[0] if args else kwargs.get("p2p_op_list", ()))
        if not isinstance(result, list) or len(result) != len(ops) or len(posted) != len(ops):
            return  # (one Work for the whole batch: which operation it waits in is unknown)
        # (Two operations with one key: the first is that key's earlier call.)
        seq = {key: tracker.counts[key] - posted.count(key) for key in posted}
        for work, op, key in zip(result, ops, posted, strict=True):
            direction, peer, _ = _p2p_parts(key)
            seq[key] += 1
            tracker.remember(work, {"op": "isend" if direction == "send>" else "irecv", "seq": seq[key],
                                    "group": key, "peers": _runs([int(peer)]),
                                    "limit": tracker.limit(dist, getattr(op, "group", None))})
    except Exception:  # noqa: BLE001 (never let bookkeeping break the user's call)
        pass


def _waiting(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait`` recording, while it blocks, that the rank waits in the
    asynchronous call the Work came from (an ``irecv(...).wait()``, a
    ``batch_isend_irecv``'s requests, ``all_reduce(async_op=True).wait()``)."""

    # NB: named ``wait``, first argument ``self``: pybind's trampoline for a
    # Python subclass of Work takes a ``wait`` found on the class for the
    # subclass's override and calls it, unless the caller is a frame of that
    # name with that self; under any other name the call to c10d's wait
    # came back here without end.
    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = _current()
        if tracker is not None and tracker.depth:
            tracker._local.began = True  # (the call of torch.distributed it is in reached its wait)
            return original(self, *args, **kwargs)
        if tracker is None or not tracker.pending or _compiling():
            return original(self, *args, **kwargs)
        try:
            call = tracker.pending.get(self)
        except TypeError:
            call = None
        if call is None:
            return original(self, *args, **kwargs)
        timeout = args[0] if args else kwargs.get("timeout")
        tracker.wait_in(call, _seconds(timeout) if timeout else None)  # (timedelta(0): no timeout of its own)
        tracker.depth = 1  # (the waits it makes through its base classes are this one)
        failed = True
        try:
            result = original(self, *args, **kwargs)
            failed = False
            tracker.pending.pop(self, None)  # (not None: it held this Work)
            return result
        finally:
            tracker.depth = 0
            tracker.leave(failed)

    wait.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return wait


def _futures(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.get_future`` noting that the future is the asynchronous call
    the Work came from: a wait on it (``all_reduce(async_op=True)
    .get_future().wait()``) is recorded as waiting in that call, as a wait
    on the Work is (the future's ``wait`` is wrapped by :func:`_waiting`)."""

    # NB: named ``get_future``, first argument ``self``: see _waiting (c10d's
    # get_future is virtual too, and a Python subclass's trampoline looks
    # the name up on the class).
    @functools.wraps(original)
    def get_future(self: Any, *args: Any, **kwargs: Any) -> Any:
        future = original(self, *args, **kwargs)
        tracker = _current()
        if tracker is not None and tracker.pending:
            try:
                call = tracker.pending.get(self)
                if call is not None:
                    tracker.remember(future, call)
            except Exception:  # noqa: BLE001,S110 (never let bookkeeping break the user's call)
                pass
        return future

    get_future.__disttest_tracked__ = True  # type: ignore[attr-defined]
    return get_future


def _future_wrappers() -> list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    """(class, method, wrapper maker) of what tracks a wait on a collective's
    future: c10d's ``Work.get_future`` and torch's ``Future.wait`` (a Python
    subclass of Work that defines its own ``get_future`` goes untracked)."""
    import torch.distributed as dist

    from disttest import _compat

    return [(dist.distributed_c10d.Work, "get_future", _futures), (_compat.future_class(), "wait", _waiting)]


_found_classes: list[Any] = []  # (ids of Work's direct subclasses, weak references to the classes walked)


def _work_classes() -> list[type]:
    """c10d's ``Work`` and every subclass of it. Walked again when
    ``Work``'s direct subclasses change (a threaded test installs tracking
    every time); a deeper subclass made later whose ``wait`` calls its
    base's is still seen through the base's."""
    import torch.distributed as dist

    direct = tuple(map(id, dist.distributed_c10d.Work.__subclasses__()))
    if _found_classes and _found_classes[0] == direct:
        classes = [ref() for ref in _found_classes[1]]
        if all(cls is not None for cls in classes):
            return classes
    classes, todo = [], [dist.distributed_c10d.Work]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        classes.append(cls)
    _found_classes[:] = [direct, [weakref.ref(cls) for cls in classes]]
    return classes


def _work_waits() -> dict[type, Any]:
    """Each class of :func:`_work_classes` that defines ``wait`` -> that
    ``wait`` (as it is now: a user's own patch included)."""
    found: dict[type, Any] = {}
    for cls in _work_classes():
        wait = vars(cls).get("wait")
        if wait is not None and not getattr(wait, "__disttest_tracked__", False):
            found[cls] = wait
    return found


_installed: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []  # (module, wrappers, originals)
#: The methods wrapped on classes (each Work class's ``wait``, ``get_future``,
#: the future's ``wait``): (class, name, original, the wrapper installed).
_patched: list[tuple[type, str, Any, Any]] = []
#: class -> {name: (original, wrapper)}: a wrapper is made once per original
#: (a threaded test installs every time).
_method_wrappers: weakref.WeakKeyDictionary[type, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
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
        methods: list[tuple[type, str, Any, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
            (cls, "wait", wait, _waiting) for cls, wait in _work_waits().items()]
        for cls, name, make in _future_wrappers():
            original = vars(cls).get(name)
            if original is not None and not getattr(original, "__disttest_tracked__", False):
                methods.append((cls, name, original, make))
        for cls, name, original, make in methods:
            made = _method_wrappers.setdefault(cls, {}).get(name)
            if made is None or made[0] is not original:
                made = _method_wrappers[cls][name] = (original, make(original))
            setattr(cls, name, made[1])  # (a class attribute, restored by the undo)
            _patched.append((cls, name, original, made[1]))
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
            while _patched:
                cls, name, original, wrapper = _patched.pop()
                if vars(cls).get(name) is wrapper:  # not if someone replaced it since
                    setattr(cls, name, original)

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
        while True:
            time.sleep(WATCH_INTERVAL)
            try:
                publish()
            except Exception:  # noqa: BLE001,S110 (bookkeeping never breaks a rank)
                pass

    threading.Thread(target=loop, name="disttest flight watcher", daemon=True).start()
    return publish
