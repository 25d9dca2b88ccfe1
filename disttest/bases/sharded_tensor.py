"""Sharded-tensor test bases: upstream's ``_shard`` harness on disttest's runners.

The names of ``torch.testing._internal.distributed._shard.sharded_tensor``
and of its siblings ``sharded_tensor._test_st_common``,
``sharded_tensor._test_ops_common`` and ``_shard.test_common``, so a
sharded-tensor suite ports by changing imports:

- :class:`ShardedTensorTestBase`: ``TEST_GPU_NUM`` (4) fresh rank processes
  per test (:class:`~disttest.MultiProcessTestCase`);
- :func:`with_comms`: starts RPC and the default group in every rank before
  the test and shuts both down after it;
- the models (:class:`MyShardedModel1`, :class:`SimpleMegatronLM`), the
  sharding specs and the op helpers upstream's tests share.

Upstream's specs place rank ``r`` on ``cuda:r``; the ``device`` keyword
gives the same specs on another device (``device="cpu"`` for gloo ranks).
torch 2.14's place them on ``device_type``, the host's accelerator or the
CPU: ``device=device_type`` gives those.
A model placed on GPUs the host lacks skips its test
(``unittest.SkipTest``) instead of failing.

As upstream's, ``with_comms`` defaults to nccl; a test whose backend needs
more GPUs than the host has is skipped in the parent, before any rank
starts. ``backend=None`` picks the host's backend: nccl where every rank has
a GPU, gloo on CPU. Timeouts, fail-fast and stacks are the runner's.
Importing this module imports no sharded-tensor code and changes nothing in
torch.
"""

from __future__ import annotations

import copy
import functools
import operator
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest.config import ConfigError
from disttest.runners.multiprocess import MultiProcessTestCase
from disttest.support.devices import (
    ACCELERATOR_DIST_BACKENDS,
    accelerator_count,
    accelerator_type,
    tp_transports,
)
from disttest.support.skips import DistSkip, TestSkip, _gpu_skip
from disttest.support.tempdirs import FILE_SCHEMA

__unittest = True

__all__ = [
    "DEFAULT_GPU_NUM",
    "PLACEMENTS",
    "SUPPORTED_BACKENDS",
    "TEST_GPU_NUM",
    "BackendNotSupported",
    "MyShardedModel1",
    "MyShardedModel2",
    "ShardedTensorTestBase",
    "SimpleMegatronLM",
    "_chunk_sharding_specs_list_for_test",
    "acc",
    "clone_module_parameter",
    "device_type",
    "gen_binary_op_func",
    "generate_chunk_sharding_specs_for_test",
    "generate_enumerable_sharding_specs_for_test",
    "generate_local_weight_sharding_params_for_test",
    "placement",
    "with_comms",
]

#: World size of :class:`ShardedTensorTestBase` (upstream's, 4).
TEST_GPU_NUM = 4
#: Ranks that ``_test_st_common``'s specs place (upstream's ``DEFAULT_GPU_NUM``).
DEFAULT_GPU_NUM = 4
#: The host's accelerator type, else ``"cpu"`` (read at import): where torch
#: 2.14's ``_test_st_common`` and ``_test_ops_common`` place their specs' ranks.
device_type: str = accelerator_type() or "cpu"
#: The host's accelerator as a device, or None (torch 2.14's modules leave
#: it behind from computing ``device_type``; None where a build's accelerator
#: has no device here, where upstream names the build's).
acc: torch.device | None = None if device_type == "cpu" else torch.device(device_type)
#: Backends ``init_pg`` accepts (upstream's list).
SUPPORTED_BACKENDS = ("nccl", "gloo", "mpi", "hccl", "xccl")


class BackendNotSupported(ConfigError, RuntimeError):
    """``init_pg`` given a backend it does not take: a ``ConfigError`` naming
    it, and a ``RuntimeError``, as upstream's ``"Backend foo not supported!"``
    is (a suite's ``assertRaises(RuntimeError)`` around it keeps working)."""

RANK_NOT_PLACED = (
    "generate_local_weight_sharding_params_for_test: rank {rank} holds no chunk of "
    "spec {placements} (disttest)"
)
UNKNOWN_BINARY_OP = (
    "gen_binary_op_func({op!r}, inplace={inplace}): not a Python binary operator{extra} "
    "nor a torch function such as 'torch.add' (disttest)"
)

