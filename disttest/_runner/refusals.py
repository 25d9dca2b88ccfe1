"""Which errors of a ``torch.distributed`` call are a refusal: torch or its
backend refusing the call on this rank before it communicated (an argument
error raised as the call was enqueued). Such an error is the rank's own, not
the consequence of a peer that skipped or failed, nor a desync: the rank's
tracker leaves it uncounted (:mod:`~disttest._runner.tracking`) and the
exception is marked, so that :func:`~disttest._runner.outcome.comm_site`
calls it the test's own error.
"""

from __future__ import annotations

import functools
import re

from disttest._ops import RENDEZVOUS_OPS
from disttest._runner.verdict import PEER_LOST
from disttest.pg._local import REFUSED_MARK as _REFUSED_MARK

__unittest = True

__all__ = ["REFUSED_MARK", "mark_refused", "refused", "refused_by_torch"]

#: Calls that communicate inside the call itself, with no Work to wait on
#: (an error before a wait is not a refusal there).
_NO_WAIT = {"monitored_barrier", *RENDEZVOUS_OPS}
#: Errors that are never a refusal, wherever raised: NCCL's (it may set up
#: its communicator with the peers as the call is enqueued), and what
#: verdict.PEER_LOST says (a peer went away, a wait ran out).
_NEVER_REFUSED = re.compile(r"nccl|network|connect|remote|socket", re.IGNORECASE)
#: Set on an exception a call of torch.distributed raised before it
#: communicated: the test's own error (see outcome.comm_site), not a peer's
#: (one name with disttest's groups, which mark their own refusals).
REFUSED_MARK = _REFUSED_MARK


def refused(error: BaseException, op: str, reached_wait: bool) -> bool:
    """Whether ``error``, raised by a call of ``op``, is torch or its backend
    refusing the call before it communicated: c10d's checks of its
    arguments (a ``TypeError`` or ``ValueError``), another Python error of
    torch's before the call's wait (pickling an object that cannot be), or
    a backend's (``ProcessGroupGloo::broadcast: invalid root rank: 5``, a
    ``RuntimeError`` raised as the call was enqueued, before its wait)."""
    if getattr(error, REFUSED_MARK, False):  # (refused by disttest's own group as it was called)
        return True
    if not refused_by_torch(error):
        return False
    if isinstance(error, (TypeError, ValueError)):
        return True
    if reached_wait or op in _NO_WAIT:
        return False
    if not isinstance(error, (RuntimeError, OSError)):
        # A Python error of torch's own code before the call communicated:
        # an object collective pickling what cannot be pickled
        # (AttributeError, PicklingError), an assertion.
        return True
    if not isinstance(error, RuntimeError):
        return False
    # (c10d raises its backends' communication errors as DistError and its subclasses)
    if any(c.__name__ in ("DistError", "DistBackendError", "DistNetworkError") for c in type(error).__mro__):
        return False
    text = str(error)
    return not (PEER_LOST.search(text) or _NEVER_REFUSED.search(text))


def mark_refused(error: BaseException) -> None:
    """Note on ``error`` that its call was refused (:data:`REFUSED_MARK`)."""
    try:
        setattr(error, REFUSED_MARK, True)
    except Exception:  # noqa: BLE001,S110 (an exception that takes no attribute stays unmarked)
        pass


def refused_by_torch(error: BaseException) -> bool:
    """Whether ``error`` was raised where torch checks a call's arguments
    (its innermost frame is in torch's own package: c10d's Python checks,
    or a C++ check surfacing at the call), not by a backend written in
    Python (the threaded group, a user's), which may have begun the
    collective with its peers before it raised."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_torch_dir())


@functools.cache
def _torch_dir() -> str:
    import os

    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
