"""Fault injection and schedule fuzzing: declared faults, as data.

``@disttest.inject_fault(rank=1, action="kill", at="all_reduce", nth=3)``
declares that rank 1 dies as it enters its third ``all_reduce`` of the test.
Declarations are plain data (:class:`Fault`) attached to the test method
(wrapped in a check that a runner found them); nothing is installed at
import or by the decorator. Inside a rank, the
collective-tracking wrapper asks :mod:`disttest.faults.rank` what to do as
the rank enters each collective; in the parent, :mod:`disttest.faults.judge`
judges the outcomes (an injected death is expected; an unfired fault is an
error) and names the injected faults in the report apart from the causes.

Whole-suite faults: ``DISTTEST_FAULT="rank=1,action=kill,at=all_reduce,nth=3"``
(several separated by ``;``; ranks as ``rank=0|2``) applies to every test,
acting where the test has the rank and reaches the call.
Schedule fuzzing: ``DISTTEST_CHAOS=<seed>`` delays each collective of each
rank by a small seeded random amount.

Depends only on the standard library and :mod:`disttest.config`.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from disttest._ops import COLLECTIVES, P2P_OPS
from disttest._typing import F as _F
from disttest.config import ConfigError, as_number

__unittest = True

__all__ = [
    "ACTIONS",
    "CHAOS_ENV",
    "DEATHS",
    "FAULT_ENV",
    "FAULT_OPTION",
    "FAULT_OPTION_ENV",
    "HIDDEN",
    "NOT_IN_A_RANK",
    "OPS",
    "Fault",
    "InjectedFault",
    "chaos_seed",
    "declared_faults",
    "env_faults",
    "inject_fault",
    "make_fault",
    "parse_fault_spec",
    "parse_seed",
    "test_faults",
]

#: The environment variable of the whole-suite faults (:func:`~disttest.faults.env_faults`).
FAULT_ENV = "DISTTEST_FAULT"
#: The pytest option of the whole-suite faults: it sets ``FAULT_ENV`` (which
#: every rank reads) and ``FAULT_OPTION_ENV`` to the same spec.
FAULT_OPTION = "--disttest-fault"
#: Holds the spec ``FAULT_OPTION`` gave, so that its faults are said to come
#: from the option, not from the variable it set.
FAULT_OPTION_ENV = "DISTTEST_FAULT_FROM_OPTION"
#: The environment variable of the schedule-fuzzing seed (:func:`~disttest.faults.chaos_seed`).
CHAOS_ENV = "DISTTEST_CHAOS"
DECORATOR = "@inject_fault"
#: Why ``@inject_fault`` on a class is refused.
ON_A_CLASS = ("it decorates test methods, not classes: put it on each test method that "
              "should see the fault (for every test of a suite, use DISTTEST_FAULT)")
#: Why a fault that gives one field twice is refused (which one would win is a guess).
TWICE = "{key}= is given twice; a fault has one of each field (separate faults with ';')"
#: A spec that declares no fault (``--disttest-fault=``, ``DISTTEST_FAULT=";"``).
NO_FAULT = "declares no fault; expected rank=R,action=A[,at=OP,nth=N,...] (separate faults with ';')"
#: Why a second fault on a call another fault (not a delay) acts on is refused.
SAME_CALL = ("{first} acts on the same call; only delays can share a call with another fault "
             "(a kill, exit, raise or hang ends the call, and a second corrupt would undo the first)")
#: Why a fault in a rank no disttest runner started (``run_rank`` under
#: torchrun, srun, mpirun) is refused: nothing would judge or report it.
UNJUDGED = ("this rank was started by an external launcher (run_rank), where no disttest parent reads "
            "which faults fired: a death could not be told from a crash, nor an unfired fault found; "
            "run the test under disttest's runners to inject faults")
#: What a fault does to its rank, as ``action=`` spells it.
ACTIONS = ("kill", "exit", "raise", "hang", "delay", "corrupt")
#: The actions that end their rank.
DEATHS = ("kill", "exit")
#: Collectives a fault can be declared at, as ``torch.distributed`` spells them.
OPS = (*COLLECTIVES, *P2P_OPS)
ANY = "any"
#: The longest ``delay`` (seconds): a day; ``hang`` blocks for good.
MAX_DELAY = 86400
#: Ops that receive no tensor values: nothing there to corrupt.
NO_VALUES = ("barrier", "monitored_barrier", "send", "isend", "all_gather_object", "broadcast_object_list",
             "gather_object", "scatter_object_list")
#: Why a corrupt fault that landed where the rank received no tensor values
#: (at="any" on a barrier, a gather's non-destination rank) is an error.
CANNOT_CORRUPT = ("it landed on {op} #{nth}, which gave rank {rank} no tensor values to corrupt; "
                  "declare it at= a collective that does, or with a different nth=")
_ATTR = "__disttest_faults__"
#: Marks a function that starts ranks itself (``spawn_threads_and_init_comms``'s
#: wrapper): a fault declared above it is read by it, not checked at its call.
SPAWNS = "__disttest_spawns__"
#: Why a test method whose faults no runner found is refused when it runs.
NOT_IN_A_RANK = ("the test runs outside disttest's ranks (a plain unittest.TestCase or pytest function, or a "
                 "SimulatedTestCase, whose ranks are one thread), "
                 "where no fault can act; declare faults on tests of MultiProcessTestCase, "
                 "MultiThreadedTestCase, MultiProcContinousTest, spawn_threads_and_init_comms or a "
                 "@pytest.mark.world_size function")
#: Why a test method whose faults a decorator hid from the runner is refused when it runs.
HIDDEN = ("disttest's runner did not see it: a decorator above @inject_fault hides it (give that "
          "decorator functools.wraps, or put @inject_fault above it)")
#: The faults the runner found for the test this thread runs as a rank
#: (set by :func:`disttest.faults.rank.armed`); unset outside a rank.
_running = threading.local()


class InjectedFault(RuntimeError):
    """Raised inside a rank by an injected ``action="raise"`` fault, in place
    of the collective (which is not called). Fields: ``rank``, ``op``, ``nth``."""

    def __init__(self, message: str, rank: int, op: str, nth: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.op = op
        self.nth = nth

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0], self.rank, self.op, self.nth))


InjectedFault.__module__ = "disttest"

_VERBS = {"kill": "killed", "exit": "exited", "raise": "raised InjectedFault", "hang": "hung",
          "delay": "delayed {seconds}s", "corrupt": "corrupted its received values"}


@dataclass(frozen=True)
class Fault:
    """One declared fault: ``action`` on each of ``ranks`` at the ``nth``
    call of ``at`` (or of any collective) within the test."""

    ranks: tuple[int, ...]
    action: str
    at: str = ANY
    nth: int = 1
    seconds: float | None = None
    where: str = DECORATOR
    #: A death (kill, exit) that may end the test: when every rank dies by
    #: such faults the test passes (else that is an error: nothing was checked).
    ends_test: bool = False

    @property
    def suite_wide(self) -> bool:
        """Declared for every test (``DISTTEST_FAULT``), not on this one: it
        acts where a test reaches its call and its rank exists."""
        return self.where in (FAULT_ENV, FAULT_OPTION)

    def describe(self, rank: int | None = None) -> str:
        """``rank 1 kill at all_reduce #3 (from @inject_fault)``."""
        return f"{self.what(rank)} (from {self.where})"

    def what(self, rank: int | None = None) -> str:
        """``rank 1 kill at all_reduce #3``."""
        who = f"rank {rank}" if rank is not None else (
            "rank " + "|".join(map(str, self.ranks)))
        action = self.action + (f" {self.seconds}s" if self.seconds is not None else "")
        ends = ", ends the test" if self.ends_test else ""
        return f"{who} {action} at {self.at_text()}{ends}"

    def at_text(self) -> str:
        return f"{self.at} #{self.nth}" if self.at != ANY else f"collective #{self.nth}"

    def fired_text(self, rank: int, op: str, nth: int) -> str:
        """``rank 1 killed at all_reduce #3``: what the report says."""
        verb = _VERBS[self.action].format(seconds=self.seconds)
        return f"rank {rank} {verb} at {op} #{nth}"


