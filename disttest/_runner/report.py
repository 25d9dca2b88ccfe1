"""From per-rank outcomes to one unittest result, with one message per test.

An AssertionError in a rank is a failure (raised as :class:`RankFailure`,
both ``AssertionError`` and ``RuntimeError`` so suites that assert
``RuntimeError`` keep passing); anything else that went wrong is an error
(:class:`RankError`); a skip in any rank with none failing is a skip. The
message names every failing rank and groups identical tracebacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
import sys
import unittest
import warnings
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from disttest._runner import settings
from disttest._runner.outcome import Kind, Outcome
from disttest._runner.tb_data import as_traceback
from disttest._runner.verdict import (
    CALLS_DIFFER,
    CALLS_DIFFER_AT,
    CALLS_MISMATCH,
    RANK,
    Status,
    Verdict,
    judge,
)
from disttest._runner.verdict import who as _who

__unittest = True

_CALLS_DIFFER_AT_END = CALLS_DIFFER_AT.split("}", 1)[1]  # (what follows the calls)

__all__ = [
    "NO_RANKS_STARTED",
    "RankError",
    "RankFailure",
    "RankReport",
    "format_report",
    "injected_lines",
    "raise_for",
    "raise_for_outcomes",
    "report_parts",
    "user_stack",
    "user_traceback",
    "warn_at",
]

HEADER = "{test!r} {verdict} (disttest): {summary}"
TIMED_OUT = "{who} did not finish {test!r} within {timeout}s"
DESYNC = "desync: {detail}, a collective its peer never entered"
DEADLOCK = "deadlock: {detail}"
CRASHED = "{who} {exit} before finishing {test!r}"
STOPPED = "{who} stopped by disttest after the failure above"
NO_RANKS_STARTED = (
    "no ranks were started for {test!r} (disttest): call self._spawn_processes() "
    "in setUp, or the test passes without running"
)
TAIL_CHARS = 2000
#: Ranks that raised alike, each with a message of its own: beyond this many
#: messages they are one section, which shows this many (a line each).
SHOWN_MESSAGES = 8
MESSAGE_CHARS = 200
MESSAGES_DIFFER = "{who}{where}: {exc_type}, {count} different messages (the first {shown}):"
NO_USER_FRAME = "(no frame of the test: the rank was in disttest's own code)"
#: A rank in a cleanup the test registered, in a function with no Python
#: frame of its own (``addCleanup(time.sleep, 100)``).
IN_CLEANUP = "(no frame of the test: the rank was in a cleanup the test registered, in a builtin it called: {frame})"
LEFT_RUNNING = "{who} left processes running when its test ended; disttest killed them: {procs}"
SECTION = "disttest {who} ({kind})"
LOGS_KEPT = "the whole output of every rank is kept in {folder} (disttest, DISTTEST_KEEP_LOGS)"
#: What disttest injected into a rank (``Outcome.faults_fired``, filled by
#: :mod:`disttest.faults.judge`) is listed apart from the causes; entries with
#: these marks are a schedule-fuzzing seed or a fault that never fired.
CHAOS_MARK = "chaos: "
#: An entry with this mark: the seconds a rank's schedule-fuzzing delays took.
DELAYED_MARK = "chaos delays: "
NEVER_MARK = "never fired: "
INJECTED = "injected by disttest (not causes): {faults}"
CHAOS = "schedule fuzzing: {setting} (the same seed gives the same delays)"
#: Appended to :data:`CHAOS` where the delays took a tenth of a second or more of a rank's time.
CHAOS_DELAYED = "; its delays took {seconds:.1f}s of {who}'s time, the most of any rank"


class RankReport(Exception):
    """Base of the exceptions a distributed test raises in the parent.

    Fields: ``test``, ``world_size``, ``timeout``, ``outcomes`` (one
    :class:`Outcome` per rank) and ``ranks`` (the failing ones).
    """

    def __init__(self, message: str, test: str, world_size: int, timeout: float | None,
                 outcomes: Sequence[Outcome], sections: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.test = test
        self.world_size = world_size
        self.timeout = timeout
        self.outcomes = list(outcomes)
        self.ranks = [o.rank for o in outcomes if o.kind.is_cause]
        #: The per-rank parts of the message, ``(title, text)``: each group of
        #: ranks with the same cause (or stopped alike), as pytest shows them
        #: in sections of their own.
        self.sections = list(sections)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole (pytest-xdist ships reports between processes); an
        # exception's default reduction passes only its message back.
        return (type(self), (self.args[0] if self.args else "", self.test, self.world_size, self.timeout,
                             self.outcomes, self.sections), self.__dict__)

    def summary(self) -> str:
        """The message without its per-rank sections: the header, what was
        injected, and anything added after (kept logs)."""
        message = str(self.args[0]) if self.args else ""
        details = _details(self.sections)
        return message.replace(details, "", 1) if details and details in message else message


class RankFailure(RankReport, AssertionError, RuntimeError):
    """A rank's assertion failed (a unittest failure; also a RuntimeError)."""


