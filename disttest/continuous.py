"""``MultiProcContinousTest``: a self-healing pool of rank processes per class.

The class's first test starts ``world_size`` rank processes and their process
group; every test of the class then runs in them (``setUp``, the test and
``tearDown`` run in each rank). A failing test fails alone. A rank that
crashes, hangs past the timeout, or leaves its peers waiting (desync) is
reported with the stacks of every rank, and the pool is rebuilt (fresh
processes, fresh group) before the next test. ``tearDownClass`` stops the
pool, bounded. ``run_rank`` runs the class's tests inside an external
launcher's process (torchrun, one or several nodes).

Spelled as upstream, ``MultiProcContinousTest``, with the corrected spelling
``MultiProcContinuousTest`` as an alias.
"""

from __future__ import annotations

import atexit
import inspect
import os
import sys
import threading
import unittest
import weakref
from datetime import timedelta
from typing import Any, ClassVar

import torch.distributed as dist

from disttest import _compat
from disttest._runner import rank as rank_mod
from disttest._runner.join import join
from disttest._runner.launcher import START_METHODS, ForkLauncher, ProcessLauncher, SpawnLauncher
from disttest._runner.outcome import Kind, Outcome, outcome_from_exception
from disttest._runner.pool import Pool
from disttest._runner.report import raise_for_outcomes
from disttest._runner.zygote import ZygoteLauncher
from disttest.case import TestCase, set_rng_seed
from disttest.config import ConfigError, get_timeout, parse_timeout, parse_world_size
from disttest.launchers import resolve_rank
from disttest.skips import backend_skip_reason, precheck_skip

__unittest = True

__all__ = ["MultiProcContinousTest", "MultiProcContinuousTest"]

#: Seconds the class's group waits beyond the test's limit before it raises.
PG_TIMEOUT_MARGIN = 60
_LAUNCHERS: dict[str, type[ProcessLauncher]] = {
    "zygote": ZygoteLauncher, "fork": ForkLauncher, "spawn": SpawnLauncher,
}
_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    # A runner that never calls tearDownClass (an interrupted run) still
    # leaves no process behind.
    for pool in list(_live_pools):
        pool.broken = True
        pool.close()


