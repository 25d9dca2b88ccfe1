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

This module only gathers the names: the bases on the runners live in
:mod:`~disttest.bases.dtensor_bases`, the local-tensor ones in
:mod:`~disttest.bases.dtensor_local`. Timeouts, fail-fast, stacks and desync
reports are the runners'. Importing this module does no tensor work and
changes nothing in torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# NB: the noqa'd names are not in __all__ but stay importable from here: the
# messages, and names upstream's module has by import, which migrated suites
# (and ``disttest.migrate``) import from here.
from disttest.bases import dtensor_bases, dtensor_models, dtensor_ops
from disttest.bases.dtensor_bases import (  # noqa: F401
    CONVERTER_MISS,
    OP_MISMATCH,
    DTensorContinuousTestBase,
    DTensorConverter,
    DTensorOpTestBase,
    DTensorTestBase,
    DTensorTestMixin,
    T,
    _DTensorProcesses,
    skip_unless_torch_gpu,
    with_comms,
)
from disttest.bases.dtensor_local import (
    UNKNOWN_SKIPPED,  # noqa: F401
    LocalDTensorContinuousTestBase,
    LocalDTensorOpTestBase,
    LocalDTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    map_local_tensor_for_rank,
    reduce_local_int,
)
from disttest.bases.dtensor_models import *  # noqa: F403  (dtensor_models.__all__)
from disttest.bases.dtensor_ops import *  # noqa: F403  (dtensor_ops.__all__)
from disttest.config import ConfigError  # noqa: F401
from disttest.runners.case import TestCase  # noqa: F401
from disttest.runners.continuous import MultiProcContinousTest  # noqa: F401
from disttest.runners.multiprocess import MultiProcessTestCase  # noqa: F401
from disttest.runners.multithread import MultiThreadedTestCase  # noqa: F401
from disttest.support.devices import ACCELERATOR_DIST_BACKENDS, accelerator_count, accelerator_type  # noqa: F401
from disttest.support.helpers import run_subtests  # noqa: F401
from disttest.support.skips import DistSkip, TestSkip, precheck_skip, skip_if_lt_x_gpu  # noqa: F401

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

#: A test method, as ``with_comms`` takes and returns it (upstream's alias).
TestFunc = Callable[..., object]

# The host's constants, the very values the bases read.
#: The accelerator type of this host ("cuda", "xpu"...), else "cpu".
DEVICE_TYPE: str = dtensor_bases.DEVICE_TYPE
#: How many accelerator devices this host has (0 without one).
DEVICE_COUNT: int = dtensor_bases.DEVICE_COUNT
#: The default c10d backend for DEVICE_TYPE ("gloo" on CPU).
PG_BACKEND: str = dtensor_bases.PG_BACKEND
#: Default world size of the DTensor bases, 4 (fewer when fewer accelerators exist).
NUM_DEVICES: int = dtensor_bases.NUM_DEVICES
#: Backends ``init_pg`` accepts (upstream's list), beside the device's own
#: "cpu:gloo,<device>:<backend>" pair.
SUPPORTED_BACKENDS = dtensor_bases.SUPPORTED_BACKENDS


def __getattr__(name: str) -> Any:
    if name in _EXPERT_STYLES:
        from disttest.bases import dtensor_experts

        return getattr(dtensor_experts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPERT_STYLES])

