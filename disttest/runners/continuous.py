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
import contextlib
import functools
import os
import sys
import time
import unittest
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import torch.distributed as dist

from disttest import _compat
from disttest._runner import cuda_fork, deadline, settings, thread_pool
from disttest._runner.join import join
from disttest._runner.launcher import ForkLauncher, ProcessLauncher, SpawnLauncher
from disttest._runner.outcome import Kind, Outcome, PhaseResult, subtests_named
from disttest._runner.pool import Pool, PoolUnavailable
from disttest._runner.rank import run_dir as rank_run_dir
from disttest._runner.report import raise_for_outcomes, warn_at
from disttest._runner.verdict import who as verdict_who
from disttest._runner.zygote import ForkServerUnsafe, ZygoteLauncher
from disttest.config import ConfigError, parse_world_size
from disttest.faults import FAULT_ENV, UNJUDGED, env_faults
from disttest.faults.judge import Injection
from disttest.faults.rank import armed
from disttest.runners import launched
from disttest.runners.case import TestCase, set_rng_seed
from disttest.support import janitor
from disttest.support.launchers import resolve_rank
from disttest.support.skips import backend_skip_reason, check_backend_name, precheck_skip

__unittest = True

__all__ = ["MultiProcContinousTest", "MultiProcContinuousTest"]

#: Seconds the class's group waits beyond the test's limit before it raises.
PG_TIMEOUT_MARGIN = 60
#: The longest group timeout given (24 days: gloo keeps it in an int of milliseconds).
PG_TIMEOUT_MAX = (2**31 - 1) / 1000
#: Seconds a pool may take to start at least, whatever the class's per-test
#: limit (one under an outer limit, pytest-timeout's, takes its share of it).
START_FLOOR = 30.0
POOL_FAILED = "the pool of {cls} could not start, so its tests do not run (disttest): {cause}"
REBUILD_CAP = (
    "the pool of {cls} broke and was rebuilt {n} times (max_pool_rebuilds); "
    "its remaining tests do not run (disttest)"
)
#: A test left sends or receives unmatched: warned, and the pool's ranks restart.
P2P_LEFT = ("{test} left point-to-point calls unmatched in the class's process group ({what}); its ranks "
            "were started afresh, as the next test's calls would have matched them and waited (disttest)")
#: A test left collectives unmatched (a rank started one its peers never
#: entered): warned, and the pool's ranks restart.
COLLECTIVES_LEFT = ("{test} left collectives unmatched ({what}); its ranks were started afresh, as the next "
                    "test's collectives would have matched them and got their values or waited (disttest)")