def _ranks(value: object, where: str) -> tuple[int, ...]:
    bad = ConfigError("fault rank", value, where, "expected a rank (an int >= 0) or a list of them")
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise bad
    ranks = []
    for item in items:
        # An int, or (from a spec) its digits: not 1.0, "-0" or "1_0".
        if isinstance(item, str) and item.strip().isascii() and item.strip().isdigit():
            item = int(item)
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise bad
        ranks.append(item)
    return tuple(sorted(set(ranks)))


def _flag(value: object, where: str) -> bool:
    """``ends_test``: a bool, or from a spec (text) 1/0, true/false, yes/no."""
    if isinstance(value, bool):
        return value
    # (a string in code, "no", is a mistake a bool() would read as True)
    text = str(value).strip().lower() if isinstance(value, str) and where != DECORATOR else None
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ConfigError("fault ends_test", value, where, "expected True or False (in a spec: 1 or 0)")


def make_fault(*, rank: object, action: object, at: object = ANY, nth: object = 1,
               seconds: object = None, where: str = DECORATOR, ends_test: object = False) -> Fault:
    """A validated :class:`Fault`; a bad value raises ``ConfigError`` naming
    it and ``where`` it came from."""
    ranks = _ranks(rank, where)
    if action not in ACTIONS:
        raise ConfigError("fault action", action, where, f"expected one of {', '.join(ACTIONS)}")
    assert isinstance(action, str)
    if at != ANY and at not in OPS:
        raise ConfigError("fault collective", at, where,
                          f"expected 'any' or a torch.distributed collective: {', '.join(OPS)}")
    assert isinstance(at, str)
    if isinstance(nth, str) and nth.strip().isascii() and nth.strip().isdigit():  # a spec; not "1_0"
        nth = int(nth)
    if isinstance(nth, bool) or not isinstance(nth, int):
        raise ConfigError("fault nth", nth, where, "expected a call number >= 1")
    count = nth
    if count < 1:
        raise ConfigError("fault nth", nth, where, "expected a call number >= 1")
    secs: float | None = None
    if action == "delay":
        bad = ConfigError("fault seconds", seconds, where,
                          f"a delay needs seconds=, a positive number up to {MAX_DELAY:g} (action 'hang' blocks for good)")
        if isinstance(seconds, str) and where == DECORATOR:
            raise bad  # (a number in code, as a class's timeout; text only from a spec)
        secs = as_number(float, seconds, bad)  # NB: float(None) is a TypeError: no seconds is bad too
        if not math.isfinite(secs) or not 0 < secs <= MAX_DELAY:
            raise bad  # (1e300 passed, and the rank died in time.sleep's OverflowError)
    elif seconds is not None:
        raise ConfigError("fault seconds", seconds, where, f"only action 'delay' takes seconds, not {action!r}")
    if action == "corrupt" and at in NO_VALUES:
        raise ConfigError("fault collective", at, where, f"{at} receives no tensor values to corrupt")
    ends = _flag(ends_test, where)
    if ends and action not in DEATHS:
        raise ConfigError("fault ends_test", ends_test, where,
                          f"only a death ({' or '.join(DEATHS)}) can end the test, not {action!r}")
    return Fault(ranks, action, at, count, secs, where, ends)


