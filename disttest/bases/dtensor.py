"""DTensor test bases: upstream's ``common_dtensor`` harness on disttest's runners.

The names of ``torch.testing._internal.distributed._tensor.common_dtensor``,
so a DTensor suite ports by changing one import:

- :class:`DTensorTestBase`: fresh rank processes per test
  (:class:`~disttest.MultiProcessTestCase`); ``@with_comms`` makes the
  default group in each rank and tears it down after the test.
- :class:`DTensorOpTestBase`: ranks as threads over the threaded group
  (:class:`~disttest.MultiThreadedTestCase`).
- :class:`DTensorContinuousTestBase`: one pool of rank processes per class
  (:class:`~disttest.MultiProcContinousTest`).
- :class:`LocalDTensorTestBase`, :class:`LocalDTensorOpTestBase`,
  :class:`LocalDTensorContinuousTestBase`,
  :func:`create_local_tensor_test_class`: every rank simulated in the test
  process by torch's local-tensor mode (where the installed torch has it).

Also here: the models, expert styles and op helpers of
:mod:`~disttest.bases.dtensor_models`, :mod:`~disttest.bases.dtensor_experts`
and :mod:`~disttest.bases.dtensor_ops`.

Timeouts, fail-fast, stacks and desync reports are the runners'. Importing
this module does no tensor work and changes nothing in torch.
"""

from __future__ import annotations

import functools
import itertools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest._runner import settings
from disttest.bases import dtensor_models, dtensor_ops
from disttest.bases.dtensor_models import *  # noqa: F403  (dtensor_models.__all__)
from disttest.bases.dtensor_ops import *  # noqa: F403  (dtensor_ops.__all__)
from disttest.config import ConfigError
from disttest.runners.case import TestCase
from disttest.runners.continuous import MultiProcContinousTest
from disttest.runners.multiprocess import MultiProcessTestCase
from disttest.runners.multithread import MultiThreadedTestCase
from disttest.support.devices import ACCELERATOR_DIST_BACKENDS, accelerator_count, accelerator_type
from disttest.support.helpers import run_subtests
from disttest.support.skips import DistSkip, TestSkip, _gpu_skip, precheck_skip, skip_if_lt_x_gpu

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
    "LocalDTensorContinuousTestBase",
    "LocalDTensorOpTestBase",
    "LocalDTensorTestBase",
    "TestFunc",
    "create_local_tensor_test_class",
    "map_local_for_rank",
    "map_local_tensor_for_rank",
    "reduce_local_int",
    "skip_unless_torch_gpu",
    "with_comms",
]
# Upstream's models, op helpers and expert styles, importable from here; the
# styles subclass torch's ParallelStyle, so they load on first use.
_EXPERT_STYLES = ["ExpertParallel", "ExpertParallelWithTP", "TensorParallelForExpert"]
__all__ += dtensor_models.__all__ + dtensor_ops.__all__ + _EXPERT_STYLES


def __getattr__(name: str) -> Any:
    if name in _EXPERT_STYLES:
        from disttest.bases import dtensor_experts

        return getattr(dtensor_experts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPERT_STYLES])


T = TypeVar("T")
#: A test method, as ``with_comms`` takes and returns it (upstream's alias).
TestFunc = Callable[..., object]

#: The accelerator type of this host ("cuda", "xpu"...), else "cpu".
DEVICE_TYPE: str = accelerator_type() or "cpu"
#: How many accelerator devices this host has (0 without one).
DEVICE_COUNT: int = accelerator_count()
#: The default c10d backend for DEVICE_TYPE ("gloo" on CPU).
PG_BACKEND: str = dist.Backend.default_device_backend_map.get(DEVICE_TYPE, "gloo")
#: Default world size of the DTensor bases, 4 (fewer when fewer accelerators exist).
NUM_DEVICES: int = min(4, DEVICE_COUNT) if DEVICE_COUNT > 1 else 4

#: Backends ``init_pg`` accepts (upstream's list), beside the device's own
#: "cpu:gloo,<device>:<backend>" pair.
SUPPORTED_BACKENDS = (
    "nccl", "gloo", "mpi", "cpu:gloo,cuda:ncclx", "cuda:ncclx", "hccl", "xccl", "fake",
    "cpu:gloo,xpu:xccl",
)