class RankError(RankReport, RuntimeError):
    """A rank raised, crashed, hung or desynchronised (a unittest error)."""


# Shown to users as disttest.RankFailure / disttest.RankError (and pickled by
# that name), where they import them from.
for _cls in (RankReport, RankFailure, RankError):
    _cls.__module__ = "disttest"


def _line(o: Outcome, who: str, test: str, timeout: float | None) -> str:
    if o.kind is Kind.TIMED_OUT:
        # (with a detail: it timed out in its start-up, join.NOT_STARTED)
        return _fill(o.detail, who) if o.detail else TIMED_OUT.format(who=who, test=test, timeout=timeout)
    if o.kind is Kind.DESYNC:
        if o.detail.endswith((CALLS_DIFFER, CALLS_MISMATCH)):  # (it says what the collective is to its peer)
            return "desync: " + _fill(o.detail, who)
        return DESYNC.format(detail=_fill(o.detail, who))
    if o.kind is Kind.DEADLOCK:
        return DEADLOCK.format(detail=_fill(o.detail, who))
    if o.kind is Kind.CRASHED:
        exit_text = o.exit.describe() if o.exit else "exited"
        return CRASHED.format(who=who, exit=exit_text, test=test) + (f" ({o.detail})" if o.detail else "")
    if o.kind is Kind.STOPPED:
        if not o.detail:
            return STOPPED.format(who=who)
        # (A detail that names its ranks by the report's grouping: verdict.WAITED_FOR.)
        return f"{_fill(o.detail, who) if '{who}' in o.detail else o.detail} (a consequence)"
    message = o.message
    if "\n" in message.strip() and o.traceback.rstrip().endswith(message.rstrip()):
        # The traceback below ends with the whole message: its first line here
        # (a tensor comparison's message was shown twice, twice a rank).
        message = message.strip().splitlines()[0]
    text = f"{who}{_in(o)}: {o.exc_type}: {message}".rstrip(": ")
    return f"{text}\n({o.detail})" if o.detail else text


def _in(o: Outcome) -> str:
    """" in tearDown": where a rank's error came from, when not the test body."""
    return f" in {o.phase}" if o.phase and o.phase != "test" else ""


#: disttest's own files (the package folder, with its separator: not a sibling such
#: as disttest_extras/).
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


#: disttest's rank entry points: frames below them are the launcher's past
#: (a forked rank's stack goes on into its parent's frames at the fork).
_ENTRIES = (" in run_rank_process", " in _main")


def user_stack(stacks: str) -> str:
    """A stack dump without disttest's own frames, cut at the rank's entry;
    threads left with no frame of their own (disttest's watcher) are dropped."""
    blocks: list[list[str]] = []  # a header (or ""), then its kept frames
    past = False  # below a rank entry: the launcher's frames, not the rank's
    innermost = ""  # the first (innermost) frame of each thread, unittest's included
    cleanup = ""  # a thread whose innermost frame is unittest's call of a cleanup
    for line in stacks.rstrip().splitlines():
        if not line.lstrip().startswith("File "):  # a thread's header, a blank line
            past = False
            innermost = ""
            blocks.append([line])
            continue
        if not innermost:
            innermost = line.strip()
            if line.endswith(_CLEANUP_CALLERS) and (_UNITTEST in line or _OWN in line):
                cleanup = innermost
        if past:
            continue
        if _OWN in line and line.endswith(_ENTRIES):
            past = True
        elif _OWN not in line and '"<string>"' not in line and _UNITTEST not in line:
            if not blocks:
                blocks.append([""])
            blocks[-1].append(line)
    busy = [b for b in blocks if any(_THREADING not in f for f in b[1:])]
    if not busy and any(b[0].startswith(("Thread ", "Current thread ")) for b in blocks):
        return IN_CLEANUP.format(frame=cleanup) if cleanup else NO_USER_FRAME
    out: list[str] = []
    for b in blocks:
        is_thread = b[0].startswith(("Thread ", "Current thread "))
        if is_thread and busy and b not in busy:
            continue
        out.extend(line for line in b if line)
        if is_thread and len(b) > 1:
            out.append("")
    return "\n".join(out).rstrip()