# The three rank orders of upstream's chunk specs (the second and third test
# that placements need not follow the ranks).
_CHUNK_ORDERS = ((0, 1, 2, 3), (2, 3, 0, 1), (3, 0, 1, 2))
# Upstream's enumerable spec: a 10x10 tensor in four 5x5 blocks.
_BLOCKS = (((0, 0), 0), ((5, 0), 1), ((0, 5), 2), ((5, 5), 3))

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    # (upstream's source text takes Python's word operators too)
    "and": lambda lhs, rhs: lhs and rhs, "or": lambda lhs, rhs: lhs or rhs,
    "is": operator.is_, "is not": operator.is_not,
    "in": lambda lhs, rhs: lhs in rhs, "not in": lambda lhs, rhs: lhs not in rhs,
}
_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv,
    "//": operator.ifloordiv, "%": operator.imod, "**": operator.ipow, "@": operator.imatmul,
    "&": operator.iand, "|": operator.ior, "^": operator.ixor, "<<": operator.ilshift,
    ">>": operator.irshift,
}


def placement(rank: int, device: str = "cuda") -> str:
    """The placement string of ``rank`` on ``device``: ``"rank:1/cuda:1"``
    (the rank's own device, as upstream's specs place it), ``"rank:1/cpu"``."""
    if device == "cpu":
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/{device}:{rank}"


def generate_chunk_sharding_specs_for_test(sharding_dim: int, *, device: str = "cuda") -> list[Any]:
    """Three ``ChunkShardingSpec`` over ``sharding_dim`` and ranks 0-3: in
    rank order, then in the orders 2, 3, 0, 1 and 3, 0, 1, 2.

    Each rank's chunk lives on ``device`` (upstream: ``cuda:<rank>``).
    """
    spec = _compat.shard_api().sharding_spec
    return [spec.ChunkShardingSpec(dim=sharding_dim, placements=[placement(r, device) for r in order])
            for order in _CHUNK_ORDERS]


def generate_enumerable_sharding_specs_for_test(*, device: str = "cuda") -> list[Any]:
    """One ``EnumerableShardingSpec``: a 10x10 tensor as four 5x5 blocks,
    rank 0 top left, rank 1 bottom left, rank 2 top right, rank 3 bottom right."""
    spec = _compat.shard_api().sharding_spec
    return [spec.EnumerableShardingSpec([
        spec.ShardMetadata(shard_offsets=list(offsets), shard_sizes=[5, 5], placement=placement(rank, device))
        for offsets, rank in _BLOCKS
    ])]


def generate_local_weight_sharding_params_for_test(
    local_weight: torch.Tensor, sharded_dim: int, gpu_num: int, spec: Any, rank: int,
) -> tuple[int, int]:
    """Where ``rank``'s chunk of ``local_weight`` starts along ``sharded_dim``
    under the chunk spec ``spec`` over ``gpu_num`` ranks, and its size: the
    reference to compare a sharded tensor's local shard against.

    Raises ``ValueError`` when ``spec`` places no chunk on ``rank`` (upstream
    returned a wrong answer then).
    """
    get_split_size, get_chunked_dim_size = _compat.shard_chunk_sizes()
    dim_size = local_weight.size(sharded_dim)
    split_size = get_split_size(dim_size, gpu_num)
    offset = 0
    for idx, where in enumerate(spec.placements):
        chunk_size = get_chunked_dim_size(dim_size, split_size, idx)
        if where.rank() == rank:
            return offset, chunk_size
        offset += chunk_size
    raise ValueError(RANK_NOT_PLACED.format(rank=rank, placements=[str(p) for p in spec.placements]))


def clone_module_parameter(module: nn.Module, param_name: str) -> nn.Parameter:
    """A new ``nn.Parameter`` holding a detached copy of ``module``'s
    attribute ``param_name``."""
    tensor = getattr(module, param_name)
    return nn.Parameter(tensor.detach().clone())


def gen_binary_op_func(python_op: str, inplace: bool = False) -> Callable[[Any, Any], Any]:
    """A function ``f(lhs, rhs)`` applying ``python_op``: a torch function
    by name (``"torch.add"``: ``torch.add(lhs, rhs)``) or a Python binary
    operator (``"+"``: ``lhs + rhs``; with ``inplace``, ``lhs += rhs`` and
    ``lhs`` is returned).

    Upstream compiles the source text with ``exec``; this looks the
    operator up, so a bad one raises ``ValueError`` here, at once.
    """
    if "torch" in python_op:
        return _torch_function(python_op, inplace)
    table = _INPLACE if inplace else _BINARY
    op = table.get(python_op.strip())
    if op is None:
        extra = " with an in-place form" if inplace and python_op.strip() in _BINARY else ""
        raise ValueError(UNKNOWN_BINARY_OP.format(op=python_op, inplace=inplace, extra=extra))
    if not inplace:
        return op

    def f(lhs: Any, rhs: Any) -> Any:
        # As upstream's ``lhs op= rhs; return lhs``: the in-place operator's
        # result (lhs itself, or a new object for types without the in-place form).
        return op(lhs, rhs)

    return f


