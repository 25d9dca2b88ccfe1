"""disttest's pytest plugin (registered through the ``pytest11`` entry point).

- ``--disttest-timeout=SECONDS``: the default per-test limit of disttest's
  runners (as ``DISTTEST_TIMEOUT``); a bad value is a usage error naming it.
- ``--disttest-mode=threads|processes|pool``: run tests made with
  ``disttest.run_in`` in that mode only (as ``DISTTEST_MODE``).
- ``--disttest-fault``, ``--disttest-chaos``, ``--disttest-repeat``: fault
  injection and schedule fuzzing (:mod:`disttest._faults_pytest`).
- ``@pytest.mark.world_size(n)``: run a disttest test (or every test of a
  class) with ``n`` ranks.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from disttest import _faults_pytest
from disttest.config import ConfigError, parse_timeout, parse_world_size
from disttest.modes import MODE_ENV, MODES

__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "pytest_configure",
           "pytest_runtest_protocol"]


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("disttest", "distributed tests (disttest)")
    group.addoption("--disttest-timeout", dest="disttest_timeout", default=None, metavar="SECONDS",
                    help="default per-test limit of disttest's runners (sets DISTTEST_TIMEOUT)")
    group.addoption("--disttest-mode", dest="disttest_mode", default=None, choices=MODES,
                    help="run disttest.run_in tests in this mode only (sets DISTTEST_MODE)")
    _faults_pytest.addoption(group)


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "world_size(n): run this disttest test with n ranks")
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
    _faults_pytest.configure(config)


def pytest_runtest_protocol(item: Any, nextitem: Any) -> bool | None:
    return _faults_pytest.runtest_protocol(item, nextitem)


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