_THREADING = os.sep + "threading.py"
#: The frames that call a test's cleanups: unittest's (a pool's rank, the
#: threads) and disttest's own (a rank process, outcome.after_cleanups).
_CLEANUP_CALLERS = (" in _callCleanup", " in doCleanups", " in after_cleanups")
#: unittest's own frames (a pool rank runs each test through ``case.run``).
_UNITTEST = os.path.dirname(unittest.__file__) + os.sep


def _fill(detail: str, who: str) -> str:
    waits = "{waits}" if who == "{who}" else ("wait" if who.startswith("ranks") else "waits")
    return detail.format(who=who, waits=waits)


def _short(o: Outcome, who: str, timeout: float | None) -> str:
    if o.kind is Kind.TIMED_OUT:
        return _fill(o.detail, who) if o.detail else f"{who} timed out after {timeout}s"
    if o.kind in (Kind.DESYNC, Kind.DEADLOCK):
        return f"{o.kind.value}: " + _fill(o.detail, who)
    if o.kind is Kind.CRASHED:
        return f"{who} {o.exit.describe() if o.exit else 'exited'}"
    return f"{who} raised {o.exc_type}{_in(o)}"


def _body(o: Outcome, stacks: str = "") -> str:
    """``o``'s traceback, stack and output; ``stacks``: the stacks to show
    instead of its own (a group's, :func:`_stacks_of`)."""
    parts = []
    if o.traceback:
        parts.append(o.traceback.rstrip())
    if stacks:
        parts.append(stacks)
    elif o.stacks:
        where = "where it crashed" if o.kind is Kind.CRASHED else "its stack"
        parts.append(f"{where}:\n" + user_stack(o.stacks))
    if o.output_tail.strip() and o.kind.is_cause:
        parts.append("its output ends:\n" + _tail(o.output_tail))
    return "\n".join(parts)


def _tail(output: str) -> str:
    """The last :data:`TAIL_CHARS` of a rank's output, from the start of a
    line where it was cut in the middle of one (it began "oisy output")."""
    tail = output[-TAIL_CHARS:]
    if len(output) > TAIL_CHARS and output[-TAIL_CHARS - 1] != "\n":
        line_end = tail.find("\n")
        if 0 <= line_end < len(tail.rstrip()) - 1:
            tail = tail[line_end + 1:]
    return tail.rstrip()


def _stacks_of(group: Sequence[Outcome], world_size: int) -> str:
    """The body of ranks grouped by their desync or deadlock: one reads as
    ``_body``; stacks that differ (a cycle's ranks wait in different calls)
    are each shown, with the ranks they are of."""
    stacks: dict[str, tuple[str, list[int]]] = {}  # the waiting thread's frames -> (a stack, its ranks)
    for o in group:
        if o.stacks:
            stack = user_stack(o.stacks)
            stacks.setdefault(_waiting_frames(stack), (stack, []))[1].append(o.rank)
    if len(stacks) < 2:
        return _body(group[0])
    return _body(group[0], "\n".join(f"the stack of {_who(ranks, world_size)}:\n{stack}"
                                     for stack, ranks in stacks.values()))


def _waiting_frames(stack: str) -> str:
    """The frames of the thread that waits (faulthandler's "Current
    thread" block, else the whole dump), without thread ids: what tells
    ranks' calls apart (their other threads, a watcher caught mid-step,
    do not)."""
    blocks = stack.split("\n\n")
    current = [b for b in blocks if b.startswith("Current thread")]
    return "\n".join(line for line in (current[0] if current else stack).splitlines()[1:])


