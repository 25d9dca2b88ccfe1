"""The DTensor bases on disttest's three runners, under upstream's names
(``common_dtensor``); import them from :mod:`disttest.bases.dtensor`.

- :class:`DTensorTestBase`: fresh rank processes per test
  (:class:`~disttest.MultiProcessTestCase`); ``@with_comms`` makes the
  default group in each rank and tears it down after the test.
- :class:`DTensorOpTestBase`: ranks as threads over the threaded group
  (:class:`~disttest.MultiThreadedTestCase`).
- :class:`DTensorContinuousTestBase`: one pool of rank processes per class
  (:class:`~disttest.MultiProcContinousTest`).
- :class:`DTensorTestMixin` (what the bases share) and
  :class:`DTensorConverter` (every even sharding of an op's arguments), and
  the host's constants (``DEVICE_TYPE``, ``NUM_DEVICES``...).

Timeouts, fail-fast, stacks and desync reports are the runners'. Importing
this module does no tensor work and changes nothing in torch.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest.bases.backend import backend_available
from disttest.config import ConfigError
from disttest.runners.continuous import MultiProcContinousTest
from disttest.runners.multiprocess import MultiProcessTestCase
from disttest.runners.multithread import MultiThreadedTestCase
from disttest.support.devices import ACCELERATOR_DIST_BACKENDS, accelerator_count, accelerator_type
from disttest.support.helpers import run_subtests
from disttest.support.skips import DistSkip, TestSkip, _gpu_skip, skip_if_lt_x_gpu

__unittest = True

__all__ = [
    "DEVICE_COUNT",
    "DEVICE_TYPE",
    "NUM_DEVICES",
    "PG_BACKEND",
    "SUPPORTED_BACKENDS",
    "DTensorContinuousTestBase",
    "DTensorConverter",
    "DTensorOpTestBase",
    "DTensorTestBase",
    "DTensorTestMixin",
    "skip_unless_torch_gpu",
    "with_comms",
]

T = TypeVar("T")

# The host's constants; documented where suites import them
# (disttest.bases.dtensor), beside the backends init_pg accepts.
DEVICE_TYPE: str = accelerator_type() or "cpu"
DEVICE_COUNT: int = accelerator_count()
PG_BACKEND: str = dist.Backend.default_device_backend_map.get(DEVICE_TYPE, "gloo")
NUM_DEVICES: int = min(4, DEVICE_COUNT) if DEVICE_COUNT > 1 else 4

SUPPORTED_BACKENDS = (
    "nccl", "gloo", "mpi", "cpu:gloo,cuda:ncclx", "cuda:ncclx", "hccl", "xccl", "fake",
    "cpu:gloo,xpu:xccl",
)

CONVERTER_MISS = (
    "DTensorConverter could not make DTensors of every tensor argument of the op "
    "(converted {hit}, left {miss} as they were: sparse, quantized, nested, meta or a "
    "tensor subclass) (disttest)"
)
OP_MISMATCH = "op on DTensors with placements {placements} differs from the op on plain tensors (disttest)"


def skip_unless_torch_gpu(method: T) -> T:
    """Skip unless torch sees ``NUM_DEVICES`` accelerator devices; decided in
    the parent, before any rank starts."""
    return cast(T, skip_if_lt_x_gpu(NUM_DEVICES)(cast(Any, method)))


class DTensorTestMixin:
    """Helpers shared by the DTensor bases (``self`` is a test case with
    ``world_size`` and ``rank``)."""

    world_size: Any
    rank: Any

    @property
    def is_local_tensor_enabled(self) -> bool:
        return False

    @property
    def device_type(self) -> str:
        """The accelerator when every rank can have one, else "cpu"."""
        if DEVICE_TYPE == "cpu" or DEVICE_COUNT < self.world_size:
            return "cpu"
        return DEVICE_TYPE

    def build_device_mesh(self) -> Any:
        """A 1-D mesh over all ranks, on ``device_type``."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device_type, (self.world_size,))

    def init_manual_seed_for_rank(self) -> None:
        """Seed torch with the rank: every rank draws different values."""
        torch.manual_seed(self.rank)

    def _test_op_on_dtensor(self, op_call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Check ``op_call(dtensors).full_tensor() == op_call(full tensors)``."""
        from torch.distributed.tensor import DTensor

        tree = _compat.pytree()
        flat, spec = tree.tree_flatten(args)
        full_args = tree.tree_unflatten(
            [a.full_tensor().detach().clone() if isinstance(a, DTensor) else a for a in flat], spec)
        full_kwargs = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in kwargs.items()}
        expected, _ = tree.tree_flatten(op_call(*full_args, **full_kwargs))
        actual, _ = tree.tree_flatten(op_call(*args, **kwargs))
        self.assertEqual([d.full_tensor() for d in actual], expected)  # type: ignore[attr-defined]

    def _test_op(self, mesh: Any, op_call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``op_call`` on plain tensors and on every even sharding of its
        tensor arguments over ``mesh``; the results must match."""
        out = op_call(*args, **kwargs)
        dtc = DTensorConverter(mesh, args, kwargs)
        for d_args, d_kwargs in dtc:
            if not dtc.successful():
                raise AssertionError(CONVERTER_MISS.format(hit=dtc.hit, miss=dtc.miss))
            d_out = op_call(*d_args, **d_kwargs)
            self.assertEqual(  # type: ignore[attr-defined]
                d_out.full_tensor(), out, msg=OP_MISMATCH.format(placements=dtc.last_placements))

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        """:func:`disttest.run_subtests` on this test."""
        run_subtests(self, *args, **kwargs)  # type: ignore[arg-type]


def _backend_needs_devices(backend: str) -> bool:
    return any(name in backend for name in ACCELERATOR_DIST_BACKENDS)


class _DTensorProcesses(MultiProcessTestCase):
    """Fresh rank processes for DTensor code, FSDP2 included (``fully_shard``
    shards into DTensors): the base of DTensorTestBase and FSDPTest."""

    #: Imported by the fork server before it forks the ranks: DTensor's
    #: ``distribute_tensor`` imports dynamo on first use (about 1 s per rank).
    rank_preload: tuple[str, ...] = ("torch._dynamo",)


class DTensorTestBase(DTensorTestMixin, _DTensorProcesses):
    """DTensor tests in ``world_size`` (default ``NUM_DEVICES``) fresh rank
    processes per test; ``@with_comms`` makes the group in every rank.

    A test that needs more accelerators than the host has is skipped in the
    parent, before any rank starts.
    """

    @property
    def world_size(self) -> int:
        return NUM_DEVICES

    @property
    def backend(self) -> str:
        """The c10d backend for ``device_type`` (gloo on CPU)."""
        return dist.get_default_backend_for_device(self.device_type)

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init_pg(self, eager_init: bool, backend: str | None = None) -> None:
        """In a rank: make the default group through the test's rendezvous
        file (``backend`` default: ``self.backend``)."""
        where = "with_comms(backend=...)" if backend is not None else f"{type(self).__name__}.backend"
        if backend is None:
            backend = self.backend
        if _backend_needs_devices(backend) and accelerator_count() < self.world_size:
            raise DistSkip(_gpu_skip(self.world_size))
        own = f"cpu:gloo,{self.device_type}:{dist.get_default_backend_for_device(self.device_type)}"
        if backend not in SUPPORTED_BACKENDS and backend != own:
            raise ConfigError("backend", backend, where, f"expected one of {[*SUPPORTED_BACKENDS, own]}")
        device_id = None
        if "nccl" in backend or "xccl" in backend:
            torch.accelerator.set_device_index(self.rank)
            device_id = torch.device(f"{self.device_type}:{self.rank}") if eager_init else None
        if backend == "fake":
            _compat.ensure_fake_backend()
        dist.init_process_group(
            backend=backend, world_size=self.world_size, rank=self.rank,
            init_method=f"file://{self.file_name}", device_id=device_id,
        )

    def destroy_pg(self, device_id: int | None = None) -> None:
        """In a rank: meet the other ranks at a barrier, then destroy the group."""
        if self.device_type == "cpu":
            dist.barrier()
        else:
            if device_id is None:
                device_id = torch.accelerator.current_device_index()
            dist.barrier(device_ids=[device_id])
        dist.destroy_process_group()


def with_comms(eager_init: Any = False, backend: str | None = None) -> Any:
    """Decorator: make the process group before the test and destroy it after.

    Bare (``@with_comms``) or with arguments (``@with_comms(eager_init=True,
    backend="gloo")``). The test case's ``init_pg(eager_init, backend)``
    runs first; a passing test ends with ``destroy_pg()`` (a barrier, then
    the group's destruction), a failing one destroys the group at once. On a
    base without ``init_pg`` (``DTensorOpTestBase``, the pool) the test runs
    unchanged. A backend that needs more accelerators than the host has,
    or one this torch was built without (``mpi``), skips the test in
    the parent, before any rank starts. ``backend`` is read as c10d reads it
    (``"GLOO"`` is gloo); a name that is no backend is a ``ConfigError`` when
    the test runs, in the parent (as upstream's fails that test alone, not
    the import of its file).
    """
    if callable(eager_init):
        return _with_comms(eager_init, False, None)
    if not isinstance(eager_init, bool):
        raise ConfigError("eager_init", eager_init, "with_comms(eager_init=...)", "expected True or False")
    if backend is not None:
        try:
            backend = _backend_name(backend)
        except ConfigError as e:
            return functools.partial(_refused, error=e)
    return functools.partial(_with_comms, eager_init=eager_init, backend=backend)


def _refused(func: Callable[..., Any], error: ConfigError) -> Callable[..., Any]:
    """``func`` under a ``with_comms`` whose backend is no backend: the test
    raises ``error`` (in the parent, where its skip checks run, before any
    rank starts; and in a rank, for a runner that has none)."""
    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise error

    def check(args: Sequence[Any]) -> TestSkip | None:
        raise error

    checks = getattr(func, "__disttest_skip_checks__", ())
    wrapper.__disttest_skip_checks__ = (*checks, check)  # type: ignore[attr-defined]
    return wrapper


#: Process groups whose backend this host may lack: skipped in the parent
#: with the reason, as ``requires_mpi()`` does (no rank starts to fail).
_HOST_BACKENDS = {"mpi": "MPI"}


def _backend_name(backend: Any) -> str:
    """``with_comms``' backend as c10d reads it (case and blanks aside),
    checked where the decorator is written: a name of
    ``SUPPORTED_BACKENDS`` or a device map (``cpu:gloo,cuda:nccl``, checked
    against the class's device in the rank)."""
    name = backend.strip().lower() if isinstance(backend, str) else ""
    if not name or (name not in SUPPORTED_BACKENDS and ":" not in name):
        raise ConfigError("backend", backend, "with_comms(backend=...)",
                          f"expected one of {list(SUPPORTED_BACKENDS)} or a device map such as 'cpu:gloo,cuda:nccl'")
    return name


def _with_comms(func: Callable[..., Any], eager_init: bool, backend: str | None) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        init_pg = getattr(self, "init_pg", None)
        if init_pg is None:
            return func(self, *args, **kwargs)
        init_pg(eager_init, backend)
        try:
            result = func(self, *args, **kwargs)
        except BaseException:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        self.destroy_pg()
        return result

    def check(args: Sequence[Any]) -> TestSkip | None:
        # In the parent: a device backend on a host with too few devices.
        owner = args[0] if args else None
        if owner is None or not hasattr(owner, "init_pg") or getattr(owner, "is_local_tensor_enabled", False):
            return None
        name = backend if backend is not None else getattr(owner, "backend", "")
        if isinstance(name, str) and _backend_needs_devices(name) and accelerator_count() < owner.world_size:
            return _gpu_skip(owner.world_size)
        if name in _HOST_BACKENDS and not backend_available(name):
            return TestSkip(72, f"c10d was not compiled with the {_HOST_BACKENDS[name]} backend")
        return None

    checks = getattr(func, "__disttest_skip_checks__", ())
    wrapper.__disttest_skip_checks__ = (*checks, check)  # type: ignore[attr-defined]
    wrapper.__disttest_with_comms__ = (eager_init, backend)  # type: ignore[attr-defined]
    return wrapper


class DTensorOpTestBase(MultiThreadedTestCase):
    """DTensor tests in ``world_size`` threads over the threaded group; the
    group exists for the whole test (``@with_comms`` changes nothing here)."""

    #: The threads share this host's device type (``DEVICE_TYPE``).
    device_type: str = DEVICE_TYPE

    @property
    def world_size(self) -> int:
        return NUM_DEVICES

    def build_device_mesh(self) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device_type, (self.world_size,))

    def setUp(self) -> None:
        super().setUp()
        # DTensor's sharding propagator shares one fake mode: the threads
        # must take turns (its lock is a no-op outside threaded tests).
        old = _compat.dtensor_sharding_prop_lock(threading.Lock())
        self.addCleanup(_compat.dtensor_sharding_prop_lock, old)
        self._spawn_threads()


