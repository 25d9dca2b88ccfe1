"""``TestDistBackend``: the base of PyTorch's backend suite, on disttest.

``TestDistBackend`` runs each test in ``WORLD_SIZE`` fresh rank processes
with a process group of the backend named by ``BACKEND``, a private temp
directory and the file barrier, as upstream's does (its ``_run`` makes the
group, meets at a barrier, runs the test, meets again). Both variables are
read when a test runs, not at import: a missing or bad one is an error that
names it; an unavailable backend is a skip that says which.

PyTorch's own ``DistributedTest._DistTestBase`` runs on it:
``class T(disttest.TestDistBackend, DistributedTest._DistTestBase)`` with
``self._spawn_processes()`` in ``setUp``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._typing import F
from disttest.config import ConfigError, parse_world_size
from disttest.runners.multiprocess import MultiProcessTestCase
from disttest.support.barrier import Barrier
from disttest.support.skips import (
    TEST_SKIPS,
    DistTestCases,
    TestSkip,
    _skip_when,
    check_backend_name,
    nccl_skip_reason,
)
from disttest.support.stores import LOOPBACK
from disttest.support.tempdirs import FILE_SCHEMA, cleanup_temp_dir, initialize_temp_directories

__unittest = True

# disttest re-exports every name listed here (see disttest/__init__.py);
# backend_from_env and world_size_from_env are imported from here by name.
__all__ = [
    "CUDA_PROFILING_SUPPORTED_BACKENDS",
    "CUSTOMIZED_TIMEOUT",
    "CUSTOM_PG_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "PROFILING_SUPPORTED_BACKENDS",
    "SEND_RECV_PROFILING_SUPPORTED_BACKENDS",
    "TestDistBackend",
    "ddp_find_unused_params_enabled_str",
    "ddp_outputs_not_used_in_loss_str",
    "ddp_prev_reduction_unfinished_str",
    "ddp_recommend_find_unused_params_str",
    "ddp_suggest_debug_mode_str",
    "default_pg_timeout",
    "get_profiler_nccl_meta",
    "get_profiling_event",
    "require_backend_is_available",
    "require_exact_world_size",
    "require_world_size",
]

#: Seconds a test's process group waits, unless CUSTOM_PG_TIMEOUT says otherwise.
default_pg_timeout = 60
#: Per-test process-group timeouts in seconds, by test name (upstream's).
CUSTOM_PG_TIMEOUT = {
    "test_ddp_uneven_inputs": 300,
    "test_ddp_model_diff_across_ranks": 5,
    "test_ddp_has_finalized": 5,
}
#: Upstream's default test timeout in seconds.
DEFAULT_TIMEOUT = 300
CUSTOMIZED_TIMEOUT = {"test_DistributedDataParallel": 500}

PROFILING_SUPPORTED_BACKENDS = [dist.Backend.NCCL, dist.Backend.GLOO, dist.Backend.MPI, dist.Backend.UCC]
CUDA_PROFILING_SUPPORTED_BACKENDS = [dist.Backend.GLOO, dist.Backend.MPI, dist.Backend.NCCL, dist.Backend.UCC]
SEND_RECV_PROFILING_SUPPORTED_BACKENDS = [dist.Backend.MPI, dist.Backend.GLOO, dist.Backend.NCCL, dist.Backend.UCC]

# DDP's error-message substrings the suite matches.
ddp_prev_reduction_unfinished_str = "Expected to have finished reduction in the prior iteration"
ddp_recommend_find_unused_params_str = "passing the keyword argument `find_unused_parameters=True`"
ddp_find_unused_params_enabled_str = "Since `find_unused_parameters=True` is enabled"
ddp_outputs_not_used_in_loss_str = "`forward` function outputs participate in calculating loss"
ddp_suggest_debug_mode_str = (
    "set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL"
)

_AVAILABLE: dict[str, Callable[[], bool]] = {
    "gloo": lambda: dist.is_gloo_available(),
    "nccl": lambda: nccl_skip_reason() is None,
    "mpi": lambda: dist.is_mpi_available(),
    "ucc": lambda: dist.is_ucc_available(),
    "xccl": lambda: bool(getattr(dist, "is_xccl_available", lambda: False)()),
}


def backend_from_env() -> str:
    """``BACKEND``, validated: a c10d backend name (built in or registered)."""
    raw = os.environ.get("BACKEND")
    if not raw:
        raise ConfigError("backend", raw, "environment variable BACKEND",
                          "set it to a c10d backend, e.g. BACKEND=gloo")
    known = set(dist.Backend.backend_list) | _compat.registered_backend_names()
    if raw.lower() not in known:
        raise ConfigError("backend", raw, "environment variable BACKEND",
                          f"expected one of {sorted(known - {'undefined'})}")
    return raw.lower()


def world_size_from_env() -> int:
    """``WORLD_SIZE``, validated."""
    raw = os.environ.get("WORLD_SIZE")
    if raw is None:
        raise ConfigError("world size", raw, "environment variable WORLD_SIZE", "set it, e.g. WORLD_SIZE=2")
    return parse_world_size(raw, "environment variable WORLD_SIZE", text=True)


def backend_available(backend: str) -> bool:
    """Whether this host can run ``backend``'s process groups."""
    probe = _AVAILABLE.get(backend)
    if probe is not None:
        return bool(probe())
    return backend.lower() in _compat.registered_backend_names() or backend in DistTestCases.backend_feature["plugin"]