def warn_at(where: Callable[..., Any] | type | None, message: str) -> None:
    """Warn ``message`` (a ``UserWarning``) at the first line of the test
    function or test class ``where``, where the user looks, rather than at
    disttest's or unittest's frame that noticed it (warning filters apply
    as to any warning there); without one, at the caller's caller."""
    found: tuple[str, int] | None = None
    if isinstance(where, type):
        with contextlib.suppress(OSError, TypeError):  # (no source: a class made at run time)
            found = inspect.getsourcefile(where) or "", inspect.getsourcelines(where)[1]
    elif where is not None:
        code = getattr(inspect.unwrap(where), "__code__", None)
        found = (code.co_filename, code.co_firstlineno) if code is not None else None
    module = sys.modules.get(getattr(where, "__module__", "") or "")
    if not found or not found[0] or module is None:
        warnings.warn(message, stacklevel=3)
        return
    warnings.warn_explicit(message, UserWarning, found[0], found[1], module=module.__name__,
                           registry=module.__dict__.setdefault("__warningregistry__", {}),
                           module_globals=module.__dict__)


def left_running_lines(outcomes: Sequence[Outcome], world_size: int) -> list[str]:
    """One line per rank that left processes running (killed by disttest)."""
    return [LEFT_RUNNING.format(who=RANK.format(rank=o.rank, world=world_size), procs="; ".join(o.left_running))
            for o in outcomes if getattr(o, "left_running", None)]


def format_report(test: str, world_size: int, timeout: float | None,
                  outcomes: Sequence[Outcome], verdict: str) -> str:
    """The message: a header naming the failing ranks, then each rank's
    cause, identical ones grouped ("ranks 1, 2/4: ...")."""
    head, sections = report_parts(test, world_size, timeout, outcomes, verdict)
    return "\n".join(head) + _details(sections)


def _own(text: str, own: str) -> str:
    """``text`` with the rank's own name (``own``) as a placeholder: ranks
    whose reports differ only in it read the same (a thousand released ranks)."""
    return text.replace(own, "\0") if text else text


def _details(sections: Sequence[tuple[str, str]]) -> str:
    """The sections as the message carries them, after its header lines."""
    return "".join(f"\n\n{text}" for _, text in sections)


def _alike(groups: dict[tuple[str, ...], list[Outcome]]) -> list[tuple[list[Outcome], list[list[Outcome]]]]:
    """``groups`` (by their key) as ``(ranks, parts)``: where more than
    :data:`SHOWN_MESSAGES` of them read the same but for the message (a
    thousand ranks that each name their own value), one group of all their
    ranks, with those groups as its parts; else each group alone."""
    by_shape: dict[tuple[str, ...], list[list[Outcome]]] = {}
    for key, group in groups.items():
        shape = key
        if len(key) > 3 and key[2]:  # (kind, type, message, traceback, ...): the message out of both
            shape = (key[0], key[1], "", key[3].replace(key[2], "\1"), *key[4:])
        by_shape.setdefault(shape, []).append(group)
    found: list[tuple[list[Outcome], list[list[Outcome]]]] = []
    for parts in by_shape.values():
        if len(parts) <= SHOWN_MESSAGES:
            found += [(part, [part]) for part in parts]
        else:
            found.append((sorted((o for part in parts for o in part), key=lambda o: o.rank), parts))
    return found


def _messages(first: Outcome, who: str, parts: Sequence[Sequence[Outcome]], world_size: int) -> str:
    """The line of ranks that raised alike, each group with its message:
    the first :data:`SHOWN_MESSAGES` of them, a line each."""
    lines = [MESSAGES_DIFFER.format(who=who, where=_in(first), exc_type=first.exc_type, count=len(parts),
                                    shown=min(len(parts), SHOWN_MESSAGES))]
    for part in parts[:SHOWN_MESSAGES]:
        message = part[0].message.strip().splitlines()[0] if part[0].message.strip() else ""
        lines.append(f"  {_who([o.rank for o in part], world_size)}: {message[:MESSAGE_CHARS]}")
    if len(parts) > SHOWN_MESSAGES:
        lines.append(f"  ... and {len(parts) - SHOWN_MESSAGES} more")
    lines.append(f"the traceback of {RANK.format(rank=first.rank, world=world_size)}:")
    return "\n".join(lines)


