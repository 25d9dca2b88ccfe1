"""The conformance tests as a mixin: one test method per case.

``CollectiveConformance`` has a ``test_<collective>__<variant>`` method for
every case of :mod:`~disttest.conformance.collectives` and
:mod:`~disttest.conformance.semantics`; each runs in every rank with the
default group already made (by the runner class it is mixed into), for any
backend.

Strict by default: a case counts as unsupported only when the backend
declares it (:attr:`CollectiveConformance.conformance_unsupported`, the
built-in table :data:`UNSUPPORTED`, or the CLI's ``--unsupported``), or when
this torch lacks the collective; any other error, "not supported" included,
is a failure. ``conformance_lenient = True`` restores the old rule: an error
that says "not supported" counts as unsupported.
"""

from __future__ import annotations

import contextlib
import re
import unittest
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from disttest.conformance import collectives, semantics  # noqa: F401 (they register the cases)
from disttest.conformance.cases import CASES, Case, Ctx, Declaration, torch_lacks
from disttest.support.skips import TestSkip

__unittest = True

__all__ = ["UNSUPPORTED", "CollectiveConformance", "Unsupported", "declaration_for"]

UNSUPPORTED_EXIT = 86  # a rank's skip code for "unsupported" (the parent decides most first)
#: A non-contiguous case: the backend wrote into the strided view's storage, then raised.
WROTE_THEN_RAISED = ("rank {rank}/{world}: the backend raised {error} after writing into the storage of a "
                     "non-contiguous view; a rejection must leave the tensor as it was")
#: A non-contiguous case: the backend raised an error that is not a rejection of the layout.
NOT_A_REJECTION = ("the backend raised {error} on a non-contiguous view; a rejection of a strided tensor must "
                   "say why (contiguous, strides, dense or layout), or the collective must compute it right")
NOT_DECLARED = ("{error} -- if {backend} lacks this by design, declare it: --unsupported {token} "
                "(or CONFORMANCE_UNSUPPORTED in the registering module)")

#: What the backends disttest knows lack by design, each with the reason
#: (measured on torch 2.13). Tokens as for ``--unsupported``.
UNSUPPORTED: dict[str, dict[str, str]] = {
    "gloo": {
        "PREMUL_SUM": "gloo: 'Cannot use ReduceOp.PREMUL_SUM with Gloo'",
        "splits_tensor": "c10d's C++ binding takes split sizes as list[int]; a tensor is a TypeError",
        "stacked": "gloo takes only the concatenated output form of all_gather_into_tensor",
        **{f"noncontiguous+{c}": "gloo KNOWN BUG: treats a strided view's storage as contiguous, "
                                 "wrong values and no error (send/recv reject it, which conforms)"
           for c in ("all_reduce", "broadcast", "reduce", "scatter", "reduce_scatter")},
    },
    # torch's FakeProcessGroup: one process's view of a world, for tracing and
    # sharding code; it completes every call at once and talks to nobody.
    "fake": {
        **{token: "fake completes every collective at once without communicating"
           for token in ("values", "barrier_waits", "missing_peer", "async_completion", "monitored_barrier")},
        **{token: "fake checks no arguments beyond what c10d's Python layer checks"
           for token in ("broadcast_src_out_of_range", "reduce_dst_out_of_range", "all_gather_list_too_long",
                         "all_gather_into_tensor_wrong_dtype", "scatter_list_too_long", "all_reduce_BAND_on_float")},
    },
    "threaded": {
        "monitored_barrier": "c10d implements monitored_barrier for gloo only",
    },
    # Measured on an H100 with torch 2.11.0+cu130, world size 1 (benchmarks/RESULTS.rst, "On a GPU").
    "nccl": {
        **{op: f"NCCL has no bitwise reduce ops: 'Cannot use ReduceOp.{op} with NCCL'"
           for op in ("BAND", "BOR", "BXOR")},
        "all_gather_coalesced": "'ProcessGroupNCCL does not support allgather_coalesced'",
        "monitored_barrier": "c10d implements monitored_barrier for gloo only",
        "splits_tensor": "c10d's C++ binding takes split sizes as list[int]; a tensor is a TypeError",
    },
    # gloo with CUDA tensors (--device cuda): on top of gloo's own row.
    "gloo/cuda": {
        "all_reduce_coalesced": "'ProcessGroupGloo::allreduce_coalesced: unsupported device type cuda'",
    },
}
#: What a backend's rejection of a strided view says (gloo's "input tensor
#: has to be contiguous", NCCL's "Tensors must be contiguous").
_LAYOUT_REJECTED = re.compile(r"contiguous|stride|dense|layout", re.I)
_NOT_SUPPORTED = re.compile(r"not supported|does not support|unsupported|cannot use|not implemented", re.I)


