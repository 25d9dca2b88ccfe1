"""Pieces shared by disttest's Python process groups (threaded and fake):
a Work over a Future, reductions, argument checks and copies."""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.futures import Future

from disttest import _compat

__unittest = True

__all__ = ["CollectiveMismatch", "CollectiveTimeout", "FutureWork", "InvalidArgument", "PythonGroup", "REFUSED_MARK",
           "check_op", "completed_work", "each_rank", "rank_runs", "refused_call"]

TIMED_OUT = "{op} on group {group} did not complete within {limit:g}s, {whose} (disttest): {why}"
#: Whose limit a timed-out Work waited for (TIMED_OUT's ``{whose}``).
GROUP_LIMIT = "the group's timeout"
WAIT_LIMIT = "the timeout passed to wait()"
RANK_RANGE = "{what}: {name}={value!r} is not a rank of group {group} (valid: 0 to {last}) (disttest)"
DISAGREE = "{what} #{seq} on group {group}: ranks pass different {name} (disttest): {values}"
#: Tensors that must agree across ranks (an all_reduce's, a broadcast's) do not.
DIFFERENT_TENSORS = "{what}: ranks passed tensors of different dtypes or shapes ({passed}) (disttest)"
#: A piece that does not fill the slot it is for (a gather's, a scatter's).
DOES_NOT_FIT = "{what}: {where}: {shape} {dtype} into {slot_shape} {slot_dtype} (disttest)"
#: Coalesced calls whose ranks pass lists of different lengths.
DIFFERENT_COUNTS = "{what}: ranks passed different numbers of tensors ({passed}) (disttest)"


class CollectiveMismatch(RuntimeError):
    """Ranks called different collectives, or passed incompatible arguments,
    at the same step of a group."""


class InvalidArgument(ValueError, RuntimeError):
    """A collective's arguments cannot work in this rank (an op its dtype
    lacks, split sizes, a rank out of range, a list of the wrong length): a
    ``ValueError``, and a ``RuntimeError`` as gloo's and NCCL's are, so that
    a suite written against either catches it."""


class CollectiveTimeout(RuntimeError):
    """A Work did not complete within its group's timeout (a peer never came).

    Fields: ``op``, ``timeout`` (seconds).
    """

    def __init__(self, message: str, op: str, timeout: float) -> None:
        super().__init__(message)
        self.op = op
        self.timeout = timeout


def seconds(timeout: Any) -> float | None:
    """A c10d timeout (timedelta or seconds; zero means none) in seconds, or None."""
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return value if value > 0 else None


class FutureWork(_compat.work_base()):  # type: ignore[misc]
    """A c10d Work over a ``torch.futures.Future`` whose value is the output
    tensors: ``wait()`` blocks until it completes, or raises its error (a
    threaded world's abort sets one). With a ``timeout`` (the group's),
    ``wait()`` raises :class:`CollectiveTimeout` after it, saying why
    (``on_timeout()`` tells, and may clean up)."""

    def __init__(self, future: Future[Any], op: str, timeout: float | None = None,
                 group: str = "", on_timeout: Callable[[], str] | None = None) -> None:
        super().__init__()
        self._future = future
        self.op = op
        self.source: int | None = None
        self._limit = timeout  # NB: not "timeout": torch 2.14's Work has a read-only one
        self._group = group
        self._on_timeout = on_timeout
        # A latch: held until the future completes (a lock is cheaper than an
        # Event, whose wait with a limit builds a Condition waiter each time).
        self._done = threading.Lock()
        self._done.acquire()
        future.add_done_callback(lambda _: self._done.release())

    def wait(self, timeout: Any = None) -> bool:
        own = seconds(timeout)
        limit = own or self._limit
        if limit is not None and not self._opened(limit):
            raise self._timed_out(limit, own=own is not None)
        self._future.wait()
        return True

    def _timed_out(self, limit: float, own: bool) -> CollectiveTimeout:
        """The error of a wait that ended at ``limit`` (``own``: the wait's
        own timeout, not the group's)."""
        why = self._on_timeout() if self._on_timeout is not None else "it never completed"
        return CollectiveTimeout(TIMED_OUT.format(op=self.op, group=self._group, limit=limit,
                                                  whose=WAIT_LIMIT if own else GROUP_LIMIT, why=why),
                                 self.op, limit)

    def _opened(self, limit: float) -> bool:
        if not self._done.acquire(timeout=limit):
            return False
        self._done.release()  # open for every other waiter too
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self) -> Any:
        try:
            self._future.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def get_future(self) -> Future[Any]:
        return self._future

    def result(self) -> Any:
        return self._future.value()

    def _source_rank(self) -> int:
        if self.source is None:
            raise RuntimeError("the source rank is known only once recv completes (disttest)")
        return self.source

    def synchronize(self) -> None:
        self.wait()


