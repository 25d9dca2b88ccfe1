"""disttest's pytest plugin (registered through the ``pytest11`` entry point).

- ``--disttest-timeout=SECONDS``: the default per-test limit of disttest's
  runners (as ``DISTTEST_TIMEOUT``); a bad value is a usage error naming it.
- ``--disttest-mode=threads|processes|pool``: run tests made with
  ``disttest.run_in`` in that mode only (as ``DISTTEST_MODE``).
- ``@pytest.mark.world_size(n)``: run a disttest test (or every test of a
  class) with ``n`` ranks; on a plain test function, run the function in
  ``n`` ranks (``mode="threads"`` or ``"processes"``), with the fixtures
  ``rank`` and ``world_size`` (``disttest._pytest_support``).
- A report header line; under pytest-xdist, a slice of the GPUs per worker.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from disttest import _pytest_support
from disttest.config import ConfigError, parse_timeout, parse_world_size
from disttest.modes import MODE_ENV, MODES

__all__ = [
    "pytest_addoption", "pytest_collection_modifyitems", "pytest_configure", "pytest_pyfunc_call",
    "pytest_report_header", "rank", "world_size",
]


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("disttest", "distributed tests (disttest)")
    group.addoption("--disttest-timeout", dest="disttest_timeout", default=None, metavar="SECONDS",
                    help="default per-test limit of disttest's runners (sets DISTTEST_TIMEOUT)")
    group.addoption("--disttest-mode", dest="disttest_mode", default=None, choices=MODES,
                    help="run disttest.run_in tests in this mode only (sets DISTTEST_MODE)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "world_size(n, mode='threads'): run this disttest test "
                                       "(or plain function: threads or processes) with n ranks")
    try:
        _pytest_support.apply_xdist_gpu_slice()
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    raw = config.getoption("disttest_timeout")
    if raw is not None:
        try:
            seconds = parse_timeout(raw, "--disttest-timeout")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        os.environ["DISTTEST_TIMEOUT"] = str(seconds)
    mode = config.getoption("disttest_mode")
    if mode is not None:
        os.environ[MODE_ENV] = mode


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        marker = item.get_closest_marker("world_size")
        if marker is None:
            continue
        if not marker.args:
            raise pytest.UsageError(f"@pytest.mark.world_size needs a number, on {item.nodeid} (disttest)")
        try:
            size = parse_world_size(marker.args[0], f"@pytest.mark.world_size on {item.nodeid}")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        func = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if func is not None:
            func._required_world_size = size


def pytest_report_header(config: Any) -> str:
    return _pytest_support.header_line()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    marker = pyfuncitem.get_closest_marker("world_size")
    if marker is None or not marker.args or not _pytest_support.wants_ranks(pyfuncitem.obj):
        return None
    where = f"@pytest.mark.world_size on {pyfuncitem.nodeid}"
    mode = _pytest_support.function_mode(marker.kwargs, where)
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    _pytest_support.run_function(pyfuncitem.obj, kwargs, marker.args[0], mode, pyfuncitem.name)
    return True


@pytest.fixture
def rank() -> int:
    """This rank's number, in a function marked ``world_size`` (-1 elsewhere)."""
    return _pytest_support.NOT_IN_A_RANK


@pytest.fixture
def world_size(request: Any) -> int:
    """The number of ranks of a function marked ``world_size`` (-1 elsewhere)."""
    marker = request.node.get_closest_marker("world_size")
    if marker is None or not marker.args:
        return _pytest_support.NOT_IN_A_RANK
    return parse_world_size(marker.args[0], f"@pytest.mark.world_size on {request.node.nodeid}")