class Unsupported(unittest.SkipTest):
    """The backend lacks this case (a skip the report counts apart)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"unsupported: {what} ({why})")


def declaration_for(backend: str | None, extra: Declaration | None = None, device: str = "cpu") -> Declaration:
    """The built-in declaration of ``backend`` plus ``extra``; with tensors on
    a ``device`` other than the CPU, plus the table's ``backend/device`` row."""
    out = Declaration(UNSUPPORTED.get(backend or "", {}))
    kind = torch.device(device).type
    if kind != "cpu":
        out.extend(UNSUPPORTED.get(f"{backend}/{kind}", {}), "")
    if extra is not None:
        out.reasons.update(extra.reasons)
    return out


def _backend_of(test: Any) -> str | None:
    named = getattr(test, "conformance_backend", None)
    if named:
        return str(named)
    return str(dist.get_backend()) if dist.is_initialized() else None


def _world_of(test: Any) -> int | None:
    try:
        return int(test.world_size)
    except (AttributeError, TypeError, ValueError):
        return dist.get_world_size() if dist.is_initialized() else None


def _device_of(test: Any) -> str:
    return str(getattr(test, "conformance_device", None) or "cpu")


def _skip_for(test: Any, case: Case) -> TestSkip | None:
    lacks = torch_lacks(case)
    if lacks:
        return TestSkip(UNSUPPORTED_EXIT, f"unsupported: {lacks}")
    declared = declaration_for(_backend_of(test), getattr(test, "conformance_unsupported", None),
                               _device_of(test)).match(case)
    if declared:
        return TestSkip(UNSUPPORTED_EXIT, f"unsupported: {declared}")
    world = _world_of(test)
    if world is not None and world < case.min_world:
        return TestSkip(73, f"needs world size {case.min_world}, this run has {world}")
    return None


def _method(case: Case) -> Callable[..., None]:
    def check(args: Any) -> TestSkip | None:
        return _skip_for(args[0] if args else None, case)

    def test(self: Any) -> None:
        skip = check((self,))
        if skip is not None:
            raise unittest.SkipTest(skip.message)
        device = _device_of(self)
        ctx: Ctx | None = None
        try:
            # (a device context is thread-local: threaded ranks each get theirs)
            with warnings.catch_warnings(), (torch.device(device) if device != "cpu" else contextlib.nullcontext()):
                # torch 2.13 deprecates all_gather_into_tensor & co. in favour of *_single
                warnings.simplefilter("ignore", FutureWarning)
                ctx = Ctx()
                case.body(ctx)
        except AssertionError:
            raise
        except Exception as e:
            text = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            if "noncontiguous" in case.tags:
                # Rejecting a strided tensor is conforming, saying so and
                # leaving it as it was; an error of any other kind, or after
                # writing into it, is not (both passed).
                if ctx is not None and ctx.written_bases():
                    raise AssertionError(WROTE_THEN_RAISED.format(
                        rank=ctx.rank, world=ctx.world, error=f"{type(e).__name__}: {text}")) from e
                if not _LAYOUT_REJECTED.search(str(e)):
                    raise AssertionError(NOT_A_REJECTION.format(error=f"{type(e).__name__}: {text}")) from e
                return
            if getattr(self, "conformance_lenient", False) and _NOT_SUPPORTED.search(str(e)):
                raise Unsupported(case.name, text) from None
            if _NOT_SUPPORTED.search(str(e)):
                token = case.op or case.collective
                raise AssertionError(NOT_DECLARED.format(error=f"{type(e).__name__}: {text}",
                                                         backend=_backend_of(self), token=token)) from e
            raise

    test.__name__ = test.__qualname__ = case.name
    test.__doc__ = f"Conformance: {case.collective} ({', '.join(sorted(case.all_tags - {case.collective}))})."
    test.__conformance__ = case  # type: ignore[attr-defined]
    # (decided in the parent too, before any rank starts)
    test.__disttest_skip_checks__ = (check,)  # type: ignore[attr-defined]
    return test


class CollectiveConformance:
    """Collective semantics, checked against values numpy computes.

    Mix into a runner class whose ranks have a default group (see
    :mod:`disttest.conformance`). Class attributes: ``conformance_backend``
    (the backend's name, for its built-in declaration; else the group's),
    ``conformance_unsupported`` (a :class:`Declaration` of what it lacks),
    ``conformance_lenient``, ``conformance_device`` (where the cases' tensors
    live: ``"cpu"``, or ``"cuda"``; results are compared on the CPU).
    """

    conformance_backend: ClassVar[str | None] = None
    conformance_device: ClassVar[str] = "cpu"
    conformance_unsupported: ClassVar[Declaration | None] = None
    conformance_lenient: ClassVar[bool] = False


for _case in CASES:
    setattr(CollectiveConformance, _case.name, _method(_case))
del _case
