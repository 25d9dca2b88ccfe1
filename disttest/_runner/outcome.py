"""The per-rank outcome: what one rank did in one test, as picklable data.

Shared by every runner and by the code inside ranks; depends only on the
standard library and :mod:`disttest.support.skips` (for the exit-code mapping).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import re
import reprlib
import signal
import sys
import textwrap
import threading
import time
import traceback
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

from disttest._runner.settings import KEEP_LOGS_ENV, TB_LOCALS_ENV
from disttest._runner.tb_data import POSITIONS, Shown, positions
from disttest.config import ConfigError, parse_flag
from disttest.support.skips import skip_for_exit_code

__unittest = True

__all__ = ["COMM_MODULES", "MAX_TEXT", "OTHER_DIST_MODULES", "PEER_LOST", "ExitStatus", "Kind", "Outcome", "PhaseResult", "cap", "comm_site", "in_phase", "wrapped_peer_loss",
           "TB_LOCALS_ENV", "ask_locals", "outcome_from_exception", "safe_str", "showing_locals",
           "subtests_named"]


class Kind(str, enum.Enum):
    """How a rank's part in a test ended."""

    PASSED = "passed"
    FAILED = "failed"  # an AssertionError
    ERRORED = "errored"  # any other exception, or sys.exit(non-skip code)
    SKIPPED = "skipped"
    CRASHED = "crashed"  # died (exit code or signal) without reporting
    TIMED_OUT = "timed out"
    DESYNC = "desync"  # waited in a collective a finished peer never joined
    DEADLOCK = "deadlock"  # waited for a peer that waits for it in a call that cannot match
    STOPPED = "stopped"  # stopped by disttest because a peer failed

    @property
    def is_cause(self) -> bool:
        """True for the kinds that make a test fail or error by themselves."""
        # NB: by value: the join loop asks it of every rank at each new fact.
        return self._value_ in _CAUSES


_CAUSES = frozenset(k.value for k in (Kind.FAILED, Kind.ERRORED, Kind.CRASHED, Kind.TIMED_OUT, Kind.DESYNC,
                                      Kind.DEADLOCK))


@dataclass(frozen=True)
class ExitStatus:
    """How a rank process ended: an exit code, or the signal that killed it."""

    code: int | None = None
    signal: int | None = None
    #: How the rank was lost when neither is known ("was lost: the fork server ...").
    note: str = ""

    def describe(self) -> str:
        if self.note:
            return self.note
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"was killed by {name}"
        return f"exited with code {self.code}"

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        import os

        if os.WIFSIGNALED(status):
            return cls(signal=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status))

    @classmethod
    def from_exitcode(cls, exitcode: int) -> ExitStatus:
        """From multiprocessing's convention (negative: killed by a signal)."""
        return cls(signal=-exitcode) if exitcode < 0 else cls(code=exitcode)


@dataclass
class Outcome:
    """One rank's result for one test."""

    rank: int
    kind: Kind
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    exit: ExitStatus | None = None
    stacks: str = ""
    output_tail: str = ""
    detail: str = ""  # desync or timeout explanation
    #: The rank's traceback (user frames only) as tblib data, so the parent
    #: can attach it to the report and pytest shows the failing line.
    tb_data: dict[str, Any] | None = None
    #: When the rank's test ended (time.time(): one clock for every rank of a
    #: host); 0 when unknown (a rank that died without reporting).
    at: float = 0.0
    #: The phase that failed: "setUp", "test", "tearDown", "cleanup" (or ""
    #: where the runner runs only the test body).
    phase: str = ""
    #: What disttest injected into this rank in the test ("rank 1 killed at
    #: all_reduce #3"; see disttest.faults), set by the parent's judge.
    faults_fired: list[str] = field(default_factory=list)
    #: Processes the rank started that were still running when its test
    #: ended, killed by disttest ("pid 123: sleep 300").
    left_running: list[str] = field(default_factory=list)
    #: For an error: the torch.distributed function the test called that it
    #: came out of ("DTensor.full_tensor", "all_reduce"), "" when it came
    #: from the test's own code (see :func:`comm_site`).
    comm: str = ""
    #: For a failure or an error of the test's own code: the torch.distributed
    #: call whose lost peer it was raised while handling (see
    #: :func:`wrapped_peer_loss`). A fact for the report's order only: such a
    #: rank stays a cause (its assertion may be the test's real check).
    wrapped: str = ""
    #: Why this pool worker can run no further test although it is alive
    #: ("the test destroyed the default process group"); "" when it can.
    #: The parent then gives the class a fresh pool (not a breakage).
    retired: str = ""

    @property
    def skip_reason(self) -> str:
        return self.message if self.kind is Kind.SKIPPED else ""


