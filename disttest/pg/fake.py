"""Fake communication for one-process tests: a world without peers.

``mock_init_dist(rank, world_size)`` makes the current process rank
``rank`` of a world of ``world_size`` with no other process: every
collective completes at once, as if *every rank had passed this rank's
tensors* (``all_reduce`` SUM multiplies by the world size, ``all_gather``
fills each slot with this rank's tensor, ``broadcast`` and ``recv`` leave
tensors as they are). Output shapes are right and Works carry their output
tensors, so code such as ``DistributedDataParallel(model)`` runs forward and
backward in one process with a fake world of 8. Object collectives whose
data would come from another rank (``broadcast_object_list`` and
``scatter_object_list`` on a non-source rank) leave the caller's list as it
was.

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
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._typing import F
from disttest.config import parse_world_size
from disttest.pg._local import (
    FutureWork,
    InvalidArgument,
    PythonGroup,
    _copy,
    _splits,
    completed_work,
)

__unittest = True

__all__ = [
    "BACKEND",
    "ALREADY_INITIALIZED",
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


def _same_everywhere(t: torch.Tensor, op: Any, n: int) -> torch.Tensor:
    """The reduction of ``n`` copies of ``t`` under ``op``, in closed form."""
    kind, factor = _compat.reduce_op_parts(op)
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

    def _reduced(self, tensors: list[torch.Tensor], op: Any) -> FutureWork:
        with torch.no_grad():
            for t in tensors:
                _copy(t, _same_everywhere(t.detach(), op, self.size()))
        return completed_work(tensors, "all_reduce")

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FutureWork:
        return self._reduced(tensors, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> FutureWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> FutureWork:
        self._root("reduce", "dst", opts.rootRank)
        if opts.rootRank == self.rank():
            return self._reduced(tensors, opts.reduceOp)
        return completed_work(tensors, "reduce")

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> FutureWork:
        self._root("broadcast", "src", opts.rootRank)
        return completed_work(tensors, "broadcast")

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        self._count("all_gather", "tensor_list", outputs[0])
        with torch.no_grad():
            for out in outputs[0]:
                _copy(out, inputs[0].reshape(out.shape))
        return completed_work(outputs, "all_gather")

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> FutureWork:
        with torch.no_grad():
            for per_rank in outputs:
                for out, inp in zip(per_rank, inputs, strict=True):
                    _copy(out, inp)
        return completed_work(outputs, "all_gather_coalesced")

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> FutureWork:
        self._elements("all_gather_into_tensor", output, input, self.size())
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
                for out in outputs[0]:
                    _copy(out, inputs[0])
        return completed_work(outputs, "gather")

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> FutureWork:
        self._root("scatter", "src", opts.rootRank)
        if opts.rootRank == self.rank():
            self._count("scatter", "scatter_list", inputs[0])
            with torch.no_grad():
                _copy(outputs[0], inputs[0][self.rank()])
        return completed_work(outputs, "scatter")

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> FutureWork:
        self._count("reduce_scatter", "input_list", inputs[0])
        with torch.no_grad():
            _copy(outputs[0], _same_everywhere(inputs[0][self.rank()].detach(), opts.reduceOp, self.size()))
        return completed_work(outputs, "reduce_scatter")

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> FutureWork:
        self._elements("reduce_scatter_tensor", input, output, self.size())
        piece = input.reshape(-1).chunk(self.size())[self.rank()]
        with torch.no_grad():
            _copy(output, _same_everywhere(piece.detach(), opts.reduceOp, self.size()).reshape(output.shape))
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
            for out in outputs:
                if out.shape == mine.shape:
                    _copy(out, mine)
        return completed_work(outputs, "all_to_all")

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> FutureWork:
        n = self.size()
        mine = input.split(_splits(input_split_sizes, input.size(0), n, "all_to_all_single"))[self.rank()]  # type: ignore[no-untyped-call]  # torch: Tensor.split is unannotated
        with torch.no_grad():
            for slot in output.split(_splits(output_split_sizes, output.size(0), n, "all_to_all_single")):  # type: ignore[no-untyped-call]  # torch: unannotated
                if slot.shape == mine.shape:
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
        src = bound.get("src")
        if src is None:
            src = bound.get("group_src")
        if src is None:
            src = 0  # NB: as torch, neither given means rank 0 (missing it, rank 1 unpickled garbage)
        if _fake_target(bound.get("group")) and src != dist.get_rank():
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


def _install() -> bool:
    """Register the ``mock_process_group`` backend and wrap the object
    collectives, unless already done; True if this call did it."""
    if _undo:
        return False
    if _compat.backend_creator(BACKEND) is not _create:
        _undo.append(_compat.register_backend(BACKEND, _create, ["cpu", "cuda"]))
    _undo.append(_install_object_wrappers())
    return True


def _uninstall() -> None:
    """Undo :func:`_install`: torch is as it was before."""
    while _undo:
        _undo.pop()()


# --- the fake world ------------------------------------------------------------


def mock_init_dist(rank: int, world_size: int) -> None:
    """Make this process rank ``rank`` of a fake world of ``world_size``.

    Raises :class:`AlreadyInitialized` if a process group exists.
    """
    size = parse_world_size(world_size, "mock_init_dist(world_size=...)")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        from disttest.config import ConfigError

        raise ConfigError("rank", rank, "mock_init_dist(rank=...)", f"expected 0 <= rank < {size}")
    if dist.is_initialized():
        raise AlreadyInitialized(ALREADY_INITIALIZED.format(
            backend=dist.get_backend(), rank=dist.get_rank(), size=dist.get_world_size()))
    _install()
    dist.init_process_group(backend=BACKEND, rank=rank, world_size=size, store=FakeStore(),
                            timeout=timedelta(seconds=30))


@contextlib.contextmanager
def with_dist(rank: int = 0, world_size: int = 2) -> Iterator[None]:
    """A fake world for the block; its group is destroyed on exit, also when
    the block raises, and the backend and wrappers it installed are removed.
    Refuses to nest (:class:`AlreadyInitialized`)."""
    owner = not _undo
    try:
        mock_init_dist(rank=rank, world_size=world_size)
    except BaseException:
        if owner:
            _uninstall()
        raise
    try:
        yield
    finally:
        # (no group existed on entry: one left now is the block's, whatever its
        # backend, as upstream destroys it)
        if dist.is_initialized():
            dist.destroy_process_group()
        if owner:
            _uninstall()


def with_fake_comms(func: F | None = None, rank: int = 0, world_size: int = 2) -> Any:
    """Decorator: run a test method, or any function, in a fake world (an
    ``async def`` one for as long as its coroutine runs)."""
    if func is None:
        return functools.partial(with_fake_comms, rank=rank, world_size=world_size)
    if inspect.iscoroutinefunction(func):
        coroutine = func

        @functools.wraps(func)
        async def awaiting(*args: Any, **kwargs: Any) -> Any:
            with with_dist(rank, world_size):
                return await coroutine(*args, **kwargs)

        return awaiting

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with with_dist(rank, world_size):
            return func(*args, **kwargs)

    return wrapper
