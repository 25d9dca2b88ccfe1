"""The test-method dispatch shared by the per-test runners.

The test case object unittest makes in the parent has each test method
replaced by a wrapper: in the parent (``rank`` is the main rank) it joins
the ranks; in a rank it runs the body. Upstream's hook names are kept
(``join_or_run``).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from disttest.case import TestCase
from disttest.config import get_timeout, parse_timeout, parse_world_size
from disttest.skips import get_required_world_size, precheck_skip

__unittest = True

__all__ = ["RankDispatch"]


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
        """Raise the skip the test's decorators decide, before any rank starts."""
        method = getattr(type(self), self._testMethodName, None)
        skip = precheck_skip(self, method) if method is not None else None
        if skip is not None:
            raise skip

    def _effective_world_size(self) -> int:
        size = get_required_world_size(self, self.world_size)  # type: ignore[attr-defined]
        return parse_world_size(size, f"{type(self).__name__}.world_size")

    def _test_timeout(self) -> float:
        limit = getattr(self, "timeout", None)
        if limit is not None:
            return parse_timeout(limit, f"{type(self).__name__}.timeout")
        return get_timeout(self.id())