class DTensorContinuousTestBase(DTensorTestMixin, MultiProcContinousTest):  # type: ignore[misc]
    """DTensor tests in one pool of rank processes per class (``world_size``,
    default 2, as a class attribute); the class's group lives as long as the
    pool (``@with_comms`` changes nothing here)."""

    @classmethod
    def backend_str(cls) -> str:
        return dist.get_default_backend_for_device(DEVICE_TYPE)

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        if DEVICE_TYPE != "cpu":
            if world_size > DEVICE_COUNT:
                raise DistSkip(_gpu_skip(world_size))
            torch.accelerator.set_device_index(rank)
        super()._init_pg(rank, world_size, rdvz_file)


class DTensorConverter:
    """Iterate over every even sharding of an op's tensor arguments.

    Each step yields ``(args, kwargs)`` with every tensor replaced by a
    DTensor on ``mesh`` (``Replicate()``, or ``Shard(d)`` for each dimension
    that ``mesh.size()`` divides); ``successful()`` says whether every tensor
    could be converted. ``last_placements`` names the step's choice.
    """

    def __init__(self, mesh: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 replicate_only: bool = False) -> None:
        tree = _compat.pytree()
        self.hit = 0
        self.miss = 0
        self.mesh = mesh
        self.args = args
        self.kwargs = kwargs
        self.replicate_only = replicate_only
        self.flatten_args, self.flatten_args_spec = tree.tree_flatten(args)
        self.flatten_kwargs, self.flatten_kwargs_spec = tree.tree_flatten(kwargs)
        choices = [self.gen_sharding_choices_for_arg(a)
                   for a in (*self.flatten_args, *self.flatten_kwargs) if isinstance(a, torch.Tensor)]
        self.sharding_combs: Iterator[Sequence[Any]] = iter(itertools.product(*choices))
        self.last_placements: tuple[Any, ...] = ()

    def successful(self) -> bool:
        return self.hit > 0 and self.miss == 0

    def is_supported_tensor(self, t: torch.Tensor) -> bool:
        return not (t.is_sparse_csr or t.is_sparse or t.is_mkldnn or t.is_quantized or t.is_nested
                    or _compat.is_functional_tensor(t) or t.is_neg() or t.is_conj()
                    or t.device.type in ("lazy", "meta"))

    def gen_sharding_choices_for_arg(self, arg: torch.Tensor) -> Sequence[Any]:
        from torch.distributed.tensor import Replicate, Shard

        if self.replicate_only or arg.dtype == torch.bool:  # c10d has no bool collectives
            return [Replicate()]
        size = self.mesh.size()
        return [Replicate(), *(Shard(i) for i, s in enumerate(arg.shape) if s > 1 and s % size == 0)]

    def __iter__(self) -> DTensorConverter:
        return self

    def __next__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        tree = _compat.pytree()
        placements = next(self.sharding_combs)
        self.last_placements = tuple(placements)
        chosen = iter(placements)

        def convert(flat: list[Any]) -> list[Any]:
            return [self.to_dist_tensor(a, self.mesh, [next(chosen)]) if isinstance(a, torch.Tensor) else a
                    for a in flat]

        new_args = convert(self.flatten_args)
        new_kwargs = convert(self.flatten_kwargs)
        return (tree.tree_unflatten(new_args, self.flatten_args_spec),
                tree.tree_unflatten(new_kwargs, self.flatten_kwargs_spec))

    def to_dist_tensor(self, t: torch.Tensor, mesh: Any, placements: list[Any]) -> Any:
        from torch.distributed.tensor import Replicate, distribute_tensor

        lt = _compat.local_tensor()
        plain = (torch.Tensor, nn.Parameter) + ((lt.LocalTensor,) if lt is not None else ())
        if type(t) in plain:
            if not self.is_supported_tensor(t):
                self.miss += 1
                return t
            self.hit += 1
            r = distribute_tensor(t, mesh, [Replicate()] * mesh.ndim if t.ndim == 0 else placements)
            return nn.Parameter(r, requires_grad=r.requires_grad) if isinstance(t, nn.Parameter) else r
        if torch.overrides.is_tensor_like(t):  # type: ignore[no-untyped-call]  # torch: unannotated
            self.miss += 1  # a tensor subclass: not converted
            return t
        raise TypeError(f"DTensorConverter: expected a tensor, got {type(t).__name__} {t!r} (disttest)")
