"""Fake communication for one-process tests: a world without peers.

``mock_init_dist(rank, world_size)`` makes the current process rank
``rank`` of a world of ``world_size`` with no other process: every
collective completes at once, as if *every rank had passed this rank's
tensors* (``all_reduce`` SUM multiplies by the world size, ``all_gather``
fills each slot with this rank's tensor, ``broadcast`` and ``recv`` leave
tensors as they are; so does ``scatter`` on a rank that is not its
source). Output shapes are right and Works carry their output tensors, so
code such as ``DistributedDataParallel(model)`` runs forward and backward in
one process with a fake world of 8. Object collectives whose data would come
from another rank (``broadcast_object_list`` and ``scatter_object_list`` on
a non-source rank) leave the caller's list as it was. Calls gloo refuses
(another dtype or shape, a bitwise reduction of floats) are refused here.

Upstream's names: ``MockProcessGroup``, ``create_mock_pg``, the backend
``"mock_process_group"``, ``mock_init_dist``, ``with_dist``,
``with_fake_comms``, ``FakeStore``. torch's own ``fake`` backend can be
registered too (:func:`register_fake_backend`) for code that asks for it.

Importing this module changes nothing in torch. The backend and the object
collective wrappers are installed by ``mock_init_dist`` (and stay for the
process, as upstream's registration does) or by ``with_dist`` /
``with_fake_comms``, which remove them again on exit.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import unittest
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._typing import F
from disttest.config import MAX_FAKE_WORLD_SIZE, ConfigError, parse_world_size
from disttest.pg._local import (
    FutureWork,
    InvalidArgument,
    PythonGroup,
    _copy,
    _fits,
    _one_dtype,
    _splits,
    check_op,
    completed_work,
)

__unittest = True

__all__ = [
    "BACKEND",
    "ALREADY_INITIALIZED",
    "NOT_DECORATABLE",
    "AlreadyInitialized",
    "FakeProcessGroup",  # noqa: F822 (module __getattr__)
    "FakeStore",
    "_create_fake_pg",
    "MockProcessGroup",
    "create_mock_pg",
    "mock_init_dist",
    "register_fake_backend",
    "with_dist",
    "with_fake_comms",
]

BACKEND = "mock_process_group"
ALREADY_INITIALIZED = (
    "a process group already exists (backend {backend!r}, rank {rank} of {size}); "
    "fake comms need none (disttest): destroy it first, or do not nest with_dist / with_fake_comms"
)
R: Any = dist.ReduceOp.RedOpType  # (the stubs lack most members)
#: A list argument of the wrong length for the fake world.
WRONG_COUNT = "{what}: {name} holds {got} tensor(s); a world of {n} needs {n}, one a rank (disttest)"
#: A root or peer that is no rank of the fake world.
NOT_A_RANK = "{what}: {name}={value!r} is not a rank of the fake world (valid: 0 to {last}) (disttest)"
#: An all-gather's (or a reduce-scatter's) output and input sizes that do not fit.
WRONG_SIZE = ("{what}: {out} element(s) against {inp}; a world of {n} needs {n} times as many in the larger "
              "(disttest)")
#: A receive from any rank in a world of one.
NO_SENDER = "recv from any rank in a fake world of 1: no other rank could send it (disttest)"


class AlreadyInitialized(RuntimeError, AssertionError):
    """Fake comms were asked for while a process group exists (an
    ``AssertionError`` too, as upstream's ``mock_init_dist`` raised)."""


class FakeStore(dist.HashStore):
    """A store that needs no peers (in memory, in this process)."""


def _create_fake_pg(common_opts: Any, backend_opts: Any) -> Any:
    """The creator of c10d's ``fake`` backend (upstream's
    ``fake_pg._create_fake_pg``): a ``FakeProcessGroup`` of the group's
    rank and size, which communicates nothing."""
    return _compat.fake_process_group()._create_internal(  # type: ignore[attr-defined]
        common_opts.group_rank, common_opts.group_size, backend_opts)


def __getattr__(name: str) -> Any:
    # Upstream's fake_pg hands on c10d's class; looked up when asked for.
    if name == "FakeProcessGroup":
        return _compat.fake_process_group()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_fake_backend() -> None:
    """Register torch's ``fake`` backend (``FakeProcessGroup``), once."""
    _compat.ensure_fake_backend()


def _same_everywhere(t: torch.Tensor, op: Any, n: int, what: str = "all_reduce") -> torch.Tensor:
    """The reduction of ``n`` copies of ``t`` under ``op``, in closed form
    (refused where gloo and the threaded group refuse it: a bitwise op on
    floating-point tensors, AVG on integers)."""
    kind, factor = _compat.reduce_op_parts(op)
    check_op(kind, t.dtype, what)
    if kind in (R.MIN, R.MAX, R.BAND, R.BOR, R.AVG):
        return t
    if kind == R.SUM:
        return t * n
    if kind == R.PRODUCT:
        return t ** n
    if kind == R.BXOR:
        return t if n % 2 else torch.zeros_like(t)
    if kind == R.PREMUL_SUM:
        return cast(torch.Tensor, t * (factor * n))  # factor: a float or a tensor
    raise ValueError(f"reduce op {kind} is not supported by fake comms (disttest)")


class MockProcessGroup(PythonGroup):
    """One rank of a world with no peers: collectives complete at once, as if
    every rank had passed this rank's tensors."""

    BACKEND_NAME = BACKEND

    def __init__(self, rank: int, world_size: int, name: str = "") -> None:
        # (MockProcessGroup(3, 2) was made, and its collectives indexed out of range)
        rank, world_size = _checked(rank, world_size, "MockProcessGroup")
        super().__init__(rank, world_size, name)

    def __repr__(self) -> str:
        return f"MockProcessGroup(rank={self.rank()}, world_size={self.size()})"

    def _count(self, what: str, name: str, tensors: list[Any]) -> None:
        """A list a collective needs one tensor a rank in (gloo refuses
        another length; fake comms filled what fitted and went on)."""
        if len(tensors) != self.size():
            raise InvalidArgument(WRONG_COUNT.format(what=what, name=name, got=len(tensors), n=self.size()))

    def _root(self, what: str, name: str, rank: int) -> None:
        if not 0 <= rank < self.size():
            raise InvalidArgument(NOT_A_RANK.format(what=what, name=name, value=rank, last=self.size() - 1))

    def _elements(self, what: str, output: torch.Tensor, input: torch.Tensor, times: int) -> None:
        """``output`` holds ``times`` as many elements as ``input`` (an all-gather's)."""
        if output.numel() != input.numel() * times:
            raise InvalidArgument(WRONG_SIZE.format(what=what, out=output.numel(), inp=input.numel(), n=self.size()))

    def _reduced(self, tensors: list[torch.Tensor], op: Any, what: str = "all_reduce") -> FutureWork:
        with torch.no_grad():
            for t in tensors:
                _copy(t, _same_everywhere(t.detach(), op, self.size(), what))
        return completed_work(tensors, what)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FutureWork:
        return self._reduced(tensors, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> FutureWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> FutureWork:
        self._root("reduce", "dst", opts.rootRank)
        if opts.rootRank == self.rank():
            return self._reduced(tensors, opts.reduceOp, "reduce")
        for t in tensors:  # (checked on every rank, as the root would refuse it)
            check_op(_compat.reduce_op_parts(opts.reduceOp)[0], t.dtype, "reduce")
        return completed_work(tensors, "reduce")

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> FutureWork:
        self._root("broadcast", "src", opts.rootRank)
        return completed_work(tensors, "broadcast")

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        self._count("all_gather", "tensor_list", outputs[0])
        _one_dtype("all_gather", outputs[0], inputs)
        with torch.no_grad():
            for r, out in enumerate(outputs[0]):
                _fits("all_gather", out, inputs[0], f"rank {r} sends to output {r}")
                _copy(out, inputs[0])
        return completed_work(outputs, "all_gather")

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        with torch.no_grad():
            for per_rank in outputs:
                for j, (out, inp) in enumerate(zip(per_rank, inputs, strict=True)):
                    _fits("all_gather_coalesced", out, inp, f"tensor {j}")
                    _copy(out, inp)
        return completed_work(outputs, "all_gather_coalesced")

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> FutureWork:
        self._elements("all_gather_into_tensor", output, input, self.size())
        _one_dtype("all_gather_into_tensor", [output], [input])
        with torch.no_grad():
            _copy(output, input.reshape(-1).repeat(self.size()).reshape(output.shape))
        return completed_work([output], "all_gather_single")

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        for out, inp in zip(outputs, inputs, strict=True):
            self.all_gather_single(out, inp)
        return completed_work(outputs, "all_gather_single_coalesced")

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> FutureWork:
        self._root("gather", "dst", opts.rootRank)
        if opts.rootRank == self.rank():
            self._count("gather", "gather_list", outputs[0])
            with torch.no_grad():
                for r, out in enumerate(outputs[0]):
                    _fits("gather", out, inputs[0], f"rank {r} sends to the root's output {r}")
                    _copy(out, inputs[0])
        return completed_work(outputs, "gather")

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> FutureWork:
        self._root("scatter", "src", opts.rootRank)
        if opts.rootRank == self.rank():
            self._count("scatter", "scatter_list", inputs[0])
            for r, piece in enumerate(inputs[0]):
                _fits("scatter", outputs[0], piece, f"the root's input {r} to rank {r}'s output")
            with torch.no_grad():
                _copy(outputs[0], inputs[0][self.rank()])
        return completed_work(outputs, "scatter")

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> FutureWork:
        self._count("reduce_scatter", "input_list", inputs[0])
        for r, piece in enumerate(inputs[0]):
            _fits("reduce_scatter", outputs[0], piece, f"the inputs {r} into rank {r}'s output")
        with torch.no_grad():
            _copy(outputs[0], _same_everywhere(inputs[0][self.rank()].detach(), opts.reduceOp, self.size(),
                                               "reduce_scatter"))
        return completed_work(outputs, "reduce_scatter")

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> FutureWork:
        self._elements("reduce_scatter_tensor", input, output, self.size())
        _one_dtype("reduce_scatter_tensor", [output], [input])
        piece = input.reshape(-1).chunk(self.size())[self.rank()]
        with torch.no_grad():
            _copy(output, _same_everywhere(piece.detach(), opts.reduceOp, self.size(),
                                           "reduce_scatter_tensor").reshape(output.shape))
        return completed_work([output], "reduce_scatter_single")

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> FutureWork:
        for out, inp in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, inp, opts)
        return completed_work(outputs, "reduce_scatter_single_coalesced")

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        self._count("all_to_all", "output_tensor_list", outputs)
        self._count("all_to_all", "input_tensor_list", inputs)
        mine = inputs[self.rank()]
        with torch.no_grad():
            for src, out in enumerate(outputs):
                # (every rank sends what this rank sends itself: each output must take it)
                _fits("all_to_all", out, mine, f"rank {src} sends to output {src}")
                _copy(out, mine)
        return completed_work(outputs, "all_to_all")

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> FutureWork:
        n = self.size()
        _one_dtype("all_to_all_single", [output], [input])
        mine = input.split(_splits(input_split_sizes, input.size(0), n, "all_to_all_single"))[self.rank()]  # type: ignore[no-untyped-call]  # torch: Tensor.split is unannotated
        with torch.no_grad():
            for src, slot in enumerate(output.split(_splits(output_split_sizes, output.size(0), n, "all_to_all_single"))):  # type: ignore[no-untyped-call]  # torch: unannotated
                _fits("all_to_all_single", slot, mine, f"rank {src} sends to this rank")
                _copy(slot, mine)
        return completed_work([output], "all_to_all_single")

    def barrier(self, opts: Any = None) -> FutureWork:
        return completed_work(None, "barrier")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> FutureWork:
        self._root("send", "dst", dst)
        return completed_work(tensors, "send")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> FutureWork:
        self._root("recv", "src", src)
        work = completed_work(tensors, "recv")
        work.source = src
        return work

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> FutureWork:
        if self.size() == 1:  # (no other rank could send it: a real group waits for ever)
            raise InvalidArgument(NO_SENDER)
        work = completed_work(tensors, "recv")
        work.source = 1 if self.rank() == 0 else 0
        return work


def create_mock_pg(prefix_store: Any, rank: int, world_size: int, timeout: timedelta) -> MockProcessGroup:
    """The backend's creator (upstream's signature)."""
    return MockProcessGroup(rank, world_size)


def _create(opts: Any, backend_opts: Any) -> MockProcessGroup:
    return MockProcessGroup(opts.group_rank, opts.group_size, str(opts.group_id))




# --- object collectives whose data comes from another rank ---------------------


def _fake_target(group: Any) -> bool:
    pg = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
    return isinstance(pg, MockProcessGroup)


def _keep_when_fake(func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind_partial(*args, **kwargs).arguments
        group = bound.get("group")
        if _fake_target(group):
            # NB: src is a global rank, group_src one of the group (a rank's
            # group rank was compared with its global one: its own scatter
            # was dropped, another's unpickled garbage); neither means 0, as torch.
            src, group_src = bound.get("src"), bound.get("group_src")
            mine = dist.get_rank() if src is not None or group is None else dist.get_rank(group)
            if (src if src is not None else group_src if group_src is not None else 0) != mine:
                return None  # no rank can send: the caller's list stays as it was
        return func(*args, **kwargs)

    wrapper.__disttest_fake_aware__ = True  # type: ignore[attr-defined]
    return wrapper


def _install_object_wrappers() -> Callable[[], None]:
    """Wrap the object collectives of c10d; return the undo."""
    import torch.distributed.distributed_c10d as c10d

    undo: list[tuple[Any, str, Any]] = []
    for name in ("broadcast_object_list", "scatter_object_list"):
        func = getattr(c10d, name)
        if getattr(func, "__disttest_fake_aware__", False):
            continue
        wrapped = _keep_when_fake(func)
        for module in (c10d, dist):
            if getattr(module, name) is func:
                setattr(module, name, wrapped)
                undo.append((module, name, func))

    def restore() -> None:
        for module, name, func in undo:
            if getattr(getattr(module, name), "__wrapped__", None) is func:
                setattr(module, name, func)

    return restore


_undo: list[Callable[[], None]] = []  # while a fake world is installed
#: The fake worlds open now (``with_dist`` blocks, in any thread), and
#: whether ``mock_init_dist`` was called outside one (then the install stays
#: for the process, as upstream's registration does).
_open = [0]
_kept = [False]
#: NB: default groups are per thread where threads are ranks; the install is
#: the process's, made by the first world and undone by the last.
_lock = threading.RLock()


def _install() -> bool:
    """Register the ``mock_process_group`` backend, wrap the object
    collectives and let c10d's store-based barrier pass in a fake world,
    unless already done; True if this call did it."""
    with _lock:
        if _undo:
            return False
        if _compat.backend_creator(BACKEND) is not _create:
            _undo.append(_compat.register_backend(BACKEND, _create, ["cpu", "cuda"]))
        _undo.append(_install_object_wrappers())
        # (TORCH_DIST_INIT_BARRIER=1: a fake world's other ranks never check in)
        _undo.append(_compat.skip_store_barriers(lambda: _fake_target(None)))
        return True


def _uninstall() -> None:
    """Undo :func:`_install`: torch is as it was before."""
    with _lock:
        while _undo:
            _undo.pop()()


# --- the fake world ------------------------------------------------------------


def _checked(rank: object, world_size: object, where: str) -> tuple[int, int]:
    """``(rank, world_size)`` of a fake world, or a :class:`ConfigError`
    naming the bad value and ``where`` it was given (``"with_dist"``...)."""
    size = parse_world_size(world_size, f"{where}(world_size=...)", most=MAX_FAKE_WORLD_SIZE)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ConfigError("rank", rank, f"{where}(rank=...)", f"expected 0 <= rank < {size}")
    return rank, size


def _init(rank: int, size: int) -> None:
    if dist.is_initialized():
        raise AlreadyInitialized(ALREADY_INITIALIZED.format(
            backend=dist.get_backend(), rank=dist.get_rank(), size=dist.get_world_size()))
    _install()
    dist.init_process_group(backend=BACKEND, rank=rank, world_size=size, store=FakeStore(),
                            timeout=timedelta(seconds=30))


def mock_init_dist(rank: int, world_size: int) -> None:
    """Make this process rank ``rank`` of a fake world of ``world_size``
    (up to :data:`~disttest.config.MAX_FAKE_WORLD_SIZE`: no rank starts).

    Raises :class:`AlreadyInitialized` if a process group exists. The
    backend stays registered for the process, as upstream's does.
    """
    rank, size = _checked(rank, world_size, "mock_init_dist")
    with _lock:  # (kept once made: a refused call leaves the install to the worlds open)
        _init(rank, size)
        _kept[0] = True


@contextlib.contextmanager
def with_dist(rank: int = 0, world_size: int = 2) -> Iterator[None]:
    """A fake world for the block; its group is destroyed on exit, also when
    the block (or making the group) raises; the last world open removes the
    backend and wrappers, and each puts back the ``sys.excepthook`` that
    c10d's ``init_process_group`` wrapped (nested ``[rank0]: [rank1]:``
    prefixes after a few worlds). Refuses to nest in one thread
    (:class:`AlreadyInitialized`); worlds in several threads (thread ranks)
    may be open at once."""
    rank, size = _checked(rank, world_size, "with_dist")
    hooks = sys.excepthook, threading.excepthook
    with _lock:
        _open[0] += 1
    refused = False
    try:
        try:
            _init(rank, size)
        except AlreadyInitialized:
            refused = True
            raise
        yield
    finally:
        try:
            # (no group existed on entry unless refused: one left now is the
            # block's, or half made by a failed _init, whatever its backend,
            # as upstream destroys it)
            if dist.is_initialized() and not refused:
                dist.destroy_process_group()
        finally:
            sys.excepthook, threading.excepthook = hooks
            with _lock:
                _open[0] -= 1
                if _open[0] == 0 and not _kept[0]:
                    _uninstall()


#: ``with_fake_comms`` given something it cannot decorate.
NOT_DECORATABLE = ("with_fake_comms({what}): expected a function, a test method or a TestCase class; give the "
                   "world's size by name, with_fake_comms(world_size=...) (disttest)")


def with_fake_comms(func: F | None = None, rank: int = 0, world_size: int = 2) -> Any:
    """Decorator: run a test method, or any function, in a fake world (an
    ``async def`` one for as long as its coroutine runs, a generator for as
    long as it is iterated). On a ``TestCase`` class, each of its test
    methods runs in one. The rank and size are checked when it decorates."""
    _checked(rank, world_size, "with_fake_comms")
    if func is None:
        return functools.partial(with_fake_comms, rank=rank, world_size=world_size)
    if inspect.isclass(func):
        # (the class was replaced by a function: its tests vanished, and the run said OK)
        # Inherited test methods too (a mixin's, a base class's: they ran in no
        # world), each wrapped on this class; one its base wrapped already is left so.
        prefix = getattr(unittest.defaultTestLoader, "testMethodPrefix", "test")
        for name in dir(func):
            member = inspect.getattr_static(func, name, None)
            if name.startswith(prefix) and inspect.isfunction(member) and not getattr(member, _IN_FAKE_WORLD, False):
                setattr(func, name, with_fake_comms(member, rank=rank, world_size=world_size))
        return func
    if not callable(func):
        raise TypeError(NOT_DECORATABLE.format(what=repr(func)))
    if inspect.iscoroutinefunction(func):
        coroutine = func

        @functools.wraps(func)
        async def awaiting(*args: Any, **kwargs: Any) -> Any:
            with with_dist(rank, world_size):
                return await coroutine(*args, **kwargs)

        setattr(awaiting, _IN_FAKE_WORLD, True)
        return awaiting
    if inspect.isgeneratorfunction(func):
        generator = func

        @functools.wraps(func)
        def iterating(*args: Any, **kwargs: Any) -> Any:
            with with_dist(rank, world_size):
                return (yield from generator(*args, **kwargs))

        setattr(iterating, _IN_FAKE_WORLD, True)
        return iterating

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with with_dist(rank, world_size):
            return func(*args, **kwargs)

    setattr(wrapper, _IN_FAKE_WORLD, True)
    return wrapper


#: Set on a function that ``with_fake_comms`` wrapped (a class decorated
#: after its base leaves the base's tests as they are).
_IN_FAKE_WORLD = "__disttest_fake_world__"