CONVERTER_MISS = (
    "DTensorConverter could not make DTensors of every tensor argument of the op "
    "(converted {hit}, left {miss} as they were: sparse, quantized, nested, meta or a "
    "tensor subclass) (disttest)"
)
UNKNOWN_SKIPPED = (
    "create_local_tensor_test_class(skipped_tests=...): {names} are not tests of {cls} (disttest)"
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
    unchanged. A backend that needs more accelerators than the host has skips
    the test in the parent, before any rank starts.
    """
    if callable(eager_init):
        return _with_comms(eager_init, False, None)
    if not isinstance(eager_init, bool):
        raise ConfigError("eager_init", eager_init, "with_comms(eager_init=...)", "expected True or False")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ConfigError("backend", backend, "with_comms(backend=...)", "expected a backend name")
    return functools.partial(_with_comms, eager_init=eager_init, backend=backend)


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


# --- local-tensor mode: every rank simulated in the test process --------------


def _local_tensor_module() -> Any:
    lt = _compat.local_tensor()
    if lt is None:
        import unittest

        raise unittest.SkipTest(_compat.LOCAL_TENSOR_MISSING.format(version=torch.__version__))
    return lt


class _LocalRanks:
    """What the local-tensor bases share: every rank is this process, under
    torch's local-tensor mode; ``rank`` is symbolic and holds every rank's value."""

    world_size: Any

    @property
    def is_local_tensor_enabled(self) -> bool:
        return True

    def _handle_test_skip(self, msg: str) -> None:
        self.skipTest(msg)  # type: ignore[attr-defined]

    def _get_local_tensor_mode(self) -> Any:
        return _local_tensor_module().LocalTensorMode(frozenset(range(self.world_size)))

    @property
    def rank(self) -> Any:
        lt = _local_tensor_module()
        return torch.SymInt(lt.LocalIntNode({r: r for r in range(self.world_size)}))  # type: ignore[no-untyped-call]  # torch: unannotated

    @rank.setter
    def rank(self, rank: Any) -> None:
        pass  # the runners set a main rank; here every rank is this process

    def _local_setup(self) -> None:
        _local_tensor_module()  # skips on a torch without the mode
        _compat.enable_record_function(False)
        self.addCleanup(_compat.enable_record_function, True)  # type: ignore[attr-defined]
        self.addCleanup(_compat.reset_dtensor_rng_tracker)  # type: ignore[attr-defined]

    def build_device_mesh(self) -> Any:
        with _local_tensor_module().maybe_disable_local_tensor_mode():
            return super().build_device_mesh()  # type: ignore[misc]

    def init_manual_seed_for_rank(self) -> None:
        torch.manual_seed(0)


class _LocalMixin(_LocalRanks):
    """The per-test local-tensor bases: no ranks to start; ``with_comms``
    makes the ``fake`` group for the test."""

    def join_or_run(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        return fn

    def init_pg(self, eager_init: bool, backend: str | None = None) -> None:
        from disttest.pg.fake import FakeStore

        _compat.ensure_fake_backend()
        dist.init_process_group("fake", rank=0, world_size=self.world_size, store=FakeStore())
        self._pg = dist.group.WORLD

    def destroy_pg(self, device_id: int | None = None) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._pg = None

    def _spawn_processes(self, start_method: str | None = None) -> None:
        pass

    def _spawn_threads(self) -> None:
        pass

    def run_test(self, test_name: str, parent_pipe: Any = None) -> None:
        getattr(self, test_name)()


class LocalDTensorTestBase(_LocalMixin, DTensorTestBase):
    """:class:`DTensorTestBase` with every rank simulated in the test process
    (torch's local-tensor mode over the ``fake`` group): no processes."""

    def setUp(self) -> None:
        super().setUp()
        self._local_setup()


class LocalDTensorOpTestBase(_LocalMixin, DTensorOpTestBase):
    """:class:`DTensorOpTestBase` with every rank simulated in the test
    process (torch's local-tensor mode): no threads."""

    def setUp(self) -> None:
        super().setUp()
        self._local_setup()


class LocalDTensorContinuousTestBase(_LocalRanks, DTensorContinuousTestBase):  # type: ignore[misc]
    """:class:`DTensorContinuousTestBase` with every rank simulated in the
    test process (torch's local-tensor mode): no pool.

    The class's first test makes the ``fake`` default group (``cls.pg``) of
    ``world_size`` (default ``NUM_DEVICES``, or the test's recorded size);
    the class's tests share it and ``tearDownClass`` destroys it
    (``@with_comms`` changes nothing here). A test enters the mode itself
    (``with self._get_local_tensor_mode():``), or its class comes from
    :func:`create_local_tensor_test_class` with this ``base_class``.
    """

    world_size: int = NUM_DEVICES
    _local_group_size: int | None = None

    def _dispatching(self) -> bool:
        return False  # every rank is this process: no pool to dispatch to

    def _callSetUp(self) -> None:
        method = getattr(type(self), self._testMethodName, None)
        skip = precheck_skip(self, method) if method is not None else None
        if skip is not None:
            raise skip
        super()._callSetUp()

    def _callTestMethod(self, method: Any) -> None:
        self._phase = "test"
        TestCase._callTestMethod(self, method)  # no rank process to arm faults in

    def setUp(self) -> None:
        owner = type(self)
        size = settings.world_size(self, self._testMethodName)
        settings.pin_world_size(self, size)
        super().setUp()
        self._local_setup()
        if owner.__dict__.get("_local_group_size") != size or not dist.is_initialized():
            owner._destroy_local_group()
            from disttest.pg.fake import FakeStore

            _compat.ensure_fake_backend()
            dist.init_process_group("fake", rank=0, world_size=size, store=FakeStore())
            owner.pg, owner._local_group_size = _compat.default_group(), size

    @classmethod
    def _destroy_local_group(cls) -> None:
        if cls.__dict__.get("_local_group_size") is not None:
            cls.pg, cls._local_group_size = None, None
            if dist.is_initialized():
                dist.destroy_process_group()

    @classmethod
    def tearDownClass(cls) -> None:
        cls._destroy_local_group()
        super().tearDownClass()


def _in_local_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
    return dtensor_ops.make_wrapped(fn, [lambda test: test._get_local_tensor_mode()])


def create_local_tensor_test_class(orig_cls: type, skipped_tests: Sequence[str] | None = None,
                                   base_class: type = LocalDTensorTestBase) -> type:
    """A copy of ``orig_cls`` (named ``<name>WithLocalTensor``) whose tests
    run in the test process under torch's local-tensor mode; the tests named
    in ``skipped_tests`` are skipped, saying so."""
    skipped = list(skipped_tests or [])
    unknown = [n for n in skipped if not callable(getattr(orig_cls, n, None))]
    if unknown:
        warnings.warn(UNKNOWN_SKIPPED.format(names=unknown, cls=orig_cls.__name__), stacklevel=2)
    dct = dict(orig_cls.__dict__)
    for name, fn in list(dct.items()):
        if not callable(fn) or not name.startswith("test"):
            continue
        if name in skipped:
            reason = f"listed in create_local_tensor_test_class({orig_cls.__name__}, skipped_tests=...)"
            dct[name] = functools.wraps(fn)(lambda self, reason=reason: self.skipTest(reason))
        elif name.startswith("test_"):
            dct[name] = _in_local_mode(fn)
    dct.pop("__dict__", None)
    dct.pop("__weakref__", None)
    return type(orig_cls.__name__ + "WithLocalTensor", (base_class, *orig_cls.__bases__), dct)


def _apply_for_rank(rank: Any, func: Callable[[Any], Any]) -> Any:
    return func(rank)


def _apply_tensor_for_rank(tensor: Any, rank: Any, func: Callable[[Any, Any], Any]) -> Any:
    return func(tensor, rank)


def map_local_for_rank(rank: Any, func: Callable[[Any], Any]) -> Any:
    """``func(rank)``; under local-tensor mode, once per simulated rank."""
    lt = _compat.local_tensor()
    if lt is None:
        return func(rank)
    return lt.maybe_run_for_local_tensor(_apply_for_rank)(rank, func)


def map_local_tensor_for_rank(tensor: Any, rank: Any, func: Callable[[Any, Any], Any]) -> Any:
    """``func(tensor, rank)``; under local-tensor mode, once per simulated rank."""
    lt = _compat.local_tensor()
    if lt is None:
        return func(tensor, rank)
    return lt.maybe_run_for_local_tensor(_apply_tensor_for_rank)(tensor, rank, func)


def reduce_local_int(val: Any, func: Callable[[Any], Any]) -> Any:
    """``func`` over every rank's value of a local int (``{rank: value}``)."""
    return func(val.node._local_ints)