def inject_fault(*, rank: int | Sequence[int], action: str, at: str = ANY, nth: int = 1,
                 seconds: float | None = None, ends_test: bool = False) -> Callable[[_F], _F]:
    """Decorator: inject a fault into a distributed test (stackable).

    Works on test methods of ``MultiProcessTestCase``, ``MultiThreadedTestCase``
    and ``MultiProcContinousTest``. In each rank of ``rank`` (an int or a
    list), at its ``nth`` call (1-based, counted per test) of collective
    ``at`` (``"any"``: of any collective), the fault fires as the rank
    enters the call:

    - ``kill``: the rank dies by SIGKILL (threads: the rank thread ends and
      every collective of a group that has it fails at once, as a gloo group
      breaks when a peer process dies; groups without it go on);
    - ``exit``: ``os._exit(1)`` (threads: as ``kill``);
    - ``raise``: :class:`InjectedFault` is raised; the collective is not called;
    - ``hang``: the rank blocks there (the test's timeout reports it, with stacks);
    - ``delay``: the rank sleeps ``seconds`` first;
    - ``corrupt``: the collective completes, then every element the rank
      received has its bits inverted (bitwise not; bool: logical not), so
      every element changes (a float may become NaN); an asynchronous
      call's values change when the test waits for them.

    The parent expects an injected death: the test passes when every other
    rank passes. When every rank dies by injected faults, nothing of the
    test was checked: an error, unless each of those deaths says
    ``ends_test=True``. A declared fault that never fires is an error of the
    test, and so is a ``corrupt`` that lands where the rank received no
    tensor values; two faults on one call of one rank (other than delays)
    are refused, and so is a rank outside the test's world. The method is
    wrapped in a check: run where no runner found its faults (outside
    disttest's ranks, or under a decorator without ``functools.wraps``), it
    raises ``ConfigError`` instead of running without them. Nothing is
    installed in torch; a bad value raises ``ConfigError``.
    """
    fault = make_fault(rank=rank, action=action, at=at, nth=nth, seconds=seconds, where=DECORATOR,
                       ends_test=ends_test)

    def decorate(func: _F) -> _F:
        if isinstance(func, type):
            # A fault on the class would be read by no test: refused, never dropped.
            raise ConfigError("fault target", func.__qualname__, DECORATOR, ON_A_CLASS)
        # Outermost decorator last in the source order: keep source order.
        existing = list(getattr(func, _ATTR, ()))
        if getattr(func, _CHECKED, False) or getattr(func, SPAWNS, False) or inspect.iscoroutinefunction(func):
            setattr(func, _ATTR, (fault, *existing))
            return func
        checked = _checked(func)
        setattr(checked, _ATTR, (fault, *existing))
        return cast(_F, checked)

    return decorate


