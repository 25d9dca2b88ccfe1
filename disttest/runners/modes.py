"""One test body, three ways to run its ranks.

``@run_in("threads", "processes", "pool")`` on a plain class of test methods
makes one test class per mode, in the class's own module, named
``<Class>_threads``, ``<Class>_processes`` and ``<Class>_pool``; each has the
default group made before its tests run (the threaded backend for threads,
``backend`` (default gloo) otherwise). So a collective bug can be debugged in
threads and confirmed in processes without rewriting the test.

``DISTTEST_MODE=threads`` (or ``processes``, ``pool``, ``simulated``) runs
one mode only: the other classes skip, saying why (``simulated`` names the
classes :func:`disttest.run_simulated` makes, so every ``run_in`` class
skips). The decorated class itself is left as a plain mixin, so it is not
collected as a test.
"""

from __future__ import annotations

import os
import sys
import unittest
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from disttest._runner import rank as rank_mod
from disttest._runner import settings
from disttest.config import ConfigError, parse_world_size
from disttest.support.skips import check_backend_name

__unittest = True

__all__ = ["FORCED_MODES", "MODES", "MODE_ENV", "SIMULATED_MODE", "forced_mode", "only_in_forced_mode", "run_in"]

MODES = ("threads", "processes", "pool")
MODE_ENV = "DISTTEST_MODE"
#: The mode of the classes :func:`disttest.run_simulated` makes (``<Class>_simulated``).
SIMULATED_MODE = "simulated"
#: What ``DISTTEST_MODE`` (and pytest's ``--disttest-mode``) may name.
FORCED_MODES = (*MODES, SIMULATED_MODE)
#: Why a class of another mode skips while ``DISTTEST_MODE`` forces one.
FORCED_SKIP = "{env}={mode} runs the {mode} mode only"


def body_world_size(body: type, default: int) -> Any:
    """A body's ``world_size`` as its class says it: an attribute, or
    upstream's ``@property def world_size(self): return 4``, read on a bare
    instance (it was refused as ``<property object at ...>``)."""
    raw = getattr(body, "world_size", default)
    if isinstance(raw, property) and raw.fget is not None:
        try:
            return raw.fget(object.__new__(body))
        except Exception:  # noqa: BLE001 (one that needs the instance's state: named as it is)
            return raw
    return raw


def forced_mode() -> str | None:
    """The mode ``DISTTEST_MODE`` forces, or None; a value that names no
    mode is a :class:`~disttest.ConfigError` naming it."""
    raw = os.environ.get(MODE_ENV, "")
    if not raw.strip():
        return None
    return settings.pick("mode", raw, f"environment variable {MODE_ENV}", FORCED_MODES)


def only_in_forced_mode(cls: type, mode: str) -> type:
    """``cls``, a class of ``mode``; skipped, saying why, while
    ``DISTTEST_MODE`` forces another mode."""
    forced = forced_mode()
    if forced is None or forced == mode:
        return cls
    return unittest.skip(FORCED_SKIP.format(env=MODE_ENV, mode=forced))(cls)


def _per_test(body: type, base: type, spawn: Callable[[Any], None]) -> type:
    """``body`` on ``base``, a runner that starts its ranks per test:
    ``spawn(case)`` in setUp."""

    class PerTest(body, base):  # type: ignore[misc]  # bases known only at run time
        def setUp(self) -> None:
            super().setUp()
            spawn(self)

    return PerTest


def _threads(body: type) -> type:
    from disttest.runners.multithread import MultiThreadedTestCase

    return _per_test(body, MultiThreadedTestCase, lambda case: case._spawn_threads())


def _processes(body: type) -> type:
    from disttest.runners.multiprocess import MultiProcessTestCase

    base: Any = _per_test(body, MultiProcessTestCase, lambda case: case._spawn_processes())

    class Processes(base):  # type: ignore[misc]  # a base known only at run time
        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
            # The ranks started (a world_size marker's), not the body's size.
            ctx = rank_mod.current()
            size = ctx.spec.world_size if ctx is not None else cls._mode_world_size()
            dist.init_process_group(getattr(cls, "backend", "gloo"), rank=rank, world_size=size,
                                     store=dist.FileStore(file_name, size))
            super()._run(rank, test_name, file_name, parent_pipe, **kwargs)

    return Processes


def _pool(body: type) -> type:
    from disttest.runners.continuous import MultiProcContinousTest

    class Pool(body, MultiProcContinousTest):  # type: ignore[misc]  # bases known only at run time
        @classmethod
        def backend_str(cls) -> str:
            return str(getattr(cls, "backend", "gloo"))

    return Pool


_MAKERS: dict[str, Callable[[type], type]] = {"threads": _threads, "processes": _processes, "pool": _pool}


def run_in(*modes: str) -> Callable[[type], type]:
    """Class decorator: one test class per mode in ``modes`` (default all
    three), in the decorated class's module. The body class may set
    ``world_size`` (an int, default 2), ``backend`` (for processes and pool,
    default "gloo") and ``timeout``."""
    chosen = modes or MODES
    for mode in chosen:
        if mode == SIMULATED_MODE:
            raise ConfigError("mode", mode, "run_in(...)",
                              f"expected one of {MODES}; @disttest.run_simulated makes the simulated "
                              "class, and stacks with run_in")
        if mode not in MODES:
            raise ConfigError("mode", mode, "run_in(...)", f"expected one of {MODES}")

    def decorator(body: type) -> type:
        if isinstance(body, type) and issubclass(body, unittest.TestCase):
            raise TypeError(f"run_in: {body.__name__} must be a plain class of test methods, "
                            "not a TestCase (disttest makes the TestCase per mode)")
        # NB: inherited too, as run_simulated reads it (a body's mixin may set it).
        size = parse_world_size(body_world_size(body, 2), f"{body.__name__}.world_size")
        # Threads always use the threaded group; the name still must be one
        # the other modes can make (a typo would pass as threads only).
        check_backend_name(getattr(body, "backend", "gloo"), f"{body.__name__}.backend")
        module = sys.modules[body.__module__]
        forced_mode()  # a bad value is named before any class is made
        for mode in chosen:
            cls: Any = _MAKERS[mode](body)
            cls.__name__ = cls.__qualname__ = f"{body.__name__}_{mode}"
            cls.__module__ = body.__module__
            cls.world_size = size
            cls._mode_world_size = classmethod(lambda c, s=size: s)
            setattr(module, cls.__name__, only_in_forced_mode(cls, mode))
        return body

    return decorator
