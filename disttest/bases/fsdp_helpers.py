"""Helpers of upstream's FSDP tests (``common_fsdp``): a stand-in process
group, subtest names, full parameters, and the eager/compiled test decorator.

Importing this module does no tensor work and changes nothing in torch;
``compiled_fsdp_test`` patches what it patches only while its test runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from copy import deepcopy
from enum import Enum, auto
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest._runner.report import warn_at

__unittest = True

__all__ = [
    "DummyProcessGroup",
    "compiled_fsdp_test",
    "get_full_params",
    "subtest_name",
]

F = TypeVar("F", bound=Callable[..., Any])

NO_SUBTEST_NAME = "subtest_name: no name for {value!r} (looked up as {key!r}) in {known} (disttest)"
NO_TRITON = (
    "compiled_fsdp_test: {test} ran in EAGER mode only; its COMPILED_COMPUTE mode needs Inductor "
    "on GPU, which needs Triton and a recent GPU arch, and this host has none (disttest)"
)


class _CompletedWork:
    """What :meth:`DummyProcessGroup.allreduce` returns: work already done,
    whose future holds ``1``."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        future: torch.futures.Future[Any] = torch.futures.Future()
        future.set_result(1)
        return future


class DummyProcessGroup:
    """A process group that talks to no one: it answers ``rank()`` and
    ``size()``, and ``allreduce`` returns completed work (future result
    ``1``) without touching the tensors. For wrapping tests that need a
    group but run no collective (upstream's; in the calling thread only)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank = rank
        self._size = size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, *args: Any, **kwargs: Any) -> _CompletedWork:
        return _CompletedWork()


def subtest_name(test_name_mapping: Mapping[str, str], *args: Any) -> str:
    """The parts named by ``test_name_mapping[str(arg)]`` (``"none"`` for a
    None argument), joined by ``_``: a test name suffix for a combination
    of ``args``. A value the mapping lacks raises ``KeyError`` naming it."""
    parts = []
    for value in args:
        if value is None:
            parts.append("none")
            continue
        key = str(value)
        if key not in test_name_mapping:
            raise KeyError(NO_SUBTEST_NAME.format(value=value, key=key, known=sorted(test_name_mapping)))
        parts.append(test_name_mapping[key])
    return "_".join(parts)


def get_full_params(model: nn.Module, recurse: bool = True) -> list[nn.Parameter]:
    """Copies of ``model``'s unsharded parameters, gathered inside
    ``FSDP.summon_full_params`` (a collective: every rank calls it).

    ``recurse=False`` unshards only the parameters of ``model``'s own FSDP
    unit; ``True`` those of every unit below it too.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(model, recurse=recurse):
        return deepcopy(list(model.parameters()))


class _FullyShardMode(Enum):
    EAGER = auto()
    COMPILED_COMPUTE = auto()


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fully_shard_with_compiled_compute(compile_compute_on_module: type | None, *args: Any,
                                       **kwargs: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    result = fully_shard(*args, **kwargs)
    if compile_compute_on_module is None or isinstance(args[0], compile_compute_on_module):
        args[0].compile()
    return result


def compiled_fsdp_test(compile_compute_on_module: type | None = None) -> Callable[[F], F]:
    """Decorator: run the test once with ``fully_shard`` as is (EAGER), then
    once with a ``fully_shard`` that also calls ``.compile()`` on each module
    it shards (of ``compile_compute_on_module`` only, when given), with
    Inductor's ``compile_threads`` at 1 (COMPILED_COMPUTE).

    The test's module must use ``fully_shard`` as a global (``from
    torch.distributed.fsdp import fully_shard``): that global is replaced
    for the run. The ranks meet at a barrier before and after each mode (so
    threaded ranks see the same function); the global and the config are
    restored after each mode, also when the test fails (then without the
    closing barrier, so a failing rank reports instead of waiting).

    Without Triton and a GPU for it (on CPU, say) the COMPILED_COMPUTE mode
    is skipped with a warning (``NO_TRITON``), as upstream.
    """

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            from torch.distributed.fsdp import fully_shard

            name = fully_shard.__name__
            namespace: dict[str, Any] = getattr(func, "__globals__")  # noqa: B009  # F is any callable
            for mode in _FullyShardMode:
                if mode is _FullyShardMode.COMPILED_COMPUTE and not _compat.has_triton():
                    warn_at(func, NO_TRITON.format(test=func.__qualname__))
                    continue
                config = _compat.inductor_config()
                orig_threads = config.compile_threads
                had, before = name in namespace, namespace.get(name)
                _barrier()
                if mode is _FullyShardMode.COMPILED_COMPUTE:
                    config.compile_threads = 1
                    namespace[name] = functools.partial(_fully_shard_with_compiled_compute,
                                                        compile_compute_on_module)
                else:
                    namespace[name] = fully_shard
                passed = False
                try:
                    func(*args, **kwargs)
                    passed = True
                finally:
                    try:
                        if passed:
                            _barrier()  # other threads use the patch until every rank is done
                    finally:
                        if had:
                            namespace[name] = before
                        else:
                            namespace.pop(name, None)
                        config.compile_threads = orig_threads

        return wrapper  # type: ignore[return-value]  # same call signature as func

    return decorator
