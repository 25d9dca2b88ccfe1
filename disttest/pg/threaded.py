"""The in-process ``threaded`` process group: ranks as threads of one process.

Every collective is asynchronous underneath: a rank's call registers its
tensors and returns a :class:`ThreadedWork` at once; the last rank of the
group to arrive checks the arguments of all ranks, computes the result into
every rank's tensors and completes their futures. Blocking happens only in
``wait()``, and :meth:`ThreadedWorld.abort` fails every pending future, so a
rank waiting for a peer that raised, returned early or hung is released
with an error that says why. Collectives are matched by group and sequence
number, so ranks that call different collectives at the same step get an
error naming both, not a hang.

State lives in a :class:`ThreadedWorld` per test (:mod:`disttest.pg._world`;
upstream keeps it on the class, so one test's abort leaks into the next). c10d's registry of groups
is made thread-local while a world is installed, so each thread has its own
default group (:func:`_install_threaded_pg`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest.pg._local import (
    DOES_NOT_FIT,
    CollectiveMismatch,
    CollectiveTimeout,
    FutureWork,
    InvalidArgument,
    PythonGroup,
    _copy,
    _counts,
    _fits,
    _one_dtype,
    _reduce,
    _same,
    _splits,
    check_rank,
    completed_work,
    op_label,
    refused_call,
    seconds,
)
from disttest.pg._world import CollectiveAborted, ThreadedWork, ThreadedWorld, _thread_world

__unittest = True

__all__ = [
    "BACKEND",
    "binop_reduce",
    "bitwise_reduce",
    "CollectiveAborted",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "InvalidArgument",
    "FutureWork",
    "ProcessLocalGroup",
    "ThreadedWork",
    "ThreadedWorld",
    "completed_work",
    "install_threaded_pg",
    "register_for_process",
    "uninstall_threaded_pg",
]

BACKEND = "threaded"

def _n_times(payloads: list[Any], n: int, what: str, larger: str) -> list[torch.Tensor]:
    """The inputs of a flat gather or scatter of ``(output, input)`` per
    rank, checked: alike across ranks, and the ``larger`` one ("output" or
    "input") of each rank ``n`` times the other."""
    ins = [p[1] for p in payloads]
    _same(ins, what)
    for r, (out, inp) in enumerate(payloads):
        big, small = (out, inp) if larger == "output" else (inp, out)
        if big.numel() != n * small.numel():
            raise InvalidArgument(f"{what}: rank {r}'s {larger} has {big.numel()} elements, "
                             f"needs {n} x {small.numel()} (disttest)")
    return ins


def _roots_list(lists: list[list[torch.Tensor]], n: int, what: str, which: str) -> list[torch.Tensor]:
    """The root's one list of ``n`` tensors (``which``: "outputs" of a
    gather, "inputs" of a scatter), or a ValueError saying what it needs."""
    if len(lists) != 1 or len(lists[0]) != n:
        raise InvalidArgument(f"{what}: the root needs a list of {n} {which} (disttest)")
    return lists[0]


# --- the process group ----------------------------------------------------------


class ProcessLocalGroup(PythonGroup):
    """One rank's view of a threaded group; every collective of c10d."""

    BACKEND_NAME = BACKEND

    def __init__(self, rank: int, world_size: int, name: str = "", world: ThreadedWorld | None = None,
                 timeout: Any = None, members: Sequence[int] | None = None) -> None:
        """``members``: the group's global ranks (default: ranks 0 to world_size - 1)."""
        super().__init__(rank, world_size, name)
        self._tworld = world if world is not None else _current_world()
        #: the group's global ranks, as this rank made it (the world checks that its peers agree)
        self.members = self._tworld.register(name, members if members else range(world_size))
        # As upstream's group: autograd runs backward in the calling thread
        # (thread-local), whose default group is this thread's, not on
        # device threads that have none.
        torch.autograd.set_multithreading_enabled(False)
        #: seconds a Work waits for its peers before it raises (None: until the test ends)
        self.timeout = seconds(timeout)

    @property
    def pg_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"ThreadedPG(group={self._name!r}, rank={self.rank()}, world_size={self.size()})"

    def _join(self, op: str, payload: Any, compute: Callable[[list[Any]], list[Any]],
              agree: dict[str, Any] | None = None) -> ThreadedWork:
        return self._tworld.collective(self, op, payload, compute, agree)

    def _root(self, root: int, what: str, name: str) -> int:
        return check_rank(root, self.size(), what, name, self._name)

    # -- reductions --
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None, what: str = "all_reduce") -> ThreadedWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def compute(all_tensors: list[list[torch.Tensor]]) -> list[Any]:
            for i in range(_counts(what, all_tensors)):
                column = [ts[i] for ts in all_tensors]
                _same(column, what)
                result = _reduce(column, op, what)
                for t in column:
                    _copy(t, result)
            return all_tensors

        return self._join(what, tensors, compute, {"op": op_label(op)})

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> ThreadedWork:
        # (its own collective: gloo matches it only with another rank's all_reduce_coalesced)
        return self.allreduce(tensors, opts, "all_reduce_coalesced")

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> ThreadedWork:
        root, op = self._root(opts.rootRank, "reduce", "dst"), opts.reduceOp

        def compute(all_tensors: list[list[torch.Tensor]]) -> list[Any]:
            column = [ts[0] for ts in all_tensors]
            _same(column, "reduce")
            _copy(column[root], _reduce(column, op, "reduce"))
            return all_tensors

        return self._join("reduce", tensors, compute, {"dst": root, "op": op_label(op)})

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> ThreadedWork:
        root = self._root(opts.rootRank, "broadcast", "src")

        def compute(all_tensors: list[list[torch.Tensor]]) -> list[Any]:
            _counts("broadcast", all_tensors)
            for i, src in enumerate(all_tensors[root]):
                column = [ts[i] for ts in all_tensors]
                _same(column, "broadcast")
                for t in column:
                    if t is not src:
                        _copy(t, src)
            return all_tensors

        return self._join("broadcast", tensors, compute, {"src": root})

    # -- gathers and scatters --
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> ThreadedWork:
        n = self.size()
        _one_dtype("all_gather", [t for ts in outputs for t in ts], inputs)
        for i, out in enumerate(outputs[0] if inputs else []):
            # (as gloo checks each output against this rank's input as it is called: refused here)
            if out.shape != inputs[0].shape:
                raise refused_call(CollectiveMismatch(DOES_NOT_FIT.format(
                    what="all_gather", where=f"rank {self.rank()}'s input to its output {i}",
                    shape=list(inputs[0].shape), dtype=inputs[0].dtype, slot_shape=list(out.shape),
                    slot_dtype=out.dtype)))

        def compute(payloads: list[Any]) -> list[Any]:
            ins = [p[1][0] for p in payloads]
            for r, (outs, _) in enumerate(payloads):
                if len(outs[0]) != n:
                    raise InvalidArgument(f"all_gather: rank {r} passed {len(outs[0])} outputs for {n} ranks (disttest)")
                for src, t in enumerate(ins):
                    # (the same shape, as gloo and NCCL ask: one of the same size reshaped in silence)
                    _fits("all_gather", outs[0][src], t, f"rank {src} sends to rank {r}'s output {src}")
                    _copy(outs[0][src], t)
            return [p[0] for p in payloads]

        return self._join("all_gather", (outputs, inputs), compute)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> ThreadedWork:
        def compute(payloads: list[Any]) -> list[Any]:
            _counts("all_gather_coalesced", [p[1] for p in payloads])
            for r, (outs, _) in enumerate(payloads):
                if len(outs) != len(payloads):
                    raise InvalidArgument(f"all_gather_coalesced: rank {r} passed {len(outs)} output lists "
                                          f"for {len(payloads)} ranks (disttest)")
                for src, (_, src_ins) in enumerate(payloads):
                    if len(outs[src]) != len(src_ins):
                        raise CollectiveMismatch(f"all_gather_coalesced: rank {r}'s output list {src} holds "
                                                 f"{len(outs[src])} tensors, rank {src} sends {len(src_ins)} (disttest)")
                    for j, t in enumerate(src_ins):
                        _fits("all_gather_coalesced", outs[src][j], t, f"rank {src}'s tensor {j} to rank {r}")
                        _copy(outs[src][j], t)
            return [p[0] for p in payloads]

        return self._join("all_gather_coalesced", (outputs, inputs), compute)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> ThreadedWork:
        n = self.size()
        _one_dtype("all_gather_into_tensor", [output], [input])

        def compute(payloads: list[Any]) -> list[Any]:
            flat = torch.cat([t.reshape(-1) for t in _n_times(payloads, n, "all_gather_into_tensor", "output")])
            for out, _ in payloads:
                _copy(out, flat.reshape(out.shape))
            return [[p[0]] for p in payloads]

        return self._join("all_gather_into_tensor", (output, input), compute)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> ThreadedWork:
        def compute(payloads: list[Any]) -> list[Any]:
            for j in range(_counts("all_gather_into_tensor_coalesced", [p[1] for p in payloads])):
                _same([p[1][j] for p in payloads], "all_gather_into_tensor_coalesced")
                flat = torch.cat([p[1][j].reshape(-1) for p in payloads])
                for outs, _ in payloads:
                    _copy(outs[j], flat.reshape(outs[j].shape))
            return [p[0] for p in payloads]

        return self._join("all_gather_into_tensor_coalesced", (outputs, inputs), compute)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> ThreadedWork:
        root, n = self._root(opts.rootRank, "gather", "dst"), self.size()

        def compute(payloads: list[Any]) -> list[Any]:
            outs = _roots_list(payloads[root][0], n, "gather", "outputs")
            for src, (_, ins) in enumerate(payloads):
                _fits("gather", outs[src], ins[0], f"rank {src} sends to the root's output {src}")
                _copy(outs[src], ins[0])
            return [p[0] for p in payloads]

        return self._join("gather", (outputs, inputs), compute, {"dst": root})

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> ThreadedWork:
        root, n = self._root(opts.rootRank, "scatter", "src"), self.size()

        def compute(payloads: list[Any]) -> list[Any]:
            ins = _roots_list(payloads[root][1], n, "scatter", "inputs")
            for r, (outs, _) in enumerate(payloads):
                _fits("scatter", outs[0], ins[r], f"the root's input {r} to rank {r}'s output")
                _copy(outs[0], ins[r])
            return [p[0] for p in payloads]

        return self._join("scatter", (outputs, inputs), compute, {"src": root})

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> ThreadedWork:
        op, n = opts.reduceOp, self.size()

        def compute(payloads: list[Any]) -> list[Any]:
            for r, (_, ins) in enumerate(payloads):
                if len(ins[0]) != n:
                    raise InvalidArgument(f"reduce_scatter: rank {r} passed {len(ins[0])} inputs for {n} ranks (disttest)")
            for dst, (outs, _) in enumerate(payloads):
                column = [p[1][0][dst] for p in payloads]
                _same(column, "reduce_scatter")
                _fits("reduce_scatter", outs[0], column[0], f"the inputs {dst} into rank {dst}'s output")
                _copy(outs[0], _reduce(column, op, "reduce_scatter"))
            return [p[0] for p in payloads]

        return self._join("reduce_scatter", (outputs, inputs), compute, {"op": op_label(op)})

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> ThreadedWork:
        op, n = opts.reduceOp, self.size()
        _one_dtype("reduce_scatter_tensor", [output], [input])

        def compute(payloads: list[Any]) -> list[Any]:
            ins = _n_times(payloads, n, "reduce_scatter_tensor", "input")
            total = _reduce([t.reshape(-1) for t in ins], op, "reduce_scatter_tensor")
            for dst, (out, _) in enumerate(payloads):
                _copy(out, total.chunk(n)[dst].reshape(out.shape))
            return [[p[0]] for p in payloads]

        return self._join("reduce_scatter_tensor", (output, input), compute, {"op": op_label(op)})

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> ThreadedWork:
        op, n = opts.reduceOp, self.size()

        def compute(payloads: list[Any]) -> list[Any]:
            for j in range(_counts("reduce_scatter_tensor_coalesced", [p[1] for p in payloads])):
                _same([p[1][j] for p in payloads], "reduce_scatter_tensor_coalesced")
                total = _reduce([p[1][j].reshape(-1) for p in payloads], op, "reduce_scatter_tensor")
                for dst, (outs, _) in enumerate(payloads):
                    _copy(outs[j], total.chunk(n)[dst].reshape(outs[j].shape))
            return [p[0] for p in payloads]

        return self._join("reduce_scatter_tensor_coalesced", (outputs, inputs), compute, {"op": op_label(op)})

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> ThreadedWork:
        n = self.size()

        def compute(payloads: list[Any]) -> list[Any]:
            for r, (outs, ins) in enumerate(payloads):
                if len(outs) != n or len(ins) != n:
                    raise InvalidArgument(f"all_to_all: rank {r} needs {n} inputs and {n} outputs (disttest)")
            for dst, (outs, _) in enumerate(payloads):
                for src, (_, ins) in enumerate(payloads):
                    _fits("all_to_all", outs[src], ins[dst], f"rank {src} sends to rank {dst}'s output {src}")
                    _copy(outs[src], ins[dst])
            return [p[0] for p in payloads]

        return self._join("all_to_all", (outputs, inputs), compute)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> ThreadedWork:
        n = self.size()
        _one_dtype("all_to_all_single", [output], [input])
        # Checked here, in the calling rank: bad split sizes raise at once.
        _splits(output_split_sizes, output.size(0) if output.dim() else 0, n, "all_to_all_single (output)")
        _splits(input_split_sizes, input.size(0) if input.dim() else 0, n, "all_to_all_single (input)")

        def compute(payloads: list[Any]) -> list[Any]:
            outs_split, ins_split = [], []
            for out, inp, osz, isz in payloads:
                outs_split.append(out.split(_splits(osz, out.size(0), n, "all_to_all_single")))
                ins_split.append(inp.split(_splits(isz, inp.size(0), n, "all_to_all_single")))
            for dst in range(n):
                for src in range(n):
                    piece, slot = ins_split[src][dst], outs_split[dst][src]
                    _fits("all_to_all_single", slot, piece, f"rank {src} sends to rank {dst}")
                    _copy(slot, piece)
            return [[p[0]] for p in payloads]

        return self._join("all_to_all_single", (output, input, output_split_sizes, input_split_sizes), compute)

    def barrier(self, opts: Any = None) -> ThreadedWork:
        return self._join("barrier", None, lambda payloads: [None] * len(payloads))

    # -- point to point --
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> ThreadedWork:
        return self._tworld.send(self, tensors[0], dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> ThreadedWork:
        return self._tworld.recv(self, tensors[0], src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> ThreadedWork:
        return self._tworld.recv(self, tensors[0], None, tag)


# --- registration and installation ---------------------------------------------

#: (world, c10d registry it replaced, the installing thread's autograd
#: multithreading flag before: a threaded group turns it off in its thread)
_installed: list[tuple[ThreadedWorld, Any, bool]] = []


def binop_reduce(tensors: Sequence[torch.Tensor], op: Callable[..., Any]) -> torch.Tensor:
    """Reduce ``tensors`` with ``op`` over a new first dimension
    (``torch.sum``, ``torch.mean``, ``torch.prod``, ``torch.min``,
    ``torch.max``), as upstream's threaded group does; for min and max,
    the values."""
    result = op(torch.stack(list(tensors)), dim=0)
    return result if isinstance(result, torch.Tensor) else result.values


def bitwise_reduce(tensors: Sequence[torch.Tensor], op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                   ) -> torch.Tensor:
    """Fold ``tensors`` with the elementwise ``op`` (``torch.bitwise_and``...)."""
    import functools

    return functools.reduce(op, tensors)


def _current_world() -> ThreadedWorld:
    world: ThreadedWorld | None = getattr(_thread_world, "world", None)
    if world is not None:
        return world
    if _installed:
        return _installed[-1][0]
    raise RuntimeError(
        "the threaded backend needs an installed world (disttest): use MultiThreadedTestCase, "
        "spawn_threads_and_init_comms, or call _install_threaded_pg() first"
    )


def _bind_thread(world: ThreadedWorld | None) -> None:
    """Make ``world`` the one this thread's threaded groups join."""
    _thread_world.world = world


def _create(opts: Any, backend_opts: Any) -> ProcessLocalGroup:
    world: ThreadedWorld | None = getattr(_thread_world, "world", None) or (_installed[-1][0] if _installed else None)
    if world is None and opts.group_size == 1:
        # A group of one rank made outside any threaded world, as upstream's
        # creator allows (test_c10d_common makes one of each backend torch
        # lists in a plain process): a world of its own. (Of more ranks it
        # would wait for peers that never come: _current_world says so.)
        world = ThreadedWorld()
    # global_ranks_in_group: a subgroup's ranks (empty for the default group: all).
    return ProcessLocalGroup(opts.group_rank, opts.group_size, str(opts.group_id), world=world,
                             timeout=getattr(opts, "timeout", None),
                             members=list(getattr(opts, "global_ranks_in_group", None) or ()))


_install_lock = threading.Lock()
_unregister: list[Any] = []  # the undo of the outermost install's registration


def _register_backend() -> None:
    """Make ``threaded`` our backend for the installed world. NB: importing
    torch.testing._internal's multi_threaded_pg re-registers "threaded" with
    upstream's creator; every install takes it back, and the outermost
    uninstall restores what was there before (upstream's or nothing)."""
    if _compat.backend_creator(BACKEND) is _create:
        return
    undo = _compat.register_backend(BACKEND, _create, ["cpu", "cuda"])
    if not _unregister:
        _unregister.append(undo)


def register_for_process() -> None:
    """Register ``threaded`` for the rest of the process, as importing
    upstream's helpers does (a rank process: it is the test's). Its groups
    still need a world (:func:`install_threaded_pg`)."""
    with _install_lock:
        if _compat.backend_creator(BACKEND) is not _create:
            _compat.register_backend(BACKEND, _create, ["cpu", "cuda"])


#: ``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` as they were
#: before the first install wrapped them (kept: a wrapper of another library
#: made meanwhile may still call ours after the uninstall).
_thread_start: list[Callable[..., None]] = []
_executor_submit: list[Callable[..., Any]] = []


def _in_world(state: dict[str, Any], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    undo = _compat.adopt_thread_world_state(state)
    try:
        return fn(*args, **kwargs)
    finally:
        undo()


def _start_in_rank(self: threading.Thread) -> None:
    """``threading.Thread.start`` while a threaded world is installed: a
    thread a rank starts is of that rank, as in a rank process, and sees its
    default group and groups (c10d's registry is per thread; it saw none:
    "Default process group has not been initialized"). Not a thread pool's
    worker: it may run any rank's work, and each task sees the world of the
    rank that submitted it (:func:`_submit_in_rank`)."""
    state = _compat.thread_world_state()
    target = getattr(self, "_target", None)
    if state is not None and getattr(target, "__module__", None) != "concurrent.futures.thread":
        run = self.run

        def run_in_rank() -> None:
            try:
                _in_world(state, run)
            finally:
                vars(self).pop("run", None)  # (a finished thread holds no rank's groups)

        self.run = run_in_rank  # (this thread's only)
    _thread_start[0](self)


def _submit_in_rank(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``ThreadPoolExecutor.submit`` while a threaded world is installed: the
    task runs in the world of the rank that submitted it, whichever thread
    of the pool runs it (a pool shared by the ranks runs each rank's
    tasks)."""
    state = _compat.thread_world_state()
    if state is not None:
        fn = functools.partial(_in_world, state, fn)
    return _executor_submit[0](self, fn, *args, **kwargs)


def install_threaded_pg() -> ThreadedWorld:
    """Start a threaded world: the ``threaded`` backend is registered, c10d's
    registry becomes thread-local (each thread its own default group, and a
    thread a rank starts shares its rank's) and a new :class:`ThreadedWorld`
    is what ``init_process_group("threaded", ...)`` joins. Undo with
    :func:`uninstall_threaded_pg`; nothing of it is there before the first
    install or after the last uninstall."""
    with _install_lock:
        _register_backend()
        world = ThreadedWorld()
        _installed.append((world, _compat.c10d_world(), torch.autograd.is_multithreading_enabled()))
        _compat.set_c10d_world(_compat.new_c10d_world(per_thread=True))
        _compat.set_thread_isolation(True)
        if threading.Thread.start is not _start_in_rank:
            from concurrent.futures import ThreadPoolExecutor

            _thread_start[:] = [threading.Thread.start]
            _executor_submit[:] = [ThreadPoolExecutor.submit]
            threading.Thread.start = _start_in_rank
            ThreadPoolExecutor.submit = _submit_in_rank
        return world


def uninstall_threaded_pg() -> None:
    """Restore c10d's registry, this thread's autograd multithreading flag
    (and, after the outermost install, the backend list) as they were before
    the matching install."""
    with _install_lock:
        if not _installed:
            return
        world, previous, multithreading = _installed.pop()
        # A group made in the installing thread turned autograd's device
        # threads off there: back as they were (upstream's uninstall does
        # this too). Rank threads are the runner's (every threaded test turns
        # them off in its own again).
        torch.autograd.set_multithreading_enabled(multithreading)
        world.abort("the threaded world was uninstalled")
        _compat.set_c10d_world(previous)
        if not _installed:
            _compat.set_thread_isolation(False)
            from concurrent.futures import ThreadPoolExecutor

            if threading.Thread.start is _start_in_rank:  # (not if replaced since)
                threading.Thread.start = _thread_start[0]
            if ThreadPoolExecutor.submit is _submit_in_rank:
                ThreadPoolExecutor.submit = _executor_submit[0]
            while _unregister:
                _unregister.pop()()


def _install_threaded_pg() -> Any:
    """Upstream's name for :func:`install_threaded_pg`, with upstream's
    result: c10d's registry of groups it installed (``world ==
    dist.distributed_c10d._world`` is how upstream's harness asks whether
    its world is still there), and, as upstream's, autograd's device
    threads turned off in the calling thread. :func:`install_threaded_pg`
    returns the :class:`ThreadedWorld` instead. Undo with
    :func:`_uninstall_threaded_pg`, which puts the flag back."""
    install_threaded_pg()
    torch.autograd.set_multithreading_enabled(False)
    return _compat.c10d_world()


# Upstream's name.
_uninstall_threaded_pg = uninstall_threaded_pg