_LAUNCHERS: dict[str, type[ProcessLauncher]] = {
    "zygote": ZygoteLauncher, "fork": ForkLauncher, "spawn": SpawnLauncher,
}
_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
#: The class run_rank ran with env:// in this process (a second rendezvous is refused).
_launched_by_env: list[str] = []


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
    #: thread each; on a host with CUDA devices, "zygote"), "zygote" or
    #: "spawn". Where forked workers could not use CUDA (the test process, or
    #: the fork server on importing the class's module, initialised it),
    #: "spawn" with a warning.
    start_method: str = "fork"
    #: OpenMP threads per worker (None: torch's default; see
    #: :attr:`MultiProcessTestCase.rank_threads`).
    rank_threads: int | None = 1
    #: "batch" (default) or "normal": the rank processes' scheduling policy
    #: (see ``DISTTEST_RANK_SCHEDULING`` in the README).
    rank_scheduling: str = "batch"
    #: Fresh pools a class may get after breakage (crash, hang, desync)
    #: before its remaining tests fail at once.
    max_pool_rebuilds: int = 10
    pg: ClassVar[Any] = None
    #: Under run_rank: what the ranks share after each test.
    _launched: ClassVar[Any] = None
    #: Set by :meth:`run_rank`: an external launcher runs the class's ranks, no join loop watches them.
    _run_by_launcher: ClassVar[bool] = False
    _pool: ClassVar[Pool | None] = None
    _pool_skip: ClassVar[str | None] = None
    _pool_failed: ClassVar[str | None] = None
    _pool_breaks: ClassVar[int] = 0  # how often it broke (crash, hang...)

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
        limit = cls._group_limit()
        if limit is not None:
            # A backstop beyond the test's limit: the join loop reports a
            # hang first, with the stack of a rank still waiting in it.
            kwargs["timeout"] = timedelta(seconds=min(limit + PG_TIMEOUT_MARGIN, PG_TIMEOUT_MAX))
        if rdvz_file is not None:
            kwargs["store"] = dist.FileStore(rdvz_file, world_size)
        else:
            kwargs["init_method"] = "env://"
        dist.init_process_group(**kwargs)
        cls.pg = _compat.default_group()
        if limit is not None and cls._run_by_launcher:
            # Under run_rank no join loop watches: once the group is made
            # (nodes may start apart), its calls get the limit itself.
            _compat.set_group_timeout(min(limit, PG_TIMEOUT_MAX))

    # --- settings ----------------------------------------------------------------

    @classmethod
    def _limit(cls, test_id: str | None) -> float | None:
        return settings.test_timeout(cls, test_id)

    @classmethod
    def _group_limit(cls) -> float | None:
        """The longest limit a test of the class has (``DISTTEST_TIMEOUT``,
        upstream's per-name overrides, the class's ``timeout``): the group
        outlives none of them by more than its margin."""
        prefix = f"{cls.__module__}.{cls.__qualname__}."
        limits = [cls._limit(prefix + name) for name in unittest.defaultTestLoader.getTestCaseNames(cls)]
        return max((x for x in limits if x is not None), default=cls._limit(prefix + "setUpClass"))

    @classmethod
    def _pool_world_size(cls, method_name: str | None = None) -> int:
        return settings.world_size(cls, method_name)

    @classmethod
    def _start_method(cls) -> str:
        return cls._start_choice()[0]

    @classmethod
    def _start_choice(cls) -> tuple[str, str, str | None]:
        """(start method, where it came from, the warning to give if any)."""
        method, where = settings.start_method(cls)
        if method == "fork" and not thread_pool.alone():
            # NB: forking a process with other threads can copy a lock they
            # hold; the fork server has none.
            method, where = "zygote", f"disttest's fork server in place of {where} 'fork' (the test process has threads)"
        module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        importable = "<locals>" not in cls.__qualname__ and module_file is not None
        if method == "zygote" and "<locals>" in cls.__qualname__:
            method = "fork"
        chosen, note = cuda_fork.choose(method, cls, f"the pool of {cls.__qualname__}", where, importable)
        if chosen == "zygote" and method == "fork":  # (a later fallback's warning names it so)
            where = f"disttest's fork server in place of {where} 'fork'"
        return chosen, where, note

    # --- the pool (in the test process) -------------------------------------------

    @classmethod
    def _ensure_pool(cls, world_size: int) -> Pool:
        """The class's pool of ``world_size`` ranks: the one it has, or a new
        one. A pool that could not start is not tried again for the class
        (:class:`PoolUnavailable` with the first cause, at once); fresh pools
        after breakage are capped at ``max_pool_rebuilds``."""
        reason = cls.__dict__.get("_pool_skip")
        if reason:
            raise unittest.SkipTest(reason)
        failed = cls.__dict__.get("_pool_failed")
        if failed:
            raise PoolUnavailable(failed)
        pool: Pool | None = cls.__dict__.get("_pool")
        if pool is not None and not pool.broken and pool.world_size == world_size:
            return pool
        if pool is not None:
            cls._drop_pool(pool)
        cap = settings.rebuild_cap(cls)
        settings.seed(cls)  # a bad one refused here, not by every rank
        rank_threads = settings.rank_process_options(cls)
        if cls.__dict__.get("_pool_breaks", 0) > cap:
            cls._pool_failed = REBUILD_CAP.format(cls=cls.__name__, n=cap)
            raise PoolUnavailable(cls._pool_failed)
        backend = cls.backend_str()
        check_backend_name(backend, f"{cls.__name__}.backend_str()")
        unusable = backend_skip_reason(backend)  # nccl needs a visible GPU too
        if unusable is not None:
            cls._pool_skip = unusable
            raise unittest.SkipTest(cls._pool_skip)
        method, where, note = cls._start_choice()
        module = sys.modules.get(cls.__module__)
        fields = {
            "module": cls.__module__, "qualname": cls.__qualname__,
            "module_file": getattr(module, "__file__", None),
            "threads": settings.threads_for(method, cls, rank_threads),
            "scheduling": settings.rank_scheduling(cls),
            "environ": {**os.environ, **janitor.rank_environ()}, "cwd": os.getcwd(), "sys_path": list(sys.path),
        }
        # NB: a start takes longer than a test may (the fork server, the
        # module's import), but never past an outer limit: pytest-timeout's
        # would end it with no report, and each test of the class would wait again.
        start_limit: float = max(START_FLOOR, cls._limit(None) or 0)
        outer = settings.outer_cap()
        if outer is not None:
            start_limit = min(start_limit, outer)
        try:
            try:
                pool = Pool(cls, world_size, _LAUNCHERS[method], fields, start_limit)
            except ForkServerUnsafe as e:
                note = cuda_fork.fell_back(cls, f"the pool of {cls.__qualname__}", method, where, e.reason, e.kind)
                pool = Pool(cls, world_size, SpawnLauncher, {**fields, "threads": settings.threads_for("spawn", cls, rank_threads)}, start_limit)
        except (PoolUnavailable, RuntimeError, OSError) as e:
            # (RuntimeError: the system refused a rank's process, thread_pool.START_LIMIT)
            cls._pool_failed = POOL_FAILED.format(cls=cls.__name__, cause=e)
            raise PoolUnavailable(cls._pool_failed) from None
        cls._pool = pool
        _live_pools.add(pool)
        # NB: also where a subclass's tearDownClass does not call super()'s
        # (the pool stayed until the interpreter exited). Closing is idempotent.
        cls.addClassCleanup(cls._release_pool)
        if note is not None:  # (after: a warning raised as an error leaves the pool owned)
            warn_at(cls, note)
        skips = [o for o in pool.init_outcomes.values() if o.skip_reason]
        if skips:
            cls._pool_skip = skips[0].skip_reason
            cls._drop_pool(pool)
            raise unittest.SkipTest(skips[0].skip_reason)
        return pool

    @classmethod
    def tearDownClass(cls) -> None:
        cls._release_pool()
        super().tearDownClass()

    @classmethod
    def _release_pool(cls) -> None:
        """Close the class's pool; the next run of the class starts afresh."""
        pool = cls.__dict__.get("_pool")
        if pool is not None:
            cls._drop_pool(pool)
        cls._pool_failed = None
        cls._pool_breaks = 0

    def _dispatching(self) -> bool:
        return type(self).rank < 0

    def _callTestMethod(self, method: Any) -> None:
        if not self._dispatching():
            self._phase = "test"
            with armed(type(self), self._testMethodName, self.rank, rank_run_dir()), subtests_named(self):
                self._in_rank(super()._callTestMethod, method)
            return
        pool = self._pool_in_use
        name = self._testMethodName
        keep = None
        # NB: once: under an outer limit it shrinks as time passes, and the
        # report names the limit the join kept.
        limit = settings.test_timeout(self, self.id())
        if any(o.kind.is_cause for o in pool.init_outcomes.values()):
            # The group could not be made: the class's remaining tests fail
            # at once with this cause instead of trying again.
            pool.broken = True
            outcomes = [pool.init_outcomes.get(r, Outcome(r, Kind.PASSED)) for r in range(pool.world_size)]
            type(self)._pool_failed = POOL_FAILED.format(
                cls=type(self).__name__, cause="its process group could not be made; see the first test's report")
        else:
            # Before dispatch: a fault that cannot act is refused before any rank runs the test.
            injection = Injection.for_test(type(self), name, pool.run_dir, pool.world_size)
            injection.forget_earlier()  # a rank that fails before its body writes none
            try:
                run = pool.dispatch(name)
                keep = run.keep_logs
                outcomes = join(run, limit or 0,
                                expected_end=injection.expected_end)
            except BaseException:
                # NB: interrupted (pytest-timeout's exception, Ctrl-C): the
                # ranks may still be in this test, and the next test must not
                # be sent to them.
                pool.broken = True
                self._drop_pool(pool)
                raise
            # A killed rank breaks the pool, injected or not: it is rebuilt.
            p2p, collectives = pool.note(outcomes)
            if p2p is not None:
                warn_at(method, P2P_LEFT.format(test=self.id(), what=p2p))
            if collectives is not None:
                warn_at(method, COLLECTIVES_LEFT.format(test=self.id(), what=collectives))
            outcomes = injection.judge(outcomes)
        if pool.broken or pool.retired:
            self._drop_pool(pool)
            if pool.broken:
                cls = type(self)
                cls._pool_breaks = cls.__dict__.get("_pool_breaks", 0) + 1
        causes = [o for o in outcomes if o.kind.is_cause]
        if any(o.phase and not o.phase.startswith("test") for o in causes):
            # A rank's setUp, tearDown or cleanups failed, not only the test:
            # raised from the parent's tearDown, where unittest's
            # expectedFailure (which covers the test body only) does not hide it.
            # Nor is a body's failure there a cause: it was expected.
            if getattr(method, "__unittest_expecting_failure__", False) or getattr(
                    self, "__unittest_expecting_failure__", False):
                outcomes = [Outcome(o.rank, Kind.PASSED, output_tail=o.output_tail)
                            if o.kind in (Kind.FAILED, Kind.ERRORED) and (o.phase or "test").startswith("test") else o
                            for o in outcomes]
            self._outside_the_test = functools.partial(raise_for_outcomes, name, pool.world_size, limit, outcomes,
                                                       keep_logs=keep, where=method)
            return
        raise_for_outcomes(name, pool.world_size, limit, outcomes, keep_logs=keep, where=method)

    @classmethod
    def _drop_pool(cls, pool: Pool) -> None:
        """Close ``pool``; the class has none until the next test makes one."""
        pool.close()
        _live_pools.discard(pool)
        cls._pool = None

    # --- inside a rank -------------------------------------------------------------

    @classmethod
    def _pool_init(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        cls.rank = rank
        cls.world_size = world_size
        cls.rdvz_file = rdvz_file
        cls._init_pg(rank, world_size, rdvz_file)

    @classmethod
    def _pool_run_test(cls, test_name: str, rank: int) -> Outcome:
        """Run one test in this rank through unittest's own machinery (setUp,
        the test, subTests, tearDown, cleanups, expectedFailure); the outcome
        names the phase that failed."""
        case = cls(test_name)  # seeded in _callSetUp
        result = PhaseResult(rank)
        try:
            case.run(result)
        except KeyboardInterrupt as e:
            # unittest lets it through and runs no cleanups: an error of
            # this rank, with its traceback, and the cleanups still run.
            result.addError(case, (type(e), e, e.__traceback__))
            with contextlib.suppress(Exception):
                case.doCleanups()
        return result.outcome()

    @classmethod
    def _pool_can_go_on(cls) -> bool:
        """Hook method, in a worker after each test: whether it can run
        another (default: its default process group still exists)."""
        return dist.is_initialized()

    def _callSetUp(self) -> None:
        if not self._dispatching():  # run_rank: an ordinary test in this rank
            gone = launched.peers_gone(type(self))
            if gone is not None:  # (its collectives would wait for a rank that is not there)
                raise RuntimeError(gone)
            set_rng_seed(settings.seed(self))
            self._phase = "setUp"
            if type(self)._launched is not None:
                limit = settings.test_timeout(self, self.id())
                held_for = None if limit is None else limit + launched.HOLD_GRACE
                self._held_for, self._ends_at = held_for, None if held_for is None else time.monotonic() + held_for
            self._in_rank(super()._callSetUp)
            return
        # The parent runs neither setUp nor tearDown: the ranks do.
        self.rank = self.MAIN_PROCESS_RANK
        method = getattr(type(self), self._testMethodName, None)
        size = settings.world_size(self, self._testMethodName)
        skip = precheck_skip(self, method, size) if method is not None else None
        if skip is not None:
            raise skip
        # (In the ranks, ``_pool_init`` makes ``world_size`` the pool's size.)
        self._pool_in_use = self._ensure_pool(size)

    def _callTearDown(self) -> None:
        if not self._dispatching():
            self._phase = "tearDown"
            self._in_rank(super()._callTearDown)
            return
        deferred = vars(self).pop("_outside_the_test", None)
        if deferred is not None:
            deferred()

    def _callCleanup(self, function: Any, /, *args: Any, **kwargs: Any) -> None:
        self._phase = "cleanup"
        if self._dispatching():
            super()._callCleanup(function, *args, **kwargs)  # type: ignore[misc]
        else:
            self._in_rank(functools.partial(super()._callCleanup, function, *args, **kwargs))  # type: ignore[misc]

    #: Under run_rank, how long the test is held to (its limit and
    #: HOLD_GRACE) and when that ends (``time.monotonic()``); None: no limit.
    _held_for: float | None = None
    _ends_at: float | None = None

    def _in_rank(self, call: Callable[..., None], *args: Any) -> None:
        """A phase of a test in this rank: under ``run_rank`` held to the
        test's limit (setUp, the test, tearDown and cleanups together), for
        no disttest parent watches a launcher's ranks; in a pool's rank
        as it is (the parent's join holds it)."""
        ends_at = self._ends_at if type(self)._launched is not None else None
        if ends_at is None:
            call(*args)
            return
        if self._phase in ("tearDown", "cleanup"):
            # (a test stopped at its limit left its tearDown and cleanups no
            # time: what they undo stayed for the class's next tests)
            ends_at = max(ends_at, time.monotonic() + launched.HOLD_GRACE)
        said = functools.partial(launched.TIMED_OUT.format, test=self._testMethodName, limit=self._held_for,
                                 who=verdict_who([self.rank], self.world_size))
        stack = deadline.held(call, args, ends_at, said(stack="").rstrip(":\n"))
        if stack is not None:
            raise TimeoutError(said(stack=stack)) from None

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
        they come from the launcher's environment (``disttest.support.launchers``).
        Rendezvous through ``rdvz_file`` if given, else ``env://``. Returns
        the unittest result; the caller decides the exit status
        (``sys.exit(not result.wasSuccessful())``).
        """
        # A world size the class declares (not the base's default) must be the launcher's.
        owner = next((k for k in cls.__mro__ if "world_size" in k.__dict__), MultiProcContinousTest)
        declared = owner.__dict__["world_size"]
        # Checked as given first: a launcher's value compared with "0" would
        # be a disagreement, not the bad value it is.
        if world_size is not None:
            world_size = parse_world_size(world_size, "run_rank(world_size=...)")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ConfigError("rank", rank, "run_rank(rank=...)", "expected an int >= 0")
        rank, world_size = resolve_rank(
            rank, world_size, rdvz_file is not None,
            declared if owner is not MultiProcContinousTest and isinstance(declared, int) else None,
            f"{owner.__qualname__}.world_size")
        world_size = parse_world_size(world_size, "run_rank(world_size=...)")
        if not 0 <= rank < world_size:
            raise ConfigError("rank", rank, "run_rank(rank=...)", f"expected 0 <= rank < {world_size}")
        # (set only once both are known good: a refused call leaves the class as it was)
        cls.rank, cls.world_size = rank, world_size
        cls.rdvz_file = rdvz_file
        cls._run_by_launcher = True
        suite_faults = env_faults()
        if suite_faults:  # refused before the group is made; a test's own are refused as it runs
            raise ConfigError("fault", suite_faults[0].describe(), FAULT_ENV, UNJUDGED)
        backend = cls.backend_str()
        check_backend_name(backend, f"{cls.__name__}.backend_str()")
        unusable = backend_skip_reason(backend)
        if rdvz_file is None and _launched_by_env:
            raise RuntimeError(launched.SECOND_CALL.format(cls=cls.__qualname__, first=_launched_by_env[0]))
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
        if unusable is not None:  # (as a pool skips them; the group is not made)
            with launched.skipping(cls, unusable):
                return unittest.TextTestRunner(verbosity=2).run(suite)
        with launched.run_folder():  # (rank_temp_file's: removed however this process ends)
            cls._init_pg(rank, world_size, rdvz_file)
            if rdvz_file is None:  # (once made: a rendezvous that raised may be tried again)
                _launched_by_env.append(cls.__qualname__)
            try:
                # NB: the ranks agree after each test, and leave together
                # (launched's docstring): a rank leaving early aborts the others.
                cls._launched = launched.Agreement(_compat.default_store(), cls, rank, world_size)
                end = (cls._group_limit() or 0.0) + launched.AGREE_MARGIN
                result_class = functools.partial(launched.LaunchedResult, agreement=cls._launched, end_limit=end,
                                                 holds_store=rank == 0 and rdvz_file is None)
                return unittest.TextTestRunner(verbosity=2, resultclass=result_class).run(suite)
            finally:
                cls._launched = None
                cls._pool_shutdown()


# A pytest world_size marker on a test sets the pool's size.
setattr(MultiProcContinousTest, settings.READS_MARKER, True)

#: The corrected spelling.
MultiProcContinuousTest = MultiProcContinousTest
