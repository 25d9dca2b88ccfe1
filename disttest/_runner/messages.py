"""The messages of the rank channel and of the fork server, and their one decoder.

Every process of a run talks to the test process in these typed messages,
over ``multiprocessing.connection`` framing (length-prefixed pickles): a rank
over its channel (:mod:`.channel`), the fork server over its pipes
(:mod:`.zygote`). A receiver hands each message to :func:`deliver`, which
calls the handler's ``on_<message name>`` method (as pytest-xdist's
controller dispatches each worker event to one handler). Standard library
only: ranks and the fork server import it.

A rank's conversation (a fresh-process test is a pool of one test)::

    rank -> parent   Hello(rank, token)          first, on connecting
    rank -> parent   Ready(rank, failure)        the class's group is made (pool) or not needed
    parent -> rank   Run(seq, test)              run a test (a fresh-process rank runs
                                                 its one test, seq 1, unasked)
    rank -> parent   Done(seq, outcome)          its outcome (phase, traceback, output tail...)
    parent -> rank   Leave()                     every rank has reported (or the pool closes)

Three facts do not travel as messages, on purpose: a rank's stacks
(faulthandler writes them from a signal handler, which works while the rank
is blocked inside C++, where no Python code of ours could answer), its
collective progress (a shared-memory board, :mod:`.board`: a message per
collective would cost a system call each, and the parent needs only the
latest state), and its output (file descriptors 1 and 2 go to a file, which
also catches what C++ code and child processes write).

The fork server's::

    server -> parent ServerReady(pid)
    parent -> server Start(run, spec)            fork the ranks of run ``run``
    server -> parent Started(run, pids) | StartFailed(run, text) | ForkUnsafe(run, reason)
    server -> parent Exited(run, rank, wait_status)   per rank, when reaped
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

__unittest = True

__all__ = [
    "Done", "Exited", "ForkUnsafe", "Hello", "Leave", "Ready", "Run", "ServerReady", "Start",
    "StartFailed", "Started", "UNSAFE_CUDA", "UNSAFE_KINDS", "UNSAFE_THREADS", "UNSAFE_THREADS_EARLIER", "deliver",
    "send",
]


@dataclass(frozen=True)
class Hello:
    """A rank's first message on its channel: who it is, and the run's token
    (a stray local connection does not know it)."""

    rank: int
    token: str


@dataclass(frozen=True)
class Ready:
    """The rank is ready for tests: a pool worker has made the class's group
    (or ``failure`` says why not)."""

    rank: int
    #: The outcome of making the class's group when that failed or skipped, else None.
    failure: Any = None


@dataclass(frozen=True)
class Run:
    """Run ``test`` (a test method's name); ``seq`` numbers it in the run."""

    seq: int
    test: str
    #: Show each frame's locals in the test's tracebacks (its unittest result asked: ``--locals``).
    tb_locals: bool = False


@dataclass(frozen=True)
class Done:
    """The rank's outcome of test ``seq``."""

    seq: int
    #: An ``outcome.Outcome``: kind, phase, traceback, stacks, output's end.
    outcome: Any


@dataclass(frozen=True)
class Leave:
    """Leave now: every rank has answered (a fresh-process test), or the pool
    closes."""


@dataclass(frozen=True)
class ServerReady:
    """The fork server has imported torch and waits for work."""

    pid: int


@dataclass(frozen=True)
class Start:
    """Fork the ranks of run ``run`` (``spec``: a ``rank.RankSpec``, which
    names the test's module and class, imported by the server once)."""

    run: int
    spec: Any


@dataclass(frozen=True)
class Started:
    """The ranks of run ``run`` are forked: ``{rank: pid}``."""

    run: int
    pids: dict[int, int]


@dataclass(frozen=True)
class StartFailed:
    """The fork server could not load the test's class (``text``: the
    traceback); no rank was forked."""

    run: int
    text: str


#: Why a fork server will not fork a test's ranks (:class:`ForkUnsafe`'s kind):
#: they could not use CUDA; they would hang in OpenMP (threads the import of
#: the test's module started); the same, threads started before that import.
UNSAFE_CUDA, UNSAFE_THREADS, UNSAFE_THREADS_EARLIER = "cuda", "threads", "threads-earlier"
UNSAFE_KINDS = (UNSAFE_CUDA, UNSAFE_THREADS, UNSAFE_THREADS_EARLIER)


@dataclass(frozen=True)
class ForkUnsafe:
    """The fork server will not fork the ranks of run ``run``, and forks no
    more: ``kind`` ``"cuda"``, its ranks could not use CUDA (importing the
    test's module initialised CUDA in the server); ``"threads"``, ranks that
    keep OpenMP's threads would hang (the import started threads in it);
    ``"threads-earlier"``, the same, the threads started before this import
    (the client asks a fresh server instead). ``reason`` says which, for the
    warning (:data:`UNSAFE_KINDS`)."""

    run: int
    reason: str
    kind: str = UNSAFE_CUDA


@dataclass(frozen=True)
class Exited:
    """A rank of run ``run`` ended; ``wait_status`` as ``os.waitpid`` gives it."""

    run: int
    rank: int
    wait_status: int


_HANDLERS: dict[type, str] = {cls: f"on_{cls.__name__.lower()}" for cls in
             (Hello, Ready, Run, Done, Leave, ServerReady, Start, Started, StartFailed, ForkUnsafe,
              Exited)}


def send(conn: Any, message: object) -> None:
    """Send ``message`` on ``conn`` (a ``multiprocessing`` connection) in the
    frame ``conn.send`` writes and ``conn.recv`` reads: a plain pickle, not
    ``conn.send``'s pickler, which copies its dispatch table for every
    message (half a small message's cost; no message holds a socket or a
    file descriptor)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def deliver(message: object, handler: object, *args: Any) -> bool:
    """Call ``handler.on_<name>(message, *args)`` for a known message that
    the handler handles; False for anything else (a stray or foreign
    message is dropped, never trusted)."""
    name = _HANDLERS.get(type(message))
    method = getattr(handler, name, None) if name else None
    if method is None:
        return False
    method(message, *args)
    return True
