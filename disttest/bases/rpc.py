"""Helpers for testing ``torch.distributed.rpc``, and ready test bases.

Upstream's names (``dist_utils.py`` and the RPC agent fixtures):
``dist_init``, ``noop``, ``worker_name``, ``initialize_pg``, the RRef wait
helpers, ``get_function_event``, ``INIT_METHOD_TEMPLATE``,
``RpcAgentTestFixture`` with TensorPipe and faulty flavours, and
``RpcTestCase`` (MultiProcessTestCase + the TensorPipe fixture) so that a
suite writes only test methods. Every wait loop is bounded: it raises
:class:`WaitTimeout` (a ``TimeoutError`` and, as upstream raised, a
``ValueError``) saying what it waited for and what it last saw.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
import unittest
import warnings
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

from disttest import _compat
from disttest._runner import tracking
from disttest._typing import F
from disttest.config import ConfigError, parse_timeout
from disttest.runners.multiprocess import MultiProcessTestCase
from disttest.support.devices import tp_transports
from disttest.support.skips import skip_for_exit_code
from disttest.support.tempdirs import FILE_SCHEMA

__unittest = True

__all__ = [
    "FAULTY_MESSAGES",
    "INIT_METHOD_TEMPLATE",
    "MESSAGES_TO_DELAY",
    "FaultyRpcAgentTestFixture",
    "FaultyRpcTestCase",
    "RpcAgentTestFixture",
    "RpcTestCase",
    "TensorPipeRpcAgentTestFixture",
    "WaitTimeout",
    "dist_init",
    "get_function_event",
    "get_num_owners_and_forks",
    "initialize_pg",
    "noop",
    "wait_until_node_failure",
    "wait_until_owners_and_forks_on_rank",
    "wait_until_pending_futures_and_users_flushed",
    "worker_name",
]

INIT_METHOD_TEMPLATE = FILE_SCHEMA + "{file_name}"
#: Message types the faulty agent fails by default (they are retried).
FAULTY_MESSAGES = ["RREF_FORK_REQUEST", "RREF_CHILD_ACCEPT", "RREF_USER_DELETE",
                   "CLEANUP_AUTOGRAD_CONTEXT_REQ"]
#: Message types the faulty agent delays by default, in seconds.
MESSAGES_TO_DELAY = {"PYTHON_CALL": 1.5, "SCRIPT_CALL": 1.5}
#: The group a graceful RPC shutdown is counted in (the ranks' progress records).
RPC_GROUP = "rpc"
WAITED_TOO_LONG = "waited {timeout}s for {what} (disttest); last seen: {last}"
MISSING_HOOK = ("{fixture} does not define {hook} (disttest): mix in an agent fixture such as "
                "TensorPipeRpcAgentTestFixture, or define it")


class WaitTimeout(TimeoutError, ValueError):
    """A bounded wait ran out. Fields: ``timeout``, ``what``, ``last``."""

    def __init__(self, timeout: float, what: str, last: str) -> None:
        self.timeout = timeout
        self.what = what
        self.last = last
        super().__init__(WAITED_TOO_LONG.format(timeout=timeout, what=what, last=last))


def worker_name(rank: int) -> str:
    """The RPC name of ``rank`` (``worker{rank}``)."""
    return f"worker{rank}"


def noop() -> None:
    """Does nothing (an RPC target)."""


def initialize_pg(init_method: str, rank: int, world_size: int) -> None:
    """Make a gloo default group through ``init_method``, unless one exists."""
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", init_method=init_method, rank=rank, world_size=world_size)


def _check_faults(faulty_messages: Any, messages_to_delay: Any) -> None:
    """Refuse, before any rank starts, what the faulty agent would refuse
    in every rank (a string of message types went in letter by letter)."""
    if faulty_messages is not None and (
            isinstance(faulty_messages, (str, bytes)) or not isinstance(faulty_messages, (list, tuple, set, frozenset))
            or not all(isinstance(m, str) for m in faulty_messages)):
        raise ConfigError("faulty_messages", faulty_messages, "dist_init(faulty_messages=...)",
                          "expected a list of message type names, such as ['RREF_FORK_REQUEST']")
    if messages_to_delay is not None and (
            not isinstance(messages_to_delay, dict)
            or not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                       for k, v in messages_to_delay.items())):
        raise ConfigError("messages_to_delay", messages_to_delay, "dist_init(messages_to_delay=...)",
                          "expected a dict of message type name to seconds >= 0, such as {'PYTHON_CALL': 1.5}")


def dist_init(
    old_test_method: F | None = None,
    setup_rpc: bool = True,
    clean_shutdown: bool = True,
    faulty_messages: Sequence[str] | None = None,
    messages_to_delay: dict[str, float] | None = None,
) -> Any:
    """Decorator for RPC test methods (of a test case with an RPC fixture).

    In each rank: configures fault injection, starts RPC as ``worker{rank}``,
    runs the test, then shuts RPC down (gracefully with ``clean_shutdown``),
    also when the test raises (without grace then, and never hiding the
    test's own exception), unless the test shut it down itself.
    """
    if old_test_method is None:
        return functools.partial(dist_init, setup_rpc=setup_rpc, clean_shutdown=clean_shutdown,
                                 faulty_messages=faulty_messages, messages_to_delay=messages_to_delay)
    _check_faults(faulty_messages, messages_to_delay)

    @functools.wraps(old_test_method)
    def new_test_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        _compat.set_rref_leak_check(True)
        self.worker_id = self.rank
        self.setup_fault_injection(faulty_messages, messages_to_delay)
        if not setup_rpc:
            return old_test_method(self, *args, **kwargs)
        init_rpc_quietly(name=worker_name(self.rank), backend=self.rpc_backend, rank=self.rank,
                         world_size=self.world_size, rpc_backend_options=self.rpc_backend_options)
        failed = True
        try:
            result = old_test_method(self, *args, **kwargs)
            failed = False
            return result
        except unittest.SkipTest:
            failed = False  # NB: its peers shut down gracefully, waiting for it: so does it
            raise
        except SystemExit as e:
            failed = skip_for_exit_code(e.code) is None  # (upstream's skip: sys.exit(TEST_SKIPS[...].exit_code))
            raise
        finally:
            # After a failure, a graceful shutdown would wait for peers that
            # may never come: do not let it mask the test's own error. A
            # test that shut RPC down itself has none left to shut down
            # (torch's "RPC has not been initialized" hid its exception).
            if not _compat.rpc_agent_running():
                pass
            elif clean_shutdown and not failed:
                # It waits for every worker: one that never comes (hung in
                # its test) is then named as the rank that hung, and this
                # one as waiting for it.
                with tracking.tracked("rpc.shutdown", RPC_GROUP, range(self.world_size)):
                    rpc.shutdown(graceful=True)
            elif failed:
                with contextlib.suppress(Exception):  # (the test's own exception is the report)
                    rpc.shutdown(graceful=False)
            else:
                rpc.shutdown(graceful=False)

    return new_test_method


#: The warning torch's own TensorPipe set-up raises in every rank (it hands a
#: gloo Backend to all_gather_object): noise in each report, nothing a test can fix.
_TORCH_RPC_NOISE = r"You are using a Backend .* as a ProcessGroup"


def init_rpc_quietly(**kwargs: Any) -> None:
    """``rpc.init_rpc(**kwargs)`` without the deprecation warning torch's own
    TensorPipe set-up raises (:data:`_TORCH_RPC_NOISE`), in this rank, for
    this call only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_RPC_NOISE, category=UserWarning)
        rpc.init_rpc(**kwargs)  # type: ignore[no-untyped-call]  # torch: unannotated


