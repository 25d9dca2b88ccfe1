"""``MultiProcessTestCase``: fresh rank processes for every test.

The parent (the process unittest runs) starts ``world_size`` rank processes
in ``setUp`` (``self._spawn_processes()``, the upstream idiom); each rank
runs the test method with ``self.rank`` set; the parent's copy of the test
method joins them through the shared core and turns their outcomes into the
test's result. Ranks are forked from a fork server by default (fresh
processes and a fresh process group per test, at fork speed).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._runner import cuda_fork, settings, zygote
from disttest._runner import rank as rank_mod
from disttest._runner.join import StartUp, join
from disttest._runner.launcher import ForkLauncher, ProcessLauncher, SpawnLauncher
from disttest._runner.outcome import (
    TB_LOCALS_ENV,
    Kind,
    Outcome,
    after_cleanups,
    outcome_from_exception,
    showing_locals,
    subtests_named,
)
from disttest._runner.report import NO_RANKS_STARTED, RankError, raise_for, warn_at
from disttest._runner.verdict import expected_end, judge
from disttest._runner.verdict import who as verdict_who
from disttest._runner.zygote import ForkServerUnsafe, ZygoteLauncher, ZygoteUnavailable
from disttest.config import (
    DEFAULT_WORLD_SIZE,
)
from disttest.faults.judge import Injection
from disttest.faults.rank import armed
from disttest.runners._dispatch import RankDispatch
from disttest.support import janitor
from disttest.support.helpers import set_environ
from disttest.support.skips import backend_skip_reason

__unittest = True

__all__ = ["AGAIN_IN_A_FRESH_SERVER", "COPY_CRASHED", "START_METHOD_ENV", "DistributedTestBase", "MultiProcessTestCase"]

START_METHOD_ENV = settings.START_METHOD_ENV
#: Seconds ranks started by ``spawn`` get to start, at the least (a new
#: interpreter imports torch and the test's module, seconds on a busy
#: machine): the test's own limit counts from the moment its last rank has
#: started.
START_UP_LIMIT = 60.0
#: A test whose ranks crashed when forked by a copy of the test process
#: did not crash when run again by a fresh fork server.
COPY_CRASHED = (
    "{test}: {who} crashed ({how}) in ranks forked by a copy of the test process, and not when the test ran again in "
    "ranks of a fresh fork server, whose result is the test's (disttest): a fork copies native state the test process "
    "holds, and some of it (a gloo group the test process made itself, say) is not safe to copy. The fresh fork "
    "server serves the rest of this process; set DISTTEST_FORK_SERVER=fresh to start with it"
)
#: Streamed output (``DISTTEST_OUTPUT=stream``) between the runs of a test
#: whose ranks crashed in a copy: what the ranks print next is the second run's.
AGAIN_IN_A_FRESH_SERVER = (
    "[disttest] {test}: {who} crashed ({how}) in ranks forked by a copy of the test process; the test runs again in "
    "ranks of a fresh fork server, and the ranks' output below is that run's"
)
#: Signals of a crash (not of a kill: a rank killed by SIGKILL was stopped).
_CRASH_SIGNALS = frozenset(s.value for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT,
                                              signal.SIGFPE))
_LAUNCHERS: dict[str, type[ProcessLauncher]] = {
    "zygote": ZygoteLauncher, "fork": ForkLauncher, "spawn": SpawnLauncher,
}


class MultiProcessTestCase(RankDispatch):
    """Runs each test method in ``world_size`` fresh rank processes.

    Call ``self._spawn_processes()`` in ``setUp``. The test body then runs in
    every rank (``self.rank``, ``self.world_size``, ``self.file_name``: a
    fresh rendezvous file). The parent waits at most ``timeout`` seconds
    (class attribute; else ``get_timeout(test_id)``), fails fast when a rank
    fails or dies, reports a desync when a rank waits in a collective that a
    finished peer never entered, and puts the stacks of every rank it had to
    stop into the report. No rank outlives its test.
    """

    MAIN_PROCESS_RANK = -1
    TEST_ERROR_EXIT_CODE = rank_mod.TEST_ERROR_EXIT_CODE
    #: Per-test limit in seconds; None: ``get_timeout(self.id())``.
    timeout: float | None = None
    #: How ranks start: "zygote" (default), "fork" or "spawn". Where forked
    #: ranks could not use CUDA (the test process, or the fork server on
    #: importing the test's module, initialised it), "spawn" with a warning.
    start_method: str = "zygote"
    #: OpenMP threads per forked rank (None: torch's default). Ranks forked
    #: from a process that ran a parallel op get one, with a warning.
    rank_threads: int | None = 1
    #: "batch" (default) or "normal": the rank processes' scheduling policy
    #: (see ``DISTTEST_RANK_SCHEDULING`` in the README).
    rank_scheduling: str = "batch"

    def _should_stop_test_suite(self) -> bool:
        return False

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Hook: whether a rank destroys the default group after a passing test."""
        return True

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    def __init__(self, method_name: str = "runTest", methodName: str = "runTest") -> None:
        self._launcher: ProcessLauncher | None = None
        super().__init__(method_name, methodName)

    def _join(self, fn: Callable[[], Any]) -> None:
        self._join_processes(fn)

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # The fork server, as a copy of the test process before the class's
        # own set-up (see disttest._runner.zygote), preloading meanwhile.
        zygote.prefork(cls)

    def setUp(self) -> None:
        super().setUp()
        self.special_return_code_checks: dict[Any, int] = {}
        self.skip_return_code_checks: list[Any] = []
        self.processes: list[Any] = []
        self.pid_to_pipe: dict[int, Any] = {}
        self.rank = self.MAIN_PROCESS_RANK
        self.run_dir = tempfile.mkdtemp(prefix="disttest-run-")
        self._janitor = janitor.register(self._cleanup_now, paths=[self.run_dir])
        self.addCleanup(self._cleanup_run)
        self.file_name = os.path.join(self.run_dir, "rendezvous")
        open(self.file_name, "w").close()

    def _cleanup_run(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None
        self.processes = []
        shutil.rmtree(self.run_dir, ignore_errors=True)
        janitor.unregister(self._janitor)

    def _cleanup_now(self) -> None:
        """The test process is being interrupted (Ctrl-C, SIGTERM): its
        cleanups may never run (see :mod:`disttest.support.janitor`)."""
        if self._launcher is not None:
            self._launcher.kill_now()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _current_test_name(self) -> str:
        return self.id().split(".")[-1]

    def _spawn_processes(self, start_method: str | None = None) -> None:
        """Start the ranks for the current test (call in ``setUp``).

        ``start_method``: "zygote", "fork" or "spawn"; default: the
        ``DISTTEST_START_METHOD`` variable, else the class's ``start_method``.
        A skip decided by the test's decorators is raised here, before any
        rank starts. Where forked ranks could not use CUDA, they start with
        "spawn" instead, with a warning that says why (see the GPU how-to).
        """
        self._precheck()
        method, where = settings.start_method(type(self), start_method)
        self._refuse_second_start("_spawn_processes()", self._launcher is not None)
        self._start_source = where
        self._start_processes(method)

    def _start_processes(self, proc: Any = None) -> None:
        """Hook: start the ranks with ``proc`` (a start method name; an
        upstream ``Process`` class means "spawn")."""
        self._refuse_second_start("_start_processes()", self._launcher is not None)
        source = getattr(self, "_start_source", "")
        if proc is None and not source:  # called by the test itself: as _spawn_processes() chooses
            method, source = settings.start_method(type(self))
        else:
            method = proc if isinstance(proc, str) else ("spawn" if proc is not None else self.start_method)
            source = source or "_start_processes()"
            method = settings.pick("start method", method, source, settings.START_METHODS)
        cls = type(self)
        rank_threads = settings.rank_process_options(cls)
        self._test_timeout()  # a bad one is named before any rank starts
        # As are faults that cannot act (a rank outside the world).
        self._injection = Injection.for_test(cls, self._current_test_name(), self.run_dir,
                                             self._effective_world_size())
        module = sys.modules.get(cls.__module__)
        module_file = getattr(module, "__file__", None)
        importable = "<locals>" not in cls.__qualname__ and module_file is not None
        if method == "zygote" and not importable:
            method = "fork"  # the fork server cannot import this class by name
        test = f"{cls.__qualname__}.{self._current_test_name()}"
        method, note = cuda_fork.choose(method, cls, test, source, importable)
        spec = rank_mod.RankSpec(
            module=cls.__module__, qualname=cls.__qualname__, module_file=module_file,
            test_name=self._current_test_name(), world_size=self._effective_world_size(),
            run_dir=self.run_dir, file_name=self.file_name,
            threads=settings.threads_for(method, cls, rank_threads),
            scheduling=settings.rank_scheduling(cls),
            environ={**os.environ, **janitor.rank_environ(), **({TB_LOCALS_ENV: "1"} if showing_locals() else {})},
            cwd=os.getcwd(), sys_path=list(sys.path), run_kwargs={"fake_pg": getattr(self, "fake_pg", False)},
        )
        launcher = _LAUNCHERS[method](spec)
        try:
            self._start(launcher, cls)
        except ForkServerUnsafe as e:
            note = cuda_fork.fell_back(cls, test, method, source, e.reason, e.kind)
            launcher = SpawnLauncher(dataclasses.replace(spec, threads=settings.threads_for("spawn", cls, rank_threads)))
            self._start(launcher, cls)
        except ZygoteUnavailable as e:
            warn_at(getattr(self, self._testMethodName, None), f"disttest: forking from the test process instead: {e}")
            method, note = cuda_fork.choose("fork", cls, test, source, importable, server=False)
            threads = settings.threads_for(method, cls, rank_threads)
            launcher = _LAUNCHERS[method](dataclasses.replace(spec, threads=threads))
            self._start(launcher, cls)
        # Owned first: a warning raised as an error (-W error) must leave the
        # ranks to this test's cleanup (their launcher's socket was left open).
        self._launcher = launcher
        self.processes = launcher.processes()
        if note is not None:
            warn_at(getattr(self, self._testMethodName, None), note)

    @staticmethod
    def _start(launcher: ProcessLauncher, cls: type) -> None:
        """Start the ranks; if that fails part-way, stop those started."""
        try:
            launcher.start(cls)
        except BaseException:
            launcher.close()
            raise

    def _join_processes(self, fn: Callable[[], Any]) -> None:
        """Hook: wait for the ranks and raise the test's result."""
        if self._launcher is None:
            test = self._current_test_name()
            raise RankError(NO_RANKS_STARTED.format(test=test), test, 0, None, [])
        start = time.monotonic()
        # NB: once: under an outer limit it shrinks as time passes, and the
        # report names the limit the join kept.
        self._joined_limit = self._test_timeout()
        self._outcomes = self._join_ranks(self._launcher, self._joined_limit, fn)
        crashed = self._crashed(self._outcomes, fn)
        if crashed and zygote.from_copy(self._launcher):
            self._again_in_a_fresh_server(crashed, fn)
        self._check_return_codes(fn, time.monotonic() - start)

    def _join_ranks(self, launcher: ProcessLauncher, limit: float,
                    fn: Callable[[], Any] | None = None) -> list[Outcome]:
        """The ranks' outcomes. Ranks started by ``spawn`` (a new
        interpreter each): ``limit`` counted from when the last rank started
        its test; under an outer limit (pytest-timeout's), the start-up
        counts against its share too, and the report names what the test
        had. A forked rank starts in milliseconds: the limit counts from now
        (a hang before its test is the test's, with its stack)."""
        start_up = (StartUp(launcher.started, max(limit, START_UP_LIMIT), settings.outer_cap())
                    if isinstance(launcher, SpawnLauncher) else None)
        # A rank's exit the test expects (upstream's special_return_code_checks,
        # skip_return_code_checks) does not stop its peers: they run on to
        # their own verdicts, as upstream waits for every process (they were
        # stopped half a second later, and the test passed whatever they did).
        outcomes = join(launcher, limit, expected_end=self._injection.expected_end, start_up=start_up,
                        test=self._current_test_name(), expected_exit=lambda o: self._expected_exit(o, fn))
        if start_up is not None and start_up.given is not None and start_up.given < limit:
            self._joined_limit = start_up.given
        return outcomes

    def _crashed(self, outcomes: list[Outcome], fn: Callable[[], Any]) -> list[Outcome]:
        """The ranks that crashed (a fatal signal, not an injected death nor
        one test ``fn`` expects: upstream's ``special_return_code_checks``)."""
        injected = self._injection.expected_end
        return [o for o in outcomes if o.kind is Kind.CRASHED and o.exit is not None
                and o.exit.signal in _CRASH_SIGNALS and not (injected and injected(o.rank))
                and not self._expected_exit(o, fn)]

    def _exit_rules(self, fn: Callable[[], Any] | None) -> tuple[tuple[int, ...], bool]:
        """The exit codes test ``fn`` expects (upstream's
        ``special_return_code_checks``), and whether any exit is expected
        (``skip_return_code_checks``)."""
        code = self.special_return_code_checks.get(fn)
        return (() if code is None else (code,)), fn is not None and fn in self.skip_return_code_checks

    def _expected_exit(self, o: Outcome, fn: Callable[[], Any] | None) -> bool:
        """Whether rank outcome ``o`` is an exit test ``fn`` expects."""
        return expected_end(o, *self._exit_rules(fn))

    def _again_in_a_fresh_server(self, crashed: list[Outcome], fn: Callable[[], Any]) -> None:
        """Ranks forked by a copy of the test process crashed: run the test
        again in ranks of a fresh fork server (as a fresh interpreter would
        run it). If no rank crashes there, the copy was at fault: that run's
        outcomes are the test's, no copy serves this process again, and a
        warning says so; if one does, the crash is the test's (as the first
        run reported it), and copies go on serving."""
        assert self._launcher is not None
        first, first_outcomes = self._launcher, self._outcomes
        self._launcher = None
        first.close()
        open(self.file_name, "w").close()  # a fresh rendezvous
        how = ", ".join(sorted({o.exit.describe() for o in crashed if o.exit is not None}))
        who = verdict_who([o.rank for o in crashed], len(first_outcomes))
        test = f"{type(self).__qualname__}.{self._current_test_name()}"
        if settings.output_mode() == "stream":  # (else the first run's streamed lines and the second's look alike)
            sys.stdout.write(AGAIN_IN_A_FRESH_SERVER.format(test=test, who=who, how=how) + "\n")
            sys.stdout.flush()
        reason = f"ranks of {self._current_test_name()!r} crashed in a copy"
        zygote.distrust_copies(reason)
        self._start_processes("zygote")
        again = self._launcher
        assert again is not None  # (started, or it raised)
        first_limit, self._joined_limit = self._joined_limit, self._test_timeout()
        self._outcomes = self._join_ranks(again, self._joined_limit, fn)
        if self._crashed(self._outcomes, fn):
            zygote.trust_copies_again(reason)
            self._outcomes, self._joined_limit = first_outcomes, first_limit
            return
        # (at the test's first line: the frames that noticed it are disttest's and unittest's)
        warn_at(getattr(self, self._testMethodName, None), COPY_CRASHED.format(test=test, who=who, how=how))

    def _check_return_codes(self, fn: Callable[[], Any], elapsed_time: float) -> None:
        """Hook: turn the ranks' outcomes into the test's result.

        Exit codes listed in ``special_return_code_checks[fn]`` count as
        passing; with ``fn`` in ``skip_return_code_checks`` a rank that died
        without reporting is not a cause.
        """
        outcomes = getattr(self, "_outcomes", None)
        if not outcomes:
            test = self._current_test_name()
            raise RankError(NO_RANKS_STARTED.format(test=test), test, 0, None, [])
        injection = getattr(self, "_injection", None)
        if injection is not None:
            outcomes = injection.judge(outcomes)
        codes, lenient = self._exit_rules(fn)
        verdict = judge(outcomes, expected_exit_codes=codes, lenient_exits=lenient)
        keep = self._launcher.keep_logs if self._launcher is not None else None
        limit = getattr(self, "_joined_limit", None) or self._test_timeout()
        raise_for(verdict, self._current_test_name(), len(outcomes), limit, keep, where=fn)

    # --- inside a rank -----------------------------------------------------

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any) -> None:
        """Hook, in the rank: build the test case and run the test."""
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        ctx = rank_mod.current()
        if ctx is not None:
            settings.pin_world_size(self, ctx.spec.world_size)
        self.run_test(test_name, parent_pipe)

    def run_test(self, test_name: str, parent_pipe: Any = None) -> None:
        """In the rank: seed, run the test body and the cleanups it registered
        in the rank, record its outcome.

        A failing or skipped body ends the rank here (as upstream, whose
        ``_run`` overrides rely on it); after a passing body the default group
        is destroyed if ``destroy_pg_upon_exit``.
        """
        from disttest.runners.case import set_rng_seed

        os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
        set_rng_seed(settings.seed(self))
        exc: BaseException | None = None
        try:
            with armed(type(self), test_name, self.rank, rank_mod.run_dir()), subtests_named(self):
                getattr(self, test_name)()
        except BaseException as e:  # noqa: BLE001 (everything is reported)
            exc = e
        exc = after_cleanups(self, exc)
        outcome: Outcome = outcome_from_exception(self.rank, exc)
        # While the group exists: peers judge by it.
        rank_mod.publish_progress(passed=outcome.kind is Kind.PASSED)
        rank_mod.record_test_outcome(outcome)
        if outcome.kind is not Kind.PASSED:
            raise SystemExit(self.TEST_ERROR_EXIT_CODE)
        if self.destroy_pg_upon_exit and dist.is_initialized():
            if not rank_mod.after_release(dist.destroy_process_group):
                dist.destroy_process_group()