def _torch_function(python_op: str, inplace: bool) -> Callable[[Any, Any], Any]:
    parts = python_op.strip().split(".")
    target: Any = torch
    if parts[0] != "torch":
        raise ValueError(UNKNOWN_BINARY_OP.format(op=python_op, inplace=inplace, extra=""))
    for part in parts[1:]:
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(UNKNOWN_BINARY_OP.format(op=python_op, inplace=inplace, extra=""))
    fn = target

    def f(lhs: Any, rhs: Any) -> Any:
        return fn(lhs, rhs)

    return f


def _skip_unless_devices(devices: Sequence[torch.device]) -> None:
    """Raise :class:`~disttest.DistSkip` when this host lacks one of the
    accelerator ``devices`` (upstream's tests fail there instead)."""
    wanted = [d for d in devices if d.type != "cpu"]
    if not wanted:
        return
    needed = max((d.index or 0) + 1 for d in wanted)
    host = accelerator_type()
    if any(d.type != host for d in wanted) or accelerator_count() < needed:
        raise DistSkip(_gpu_skip(needed))


class SimpleMegatronLM(nn.Module):
    """Two linear layers with GELU between them (``fc1``, ``gelu``, ``fc2``),
    the model upstream shards Megatron-style (``fc1`` by columns, ``fc2`` by
    rows).

    :param linear_size: ``[(in1, out1), (in2, out2)]``, the two layers' sizes.
    :param rank: when given, both layers move to ``cuda:<rank>``; on a host
        without that GPU the test skips.
    :param dtype: the layers' dtype.
    """

    def __init__(self, linear_size: Sequence[Sequence[Any]], rank: int | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if rank is not None:
            _skip_unless_devices([torch.device("cuda", rank)])
        self.fc1 = nn.Linear(*linear_size[0], dtype=dtype)  # type: ignore[misc]  # (in, out[, bias]): never a dtype
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(*linear_size[1], dtype=dtype)  # type: ignore[misc]  # (in, out[, bias]): never a dtype
        if rank is not None:
            self.fc1.cuda(rank)
            self.fc2.cuda(rank)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.gelu(self.fc1(inp)))  # type: ignore[no-any-return]

    def get_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The two weights; of a sharded weight, this rank's local tensor."""
        sharded = _compat.shard_api().sharded_tensor.ShardedTensor
        return tuple(  # type: ignore[return-value]
            w.local_tensor() if isinstance(w, sharded) else w for w in (self.fc1.weight, self.fc2.weight))

    def get_biases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The two biases."""
        return self.fc1.bias, self.fc2.bias

    def get_weight_grads(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The gradients of the two weights."""
        return self.fc1.weight.grad, self.fc2.weight.grad

    def get_bias_grads(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The gradients of the two biases."""
        return self.fc1.bias.grad, self.fc2.bias.grad


#: ``_test_st_common``'s placements, before shuffling: rank ``r`` on ``cuda:r``.
PLACEMENTS = [placement(rank) for rank in range(DEFAULT_GPU_NUM)]  # a list, as upstream's


def _chunk_sharding_specs_list_for_test(sharding_dims: Sequence[int], seed: int = 0, *,
                                        device: str = "cuda") -> list[Any]:
    """One ``ChunkShardingSpec`` per entry of ``sharding_dims``, over ranks
    0-3 in a shuffled order: spec ``i`` shuffles the previous spec's order
    with ``random.Random(seed + i)``, as upstream's.

    Each call starts from the rank order (upstream shuffles a module-level
    list in place, so its specs also depend on earlier calls in the process);
    every rank that makes the same calls gets the same specs. ``device``:
    where each rank's chunk lives (upstream: ``cuda:<rank>``).
    """
    spec = _compat.shard_api().sharding_spec
    order = [placement(rank, device) for rank in range(DEFAULT_GPU_NUM)]
    specs = []
    for i, dim in enumerate(sharding_dims):
        random.Random(seed + i).shuffle(order)
        specs.append(spec.ChunkShardingSpec(dim=dim, placements=copy.deepcopy(order)))
    return specs


def _rand_sharded(spec: Any, group: Any, init_rrefs: bool) -> Any:
    """A 10x20 random sharded tensor under ``spec``; skips the test when the
    spec places shards on GPUs this host lacks."""
    _skip_unless_devices([p.device() for p in getattr(spec, "placements", ())])
    return _compat.shard_api().sharded_tensor.rand(spec, 10, 20, process_group=group, init_rrefs=init_rrefs)


class MyShardedModel2(nn.Module):
    """A module with a 10x20 sharded tensor under ``spec``
    (``sharded_tensor2``, None without a spec) and a 2x2 parameter
    (``random_tensor2``). Build it in every rank of ``group``."""

    def __init__(self, spec: Any = None, group: Any = None, init_rrefs: bool = True) -> None:
        super().__init__()
        self.sharded_tensor2 = None if spec is None else _rand_sharded(spec, group, init_rrefs)
        self.random_tensor2 = nn.Parameter(torch.rand(2, 2))


class MyShardedModel1(nn.Module):
    """:class:`MyShardedModel2`'s parent: ``sharded_tensor1``,
    ``random_tensor1`` and a ``submodule`` (a :class:`MyShardedModel2` under
    the same spec and group)."""

    def __init__(self, spec: Any = None, group: Any = None, init_rrefs: bool = True) -> None:
        super().__init__()
        self.sharded_tensor1 = None if spec is None else _rand_sharded(spec, group, init_rrefs)
        self.random_tensor1 = nn.Parameter(torch.rand(2, 2))
        self.submodule = MyShardedModel2(spec, group, init_rrefs)


def _needs_devices(backend: str) -> bool:
    return backend in ACCELERATOR_DIST_BACKENDS


def _backend_skip(backend: str, world_size: int) -> TestSkip | None:
    """Upstream's rule: an accelerator backend runs only where it is the
    host accelerator's own and every rank has a device."""
    if not _needs_devices(backend):
        return None
    host = accelerator_type()
    if host is None or _compat.default_backend_for_device(host) != backend or accelerator_count() < world_size:
        return _gpu_skip(world_size)
    return None


class ShardedTensorTestBase(MultiProcessTestCase):
    """Sharded-tensor tests in ``world_size`` (default ``TEST_GPU_NUM``, 4)
    fresh rank processes per test; ``@with_comms`` starts RPC and the default
    group in every rank.

    The rendezvous of both is the test's file (``self.file_name``).
    """

    @property
    def world_size(self) -> int:
        return TEST_GPU_NUM

    @property
    def backend(self) -> str:
        """The host's backend for sharded tensors, what ``backend=None``
        picks: the accelerator's (nccl for CUDA) when every rank has a device,
        else gloo."""
        host = accelerator_type()
        if host is not None and accelerator_count() >= self.world_size:
            return _compat.default_backend_for_device(host)
        return "gloo"

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init_pg(self, backend: str | None = "nccl") -> None:
        """In a rank: make the default group of ``world_size`` ranks over
        ``backend`` (None: ``self.backend``); with nccl or xccl, also select
        the rank's own device. An accelerator backend on a host without a
        device per rank skips the test."""
        where = "init_pg(backend=...)"
        if backend is None:
            backend, where = self.backend, f"{type(self).__name__}.backend"
        if backend not in SUPPORTED_BACKENDS:
            raise BackendNotSupported("backend", backend, where, f"expected one of {list(SUPPORTED_BACKENDS)}")
        skip = _backend_skip(backend, self.world_size)
        if skip is not None:
            raise DistSkip(skip)
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"{FILE_SCHEMA}{self.file_name}")
        if backend in ("nccl", "xccl"):
            _compat.set_device_index(self.rank)

    def init_rpc(self) -> None:
        """In a rank: start RPC (TensorPipe) as ``worker<rank>``.

        Where every rank has an accelerator device, each pair of workers maps
        its devices to each other's, as upstream's; on a host without them
        RPC carries CPU tensors only (TensorPipe refuses a device map there).
        """
        from torch.distributed import rpc

        options = rpc.TensorPipeRpcBackendOptions(_transports=tp_transports())
        options.init_method = f"{FILE_SCHEMA}{self.file_name}"
        if accelerator_count() >= self.world_size:
            for rank in range(self.world_size):
                options.set_device_map(f"worker{rank}", {rank: self.rank, self.rank: rank})
        from disttest.bases.rpc import init_rpc_quietly

        init_rpc_quietly(name=f"worker{self.rank:d}", rank=self.rank, world_size=self.world_size,
                         rpc_backend_options=options)

    def init_comms(self, init_rpc: bool = True, backend: str | None = "nccl") -> None:
        """In a rank: ``init_rpc()`` (when ``init_rpc``), then ``init_pg(backend)``."""
        if init_rpc:
            self.init_rpc()
        self.init_pg(backend=backend)

    def destroy_comms(self, destroy_rpc: bool = True) -> None:
        """In a rank: meet every rank at a barrier, shut RPC down (when
        ``destroy_rpc``), then destroy the default group."""
        from torch.distributed import rpc

        dist.barrier()
        if destroy_rpc:
            rpc.shutdown()
        dist.destroy_process_group()

    def assert_sharded_tensor_equal(self, st1: Any, st2: Any) -> None:
        """Assert that two sharded tensors hold equal local shards (tensors
        and metadata, in order), equal global metadata and sharding specs, and
        as many remote shards (on this rank)."""
        local1, local2 = st1.local_shards(), st2.local_shards()
        self.assertEqual(len(local1), len(local2))
        for shard1, shard2 in zip(local1, local2, strict=True):
            self.assertEqual(shard1.tensor, shard2.tensor)
            self.assertEqual(shard1.metadata, shard2.metadata)
        self.assertEqual(st1.metadata(), st2.metadata())
        self.assertEqual(st1.sharding_spec(), st2.sharding_spec())
        self.assertEqual(len(st1.remote_shards()), len(st2.remote_shards()))