#: The words of an RPC that ran past its timeout (torch's).
_RPC_TIMED_OUT = "ran for more than set timeout"


def wait_until_node_failure(rank: int, expected_error_regex: str = ".*", timeout: float = 60) -> str:
    """Call ``noop`` on ``rank`` until a call fails with an error matching
    ``expected_error_regex``; return that error's text. Bounded by
    ``timeout``: each call has the agent's RPC timeout, as upstream's, or
    what is left of ``timeout`` where that is less; a call that ran out of
    what was left is no failure of the node (a slow peer is alive), and
    the wait ends with :class:`WaitTimeout`."""
    limit = parse_timeout(timeout, "wait_until_node_failure(timeout=...)")
    deadline = time.monotonic() + limit
    last = "every call succeeded"
    while (left := deadline - time.monotonic()) > 0:
        # (without an agent, rpc_sync's own error is the one matched, as upstream's)
        agents = rpc.get_rpc_timeout() if _compat.rpc_agent_running() else 0.0
        shortened = agents <= 0 or agents > left  # (0: the agent waits for ever)
        try:
            rpc.rpc_sync(worker_name(rank), noop, args=(), timeout=left if shortened else UNSET_RPC_TIMEOUT)
            time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 (any failure is what we wait for)
            if shortened and _RPC_TIMED_OUT in str(e):
                last = f"the last call ran past what was left of the limit ({left:.3g}s)"
                continue
            if re.search(expected_error_regex, str(e)):
                return str(e)
            last = f"{type(e).__name__}: {e}"
    raise WaitTimeout(limit, f"an RPC to {worker_name(rank)} to fail matching {expected_error_regex!r}", last)