class DistributedTestBase(MultiProcessTestCase):
    """A MultiProcessTestCase that starts its ranks in ``setUp`` and makes
    the process group by device type (gloo on CPU, nccl on CUDA...)."""

    def setUp(self) -> None:
        super().setUp()
        self.addCleanup(set_environ, set_environ({"WORLD_SIZE": str(self.world_size)}))
        self._spawn_processes()

    def backend(self, device: str) -> str:
        """The c10d backend for ``device``."""
        if "cuda" in device:
            return "nccl"
        if "hpu" in device:
            return "hccl"
        if "xpu" in device:
            return "xccl"
        return "gloo"

    def create_pg(self, device: str, world_size: int | None = None) -> Any:
        """In a rank: make the default group for ``device`` through the test's
        rendezvous file, and return it."""
        world_size = self.world_size if world_size is None else world_size
        backend = self.backend(device)
        unusable = backend_skip_reason(backend) if backend == "nccl" else None
        if unusable is not None:  # a CUDA build of torch on a host without a visible GPU
            raise unittest.SkipTest(unusable)
        store = dist.FileStore(self.file_name, world_size)
        dist.init_process_group(backend=backend, world_size=world_size, rank=self.rank, store=store)
        if "nccl" in backend or "xccl" in backend:
            accelerator = _compat.accelerator_type()
            if accelerator is None:
                raise RuntimeError(
                    f"expected an accelerator for the {backend} backend, found none (disttest)"
                )
            dev = torch.device(f"{accelerator}:{self.rank}")
            torch.set_default_device(dev)
            _compat.set_device_index(dev)
        return _compat.default_group()

    def rank_to_device(self, device: str) -> dict[int, list[int]]:
        """``{rank: [device index]}``, round-robin over the visible devices."""
        count = max(1, torch.get_device_module(device).device_count())
        return {i: [i % count] for i in range(self.world_size)}