class MultiProcContinousTest(TestCase):
    """Runs every test of the class in one pool of ``world_size`` rank processes.

    Class attributes and hooks (upstream's): ``world_size`` (default 2),
    ``backend_str()`` (None: c10d picks by device), ``opts()`` (the group's
    options), ``timeout`` (seconds or a timedelta: each test's limit and the
    group's timeout; None: ``get_timeout``), ``device_type()``, and in the
    ranks ``rank`` and ``cls.pg`` (the class's group).
    """

    MAIN_PROCESS_RANK = -1
    world_size: int = 2
    rank: int = -2  # set in the ranks
    rdvz_file: str | None = None
    timeout: float | timedelta | None = None
    #: "fork" (default: workers forked from the test process, one OpenMP
    #: thread each), "zygote" or "spawn".
    start_method: str = "fork"
    rank_threads: int | None = 1
    pg: ClassVar[Any] = None
    _pool: ClassVar[Pool | None] = None
    _pool_skip: ClassVar[str | None] = None

    # --- hooks -----------------------------------------------------------------

    @classmethod
    def backend_str(cls) -> str | None:
        """Hook: the c10d backend of the class's group (None: by device)."""
        return None

    @classmethod
    def device_type(cls) -> str:
        """Hook: the device the class tests ("cpu" on a host without accelerators)."""
        return _compat.accelerator_type() or "cpu"

    @classmethod
    def opts(cls, high_priority_stream: bool = False) -> Any:
        """Hook: options for ``init_process_group(pg_options=...)``."""
        return None

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        """Hook, in a rank: make the class's group, through ``rdvz_file`` if
        given, else ``env://`` (MASTER_ADDR/MASTER_PORT, as torchrun sets)."""
        os.environ["LOCAL_RANK"] = os.environ.get("LOCAL_RANK", str(rank))
        kwargs: dict[str, Any] = {"backend": cls.backend_str(), "world_size": world_size,
                                  "rank": rank, "pg_options": cls.opts()}
        limit = cls._limit(None)
        if limit is not None:
            # A backstop beyond the test's limit: the join loop reports a
            # hang first, with the stack of a rank still waiting in it.
            kwargs["timeout"] = timedelta(seconds=limit + PG_TIMEOUT_MARGIN)
        if rdvz_file is not None:
            kwargs["store"] = dist.FileStore(rdvz_file, world_size)
        else:
            kwargs["init_method"] = "env://"
        dist.init_process_group(**kwargs)
        cls.pg = dist.distributed_c10d._get_default_group()

    # --- settings ----------------------------------------------------------------

    @classmethod
    def _limit(cls, test_id: str | None) -> float | None:
        raw = inspect.getattr_static(cls, "timeout", None)
        if isinstance(raw, property):
            raw = raw.fget(object.__new__(cls))  # type: ignore[misc]
        if raw is None:
            return get_timeout(test_id) if test_id is not None else None
        if isinstance(raw, timedelta):
            raw = raw.total_seconds()
        return parse_timeout(raw, f"{cls.__name__}.timeout")

    @classmethod
    def _pool_world_size(cls) -> int:
        raw = inspect.getattr_static(cls, "world_size", None)
        if isinstance(raw, property):
            raw = raw.fget(object.__new__(cls))  # type: ignore[misc]
        return parse_world_size(raw, f"{cls.__name__}.world_size")

    @classmethod
    def _start_method(cls) -> str:
        method = os.environ.get("DISTTEST_START_METHOD") or cls.start_method
        where = ("environment variable DISTTEST_START_METHOD" if os.environ.get("DISTTEST_START_METHOD")
                 else f"{cls.__name__}.start_method")
        if method not in START_METHODS:
            raise ConfigError("start method", method, where, f"expected one of {START_METHODS}")
        if method == "fork" and threading.active_count() > 1:
            # NB: forking a process with other threads can copy a lock they
            # hold; the fork server has none.
            method = "zygote"
        if method == "zygote" and "<locals>" in cls.__qualname__:
            method = "fork"
        return method

    # --- the pool (in the test process) -------------------------------------------

    @classmethod
    def _ensure_pool(cls) -> Pool:
        reason = cls.__dict__.get("_pool_skip")
        if reason:
            raise unittest.SkipTest(reason)
        pool = cls.__dict__.get("_pool")
        if pool is not None and not pool.broken:
            return pool
        if pool is not None:
            pool.close()
        unusable = backend_skip_reason(cls.backend_str())  # nccl needs a visible GPU too
        if unusable is not None:
            cls._pool_skip = unusable
            raise unittest.SkipTest(cls._pool_skip)
        method = cls._start_method()
        module = sys.modules.get(cls.__module__)
        fields = {
            "module": cls.__module__, "qualname": cls.__qualname__,
            "module_file": getattr(module, "__file__", None),
            "threads": None if method == "spawn" else cls.rank_threads,
            "environ": dict(os.environ), "cwd": os.getcwd(), "sys_path": list(sys.path),
        }
        start_limit = max(30.0, cls._limit(None) or 0)
        pool = Pool(cls, cls._pool_world_size(), _LAUNCHERS[method], fields, start_limit)
        cls._pool = pool
        _live_pools.add(pool)
        skips = [o for o in pool.init_outcomes.values() if o.skip_reason]
        if skips:
            cls._pool_skip = skips[0].skip_reason
            pool.close()
            cls._pool = None
            raise unittest.SkipTest(skips[0].skip_reason)
        return pool

    @classmethod
    def tearDownClass(cls) -> None:
        pool = cls.__dict__.get("_pool")
        if pool is not None:
            pool.close()
            _live_pools.discard(pool)
            cls._pool = None
        super().tearDownClass()

    def _dispatching(self) -> bool:
        return type(self).rank < 0

    def _callSetUp(self) -> None:
        if not self._dispatching():  # run_rank: an ordinary test in this rank
            set_rng_seed(self.seed)
            super()._callSetUp()  # type: ignore[misc]
            return
        # The parent runs neither setUp nor tearDown: the ranks do.
        self.rank = self.MAIN_PROCESS_RANK
        method = getattr(type(self), self._testMethodName, None)
        skip = precheck_skip(self, method) if method is not None else None
        if skip is not None:
            raise skip
        self._pool_in_use = self._ensure_pool()

    def _callTestMethod(self, method: Any) -> None:
        if not self._dispatching():
            super()._callTestMethod(method)
            return
        pool = self._pool_in_use
        name = self._testMethodName
        if any(o.kind.is_cause for o in pool.init_outcomes.values()):
            pool.broken = True  # the next test tries a fresh pool
            outcomes = [pool.init_outcomes.get(r, Outcome(r, Kind.PASSED)) for r in range(pool.world_size)]
        else:
            outcomes = join(pool.dispatch(name), self._limit(self.id()) or 0)
            pool.note(outcomes)
        if pool.broken:
            pool.close()
            type(self)._pool = None
        raise_for_outcomes(name, pool.world_size, self._limit(self.id()), outcomes)

    def _callTearDown(self) -> None:
        if not self._dispatching():
            super()._callTearDown()  # type: ignore[misc]

    # --- inside a rank -------------------------------------------------------------

    @classmethod
    def _pool_init(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        cls.rank = rank
        cls.world_size = world_size
        cls.rdvz_file = rdvz_file
        cls._init_pg(rank, world_size, rdvz_file)

    @classmethod
    def _pool_run_test(cls, test_name: str, rank: int) -> Outcome:
        """Run one test in this rank as unittest would: setUp, the test,
        tearDown, cleanups; the first exception decides the outcome."""
        case = cls(test_name)
        error: BaseException | None = None
        set_rng_seed(case.seed)
        try:
            case.setUp()
        except BaseException as e:  # noqa: BLE001
            error = e
        else:
            try:
                getattr(case, test_name)()
            except BaseException as e:  # noqa: BLE001
                error = e
            try:
                case.tearDown()
            except BaseException as e:  # noqa: BLE001
                error = error or e
        try:
            case.doCleanups()
        except BaseException as e:  # noqa: BLE001
            error = error or e
        return outcome_from_exception(rank, error)

    @classmethod
    def _pool_shutdown(cls) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- external launchers --------------------------------------------------------

    @classmethod
    def run_rank(cls, rank: int | None = None, world_size: int | None = None,
                 rdvz_file: str | None = None) -> unittest.TestResult:
        """Run the class's tests in this process, as ``rank`` of ``world_size``.

        For external launchers: each process (torchrun's, srun's, mpirun's,
        on one node or several) calls it. Without ``rank``/``world_size``
        they come from the launcher's environment (``disttest.launchers``).
        Rendezvous through ``rdvz_file`` if given, else ``env://``. Returns
        the unittest result; the caller decides the exit status
        (``sys.exit(not result.wasSuccessful())``).
        """
        rank, world_size = resolve_rank(rank, world_size, rdvz_file is not None)
        cls.rank = parse_world_size(rank + 1, "run_rank(rank=...)") - 1
        cls.world_size = parse_world_size(world_size, "run_rank(world_size=...)")
        if not 0 <= rank < world_size:
            raise ConfigError("rank", rank, "run_rank(rank=...)", f"expected 0 <= rank < {world_size}")
        cls.rdvz_file = rdvz_file
        cls._init_pg(rank, world_size, rdvz_file)
        try:
            suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
            return unittest.TextTestRunner(verbosity=2).run(suite)
        finally:
            if dist.is_initialized():
                # NB: every rank (every node) finishes its tests before any
                # tears the group down; a node leaving early aborts the others.
                dist.barrier()
            cls._pool_shutdown()


#: The corrected spelling.
MultiProcContinuousTest = MultiProcContinousTest
del rank_mod