def wait_until_pending_futures_and_users_flushed(timeout: float = 20) -> None:
    """Wait until this node's RRef context has no pending futures or users."""
    limit = parse_timeout(timeout, "wait_until_pending_futures_and_users_flushed(timeout=...)")
    deadline = time.monotonic() + limit
    while True:
        info = _compat.rref_debug_info()
        futures, users = int(info["num_pending_futures"]), int(info["num_pending_users"])
        if futures == 0 and users == 0:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(limit, "pending RRef futures and users to flush",
                              f"{futures} pending futures, {users} pending users")
        time.sleep(0.05)


def get_num_owners_and_forks() -> tuple[str, str]:
    """(number of OwnerRRefs, number of forks) on this node."""
    info = _compat.rref_debug_info()
    return info["num_owner_rrefs"], info["num_forks"]


def wait_until_owners_and_forks_on_rank(num_owners: int, num_forks: int, rank: int,
                                        timeout: float = 20) -> None:
    """Wait until ``rank`` holds ``num_owners`` OwnerRRefs and ``num_forks`` forks."""
    limit = parse_timeout(timeout, "wait_until_owners_and_forks_on_rank(timeout=...)")
    deadline = time.monotonic() + limit
    while True:
        owners, forks = rpc.rpc_sync(worker_name(rank), get_num_owners_and_forks, args=(), timeout=5)
        if int(owners) == num_owners and int(forks) == num_forks:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(limit, f"{num_owners} owners and {num_forks} forks on rank {rank}",
                              f"{owners} owners, {forks} forks")
        time.sleep(0.1)


def get_function_event(function_events: Sequence[Any], partial_event_name: str) -> Any:
    """The first profiler event whose name contains ``partial_event_name``;
    an ``IndexError`` naming the events there are if none does (upstream's
    is a bare ``IndexError``, which suites may catch)."""
    for event in function_events:
        if partial_event_name in event.name:
            return event
    names = sorted({e.name for e in function_events})
    raise IndexError(f"no profiler event contains {partial_event_name!r} (disttest); events: {names}")


