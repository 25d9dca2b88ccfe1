"""What a test can change for its whole process (:func:`snapshot`), put back
after it where the process outlives the test: rank threads (the test
process's own state) and pool workers (the next test's).

Self-contained: the standard library and torch.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

__unittest = True

__all__ = ["snapshot"]


def snapshot(rng: bool = True) -> Callable[[], None]:
    """Note what a test can change for the whole process that a fresh rank
    process would take with it: torch's default dtype, intra-op thread
    count, deterministic algorithms, anomaly mode, float32 matmul precision
    and (``rng``) CPU random state, Python's random state (``rng``) and
    recursion limit, the working directory, the environment and the
    warnings filters; return what puts them back. (Python's random state
    is most of the cost, 12 us of 18: a pool worker's next test seeds its
    generators in ``TestCase.setUp`` anyway.)"""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    environ, filters = _environ_data(), list(warnings.filters)
    precision, recursion = torch.get_float32_matmul_precision(), sys.getrecursionlimit()
    states = (torch.get_rng_state(), random.getstate()) if rng else None
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # (a folder removed under the process: nothing to go back to)
        cwd = None

    def restore() -> None:
        if cwd is not None:
            with contextlib.suppress(OSError):  # (removed since: the process stays where the test left it)
                if os.getcwd() != cwd:  # (raises where the test's folder was removed under it)
                    os.chdir(cwd)
        if torch.get_float32_matmul_precision() != precision:
            torch.set_float32_matmul_precision(precision)
        if sys.getrecursionlimit() != recursion:
            sys.setrecursionlimit(recursion)
        if states is not None:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) != deterministic:
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        if (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) != anomaly:
            torch.autograd.set_detect_anomaly(anomaly[0], check_nan=anomaly[1])
        if _environ_data() != environ:  # (compared as the bytes the process has: no decoding)
            before = _decoded(environ)
            for name in [n for n in os.environ if n not in before]:
                del os.environ[name]
            for name, value in before.items():
                if os.environ.get(name) != value:
                    os.environ[name] = value
        if warnings.filters != filters:
            warnings.filters[:] = filters  # type: ignore[index]  # (a list in CPython)
            mutated = getattr(warnings, "_filters_mutated", None)  # (CPython: drop its cache)
            if callable(mutated):
                mutated()

    return restore


def _environ_data() -> dict[Any, Any]:
    """A copy of the environment as ``os.environ`` keeps it (CPython's
    ``_data``: encoded keys and values, copied without decoding each), else
    as strings."""
    data = getattr(os.environ, "_data", None)
    return dict(data) if isinstance(data, dict) else dict(os.environ)


def _decoded(environ: dict[Any, Any]) -> dict[str, str]:
    """``environ`` (from :func:`_environ_data`) as names and values."""
    key, value = getattr(os.environ, "decodekey", None), getattr(os.environ, "decodevalue", None)
    if isinstance(getattr(os.environ, "_data", None), dict) and key is not None and value is not None:
        return {key(k): value(v) for k, v in environ.items()}
    return environ
