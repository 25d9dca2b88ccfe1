"""Small test helpers upstream suites use: captured output, environment
switches for debug levels and NCCL waits, DDP error checks, subtests."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import sys
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch.distributed as dist

from disttest import _compat
from disttest._typing import F

__unittest = True

__all__ = [
    "captured_output",
    "patched_environ",
    "run_subtests",
    "set_environ",
    "verify_ddp_error_logged",
    "with_dist_debug_levels",
    "with_nccl_blocking_wait",
]


@contextlib.contextmanager
def captured_output() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Capture ``sys.stdout`` and ``sys.stderr`` into two StringIO objects."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = old


def set_environ(changes: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (or, for None, unset) variables; return their previous values in
    the same form, so that ``set_environ(previous)`` restores them."""
    previous = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return previous


@contextlib.contextmanager
def patched_environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) variables for the block; restore every one
    of them afterwards, including those that were unset before."""
    previous = set_environ(changes)
    try:
        yield
    finally:
        set_environ(previous)


def with_nccl_blocking_wait(func: F) -> F:
    """Run the test with ``TORCH_NCCL_BLOCKING_WAIT=1`` and
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` unset; both are restored after
    (upstream leaves BLOCKING_WAIT set when it was unset before)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": None, "TORCH_NCCL_BLOCKING_WAIT": "1"}
        with patched_environ(env):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def with_dist_debug_levels(levels: Iterable[str]) -> Callable[[F], F]:
    """Run the test once per ``TORCH_DISTRIBUTED_DEBUG`` level in ``levels``.

    Between levels the ranks meet at a barrier when a process group exists.
    The previous level is restored afterwards, also when a run fails.
    """
    levels = list(levels)

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = None
            name = "TORCH_DISTRIBUTED_DEBUG"
            try:
                with patched_environ({name: os.environ.get(name)}):
                    for level in levels:
                        os.environ[name] = level
                        dist.set_debug_level_from_env()
                        result = func(*args, **kwargs)
                        if dist.is_initialized():
                            dist.barrier()
            finally:
                dist.set_debug_level_from_env()
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


def verify_ddp_error_logged(model_DDP: Any, err_substr: str) -> None:  # noqa: N803 (upstream's keyword)
    """Assert that DDP's logging data recorded an error containing
    ``err_substr`` (without any C++ stack trace appended to it)."""
    data = model_DDP._get_ddp_logging_data()
    for key in ("iteration", "has_error", "error"):
        if key not in data:
            raise AssertionError(f"expected {key!r} in DDP logging data, got keys {sorted(data)}")
    expected = err_substr.split("\nException raised from ")[0]
    if expected not in data["error"]:
        raise AssertionError(
            f"did not find {expected!r} in DDP logging data error: {data['error']!r}"
        )


def run_subtests(
    cls_inst: unittest.TestCase,
    subtest_config: Mapping[str, list[Any]],
    test_fn: Callable[..., Any],
    *test_args: Any,
    **test_kwargs: Any,
) -> None:
    """Run ``test_fn`` once per combination of ``subtest_config`` values, each
    as a ``subTest`` with those values as keyword arguments.

    Dynamo state is reset around each run (when dynamo is loaded), and ranks
    meet at a barrier between runs when a process group exists.
    """
    keys = list(subtest_config)
    for values in itertools.product(*(subtest_config[k] for k in keys)):
        kwargs = dict(zip(keys, values, strict=True))
        with cls_inst.subTest(**kwargs):
            _compat.reset_dynamo()
            test_fn(*test_args, **test_kwargs, **kwargs)
            _compat.reset_dynamo()
        if dist.is_initialized():
            dist.barrier()
