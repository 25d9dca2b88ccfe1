"""The code that runs inside a rank process: the one rank loop.

Self-contained: it depends on the standard library, torch, the data
modules of the core (:mod:`.outcome`, :mod:`.board`, :mod:`.tracking`, :mod:`.messages`, :mod:`.proctree`,
:mod:`.channel`'s ``connect``, :mod:`.process_state`) and :mod:`disttest._compat`, not on the runners. A rank prepares itself
right after fork (parent-death signal, environment, output to a file, one
OpenMP thread, stack dumps on SIGUSR1, collective tracking), connects to the
parent, and then runs the loop every rank process runs: be ready (a pool
worker makes the class's group first), then for each ``Run`` message run the
test through unittest's machinery and answer ``Done`` with its outcome,
until told to ``Leave``. A fresh-process rank is a pool of one test, which
it starts without waiting for the parent's ``Run``: its ``_run`` hook
(upstream's) runs the test, and after answering it stays until the parent
says every rank has answered, or a moment (see :data:`LINGER`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import importlib
import importlib.util
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, cast

from disttest import _compat
from disttest._runner import board, process_state, rank_look, tracking
from disttest._runner.channel import connect
from disttest._runner.functional import track_functional
from disttest._runner.messages import Done, Hello, Ready, Run, send
from disttest._runner.outcome import Kind, Outcome, ask_locals, outcome_from_exception
from disttest._runner.proctree import (
    PR_SET_PDEATHSIG,
    descendants,
    kill_descendants,
    libc,
    set_child_subreaper,
)
from disttest.support import tempdirs

__unittest = True

__all__ = ["RankSpec", "current", "paths", "process_helpers", "record_test_outcome", "resolve_class", "run_dir",
           "run_rank_process"]

STACK_SIGNAL = signal.SIGUSR1
TEST_ERROR_EXIT_CODE = 10
#: Written to the rank's output (which the report shows) when its outcome
#: cannot reach the parent: the test closed the rank's channel (a
#: ``closerange`` of every descriptor above 2, a fork helper closing fds).
UNREPORTED = ("disttest: rank {rank} could not send the outcome of {test!r} to the parent ({error}: did the test "
              "close the rank's file descriptors?); its outcome: {outcome}")
#: Seconds at most a fresh-process rank stays after answering, unless the
#: parent says ``Leave`` sooner (every rank has answered). Its exit would
#: close its sockets under peers still completing communication with it (a
#: gloo handshake, a collective it already joined), turning their own report
#: into "connection closed by peer"; and a peer left waiting in a collective
#: this rank never joins gets the time to show where it waits (desync).
#: A rank that passed stays longer: that costs nothing when every rank
#: answers (the parent releases them at once), and gives a loaded machine the
#: time to show a peer waiting in a collective the rank never entered, also
#: one issued from C++ (published by the flight recorder's watcher). A failing
#: rank does not: the parent sees a failure when the rank has exited.
LINGER = 0.3
LINGER_AFTER_PASS = 2.0
FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_ENTRIES = 64  # flight-recorder entries kept per rank
_context_publish: list[Any] = []


@dataclass
class RankSpec:
    """Everything a rank needs to run one test, picklable for the fork server."""

    module: str
    qualname: str
    module_file: str | None
    test_name: str
    world_size: int
    run_dir: str
    file_name: str
    threads: int | None = 1
    environ: dict[str, str] = field(default_factory=dict)
    cwd: str = "."
    sys_path: list[str] = field(default_factory=list)
    run_kwargs: dict[str, Any] = field(default_factory=dict)
    #: "test": run one test and exit; "pool": serve the class's tests.
    entry: str = "test"
    address: str = ""
    token: str = ""
    #: "batch" or "normal" (``settings.rank_scheduling``).
    scheduling: str = "normal"
    #: The test process's ``sys.argv`` (upstream's spawned ranks have it).
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class _Context:
    rank: int
    spec: RankSpec
    test_outcome: Outcome | None = None
    pid: int = field(default_factory=os.getpid)
    #: Run after the parent has released the rank (see :func:`after_release`).
    after_release: list[Any] = field(default_factory=list)
    #: The file faulthandler writes this rank's stacks to, where it was re-armed.
    stack_file: Any = None


def after_release(fn: Any) -> bool:
    """In a rank process: call ``fn`` once the rank has reported and been
    released (or has lingered), not now; False outside a rank (call it
    yourself). For a passing rank's ``destroy_process_group``: destroying
    the group closes its connections, so a peer still waiting in a
    collective this rank never entered would fail at once ("connection
    closed by peer") instead of being seen waiting (a desync)."""
    ctx = current()
    if ctx is None or ctx.pid != os.getpid():
        return False
    ctx.after_release.append(fn)
    return True


def _leave_if_forked(ctx: _Context) -> None:
    """A process the test forked (``os.fork()`` in the body) that went on
    through the test: it leaves quietly; only the rank reports."""
    if os.getpid() != ctx.pid:
        os._exit(0)


_context: list[_Context] = []  # the one context of this rank process


def paths(run_dir: str, rank: int) -> dict[str, str]:
    """The files of ``rank`` in a run directory: its output, its stack dumps,
    and the run's progress board."""
    base = os.path.join(run_dir, f"rank{rank}")
    return {"log": base + ".log", "stacks": base + ".stacks", "progress": os.path.join(run_dir, "progress")}


def current() -> _Context | None:
    """This process's rank context, or None outside a rank."""
    return _context[0] if _context else None


def run_dir() -> str | None:
    """The run directory of this rank process's launcher, or None outside a rank."""
    ctx = current()
    return ctx.spec.run_dir if ctx is not None else None


def resolve_class(spec: RankSpec) -> type:
    """Import the test's module (by name, or ``__main__`` by file) and find
    the class by its qualified name."""
    if spec.module == "__main__":
        module = sys.modules.get("__mp_main__")
        if module is None or getattr(module, "__file__", None) != spec.module_file:
            if not spec.module_file:
                raise ImportError("the test's __main__ module has no file")
            loader_spec = importlib.util.spec_from_file_location("__mp_main__", spec.module_file)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules["__mp_main__"] = module
            loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(spec.module)
        except ModuleNotFoundError as e:
            root = _package_root(spec.module, spec.module_file)
            if root is None or not e.name or not (spec.module + ".").startswith(e.name + "."):
                raise
            # pytest's --import-mode=importlib names the module from its path
            # without putting the folder above it on sys.path: a spawned rank
            # (a fresh interpreter) could not import it by that name.
            sys.path.append(root)
            try:
                module = importlib.import_module(spec.module)
            except ModuleNotFoundError:
                # a package of the same name found first (another folder's
                # tests/): the test's own, from its folder
                sys.path.insert(0, sys.path.pop())
                inside = os.path.join(root, "")
                parts = spec.module.split(".")
                for n in range(len(parts) - 1, 0, -1):
                    name = ".".join(parts[:n])
                    package = sys.modules.get(name)
                    if package is not None and not any(
                            os.path.abspath(p).startswith(inside) for p in getattr(package, "__path__", ())):
                        del sys.modules[name]
                module = importlib.import_module(spec.module)
    obj: Any = module
    for part in spec.qualname.split("."):
        obj = getattr(obj, part)
    return cast(type, obj)


def _package_root(name: str, file: str | None) -> str | None:
    """The folder from which module ``name`` imports as the file ``file``
    (``tests.test_x`` at ``/a/tests/test_x.py``: ``/a``), or None."""
    if not file:
        return None
    stem = os.path.splitext(os.path.abspath(file))[0]
    if os.path.basename(stem) == "__init__":
        stem = os.path.dirname(stem)
    tail = os.path.join(*name.split("."))
    if not stem.endswith(os.sep + tail):
        return None
    return stem[: -len(tail) - 1] or os.sep


def record_test_outcome(outcome: Outcome) -> None:
    """Called by the test case in the rank once the test body has ended."""
    ctx = current()
    if ctx is not None:
        ctx.test_outcome = outcome


def set_parent_death_signal(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Get ``sig`` when the parent dies (Linux): SIGKILL ends a rank even
    while it is blocked in C++; exit now if the parent has died already."""
    if sys.platform.startswith("linux"):
        libc().prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:
        os._exit(1)


def process_helpers() -> frozenset[int]:
    """This process's children that serve the whole process, not one test:
    multiprocessing's resource tracker (under the ``spawn`` start method a
    rank has, the first ``multiprocessing.Queue`` or lock starts it; killed
    after that test, it would be named as left running and restarted, with
    a warning, by the next test of a pool worker). A rank kills it when it
    ends; the test process's launchers leave it alone."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return frozenset() if pid is None else frozenset({pid})


def _prepare(spec: RankSpec, rank: int, parent_pid: int) -> dict[str, str]:
    set_parent_death_signal(parent_pid)
    set_child_subreaper()
    # First: the handlers below (faulthandler's) are ours, not the forker's.
    rank_look.restore_signals()
    # A process group of its own: a test's os.killpg(0, ...) (or a terminal's
    # Ctrl-C) reaches this rank and its children, not the test process.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    files = paths(spec.run_dir, rank)
    # First, so that the parent can read our stack as soon as we exist.
    stacks = open(files["stacks"], "w")  # noqa: SIM115 (kept open for the signal)
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
    if spec.scheduling == "batch" and hasattr(os, "SCHED_BATCH"):
        # Only from the normal policy: one the user chose for the run (chrt) stays.
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(0) == os.SCHED_OTHER:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    os.chdir(spec.cwd)
    _set_environ(spec.environ)
    sys.path[:] = spec.sys_path
    log_fd = os.open(files["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    # A test runner may have replaced the streams (pytest's capture).
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if spec.threads is not None:
        # NB: first tensor-library call after fork; a parent that ran a
        # parallel op leaves OpenMP unusable here unless we go serial.
        import torch

        torch.set_num_threads(spec.threads)
    faulthandler.enable(file=2, all_threads=True)  # fd 2: the rank's log
    tracking.install_tracking()
    # assert_close imports torch.distributed.tensor (0.9 s) only to ask
    # whether an input is a DTensor: not before anything else imported it.
    _compat.lazy_dtensor_comparison()
    tracking.track_into(board.ProgressBoard(files["progress"], spec.world_size), rank)
    # c10d's flight recorder sees collectives issued from C++ (DDP's reducer)
    # and functional collectives; the watcher publishes what it sees.
    os.environ.setdefault(FR_ENV, str(FR_ENTRIES))
    _context_publish[:] = [tracking.watch_flight_recorder()]
    # As upstream's ranks: argv, start method, backends.
    rank_look.prepare_process(spec.argv)
    return files


def _set_environ(environ: dict[str, str]) -> None:
    """Make ``os.environ`` equal to ``environ``, touching only what differs
    (each change is a putenv; a fork server's environment is mostly the
    test process's already)."""
    for key in [k for k in os.environ if k not in environ]:
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def publish_progress(passed: bool = False) -> None:
    """Publish that this rank's test has ended (its peers' desync judgement
    needs when), and, unless it ``passed``, what the flight recorder says it
    was in (the judgement of its own error needs that)."""
    for publish in _context_publish:
        try:
            publish(done=True, look=not passed)
        except Exception:  # noqa: BLE001,S110 (bookkeeping never breaks a rank)
            pass


def tail(path: str, limit: int = 4000, start: int = 0) -> str:
    """The last ``limit`` bytes of a file after offset ``start``, as text
    (empty if unreadable)."""
    # (os.open and pread: a pool worker asks after every test, most often
    # of a log that has not grown.)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        if size <= start:
            return ""
        begin = max(start, size - limit)
        return os.pread(fd, size - begin, begin).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _final_outcome(ctx: _Context, exc: BaseException | None) -> Outcome:
    after = outcome_from_exception(ctx.rank, exc)
    test = ctx.test_outcome
    if test is None:
        if exc is not None and after.kind is not Kind.SKIPPED:
            after.detail = "raised outside the test body (in _run)"
        return after
    if test.kind is Kind.PASSED and after.kind is not Kind.PASSED:
        after.detail = "raised after the test body passed (in _run)"
        return after
    return test


class _OneTest:
    """A fresh-process rank's part: nothing to make first; the test runs
    through the class's ``_run`` hook (upstream suites override it)."""

    single = True

    def __init__(self, cls: Any, ctx: _Context) -> None:
        self.cls = cls
        self.ctx = ctx

    def init(self) -> Outcome | None:
        return None

    def run(self, test: str) -> Outcome:
        spec = self.ctx.spec
        exc: BaseException | None = None
        try:
            self.cls._run(self.ctx.rank, test, spec.file_name, None, **spec.run_kwargs)
        except BaseException as e:  # noqa: BLE001 (everything is reported)
            exc = e
        return _final_outcome(self.ctx, exc)

    def shutdown(self) -> None:
        for fn in self.ctx.after_release:
            with contextlib.suppress(Exception):
                fn()


#: Why a pool worker can run no further test.
GROUP_DESTROYED = "the test destroyed the class's default process group"


class _PoolWorker:
    """A pool worker's part: make the class's process group, run each test
    through unittest's own machinery, destroy the group at the end."""

    single = False

    def __init__(self, cls: Any, ctx: _Context) -> None:
        self.cls = cls
        self.ctx = ctx
        self.failure: Outcome | None = None

    def init(self) -> Outcome | None:
        spec = self.ctx.spec
        try:
            self.cls._pool_init(self.ctx.rank, spec.world_size, spec.file_name)
        except BaseException as e:  # noqa: BLE001 (reported for every test)
            self.failure = outcome_from_exception(self.ctx.rank, e)
            self.failure.detail = "raised while making the class's process group"
        return self.failure

    def run(self, test: str) -> Outcome:
        if self.failure is not None:
            return dataclasses.replace(self.failure)
        # What the test changes for the whole process ends with it, as a
        # fresh rank process would take it with it (the next test's start;
        # its setUp seeds the random generators).
        restore = process_state.snapshot(rng=False)
        try:
            outcome = cast(Outcome, self.cls._pool_run_test(test, self.ctx.rank))
        finally:
            restore()
        if not self.cls._pool_can_go_on():
            outcome.retired = GROUP_DESTROYED
        return outcome

    def shutdown(self) -> None:
        if self.failure is None:
            self.cls._pool_shutdown()


def run_rank_process(cls: Any, spec: RankSpec, rank: int, parent_pid: int) -> None:
    """The body of every rank process (forked or spawned; fresh or pooled):
    the one rank loop. Never returns."""
    code = TEST_ERROR_EXIT_CODE
    try:
        files = _prepare(spec, rank, parent_pid)
        ctx = _Context(rank, spec)
        _context[:] = [ctx]
        tempdirs.use_run_folder(spec.run_dir)
        conn = connect(spec.address)
        send(conn, Hello(rank, spec.token))
        part = (_PoolWorker if spec.entry == "pool" else _OneTest)(cls, ctx)
        send(conn, Ready(rank, part.init()))
        passed = lost = False
        # A fresh-process rank knows its one test: it starts it at once
        # instead of waiting a round trip for the parent's Run (the parent may
        # still be busy starting the other ranks).
        first: Run | None = Run(1, spec.test_name) if part.single else None
        while True:
            try:
                message = first if first is not None else conn.recv()
            except (EOFError, OSError):
                break  # the parent has gone
            first = None
            if not isinstance(message, Run):
                break  # Leave
            undo_locals = ask_locals(message.tb_locals) if message.tb_locals else None
            try:
                outcome = _run_one(part, ctx, files, message.test)
            finally:
                if undo_locals is not None:
                    undo_locals()
            try:
                send(conn, Done(message.seq, outcome))
            except OSError as e:
                _unreported(rank, message.test, outcome, e)
                lost = True
                break
            if part.single:
                passed = outcome.kind in (Kind.PASSED, Kind.SKIPPED)
                # Stay until every rank has answered (the parent says Leave),
                # at most a moment: see LINGER.
                with contextlib.suppress(OSError):
                    conn.poll(LINGER_AFTER_PASS if passed else LINGER)
                break
        part.shutdown()
        kill_descendants()
        # A pool worker that leaves cleanly has done its part; a fresh-process
        # rank only once its test passed or skipped (and either, once the
        # parent had its outcome: else the parent reads it in the output).
        code = 0 if not lost and (passed or not part.single) else TEST_ERROR_EXIT_CODE
    finally:
        _exit(code)


def _run_one(part: _OneTest | _PoolWorker, ctx: _Context, files: dict[str, str], test: str) -> Outcome:
    """Run one test in this rank; its outcome with what it left behind,
    the flight recorder's final counts published, and its output's end."""
    tracking.restart_counts()
    track_functional()  # (where the test's module loaded torch's functional collectives)
    before = descendants()
    ctx.test_outcome = None
    handler = signal.getsignal(STACK_SIGNAL)
    start = _log_size(files["log"])  # a pool worker's log holds its earlier tests' output too
    outcome = part.run(test)
    # All of this test's output in the log before it is reported (and
    # before the parent's last read of it for this test).
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    if not part.single and signal.getsignal(STACK_SIGNAL) is not handler:
        _rearm_stacks(ctx, files)
    _leave_if_forked(ctx)
    outcome.left_running = kill_descendants(keep=before | process_helpers())
    publish_progress(passed=outcome.kind in (Kind.PASSED, Kind.SKIPPED))
    outcome.output_tail = tail(files["log"], start=start)
    return outcome


def _unreported(rank: int, test: str, outcome: Outcome, error: OSError) -> None:
    """Write ``outcome`` where the report reads it when the channel is gone:
    the rank's output (descriptor 2, its log)."""
    said = outcome.kind.value
    if outcome.exc_type or outcome.message:
        said += f": {outcome.exc_type}: {outcome.message}" if outcome.exc_type else f": {outcome.message}"
    if outcome.traceback:
        said += "\n" + outcome.traceback.rstrip()
    text = UNREPORTED.format(rank=rank, test=test, error=error, outcome=said)
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode(errors="replace"))


def _rearm_stacks(ctx: _Context, files: dict[str, str]) -> None:
    """The test set its own handler for the stack signal: put faulthandler's
    back for the worker's later tests (their hang reports need it)."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.unregister(STACK_SIGNAL)  # NB: register alone keeps the test's handler
        ctx.stack_file = open(files["stacks"], "a")  # noqa: SIM115 (kept open for the signal)
        faulthandler.register(STACK_SIGNAL, file=ctx.stack_file, all_threads=True, chain=False)


def _exit(code: int) -> None:
    """Leave the rank process now: flush, then skip the atexit handlers it
    inherited (they belong to the process that forked it)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