def with_comms(func: Callable[..., Any] | None = None, init_rpc: bool = True,
               backend: str | None = "nccl") -> Any:
    """Decorator: start RPC and the default group before the test, shut both
    down after it.

    Bare (``@with_comms``) or with arguments (``@with_comms(init_rpc=False,
    backend="gloo")``). In each rank the test case's ``init_comms(init_rpc,
    backend)`` runs first; a passing test ends with ``destroy_comms()`` (a
    barrier, then RPC's graceful shutdown and the group's destruction), a
    failing one shuts both down at once, without waiting for its peers.
    ``backend=None`` is the case's ``backend`` (gloo on CPU). A backend that
    needs more GPUs than the host has skips the test in the parent, before
    any rank starts (upstream's ranks exit with the ``multi-gpu-<n>`` code).
    """
    if not isinstance(init_rpc, bool):
        raise ConfigError("init_rpc", init_rpc, "with_comms(init_rpc=...)", "expected True or False")
    if backend is not None and backend not in SUPPORTED_BACKENDS:  # (refused here, not in every rank)
        raise BackendNotSupported("backend", backend, "with_comms(backend=...)",
                                  f"expected one of {list(SUPPORTED_BACKENDS)} or None")
    if func is None:
        return functools.partial(with_comms, init_rpc=init_rpc, backend=backend)
    if not callable(func):
        raise ConfigError("test", func, "with_comms(...)", "expected a test method to decorate")

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        skip = check((self,))
        if skip is not None:
            raise DistSkip(skip)
        self.init_comms(init_rpc=init_rpc, backend=backend)
        try:
            result = func(self, *args, **kwargs)
        except BaseException:
            _abandon_comms(init_rpc)
            raise
        self.destroy_comms(destroy_rpc=init_rpc)
        return result

    def check(args: Sequence[Any]) -> TestSkip | None:
        # In the parent (and again in the rank): too few devices for the backend.
        owner = args[0] if args else None
        if owner is None:
            return None
        name = backend if backend is not None else getattr(owner, "backend", "gloo")
        return _backend_skip(name, owner.world_size) if isinstance(name, str) else None

    checks = getattr(func, "__disttest_skip_checks__", ())
    wrapper.__disttest_skip_checks__ = (*checks, check)  # type: ignore[attr-defined]
    return wrapper


def _abandon_comms(rpc_started: bool) -> None:
    """After a failing test: stop RPC and the group without the barrier and
    the graceful shutdown, which would wait for peers that may never come."""
    if rpc_started:
        from torch.distributed import rpc

        try:
            rpc.shutdown(graceful=False)
        except RuntimeError:
            pass  # RPC was not running: the failure came before it started.
    if dist.is_initialized():
        dist.destroy_process_group()