def report_parts(test: str, world_size: int, timeout: float | None, outcomes: Sequence[Outcome],
                 verdict: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The report's header lines and its sections, ``(title, text)``: one per
    group of ranks that read the same, causes first."""
    groups: dict[tuple[str, ...], list[Outcome]] = {}
    for o in outcomes:
        own = RANK.format(rank=o.rank, world=world_size)  # read as "the rank itself"
        if o.kind in (Kind.DESYNC, Kind.DEADLOCK):
            # The collective and the peer matter; the transport's message
            # (ports, addresses) differs from rank to rank.
            key: tuple[str, ...] = (o.kind.value, o.detail)
        elif o.kind.is_cause or o.kind is Kind.STOPPED:
            key = (o.kind.value, o.exc_type, *(_own(text, own) for text in (o.message, o.traceback, o.detail)),
                   o.stacks, o.phase, o.exit.describe() if o.exit else "")  # (how a crashed rank ended)
        else:
            continue
        groups.setdefault(key, []).append(o)
    # Causes first (those that failed handling a lost peer last among them:
    # outcome.wrapped_peer_loss), then the ranks disttest stopped because of them.
    ordered = sorted(_alike(groups), key=lambda g: (not g[0][0].kind.is_cause, bool(g[0][0].wrapped)))
    # The header merges groups that read the same (ranks that all timed out).
    heads: dict[str, list[int]] = {}
    for g, _ in ordered:
        if g[0].kind.is_cause:
            heads.setdefault(_short(g[0], "{who}", timeout), []).extend(o.rank for o in g)
    summary = "; ".join(_fill(text, _who(sorted(ranks), world_size)) for text, ranks in heads.items())
    lines = [HEADER.format(test=test, verdict=verdict, summary=summary)]
    lines += injected_lines(outcomes)
    lines += left_running_lines(outcomes, world_size)
    sections = []
    for group, parts in ordered:
        who = _who([o.rank for o in group], world_size)
        first = group[0]
        if len(group) > 1:  # the rank's own name reads as the group's
            own = RANK.format(rank=first.rank, world=world_size)
            # (A deadlock's detail, and that of calls that differ, name each rank as itself.)
            named = first.kind is Kind.DEADLOCK or first.detail.endswith(_CALLS_DIFFER_AT_END)
            detail = first.detail if named else first.detail.replace(own, who)
            first = dataclasses.replace(first, message=first.message.replace(own, who), detail=detail)
        if len(parts) > 1:  # ranks that read alike but for their messages
            text = _messages(first, who, parts, world_size)
        else:
            text = _line(first, who, test, timeout)
        body = _body(first) if first.kind not in (Kind.DESYNC, Kind.DEADLOCK) else _stacks_of(group, world_size)
        sections.append((SECTION.format(who=who, kind=group[0].kind.value), f"{text}\n{body}" if body else text))
    return lines, sections


def raise_for_outcomes(test: str, world_size: int, timeout: float | None,
                       outcomes: Sequence[Outcome], always_failure: bool = False,
                       keep_logs: Callable[[str], str] | None = None,
                       where: Callable[..., Any] | None = None) -> None:
    """Raise the unittest outcome of ``outcomes`` (:func:`~.verdict.judge`);
    return if all passed."""
    raise_for(judge(outcomes, always_failure), test, world_size, timeout, keep_logs, where)


def raise_for(verdict: Verdict, test: str, world_size: int, timeout: float | None,
              keep_logs: Callable[[str], str] | None = None,
              where: Callable[..., Any] | None = None) -> None:
    """Raise ``verdict`` to unittest: SkipTest, :class:`RankFailure` or
    :class:`RankError` with the report; return if the test passed.
    ``keep_logs(test)`` keeps the ranks' whole logs (DISTTEST_KEEP_LOGS)
    and returns their folder, which the report names.

    The exception's traceback is the user's, never disttest's: the failing
    rank's own frames, else the frames of its stack (a rank that hung,
    crashed or was left waiting), else the test method ``where``."""
    if verdict.status is Status.SKIPPED:
        raise unittest.SkipTest(verdict.reason)
    if verdict.status is Status.PASSED:
        left = left_running_lines(verdict.outcomes, world_size)
        if left:
            warn_at(where, f"{test!r} (disttest): " + "; ".join(left))
        return
    failed = verdict.status is Status.FAILED
    causes = [o for o in verdict.outcomes if o.kind.is_cause]
    xfailed = sys.modules.get("_pytest.outcomes")
    if failed and causes and all(o.exc_type == "XFailed" for o in causes) and xfailed is not None:
        # pytest.xfail() in the ranks that failed: pytest's xfail, as in one process.
        raise xfailed.XFailed(causes[0].message) from None
    cls: type[RankReport] = RankFailure if failed else RankError
    outcomes = verdict.outcomes
    head, sections = report_parts(test, world_size, timeout, outcomes, verdict.status.value)
    message = "\n".join(head) + _details(sections)
    if keep_logs is not None and settings.keep_logs():
        message += "\n\n" + LOGS_KEPT.format(folder=keep_logs(test))
    report = cls(message, test, world_size, timeout, outcomes, sections)
    # NB: from None: what was being handled when the verdict came (a join
    # loop's own exception) is disttest's, not the test's.
    raise report.with_traceback(user_traceback(outcomes, where)) from None


def user_traceback(outcomes: Sequence[Outcome], where: Callable[..., Any] | None = None) -> TracebackType | None:
    """The traceback a report is raised with, rebuilt from the user's frames
    only, so that pytest and unittest (which hide frames of modules that set
    ``__unittest``) show the user's lines: the first failing rank's own
    traceback; else, for a rank with no exception (it hung, crashed, or
    waited in a collective its peer never entered), the user's frames of its
    stack; else the test method ``where``; else None."""
    causes = sorted((o for o in outcomes if o.kind.is_cause), key=lambda o: bool(o.wrapped))
    data = next((o.tb_data for o in causes if o.tb_data), None)
    if data is None:
        data = next(filter(None, (_stack_tb_data(o.stacks) for o in causes if o.stacks)), None)
    if data is None and where is not None:
        data = _code_tb_data(where)
    if data is None:
        return None
    try:
        return as_traceback(data)
    except Exception:  # noqa: BLE001 (the message has the text anyway)
        return None


_STACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<name>\S+)')


def _frame_data(filename: str, lineno: int, name: str, tb_next: dict[str, Any] | None) -> dict[str, Any]:
    return {"tb_frame": {"f_code": {"co_filename": filename, "co_name": name},
                         "f_globals": {"__file__": filename, "__name__": "__rank__"}, "f_lineno": lineno},
            "tb_lineno": lineno, "tb_next": tb_next}


def _stack_tb_data(stacks: str) -> dict[str, Any] | None:
    """The user's frames of a rank's stack dump (faulthandler's layout, most
    recent call first) as tblib data (no columns): one thread's, the current one first."""
    blocks: list[list[re.Match[str]]] = []
    current = -1
    for line in user_stack(stacks).splitlines():
        match = _STACK_FRAME.match(line)
        if match is None:
            blocks.append([])
            if line.startswith("Current thread "):
                current = len(blocks) - 1
            continue
        if not blocks:
            blocks.append([])
        blocks[-1].append(match)
    frames = blocks[current] if current >= 0 and blocks[current] else next((b for b in blocks if b), [])
    data: dict[str, Any] | None = None
    for m in frames:  # innermost first: each wraps the one after it
        data = _frame_data(m["file"], int(m["line"]), m["name"], data)
    return data