class PythonGroup(dist.ProcessGroup):
    """A process group written in Python (disttest's threaded and fake
    groups): its name, its backend's name (``BACKEND_NAME``), and the
    placeholder C++ backend c10d asks for
    (:func:`disttest._compat.register_python_group_backend`)."""

    BACKEND_NAME = ""

    def __init__(self, rank: int, world_size: int, name: str = "") -> None:
        super().__init__(rank, world_size)  # type: ignore[call-arg]
        self._name = name
        _compat.register_python_group_backend(self, rank, world_size)

    @property
    def group_name(self) -> str:
        return self._name

    def getBackendName(self) -> str:
        return self.BACKEND_NAME

    # The names other torch versions call (a subclass defines the first ones).
    def _allgather_base(self, *args: Any) -> Any:
        return self.all_gather_single(*args)

    def allgather_into_tensor_coalesced(self, *args: Any) -> Any:
        return self.all_gather_single_coalesced(*args)

    def _reduce_scatter_base(self, *args: Any) -> Any:
        return self.reduce_scatter_single(*args)

    def reduce_scatter_tensor_coalesced(self, *args: Any) -> Any:
        return self.reduce_scatter_single_coalesced(*args)

    def alltoall_base(self, *args: Any) -> Any:
        return self.all_to_all_single(*args)


def completed_work(value: Any, op: str = "") -> FutureWork:
    """A Work that has already completed with ``value``."""
    fut: Future[Any] = Future()
    fut.set_result(value)
    return FutureWork(fut, op)


# --- reductions -------------------------------------------------------------------

R: Any = dist.ReduceOp.RedOpType  # (the stubs lack most members)
_BITWISE = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}


def check_op(kind: Any, dtype: torch.dtype, what: str) -> None:
    """Refuse reduce op ``kind`` (a ``RedOpType``) on ``dtype`` where gloo
    refuses it: a bitwise op on floating-point or complex tensors, AVG on
    integer ones."""
    if kind in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise InvalidArgument(f"{what}: {kind.name} needs integer or bool tensors, got {dtype} (disttest)")
    if kind == R.AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise InvalidArgument(f"{what}: AVG needs floating-point tensors, got {dtype} (disttest)")


def _reduce(tensors: list[torch.Tensor], op: Any, what: str) -> torch.Tensor:
    kind, factor = _compat.reduce_op_parts(op)
    dtype = tensors[0].dtype
    check_op(kind, dtype, what)
    if kind in _BITWISE:
        out = tensors[0].clone()
        for t in tensors[1:]:
            out = _BITWISE[kind](out, t)
        return out
    stacked = torch.stack([t.detach() for t in tensors])
    if kind == R.SUM:
        return stacked.sum(0).to(dtype)
    if kind == R.PRODUCT:
        return stacked.prod(0).to(dtype)
    if kind == R.MIN:
        return stacked.amin(0)
    if kind == R.MAX:
        return stacked.amax(0)
    if kind == R.AVG:
        return stacked.mean(0)
    if kind == R.PREMUL_SUM:
        scale = factor if not isinstance(factor, torch.Tensor) else factor.to(stacked.device)
        return (stacked * scale).sum(0).to(dtype)
    raise InvalidArgument(f"{what}: reduce op {kind} is not supported (disttest)")


def _same(tensors: Sequence[torch.Tensor], what: str) -> None:
    first = tensors[0]
    if any(t.shape != first.shape or t.dtype != first.dtype for t in tensors):
        # Every rank's, alike ones together (it named the first that differed from rank 0's alone).
        passed = each_rank([f"{t.dtype} {list(t.shape)}" for t in tensors], "passed {}")
        raise CollectiveMismatch(DIFFERENT_TENSORS.format(what=what, passed=passed))


def _fits(what: str, slot: torch.Tensor, piece: torch.Tensor, where: str) -> None:
    """Raise :class:`CollectiveMismatch` unless ``piece`` fills ``slot`` as
    it is: the same dtype and shape. gloo refuses both; a copy would cast
    and broadcast in silence."""
    if slot.dtype != piece.dtype or slot.shape != piece.shape:
        raise CollectiveMismatch(DOES_NOT_FIT.format(what=what, where=where, shape=list(piece.shape),
                                                     dtype=piece.dtype, slot_shape=list(slot.shape),
                                                     slot_dtype=slot.dtype))


def _counts(what: str, lists: Sequence[Sequence[Any]]) -> int:
    """The one length of every rank's list (coalesced calls), or
    :class:`CollectiveMismatch` naming what each rank passed."""
    lengths = [len(x) for x in lists]
    if len(set(lengths)) > 1:
        passed = each_rank(lengths, "passed {}")  # (ranks that passed alike together: its size does not grow)
        raise CollectiveMismatch(DIFFERENT_COUNTS.format(what=what, passed=passed))
    return lengths[0] if lengths else 0


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.detach().copy_(src.to(dst.device))


