"""The test-method dispatch shared by the per-test runners.

The test case object unittest makes in the parent has each test method
replaced by a wrapper: in the parent (``rank`` is the main rank) it joins
the ranks; in a rank it runs the body. Upstream's hook names are kept
(``join_or_run``).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from disttest._runner import settings
from disttest.faults import chaos_seed, test_faults
from disttest.runners.case import TestCase
from disttest.support.skips import precheck_skip

__unittest = True

__all__ = ["SPAWNED_TWICE", "RankDispatch"]

SPAWNED_TWICE = (
    "{call} was called a second time for {test!r} (disttest): its ranks are already running, "
    "started by the first call{first}. Call it once per test (a base class's setUp and a "
    "subclass's setUp that both call it would start two sets of ranks on one rendezvous)"
)


class RankDispatch(TestCase):
    """Base of MultiProcessTestCase and MultiThreadedTestCase."""

    _MAIN_RANK = -1

    def __init__(self, method_name: str = "runTest", methodName: str = "runTest") -> None:
        if methodName != "runTest":
            method_name = methodName
        super().__init__(method_name)
        self.rank = self._MAIN_RANK
        try:
            fn = getattr(self, method_name)
        except AttributeError as e:
            if methodName != "runTest":
                raise ValueError(f"no such test method in {self.__class__}: {methodName}") from e
        else:
            setattr(self, method_name, self.join_or_run(fn))

    def join_or_run(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Hook: the parent joins the ranks; a rank runs ``fn``."""

        @functools.wraps(fn)
        def wrapper(self: RankDispatch) -> Any:
            if self.rank == self._MAIN_RANK:
                return self._join(fn)
            return fn()

        return types.MethodType(wrapper, self)

    def _join(self, fn: Callable[[], Any]) -> None:
        """Hook: wait for the ranks of the current test and raise its result."""
        raise NotImplementedError

    def _precheck(self) -> None:
        """Raise the skip the test's decorators decide, and refuse the faults
        and chaos seed it declares that cannot act, before any rank starts."""
        method = getattr(type(self), self._testMethodName, None)
        test_faults(method)
        chaos_seed()
        skip = precheck_skip(self, method, lambda: _size_or_none(self)) if method is not None else None
        if skip is not None:
            raise skip

    def _refuse_second_start(self, call: str, started: bool) -> None:
        """Raise if this test's ranks were ``started`` already; else note
        where they are being started from, for the message of a second call."""
        if started:
            test = self.id().split(".")[-1]
            raise RuntimeError(SPAWNED_TWICE.format(call=call, test=test,
                                                    first=getattr(self, "_started_at", "")))
        if not getattr(self, "_started_at", ""):
            self._started_at = _caller()

    def _effective_world_size(self) -> int:
        """The ranks to start (the run settings' world size), pinned so that
        ``self.world_size`` reads it too."""
        size = settings.world_size(self, self._testMethodName)
        settings.pin_world_size(self, size)
        return size

    def _test_timeout(self) -> float:
        limit = settings.test_timeout(self, self.id())
        assert limit is not None  # a test id always gives one
        return limit


def _size_or_none(case: Any) -> int | None:
    """The world size ``case``'s ranks will have, for its skip checks (a
    marker, ``requires_world_size``); None where it cannot be had (the
    refusal or skip comes when the ranks start)."""
    try:
        return settings.world_size(case, case._testMethodName)
    except Exception:  # noqa: BLE001 (ConfigError, a skip of no ranks: raised where it was)
        return None


# A pytest world_size marker on a test sets the ranks it starts.
setattr(RankDispatch, settings.READS_MARKER, True)


def _caller() -> str:
    """' (File "x.py", line N, in setUp)': the innermost frame outside disttest."""
    frame = sys._getframe(1)
    while frame is not None and "__unittest" in frame.f_globals:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return ""
    return f' (File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name})'