def _frames(exc: BaseException) -> list[tuple[FrameType, int]]:
    """The traceback's frames without disttest's own (modules that set
    ``__unittest``), as unittest drops them; for a failed assertion, also
    nothing after the user's last frame (the assertion's internals)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    ours = ["__unittest" in f.f_globals for f, _ in frames]
    start = next((i for i, mine in enumerate(ours) if not mine), len(frames))
    end = len(frames)
    if isinstance(exc, AssertionError):
        end = next((i for i in range(start, len(frames)) if ours[i]), end)
    kept = [fr for fr, mine in zip(frames[start:end], ours[start:end], strict=True) if not mine]
    return kept or frames


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


#: At most this many frames go into a rank's traceback data (the first and
#: the last halves): tblib's data is one level of recursion a frame, and a
#: RecursionError's thousand frames lost it all (the report pointed at the
#: test's ``def`` line).
MAX_TB_FRAMES = 200


def _tb_data(exc: BaseException) -> dict[str, Any] | None:
    """The kept frames as tblib data with their columns (:mod:`.tb_data`: a chain of the user's frames only;
    None when the exception has none: the report then finds the user's
    frames elsewhere, and never shows disttest's own as the test's)."""
    kept = {id(f) for f, _ in _frames(exc) if "__unittest" not in f.f_globals}
    tbs = [tb for tb in _walk(exc.__traceback__) if id(tb.tb_frame) in kept]
    if not tbs:
        return None
    if len(tbs) > MAX_TB_FRAMES:
        tbs = tbs[:MAX_TB_FRAMES // 2] + tbs[-MAX_TB_FRAMES // 2:]
    # A chain of just those (a traceback's tb_next is its own: copies).
    head: TracebackType | None = None
    for tb in reversed(tbs):
        head = TracebackType(head, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    try:
        from tblib import Traceback

        node: dict[str, Any] | None = Traceback(head).to_dict()
    except Exception:  # noqa: BLE001 (the text report still has it all)
        return None
    first = node
    while node is not None and head is not None:
        node[POSITIONS] = positions(head)
        # (as text: what the frame held stays in the rank)
        node["tb_frame"]["f_locals"] = {k: str(v) for k, v in (_locals(head.tb_frame) or {}).items()}
        node, head = node.get("tb_next"), head.tb_next
    return first


def _walk(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


_LOCAL_CHARS = 300  # of each local's repr


#: Whether the test that runs now asked for locals through its unittest
#: result (``python -m unittest --locals``: ``result.tb_locals``); set by the
#: runners for the test's run, in the test process (thread ranks) and in a
#: pool's ranks (a fresh-process rank has it as :data:`TB_LOCALS_ENV`).
_asked: list[bool] = [False]


def ask_locals(on: bool) -> Callable[[], None]:
    """Show (or not) locals in the tracebacks of the test that runs now,
    whatever :data:`TB_LOCALS_ENV` says; return the undo."""
    before = _asked[0]
    _asked[0] = on

    def undo() -> None:
        _asked[0] = before

    return undo


def showing_locals() -> bool:
    """Whether a rank's tracebacks show each frame's locals now."""
    return _asked[0] or _flag_on(TB_LOCALS_ENV)


def _flag_on(env: str) -> bool:
    """Whether yes/no variable ``env`` says yes; a bad value is refused where
    the run starts (``settings.check_run_variables``), not here."""
    try:
        return parse_flag(os.environ.get(env), env)
    except ConfigError:
        return False


@functools.cache
def _short_repr() -> reprlib.Repr:
    """A repr that stops early in a large builtin container (a list of a
    million ints was a 7 MB string, made to show 300 characters of it)."""
    short = reprlib.Repr()
    short.maxlevel = 4
    short.maxstring = short.maxother = short.maxlong = _LOCAL_CHARS
    short.maxtuple = short.maxlist = short.maxarray = short.maxdict = 60
    short.maxset = short.maxfrozenset = short.maxdeque = 60
    return short


def _locals(frame: FrameType) -> dict[str, Shown] | None:
    if not showing_locals():
        return None
    shown = {}
    for name, value in list(frame.f_locals.items()):
        try:
            text = _short_repr().repr(value)
        except Exception as e:  # noqa: BLE001 (a repr that raises: say so, not fail the report)
            text = f"<repr raised {type(e).__name__}>"
        shown[name] = Shown(text if len(text) <= _LOCAL_CHARS else text[:_LOCAL_CHARS] + "...")
    return shown


def _is_group(exc: BaseException) -> bool:
    """An exception group: Python 3.11's, or the ``exceptiongroup`` backport's
    on 3.10 (by name: that package need not be installed)."""
    return any(c.__name__ == "BaseExceptionGroup" for c in type(exc).__mro__) and isinstance(
        getattr(exc, "exceptions", None), (tuple, list))


def _format(exc: BaseException, _seen: set[int] | None = None) -> str:
    # As traceback's: each exception of a chain once (a cycle of causes
    # lost the whole text to a RecursionError), and a group's members below
    # it, numbered (they were dropped).
    seen = set() if _seen is None else _seen
    seen.add(id(exc))
    chained = ""
    if exc.__cause__ is not None:
        if id(exc.__cause__) not in seen:
            chained = _format(exc.__cause__, seen) + _CAUSE
    elif exc.__context__ is not None and not exc.__suppress_context__ and id(exc.__context__) not in seen:
        chained = _format(exc.__context__, seen) + _CONTEXT
    # FrameSummary without column positions: no caret anchors, so no AST is
    # built here (3.11 parses source for them; ranks may be threads).
    summary = traceback.StackSummary.from_list([
        traceback.FrameSummary(f.f_code.co_filename, lineno, f.f_code.co_name, locals=_locals(f))
        for f, lineno in _frames(exc)
    ])
    # (no header for one never raised, a group's member, as traceback's)
    header = "Traceback (most recent call last):\n" if summary else ""
    text = chained + header + "".join(summary.format()) + "".join(traceback.format_exception_only(type(exc), exc))
    if _is_group(exc):
        members = exc.exceptions  # type: ignore[attr-defined]
        for i, member in enumerate(members, 1):
            body = _format(member, seen) if id(member) not in seen else f"{type(member).__qualname__} (shown above)\n"
            text += f"+---------------- {i} of {len(members)} ----------------\n"
            text += textwrap.indent(body, "| ", lambda line: True)
    return text


PHASE_ATTR = "__disttest_phase__"
#: A rank's outcome's detail when it raised again after its first error.
ALSO = "then also raised in {later}"


#: Set on a rank's exception: what the rank also raised after it (a
#: cleanup's error after the test's), for the report's ``then also raised in``.
ALSO_ATTR = "__disttest_also__"


def after_cleanups(case: Any, exc: BaseException | None) -> BaseException | None:
    """In a rank, after its test ended with ``exc`` (None: it passed): run
    the cleanups ``case`` registered there (``addCleanup``), last first, as
    unittest runs them after ``tearDown``, each whatever the ones before it
    raised; return what the rank reports: ``exc``, noting that a cleanup
    raised too, else the first cleanup's error, marked as raised in phase
    ``cleanup``."""
    later: BaseException | None = None
    cleanups = getattr(case, "_cleanups", [])  # (unittest's own list)
    while cleanups:
        function, args, kwargs = cleanups.pop()
        try:
            function(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (every cleanup runs; the first error is the rank's)
            later = later or e
    if later is None:
        return exc
    if exc is None:
        _mark(later, PHASE_ATTR, "cleanup")
        return later
    _mark(exc, ALSO_ATTR, [_also("cleanup", later)])
    return exc


#: How much of a later error's message ``then also raised in`` shows.
_ALSO_CHARS = 500


def _also(phase: str, exc: BaseException) -> str:
    """``phase: Type: message`` of an error raised after the rank's first
    (its message cut to :data:`_ALSO_CHARS`; it was the type alone)."""
    message = safe_str(exc)
    if len(message) > _ALSO_CHARS:
        message = message[:_ALSO_CHARS] + "..."
    return f"{phase}: {type(exc).__qualname__}" + (f": {message}" if message else "")


def _mark(exc: BaseException, attr: str, value: Any) -> None:
    if not hasattr(exc, attr):
        with contextlib.suppress(AttributeError, TypeError):  # (an exception class with __slots__)
            setattr(exc, attr, value)


@contextlib.contextmanager
def in_phase(phase: str) -> Iterator[None]:
    """Mark an exception leaving the block as raised in ``phase`` (a hook
    such as ``perThreadSetUp``); :func:`outcome_from_exception` reports it."""
    try:
        yield
    except BaseException as e:
        if not hasattr(e, PHASE_ATTR):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(e, PHASE_ATTR, phase)
        raise


def outcome_from_exception(rank: int, exc: BaseException | None) -> Outcome:
    """Classify how a rank's test body ended (``exc`` None: it returned).

    AssertionError: failed; SkipTest or ``sys.exit`` with a TEST_SKIPS code:
    skipped; ``sys.exit(0)`` or ``sys.exit(None)``: passed (upstream's
    ``_run`` overrides exit this way); other exceptions and exit codes: errored.
    """
    outcome = _classify(rank, exc)
    outcome.at = time.time()
    outcome.phase = getattr(exc, PHASE_ATTR, "") if exc is not None else ""
    also = getattr(exc, ALSO_ATTR, None) if exc is not None else None
    if also and not outcome.detail:
        outcome.detail = ALSO.format(later=", ".join(also))
    return outcome


#: Characters at most of a rank's exception message or traceback in its
#: outcome (a 20 MB message must not become a 160 MB report); the middle is cut.
MAX_TEXT = 20_000
CUT = "\n... [{n} characters cut by disttest; DISTTEST_KEEP_LOGS=1 keeps them in a rank process's log] ...\n"


def cap(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, or its head and tail with a note of how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + CUT.format(n=len(text) - 2 * half) + text[-half:]


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it (a user's ``__str__`` may
    raise, even recursively)."""
    try:
        return str(exc)
    except BaseException as e:  # noqa: BLE001
        try:
            why = f"{type(e).__qualname__}: {e}"
        except BaseException:  # noqa: BLE001
            why = type(e).__qualname__
        return f"<str() failed: {why}>"