def _splits(sizes: Sequence[int] | torch.Tensor | None, total: int, n: int, what: str) -> list[int]:
    """Split sizes in every form torch takes (None or empty: even; a list,
    a tuple, a 1-D integer tensor) as a list that covers ``total``."""
    if isinstance(sizes, torch.Tensor):
        if sizes.dim() != 1 or sizes.dtype.is_floating_point or sizes.dtype.is_complex:
            raise InvalidArgument(f"{what}: split sizes must be a 1-D integer tensor, got {sizes.dtype} "
                             f"{list(sizes.shape)} (disttest)")
        sizes = [int(s) for s in sizes.tolist()]
    if sizes is None or len(sizes) == 0:
        if total % n:
            raise InvalidArgument(f"{what}: dim 0 of size {total} does not split evenly over {n} ranks (disttest)")
        return [total // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != total or min(sizes) < 0:
        raise InvalidArgument(f"{what}: split sizes {sizes} do not cover dim 0 of size {total} over {n} ranks (disttest)")
    return sizes




_E = TypeVar("_E", bound=BaseException)

#: Set on an exception a call raised before it communicated (an argument a
#: group refused as it was called): the calling rank's own error, never the
#: consequence of a peer's end (read by ``outcome.comm_site``).
REFUSED_MARK = "__disttest_refused__"


def refused_call(error: _E) -> _E:
    """``error``, marked as raised before its call communicated (:data:`REFUSED_MARK`)."""
    setattr(error, REFUSED_MARK, True)
    return error


def check_rank(value: Any, size: int, what: str, name: str, group: str) -> int:
    """``value`` as a rank of a group of ``size``, or a ValueError naming it
    and the range (raised as the call is made: a refusal)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise refused_call(InvalidArgument(RANK_RANGE.format(what=what, name=name, value=value, group=group,
                                                             last=size - 1)))
    return value


def op_label(op: Any) -> str:
    """A reduce op as its name (``PREMUL_SUM(2.0)`` with its factor)."""
    kind, factor = _compat.reduce_op_parts(op)
    name = getattr(kind, "name", str(kind))
    if factor is None:
        return str(name)
    value = factor.item() if isinstance(factor, torch.Tensor) and factor.numel() == 1 else factor
    return f"{name}({value})"


#: Up to this many ranks are named one by one; more as runs (``0-516, 518-1023``).
LISTED = 8
#: Up to this many runs are named; more are cut short, with the count of ranks.
RUNS_LISTED = 12


def rank_runs(ranks: Iterable[int]) -> str:
    """How every report names ranks: ``1, 2, 5`` for a few (up to
    :data:`LISTED`), ``0-516, 518-1023`` for many, of a size that does not
    grow with the world: ranks at a stride as ``0, 2, 4, ..., 1022 (512
    ranks, every 2nd)``, other scattered ranks cut short after
    :data:`RUNS_LISTED` runs, with their count."""
    ordered = sorted(set(ranks))
    if len(ordered) <= LISTED:
        return ", ".join(map(str, ordered))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    named = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(named) <= RUNS_LISTED:
        return ", ".join(named)
    steps = {b - a for a, b in itertools.pairwise(ordered)}
    if len(steps) == 1:
        (step,) = steps
        return f"{', '.join(named[:3])}, ..., {named[-1]} ({len(ordered)} ranks, every {_nth(step)})"
    return f"{', '.join(named[:RUNS_LISTED - 2])}, ..., {named[-1]} ({len(ordered)} ranks)"


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def each_rank(values: Sequence[Any], did: str) -> str:
    """What each rank did, ranks that did the same together (``did`` formats
    the value): ``ranks 0-16, 18-511 called all_reduce; rank 17 called
    broadcast``, of a size that does not grow with the world."""
    groups: dict[tuple[type, Any], list[int]] = {}
    first: dict[tuple[type, Any], Any] = {}
    for r, v in enumerate(values):
        # By type and value: 1 and True are equal and hash alike, "1" and 1
        # print alike; each differs from the other.
        key = (type(v), v if isinstance(v, Hashable) else repr(v))
        groups.setdefault(key, []).append(r)
        first.setdefault(key, v)
    texts = {key: did.format(v) for key, v in first.items()}
    alike = {t for t, n in collections.Counter(texts.values()).items() if n > 1}
    return "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {rank_runs(rs)} "
                     f"{did.format(repr(first[key])) if texts[key] in alike else texts[key]}"
                     for key, rs in groups.items())


def check_agree(what: str, seq: int, group: str, agree: Sequence[dict[str, Any] | None]) -> None:
    """Raise CollectiveMismatch when ranks passed different values for an
    argument every rank of a collective must share (its root, its op)."""
    first = agree[0] or {}
    for name, value in first.items():
        values = [(a or {}).get(name) for a in agree]
        if any(v != value for v in values):
            told = each_rank(values, f"passed {name}={{}}")
            raise CollectiveMismatch(DISAGREE.format(what=what, seq=seq, group=group, name=name, values=told))


def _one_dtype(what: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    # An output of another dtype would be cast silently by copy_: reject it.
    for t in outputs:
        if inputs and t.dtype != inputs[0].dtype:
            raise refused_call(InvalidArgument(f"{what}: an output is {t.dtype} but the input is "
                                               f"{inputs[0].dtype}; they must match (disttest)"))


def _copyable(error: BaseException) -> bool:
    # Each rank gets its own exception object (tracebacks are per raise).
    try:
        type(error)(*error.args)
    except Exception:  # noqa: BLE001
        return False
    return True
