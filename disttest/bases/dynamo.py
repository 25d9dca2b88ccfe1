"""Test cases for torch.compile (dynamo) over torch.distributed.

Upstream's names: ``_dynamo_dist_per_rank_init``,
``DynamoDistributedSingleProcTestCase`` and
``DynamoDistributedMultiProcTestCase``. The backend follows the device
(gloo on a host without accelerators, so these run on CPU), rendezvous is on
loopback at a free port (upstream uses fixed ports 6789 and 12355), and
dynamo's state is reset around every test. ``torch._dynamo`` (seconds to
import; its import registers torch's ``fake`` backend) is imported on first
use, not by importing this module; the fork server preloads it for the ranks
of a test module that uses this one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest.config import ConfigError
from disttest.runners.case import TestCase
from disttest.runners.multiprocess import DistributedTestBase
from disttest.support.devices import accelerator_count, accelerator_type
from disttest.support.helpers import set_environ
from disttest.support.stores import LOOPBACK, find_free_port

__unittest = True

__all__ = [
    "DynamoDistributedMultiProcTestCase",
    "DynamoDistributedSingleProcTestCase",
    "dynamo_dist_per_rank_init",
]


def _device_type() -> str:
    return accelerator_type() or "cpu"


def _rendezvous_env(world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", LOOPBACK)
    if not os.environ.get("MASTER_PORT"):
        if world_size != 1:
            raise ConfigError(
                "rendezvous port", None, "environment variable MASTER_PORT",
                f"{world_size} ranks need a shared port; DynamoDistributedMultiProcTestCase sets it",
            )
        os.environ["MASTER_PORT"] = str(find_free_port())


@contextlib.contextmanager
def dynamo_dist_per_rank_init(
    rank: int, world_size: int, backend: str | None = None, init_pg: bool = True,
    fake_pg: bool = False,
) -> Iterator[None]:
    """In a rank: make the default group (by device, or ``backend``; the
    ``fake`` backend with ``fake_pg``) and reset dynamo before and after.

    Rendezvous through ``MASTER_ADDR``/``MASTER_PORT`` (loopback; a free port
    when a single rank and none is set). The group is destroyed on exit, also
    when the body raises.
    """
    device = _device_type()
    if not fake_pg and device != "cpu":
        _compat.set_device_index(rank)
    if init_pg:
        if fake_pg:
            _compat.ensure_fake_backend()
            dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=world_size)
        else:
            _rendezvous_env(world_size)
            backend = backend or _compat.default_backend_for_device(device)
            dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    _compat.reset_dynamo()
    try:
        yield
    finally:
        _compat.reset_dynamo()
        if init_pg and dist.is_initialized():
            dist.destroy_process_group()


_dynamo_dist_per_rank_init = dynamo_dist_per_rank_init


class _DynamoState(TestCase):
    """Dynamo's TestCase behaviour, without torch.testing._internal: strict
    dynamo config for the class; fresh dynamo state and grad mode per test."""

    _exit_stack: contextlib.ExitStack

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._exit_stack = contextlib.ExitStack()
        cls._exit_stack.enter_context(_compat.dynamo_config_patch(
            raise_on_ctx_manager_usage=True, suppress_errors=False, log_compilation_metrics=False,
        ))

    @classmethod
    def tearDownClass(cls) -> None:
        cls._exit_stack.close()
        super().tearDownClass()

    def setUp(self) -> None:
        self._prior_grad = torch.is_grad_enabled()
        self._undo_config = _compat.dynamo_test_config()
        super().setUp()
        _compat.reset_dynamo()
        self._trace_handler = _compat.silence_dynamo_trace_log()

    def tearDown(self) -> None:
        _compat.remove_dynamo_trace_handler(self._trace_handler)
        _compat.reset_dynamo()
        _compat.enable_saved_tensors_hooks()
        super().tearDown()
        torch.set_grad_enabled(self._prior_grad)
        self._undo_config()


class DynamoDistributedSingleProcTestCase(_DynamoState):
    """One process, a world of one: the default group is made for the class
    (``cls.rank``, ``cls.device``, ``cls.device_ids``). Prefer it for simple
    tests; it is the easiest to debug."""

    rank: int
    device: str
    device_ids: list[int] | None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        rendezvous = {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(find_free_port())}
        cls._exit_stack.callback(set_environ, set_environ(rendezvous))
        cls.rank = 0
        device = _device_type()
        cls.device = f"{device}:{cls.rank}"
        cls.device_ids = None if device == "cpu" else [cls.rank]
        dist.init_process_group(_compat.default_backend_for_device(device), rank=0, world_size=1)
        cls._exit_stack.callback(dist.destroy_process_group)


class DynamoDistributedMultiProcTestCase(DistributedTestBase):
    """A rank per accelerator (2 ranks on a host without one), ranks started
    in ``setUp``, dynamo reset around each test in every rank. Use
    ``_dynamo_dist_per_rank_init(self.rank, self.world_size)`` in the test."""

    @property
    def world_size(self) -> int:
        return accelerator_count() or 2

    def setUp(self) -> None:
        rendezvous = {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(find_free_port())}
        self.addCleanup(set_environ, set_environ(rendezvous))
        super().setUp()

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
        handler = _compat.silence_dynamo_trace_log()
        try:
            super()._run(rank, test_name, file_name, parent_pipe, **kwargs)
        finally:
            _compat.remove_dynamo_trace_handler(handler)