def _code_tb_data(where: Callable[..., Any]) -> dict[str, Any] | None:
    """The definition of the test method ``where`` as one frame."""
    code = getattr(inspect.unwrap(where), "__code__", None)
    if code is None or code.co_filename.startswith(_OWN):
        return None
    return _frame_data(code.co_filename, code.co_firstlineno, code.co_name, None)


def injected_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """The report's lines about what disttest injected (empty if nothing)."""
    fired: list[str] = []
    never: list[str] = []
    seeds: list[str] = []
    most = (0.0, -1)  # (seconds of schedule-fuzzing delays, rank)
    for o in outcomes:
        for text in getattr(o, "faults_fired", ()) or ():
            if text.startswith(DELAYED_MARK):
                most = max(most, (float(text[len(DELAYED_MARK):]), o.rank))
            elif text.startswith(CHAOS_MARK):
                if text not in seeds:
                    seeds.append(text)
            elif text.startswith(NEVER_MARK):
                never.append(text)
            else:
                fired.append(text)
    lines = []
    if fired:
        lines.append(INJECTED.format(faults="; ".join(fired)))
    lines += never
    delayed = (CHAOS_DELAYED.format(seconds=most[0], who=f"rank {most[1]}/{len(outcomes)}")
               if most[0] >= 0.1 else "")
    for text in seeds:
        lines.append(CHAOS.format(setting=text[len(CHAOS_MARK):]) + delayed)
    return lines
