"""Dynamo and inductor: reset, preload, config patches, the trace log,
inductor's config and Triton."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__unittest = True

__all__ = [
    "dynamo_config_patch",
    "dynamo_test_config",
    "dynamo_test_state",
    "enable_saved_tensors_hooks",
    "has_triton",
    "inductor_config",
    "preload_dynamo",
    "remove_dynamo_trace_handler",
    "reset_dynamo",
    "silence_dynamo_trace_log",
]


def reset_dynamo() -> None:
    """``torch._dynamo.reset()`` and clear its counters, if dynamo is loaded.

    Does nothing when no code imported ``torch._dynamo`` (importing it only
    to reset it would cost seconds).
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    dynamo.reset()
    dynamo.utils.counters.clear()


@contextlib.contextmanager
def dynamo_test_state(reset: bool = False) -> Iterator[None]:
    """Around one test, as upstream's ``TestCase.run``: the compiler's stance
    set to "default" first (``torch.compiler.set_stance``), and
    ``torch._dynamo.config.suppress_errors`` put back after; with ``reset``
    (upstream's from torch 2.14 on), ``torch._dynamo.reset()`` before and
    after the test. Nothing where no code imported ``torch._dynamo`` (no
    stance, setting or cache can be other than the default then; importing
    it would cost seconds). NB: the reset after the test happens where the
    test imported dynamo, as upstream's."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        try:
            yield
        finally:
            dynamo = sys.modules.get("torch._dynamo")
            if reset and dynamo is not None:
                dynamo.reset()
        return
    import torch

    if reset:
        dynamo.reset()
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is not None:
        set_stance("default")
    saved = dynamo.config.suppress_errors
    try:
        yield
    finally:
        dynamo.config.suppress_errors = saved
        if reset:
            dynamo.reset()


def preload_dynamo() -> None:
    """Import ``torch._dynamo`` (a fork server does it once for its ranks)."""
    import torch._dynamo  # noqa: F401


def dynamo_config_patch(**changes: Any) -> Any:
    """``torch._dynamo.config.patch(**changes)`` (a context manager)."""
    import torch._dynamo

    return torch._dynamo.config.patch(**changes)


def dynamo_test_config() -> Callable[[], None]:
    """What dynamo's own TestCase sets for each test
    (``torch._dynamo.config.nested_graph_breaks = True`` where the installed
    torch has it: a graph break in a nested call then costs one frame, not
    two); return the undo."""
    import torch._dynamo

    config = torch._dynamo.config
    if not hasattr(config, "nested_graph_breaks"):
        return lambda: None
    prior = config.nested_graph_breaks
    config.nested_graph_breaks = True

    def undo() -> None:
        config.nested_graph_breaks = prior

    return undo


def enable_saved_tensors_hooks() -> None:
    """Allow saved-tensors hooks again (dynamo's TestCase does it after each
    test: a compiled region that disabled them and raised leaves them off)."""
    import torch

    torch._C._autograd._saved_tensors_hooks_enable()


def silence_dynamo_trace_log() -> Any:
    """Add a NullHandler to torch's trace log (as dynamo's TestCase does);
    return the handler so the caller can remove it."""
    import logging

    from torch._logging._internal import trace_log

    handler = logging.NullHandler()
    trace_log.addHandler(handler)
    return handler


def remove_dynamo_trace_handler(handler: Any) -> None:
    from torch._logging._internal import trace_log

    trace_log.removeHandler(handler)


def inductor_config() -> Any:
    """Inductor's private config module (``torch._inductor.config``:
    ``compile_threads``...), imported on first use."""
    import torch._inductor.config as module

    return module


def has_triton() -> bool:
    """``torch.utils._triton.has_triton()``: Triton and a device it can compile for."""
    from torch.utils._triton import has_triton as probe

    return bool(probe())