class RpcAgentTestFixture:
    """What ``dist_init`` needs from a test case: the RPC backend, its
    options, the init method and the error texts tests match against."""

    file_name: str

    @property
    def world_size(self) -> int:
        return 4

    @property
    def init_method(self) -> str:
        """``tcp://MASTER_ADDR:MASTER_PORT`` with ``RPC_INIT_WITH_TCP=1``, else
        the test's rendezvous file."""
        if os.environ.get("RPC_INIT_WITH_TCP") == "1":
            unset = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v, "").strip()]
            if unset:
                raise ConfigError("environment variable", " and ".join(unset), "RPC_INIT_WITH_TCP=1",
                                  "unset; a tcp:// rendezvous needs MASTER_ADDR and MASTER_PORT")
            return f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        return self.file_init_method

    @property
    def file_init_method(self) -> str:
        return INIT_METHOD_TEMPLATE.format(file_name=self.file_name)

    @property
    def rpc_backend(self) -> Any:
        """Hook: the agent's ``rpc.backend_registry.BackendType``."""
        raise self._missing_hook("rpc_backend")

    @property
    def rpc_backend_options(self) -> Any:
        """Hook: the options ``rpc.init_rpc`` gets for ``rpc_backend``."""
        raise self._missing_hook("rpc_backend_options")

    def setup_fault_injection(self, faulty_messages: Sequence[str] | None,
                              messages_to_delay: dict[str, float] | None) -> None:
        """Hook method for preparing a faulty agent; does nothing for others."""

    def get_shutdown_error_regex(self) -> str:
        """Hook: a regex matching the error of a call to a worker that has shut down."""
        raise self._missing_hook("get_shutdown_error_regex")

    def get_timeout_error_regex(self) -> str:
        """Hook: a regex matching the error of an RPC that timed out."""
        raise self._missing_hook("get_timeout_error_regex")

    def _missing_hook(self, hook: str) -> NotImplementedError:
        return NotImplementedError(MISSING_HOOK.format(fixture=type(self).__name__, hook=hook))


class TensorPipeRpcAgentTestFixture(RpcAgentTestFixture):
    """The TensorPipe agent (without InfiniBand where EFA is present)."""

    @property
    def rpc_backend(self) -> Any:
        return rpc.backend_registry.BackendType["TENSORPIPE"]

    @property
    def rpc_backend_options(self) -> Any:
        return rpc.backend_registry.construct_rpc_backend_options(  # type: ignore[no-untyped-call]  # torch: unannotated
            self.rpc_backend, init_method=self.init_method, _transports=tp_transports())

    def get_shutdown_error_regex(self) -> str:
        return "(.*)"

    def get_timeout_error_regex(self) -> str:
        return "RPC ran for more than"


class FaultyRpcAgentTestFixture(RpcAgentTestFixture):
    """torch's FaultyTensorPipeAgent: fails sends of ``messages_to_fail`` a
    few times, and delays ``messages_to_delay`` (seconds by type)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages_to_fail = list(FAULTY_MESSAGES)
        self.messages_to_delay = dict(MESSAGES_TO_DELAY)

    @property
    def rpc_backend(self) -> Any:
        _compat.load_faulty_rpc_agent()
        return rpc.backend_registry.BackendType["FAULTY_TENSORPIPE"]

    @property
    def rpc_backend_options(self) -> Any:
        return rpc.backend_registry.construct_rpc_backend_options(  # type: ignore[no-untyped-call]  # torch: unannotated
            self.rpc_backend, init_method=self.init_method, num_worker_threads=8, num_fail_sends=3,
            messages_to_fail=self.messages_to_fail, messages_to_delay=self.messages_to_delay)

    def setup_fault_injection(self, faulty_messages: Sequence[str] | None,
                              messages_to_delay: dict[str, float] | None) -> None:
        if faulty_messages is not None:
            self.messages_to_fail = list(faulty_messages)
        if messages_to_delay is not None:
            self.messages_to_delay = dict(messages_to_delay)

    def get_shutdown_error_regex(self) -> str:
        errors = ["Exception in thread pool task", "Connection reset by peer", "Connection closed by peer"]
        return "|".join(f"({e})" for e in errors)

    def get_timeout_error_regex(self) -> str:
        return "RPC ran for more than"


class RpcTestCase(TensorPipeRpcAgentTestFixture, MultiProcessTestCase):
    """Ranks start in ``setUp``; decorate test methods with ``@dist_init``."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class FaultyRpcTestCase(FaultyRpcAgentTestFixture, MultiProcessTestCase):
    """As :class:`RpcTestCase`, over the faulty agent."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