_CHECKED = "__disttest_fault_checked__"


def _checked(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, refusing to run where no runner found its faults: outside
    disttest's ranks, or under a decorator that hid them (a declared fault
    acts or is refused, never dropped)."""

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        faults: tuple[Fault, ...] = getattr(checked, _ATTR)
        seen = getattr(_running, "faults", None)
        if seen is None or not any(f in seen for f in faults):
            raise ConfigError("fault", faults[0].what(), DECORATOR, NOT_IN_A_RANK if seen is None else HIDDEN)
        return func(*args, **kwargs)

    setattr(checked, _CHECKED, True)
    return checked


def declared_faults(method: object) -> tuple[Fault, ...]:
    """The faults declared on a test method (function or bound method), also
    under other decorators (``functools.wraps`` chains, outermost first)."""
    func: object = getattr(method, "__func__", method)
    for _ in range(100):  # a chain, bounded (a cycle of __wrapped__ is not ours to follow)
        faults = getattr(func, _ATTR, None)
        if faults is not None:
            return tuple(faults)
        func = getattr(func, "__wrapped__", None)
        if func is None:
            break
    return ()


_SPEC_KEYS = ("rank", "action", "at", "nth", "seconds", "ends_test")


def parse_fault_spec(text: str, where: str = FAULT_ENV) -> tuple[Fault, ...]:
    """Faults from ``"rank=1,action=kill,at=all_reduce,nth=3"`` (several
    separated by ``;``; several ranks as ``rank=0|2``); a spec that declares
    none is a :class:`~disttest.ConfigError`."""
    faults = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        fields: dict[str, Any] = {}
        for item in part.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in _SPEC_KEYS:
                raise ConfigError("fault field", item.strip(), where,
                                  f"expected key=value with a key of {', '.join(_SPEC_KEYS)}")
            if key in fields:
                raise ConfigError("fault", part, where, TWICE.format(key=key))
            fields[key] = value.strip()
        for required in ("rank", "action"):
            if required not in fields:
                raise ConfigError("fault", part, where, f"missing {required}=")
        rank_text = fields.pop("rank")
        ranks = rank_text.split("|") if "|" in rank_text else rank_text
        faults.append(make_fault(rank=ranks, where=where, **fields))
    if not faults:  # (an empty DISTTEST_FAULT is unset: env_faults asks no spec)
        raise ConfigError("fault", text, where, NO_FAULT)
    return tuple(faults)


def env_faults(environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    """The whole-suite faults of ``DISTTEST_FAULT`` (none if unset), said to
    come from ``--disttest-fault`` where that option set them."""
    environ = os.environ if environ is None else environ
    text = environ.get(FAULT_ENV, "")
    if not text.strip():
        return ()
    return parse_fault_spec(text, FAULT_OPTION if environ.get(FAULT_OPTION_ENV) == text else FAULT_ENV)


def chaos_seed(environ: Mapping[str, str] | None = None) -> int | None:
    """The schedule-fuzzing seed of ``DISTTEST_CHAOS`` (None if unset)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CHAOS_ENV, "").strip()
    if not text:
        return None
    return parse_seed(text, CHAOS_ENV)


def parse_seed(value: object, where: str) -> int:
    """``value`` as a schedule-fuzzing seed (``DISTTEST_CHAOS``,
    ``--disttest-chaos``): a non-negative integer, else
    :class:`~disttest.ConfigError` naming the value and ``where`` it came
    from."""
    bad = ConfigError("chaos seed", value, where, "expected a seed, an int >= 0")
    seed = as_number(int, value, bad)
    if seed < 0:
        raise bad
    return seed


def test_faults(method: object, environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    """Every fault of one test: declared on it, then ``DISTTEST_FAULT``'s.
    Rank side and parent number them alike (the index names a fault).
    Faults that would land on one call of one rank, where the first leaves
    the second nothing to act on, raise ``ConfigError`` naming both."""
    faults = declared_faults(method) + env_faults(environ)
    _check_same_call(faults)
    return faults


def _check_same_call(faults: Sequence[Fault]) -> None:
    """Refuse two faults on one call of one rank unless all but one are delays."""
    seen: dict[tuple[int, str, int], Fault] = {}
    for fault in faults:
        if fault.action == "delay":
            continue
        for rank in fault.ranks:
            first = seen.setdefault((rank, fault.at, fault.nth), fault)
            if first is not fault:
                raise ConfigError("fault", fault.what(rank), fault.where,
                                  SAME_CALL.format(first=first.describe(rank)))


test_faults.__test__ = False  # type: ignore[attr-defined]
