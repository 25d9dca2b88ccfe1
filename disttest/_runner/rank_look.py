"""What makes a rank process look like a rank of upstream's harness.

Upstream's ranks are processes that ``multiprocessing``'s spawn start method
made: a fresh interpreter with the parent's ``sys.argv``, the signal
handlers Python starts with, ``spawn`` as the start method of what they
start, and the backends that importing torch's test helpers registers
(``fake`` and ``threaded``). disttest's rank processes are forked from the
fork server or the test process, which have handlers and an ``argv`` of
their own; :func:`prepare_process` puts upstream's back, inside the rank,
right after it starts (never in the parent, never at import). The audit of
every difference, and why the others are kept, is in
``docs/explanation/design.rst`` ("What a rank looks like").

Self-contained: the standard library, torch and the process groups only.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import sys
import warnings
from typing import Any

from disttest import _compat

__unittest = True

__all__ = ["drop_runner_log_handlers", "prepare_process", "restore_signals", "show_warnings"]

_RUNNER_LOGGING = "_pytest."

#: Signals a fresh interpreter does not leave at SIG_DFL (Python's own choices).
_FRESH: dict[str, Any] = {"SIGINT": signal.default_int_handler, "SIGPIPE": signal.SIG_IGN, "SIGXFSZ": signal.SIG_IGN}


def restore_signals() -> None:
    """Give every signal the handler a fresh interpreter has: the process
    that forked this one may have its own (the fork server's SIGTERM ends
    it with status 0; the test process's cleanup handlers are its own). A
    handler installed outside Python (``getsignal`` says None) is left."""
    fresh = {getattr(signal, name): h for name, h in _FRESH.items() if hasattr(signal, name)}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            current = signal.getsignal(sig)
        except ValueError:
            continue
        want = fresh.get(sig, signal.SIG_DFL)
        if current is not None and current != want:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, want)


def prepare_process(argv: list[str]) -> None:
    """In a new rank process (fresh or pooled), after :func:`restore_signals`:
    upstream's ``argv`` (the test process's), start method and backends."""
    sys.argv[:] = argv
    # Upstream's ranks are spawned and spawn what they start; a fork of a
    # process that ran tensor work can hang at its first parallel op.
    multiprocessing.set_start_method("spawn", force=True)
    # Registered by upstream's helpers when imported, so listed in its ranks
    # (for the rank's life: it is the test's process). A "threaded" group
    # still needs a thread world (MultiThreadedTestCase, _install_threaded_pg).
    _compat.install_fake_backend()
    from disttest.pg import threaded

    threaded.register_for_process()
    drop_runner_log_handlers()
    show_warnings()


def show_warnings() -> None:
    """Print warnings to stderr (the rank's output), as a fresh interpreter
    does: a rank forked while the test process records them (pytest's
    ``catch_warnings(record=True)`` around each test) would append them to
    its copy of the list, which nobody reads. The filters stay the test
    process's (pytest's ``filterwarnings`` apply to the test's code)."""
    recording = getattr(getattr(warnings, "_showwarnmsg_impl", None), "__module__", "warnings") != "warnings"
    if recording and warnings.showwarning is warnings._showwarning_orig:  # type: ignore[attr-defined]
        warnings.showwarning = _print_warning


def _print_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   file: Any = None, line: str | None = None) -> None:
    stream = sys.stderr if file is None else file
    with contextlib.suppress(OSError, AttributeError):
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))


def drop_runner_log_handlers() -> None:
    """Take the handlers of pytest's logging plugin off the root logger and
    off every logger that does not propagate (pytest attaches them there
    too, c10d's logger among them): a rank forked from the test process
    would log into its copy of pytest's capture, which nobody reads,
    instead of to its output (what a fresh interpreter's ``logging`` does),
    and a test that counts a logger's handlers would count pytest's.
    Handlers the test's code made stay."""
    loggers = [logging.getLogger(), *(lg for lg in list(logging.root.manager.loggerDict.values())
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            if type(handler).__module__.startswith(_RUNNER_LOGGING):
                logger.removeHandler(handler)