def require_backend_is_available(backends: Sequence[str]) -> Callable[[F], F]:
    """Skip unless ``BACKEND`` is one of ``backends`` and this host has it.

    A name in ``backends`` that torch does not know (nor has registered by
    the time the test runs) is a ``ConfigError`` when the test runs, where
    upstream's skips the test, as it would every time.
    """
    allowed = {str(backends)} if isinstance(backends, str) else {str(b) for b in backends}  # (a name, not its letters)

    def check(args: Sequence[Any]) -> TestSkip | None:
        backend = backend_from_env()
        for name in sorted(allowed):  # (checked as the test runs: a plugin's backend is registered by then)
            check_backend_name(name, "require_backend_is_available(backends=...)")
        if backend not in allowed:
            return TestSkip(86, f"Test requires backend {backend} to be one of {sorted(allowed)}")
        if not backend_available(backend):
            return TestSkip(72, f"Test requires backend {backend} to be available")
        return None

    return _skip_when(check)


def require_world_size(world_size: int) -> Callable[[F], F]:
    """Skip unless ``WORLD_SIZE`` is at least ``world_size`` (an int >= 1,
    else a ``ConfigError`` where it is applied)."""
    world_size = parse_world_size(world_size, "require_world_size(world_size=...)")

    def check(args: Sequence[Any]) -> TestSkip | None:
        if world_size_from_env() < world_size:
            return TestSkip(73, f"Test requires world size of {world_size:d}")
        return None

    return _skip_when(check)


def require_exact_world_size(world_size: int) -> Callable[[F], F]:
    """Skip unless ``WORLD_SIZE`` is exactly ``world_size`` (an int >= 1,
    else a ``ConfigError`` where it is applied)."""
    world_size = parse_world_size(world_size, "require_exact_world_size(world_size=...)")

    def check(args: Sequence[Any]) -> TestSkip | None:
        if world_size_from_env() != world_size:
            return TestSkip(73, f"Test requires an exact world size of {world_size:d}")
        return None

    return _skip_when(check)


def get_profiling_event(event_name: str, profiler: Any, dedup_gpu_user_annotation: bool = False) -> list[Any]:
    """The profiler's events whose name starts or ends with ``event_name``."""
    from torch.autograd import DeviceType

    events = profiler.events() if isinstance(profiler, torch.profiler.profile) else profiler.function_events  # type: ignore[no-untyped-call]  # torch: unannotated
    return [
        e for e in events
        if (e.name.endswith(event_name) or e.name.startswith(event_name))
        and not (dedup_gpu_user_annotation and e.device_type in (DeviceType.CUDA, DeviceType.XPU))
    ]


def get_profiler_nccl_meta(prof: Any) -> list[dict[str, Any]]:
    """The ``record_param_comms`` events of a profiler's Chrome trace."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="disttest-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    return [e for e in events if e.get("name") == "record_param_comms"]


def _create_autograd_profiler() -> Any:
    """An autograd profiler that records shapes (upstream's helper)."""
    return torch.autograd.profiler.profile(record_shapes=True)


def _create_torch_profiler() -> Any:
    """A ``torch.profiler`` profile of CPU activity that records shapes
    (upstream's helper)."""
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)


class TestDistBackend(MultiProcessTestCase):
    """Fresh ranks per test with a ``BACKEND`` group of ``WORLD_SIZE`` ranks.

    In the parent, ``setUp`` makes the temp directories (``TEMP_DIR``) and
    resets the barrier; call ``self._spawn_processes()`` after it. In each
    rank, ``_run`` makes the group (through the test's file), meets the
    other ranks at the file barrier, runs the test, meets them again and
    destroys the group.
    """

    @classmethod
    def setUpClass(cls) -> None:
        os.environ.setdefault("MASTER_ADDR", LOOPBACK)
        super().setUpClass()

    def setUp(self) -> None:
        backend = backend_from_env()  # errors name the variable, before any work
        world_size_from_env()
        super().setUp()
        if not backend_available(backend):
            raise unittest.SkipTest(f"backend {backend!r} is not available on this host (disttest)")
        initialize_temp_directories()
        self.addCleanup(cleanup_temp_dir)
        Barrier.init()
        # Expected to take a rank down (TORCH_NCCL_ASYNC_ERROR_HANDLING).
        finalized = getattr(getattr(self, "test_ddp_has_finalized", None), "__wrapped__", None)
        self.skip_return_code_checks = [finalized] if finalized is not None else []

    @property
    def init_method(self) -> str:
        return f"{FILE_SCHEMA}{self.file_name}"

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False

    @property
    def world_size(self) -> int:
        return world_size_from_env()

    def _barrier(self, *args: Any, **kwargs: Any) -> None:
        Barrier.sync(*args, **kwargs)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
        backend = backend_from_env()
        if backend == "nccl" and not torch.cuda.is_available():
            sys.exit(TEST_SKIPS["no_cuda"].exit_code)
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        if torch.cuda.is_available() and torch.cuda.device_count() < self.world_size:
            sys.exit(TEST_SKIPS[f"multi-gpu-{self.world_size}"].exit_code)
        seconds = CUSTOM_PG_TIMEOUT.get(test_name, default_pg_timeout)
        try:
            dist.init_process_group(init_method=self.init_method, backend=backend,
                                    world_size=self.world_size, rank=rank,
                                    timeout=timedelta(seconds=seconds))
        except RuntimeError as e:
            if "recompile" in str(e):
                sys.exit(TEST_SKIPS["backend_unavailable"].exit_code)
            raise
        # Every rank is ready before a test that may exit at once (a skip).
        self._barrier()
        self.run_test(test_name, parent_pipe)
        self._barrier()
        dist.destroy_process_group()
        sys.exit(0)
