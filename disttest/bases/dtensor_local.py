"""The DTensor bases with every rank simulated in the test process, by
torch's local-tensor mode (where the installed torch has it), under
upstream's names (``common_dtensor``); import them from
:mod:`disttest.bases.dtensor`.

- :class:`LocalDTensorTestBase`, :class:`LocalDTensorOpTestBase`,
  :class:`LocalDTensorContinuousTestBase`: the bases of
  :mod:`~disttest.bases.dtensor_bases` with no processes, threads or pool;
  ``rank`` is symbolic and holds every rank's value.
- :func:`create_local_tensor_test_class`: a copy of a test class whose tests
  run under the mode.
- :func:`map_local_for_rank`, :func:`map_local_tensor_for_rank`,
  :func:`reduce_local_int`: per-rank values under the mode.

On a torch without the mode the bases skip, saying which torch has it.
Importing this module does no tensor work and changes nothing in torch.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._runner import settings
from disttest.bases import dtensor_ops
from disttest.bases.dtensor_bases import (
    NUM_DEVICES,
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
)
from disttest.runners.case import TestCase
from disttest.support.skips import precheck_skip

__unittest = True

__all__ = [
    "LocalDTensorContinuousTestBase",
    "LocalDTensorOpTestBase",
    "LocalDTensorTestBase",
    "create_local_tensor_test_class",
    "map_local_for_rank",
    "map_local_tensor_for_rank",
    "reduce_local_int",
]

UNKNOWN_SKIPPED = (
    "create_local_tensor_test_class(skipped_tests=...): {names} are not tests of {cls} (disttest)"
)


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
        skip = precheck_skip(self, method, lambda: settings.world_size(self, self._testMethodName)) \
            if method is not None else None
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