def pytest_outcome(exc: BaseException) -> str:
    """"skip", "xfail" or "fail" for the exceptions of ``pytest.skip()``,
    ``pytest.xfail()`` and ``pytest.fail()`` (read from pytest's module where
    it is loaded, so this module needs no pytest); else ""."""
    outcomes = sys.modules.get("_pytest.outcomes")
    if outcomes is None:
        return ""
    for kind, cls_name in (("skip", "Skipped"), ("xfail", "XFailed"), ("fail", "Failed")):
        cls = getattr(outcomes, cls_name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return kind
    return ""


def _classify(rank: int, exc: BaseException | None) -> Outcome:
    if exc is None:
        return Outcome(rank, Kind.PASSED)
    name = type(exc).__qualname__
    from_pytest = pytest_outcome(exc)
    if isinstance(exc, unittest.SkipTest) or from_pytest == "skip":
        only = getattr(exc, SUBTESTS_ONLY_MARK, False)
        return Outcome(rank, Kind.SKIPPED, name, cap(safe_str(exc)), detail=SUBTEST_ONLY if only else "")
    if isinstance(exc, SystemExit):
        skip = skip_for_exit_code(exc.code)
        if skip is not None:
            return Outcome(rank, Kind.SKIPPED, name, skip.message)
        if exc.code in (0, None):
            return Outcome(rank, Kind.PASSED)
        return Outcome(
            rank, Kind.ERRORED, name, f"sys.exit({exc.code!r}) in the test", _format(exc), tb_data=_tb_data(exc)
        )
    # pytest.fail() and pytest.xfail() in a rank are failures, as in pytest.
    kind = Kind.FAILED if isinstance(exc, AssertionError) or from_pytest else Kind.ERRORED
    try:
        text = _format(exc)
    except BaseException:  # noqa: BLE001 (a hostile exception must not lose the outcome)
        text = f"{name}: {safe_str(exc)}"
    message = safe_str(exc)
    if len(message) > MAX_TEXT or len(text) > MAX_TEXT:
        _keep_whole(text)
    comm = comm_site(exc) if kind is Kind.ERRORED else ""
    return Outcome(rank, kind, name, cap(message), cap(text), tb_data=_tb_data(exc),
                   comm=comm, wrapped="" if comm else wrapped_peer_loss(exc))


def wrapped_peer_loss(exc: BaseException) -> str:
    """The torch.distributed call of an error that ``exc`` was raised while
    handling (or from) which said a peer went away or a wait ran out, or "":
    a test that catches a collective's failure and fails with words of its
    own (``self.fail(f"all_reduce failed: {e}")``). Such a rank is listed
    after the ranks whose causes are their own; it is never judged a
    consequence: its check may be the test's real one (a survivor's of an
    injected fault, a rank's while its peer's exit is expected)."""
    seen = {id(exc)}
    inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        call = comm_site(inner)
        if call and PEER_LOST.search(safe_str(inner)):
            return call
        inner = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
    return ""


#: Modules whose frames at the end of a traceback mean that communication
#: failed: torch.distributed's that communicate (c10d and its logging
#: wrapper, the functional collectives, RPC, rendezvous) and disttest's own
#: process groups.
COMM_MODULES = ("torch.distributed.distributed_c10d", "torch.distributed.c10d_logger",
                "torch.distributed._functional_collectives", "torch.distributed.rpc",
                "torch.distributed.rendezvous", "disttest.pg")
#: The rest of torch.distributed (DDP's construction, FSDP's and
#: pipelining's waits on a Work, checkpoint transports) also waits on
#: collectives from frames of its own, but mostly checks things of its own
#: there (a DTensor placement, FSDP's arguments): an error of it is
#: communication only when it says a peer went away or a wait ran out
#: (:data:`PEER_LOST`). A DTensor placement error on rank 1 was taken for
#: communication, and rank 0's skip hid it.
OTHER_DIST_MODULES = ("torch.distributed",)
#: What an error says when a peer went away or a wait ran out (gloo's and
#: NCCL's words; the verdict's too).
PEER_LOST = re.compile(
    r"closed by peer|reset by peer|broken pipe|connection (was )?(closed|reset|refused|aborted)"
    r"|remote (worker|process|end)|peer (closed|hung up|disconnected)|communicator was aborted"
    r"|timed? ?out|timeout", re.IGNORECASE)
#: Exception classes torch.distributed raises from C++ (``DistError`` and
#: its subclasses), found by name so this module needs no torch. Not
#: ``DistStoreError``: a store's ``wait``/``get`` that timed out is the test's
#: own key-value protocol (a key no rank set), not a collective a peer left.
_DIST_ERRORS = ("DistError", "DistBackendError", "DistNetworkError")
_STORE_ERROR = "DistStoreError"


def _module(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) else ""


def comm_site(exc: BaseException) -> str:
    """The torch.distributed function the test called that ``exc`` came out
    of, or "" when it came from the test's own code.

    A fact of the traceback, not of timing: after the test's last frame
    (the last one outside torch and disttest) there is a frame of
    torch.distributed (or of disttest's groups). An error raised by code
    torch called back (a hook of the test) has the test's frame last, so it
    is the test's own, and so is a call torch refused before it
    communicated (an argument error, marked by the rank's tracking).
    ``DistError`` and its subclasses count wherever they were raised.
    """
    if getattr(exc, "__disttest_refused__", False):  # (refusals.REFUSED_MARK: refused before it communicated)
        return ""
    frames = [f for f, _ in traceback.walk_tb(exc.__traceback__)]
    modules = [_module(f) for f in frames]

    def harness(i: int) -> bool:
        m = modules[i]
        return m == "torch" or m.startswith("torch.") or "__unittest" in frames[i].f_globals

    last_own = max((i for i in range(len(frames)) if not harness(i)), default=-1)
    calls = [frames[i].f_code for i in range(last_own + 1, len(frames)) if modules[i].startswith(COMM_MODULES)]
    if not calls and PEER_LOST.search(safe_str(exc)):
        calls = [frames[i].f_code for i in range(last_own + 1, len(frames))
                 if modules[i].startswith(OTHER_DIST_MODULES)]
    if calls:
        # The first named function ("wrapper" of a decorator is no name).
        names = [getattr(c, "co_qualname", c.co_name) for c in calls]
        return next((n for n in names if "<locals>" not in n), calls[0].co_name)
    names = [c.__name__ for c in type(exc).__mro__]
    if _STORE_ERROR not in names and any(n in _DIST_ERRORS for n in names):
        return type(exc).__qualname__
    return ""


def _keep_whole(text: str) -> None:
    """Write an over-long traceback whole to this rank's stderr (its log in
    a rank process), for DISTTEST_KEEP_LOGS. Not from a rank thread: its
    stderr is the test process's (a megabyte on the user's terminal)."""
    import sys

    if threading.current_thread() is not threading.main_thread() or not _flag_on(KEEP_LOGS_ENV):
        return  # (a megabyte a rank on pytest's captured output, for nothing)
    try:
        sys.__stderr__.write(text)  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        pass


#: The detail of a rank's skip that came from skipped subTests alone: the
#: rank ran the rest of its test (its peers' desyncs are not its skip's effect).
SUBTEST_ONLY = "only subTests were skipped; the rest of the test ran"
SUBTESTS_ONLY_MARK = "__disttest_subtests_only__"  # set on that SkipTest


class PhaseResult(unittest.TestResult):
    """Records, in a rank, what unittest's own machinery reports for one
    test (setUp, the test, subTests, tearDown, cleanups), with the phase
    each error came from (the one it was marked with, as a failed subTest's
    ``test (i=1)``, else the case's ``_phase``), as one :class:`Outcome`.

    The first error decides the outcome; later ones (tearDown, cleanups)
    are named in its detail. An expected failure is reported as the failure
    it is, and an unexpected success as a pass: the parent's copy of the
    test carries the same ``expectedFailure`` mark and judges it there.
    """

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self._errors: list[tuple[str, BaseException]] = []
        self._skip: str | None = None

    def _add(self, test: Any, err: Any, sub: str = "") -> None:
        phase = getattr(err[1], PHASE_ATTR, None) or (getattr(test, "_phase", "test") or "test") + sub
        self._errors.append((phase, err[1]))

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 (unittest's name)
        self._add(test, err)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._add(test, err)

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        # NB: unittest reports it after tearDown and cleanups ran, but only
        # the test body's failure is ever expected.
        self._errors.append((getattr(err[1], PHASE_ATTR, None) or "test", err[1]))

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None:  # (a rank's subTests go through subtests_named, which raises instead)
            self._add(test, err, f" {subtest._subDescription()}")

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self._skip = reason
        # (unittest calls this in its ``except SkipTest``: the exception is the one raised)
        self._subtests_only = getattr(sys.exc_info()[1], SUBTESTS_ONLY_MARK, False)

    def outcome(self) -> Outcome:
        if self._errors:
            phase, exc = self._errors[0]
            outcome = outcome_from_exception(self.rank, exc)
            outcome.phase = phase
            later = [_also(p, e) for p, e in self._errors[1:]]
            if later:
                outcome.detail = ALSO.format(later=", ".join(later))
            return outcome
        if self._skip is not None:
            outcome = outcome_from_exception(self.rank, unittest.SkipTest(self._skip))
            if getattr(self, "_subtests_only", False):
                outcome.detail = SUBTEST_ONLY
            return outcome
        return outcome_from_exception(self.rank, None)


class _RankSubTests:
    """What ``TestCase.subTest`` asks of the case's ``_outcome`` (unittest's
    private ``_Outcome``; Python 3.10 calls ``testPartExecutor`` with
    ``isTest``, later ones with ``subTest``): an error in a subTest is noted
    (so that code around the subTest cannot swallow it) and goes on marked
    with the subTest's phase (``test (i=1)``), ending the test; a skip ends
    the subTest only. Other parts (``doCleanups`` called by the test) run
    as without an outcome."""

    result_supports_subtests = True
    expecting_failure = False  # the parent's copy of the test judges expectedFailure
    expectedFailure = None  # noqa: N815 (unittest's name)
    success = True
    result = None

    def __init__(self, case: unittest.TestCase) -> None:
        self.case = case
        self.failures: list[BaseException] = []
        self.skips: list[str] = []

    @contextlib.contextmanager
    def testPartExecutor(self, test_case: Any, subTest: bool = False, isTest: bool = False) -> Iterator[None]:  # noqa: N802, N803
        if test_case is self.case:  # not a subTest: as unittest does with no outcome
            with unittest.case._Outcome().testPartExecutor(test_case):  # type: ignore[attr-defined]
                yield
            return
        phase = (getattr(self.case, "_phase", "test") or "test") + " " + test_case._subDescription()
        try:
            with in_phase(phase):
                yield
        except unittest.SkipTest as e:
            self.skips.append(str(e))
        except Exception as e:  # NB: not what stops a rank (sys.exit, disttest's stop)
            self.failures.append(e)
            raise


@contextlib.contextmanager
def subtests_named(case: unittest.TestCase) -> Iterator[None]:
    """In a rank, around the test method (every runner's): the first
    ``subTest`` that fails ends the test, and the report names it (``rank
    1/2 raised AssertionError in test (i=1)``); one that the test's own code
    caught is reported all the same, when the test ends. A skipped subTest
    is skipped and the test goes on (it is reported skipped if nothing
    failed).

    NB: the test does not go on after a failed subTest as unittest's would:
    a rank that failed part-way through a subTest's collectives would call
    the next one's while its peers are still in the first, and ranks out of
    step hang (gloo) until the timeout, which would then hide the failure.
    """
    previous = getattr(case, "_outcome", None)
    outcome = _RankSubTests(case)
    case._outcome = outcome  # type: ignore[attr-defined]
    try:
        yield
    except (Exception, SystemExit) as e:  # (sys.exit: upstream's skip codes; a caught failure comes first)
        if outcome.failures and e is not outcome.failures[0]:
            raise outcome.failures[0] from None  # the first failure is the cause
        raise
    finally:
        case._outcome = previous  # type: ignore[attr-defined]
    if outcome.failures:
        raise outcome.failures[0]
    if outcome.skips:
        skip = unittest.SkipTest(outcome.skips[0])
        setattr(skip, SUBTESTS_ONLY_MARK, True)  # (read by _classify and PhaseResult.addSkip)
        raise skip
