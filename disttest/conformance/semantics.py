"""The behaviour cases: what a backend must do beyond computing values.

A barrier holds every rank until the last arrives (measured); a collective
whose peer never comes raises within the group's timeout; an async Work is
not complete before its peers sent their data; a bad argument (a root out of
range, wrong sizes, wrong dtypes) raises and leaves the outputs alone.

NB: while one rank waits for a peer that stays away on purpose, the others
wait in a collective of the default group, which the waiting rank joins
after its error: a rank that simply returned would be a desync (disttest's
runners report a rank left waiting for a finished peer).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from disttest.conformance import reference as ref
from disttest.conformance.cases import SHORT_TIMEOUT, Ctx, add

__unittest = True

__all__: list[str] = []

DELAY = 0.5  # seconds a late rank keeps the others waiting
#: A missing peer must raise no sooner than this share of the group's
#: timeout (an error at once is no timeout), and no later than the limit.
EARLY_SHARE = 0.25
LATE_LIMIT = 3 * SHORT_TIMEOUT + 5
N = 5


def _sync() -> None:
    # A common starting line that does not rely on barrier.
    dist.all_reduce(torch.ones(1))


def barrier_waits(c: Ctx, group: str) -> None:
    if group == "world":
        ranks, g = list(range(c.world)), None
    else:
        ranks, g = c.subgroups()["sub"]
    late = ranks[-1]
    _sync()
    start = time.monotonic()
    if c.rank == late:
        time.sleep(DELAY)
    if c.rank in ranks:
        dist.barrier(group=g)
    took = c.elapsed(start)
    _sync()
    if c.rank in ranks and c.rank != late and took < 0.6 * DELAY:
        raise AssertionError(
            f"rank {c.rank}/{c.world}: barrier returned after {took:.3f}s while rank {late} arrived "
            f"{DELAY}s late: a barrier must hold every rank until the last arrives")


def barrier_repeated(c: Ctx) -> None:
    for _ in range(5):
        dist.barrier()
    work = dist.barrier(async_op=True)
    if work is None:
        raise AssertionError("barrier(async_op=True) returned no Work")
    work.wait()


def monitored_barrier(c: Ctx) -> None:
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)


def missing_peer(c: Ctx, what: str) -> None:
    g = c.short_group([0, 1])
    if c.rank == 0:
        start = time.monotonic()
        try:
            if what == "all_reduce":
                dist.all_reduce(torch.ones(N), group=g)
            else:
                dist.recv(torch.ones(N), 1, group=g)
        except Exception as e:  # noqa: BLE001 (any error is the right outcome)
            took, error = c.elapsed(start), e
        else:
            _sync()
            raise AssertionError(f"rank 0/{c.world}: {what} on a group of ranks [0, 1] returned although "
                                 f"rank 1 never called it: it must raise within the group's timeout "
                                 f"({SHORT_TIMEOUT}s)")
        _sync()
        if took < EARLY_SHARE * SHORT_TIMEOUT:
            raise AssertionError(f"rank 0/{c.world}: {what} with a missing peer raised after {took:.2f}s, "
                                 f"before the group's timeout ({SHORT_TIMEOUT}s): {error!r}")
        if took > LATE_LIMIT:
            raise AssertionError(f"rank 0/{c.world}: {what} with a missing peer raised only after "
                                 f"{took:.1f}s; the group's timeout is {SHORT_TIMEOUT}s")
    else:
        _sync()


def async_waits_for_data(c: Ctx, what: str) -> None:
    _sync()
    start = time.monotonic()
    t = ref.to_torch(ref.rank_input(c.rank, N, "float32"), "float32")
    waiter, sender = (1, 0)
    work: Any = None
    if c.rank == sender:
        time.sleep(DELAY)
    if what == "all_reduce":
        work = dist.all_reduce(t, async_op=True)
    elif what == "broadcast":
        work = dist.broadcast(t, src=sender, async_op=True)
    elif c.rank == waiter:
        work = dist.irecv(t, sender)
    elif c.rank == sender:
        work = dist.isend(t, waiter)
    # Complete before the sender sent (a backend that blocks in the call
    # until the data is there, and returns a completed Work, conforms).
    early = work is not None and work.is_completed() and c.elapsed(start) < 0.8 * DELAY
    if work is not None:
        work.wait()
    if c.rank == waiter:
        if early:
            raise AssertionError(f"rank {waiter}/{c.world}: async {what}'s Work said it was complete before "
                                 f"rank {sender} sent its data ({DELAY}s later)")
        if what == "all_reduce":
            want = ref.expected_reduce("SUM", [ref.rank_input(r, N, "float32") for r in range(c.world)], "float32")
        else:
            want = ref.rank_input(sender, N, "float32")
        c.check(t, want, "float32", f"async {what} after wait()")
    _sync()


# --- argument errors --------------------------------------------------------------


def _bad_call(c: Ctx, g: Any, what: str) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    """The bad call ``what`` and the output tensors it must leave alone."""
    w, out = c.world, torch.full((N,), -7.0)
    t = torch.ones(N)
    far = w + 4
    calls: dict[str, Callable[[], Any]] = {
        "broadcast_src_out_of_range": lambda: dist.broadcast(out, src=far),
        "reduce_dst_out_of_range": lambda: dist.reduce(out, dst=far),
        "gather_dst_out_of_range": lambda: dist.gather(t, None, dst=far),
        "scatter_src_out_of_range": lambda: dist.scatter(out, None, src=far),
        "recv_src_out_of_range": lambda: dist.recv(out, far, group=g),
        "send_dst_out_of_range": lambda: dist.send(t, far, group=g),
        "all_gather_list_too_long": lambda: dist.all_gather([out] + [torch.zeros(N) for _ in range(w)], t, group=g),
        "all_gather_into_tensor_wrong_size": lambda: dist.all_gather_into_tensor(out, t, group=g),
        "all_gather_into_tensor_wrong_dtype": lambda: dist.all_gather_into_tensor(
            torch.zeros(w * N, dtype=torch.float64), t, group=g),
        "reduce_scatter_tensor_wrong_size": lambda: dist.reduce_scatter_tensor(out, torch.ones(w * N + 1), group=g),
        "all_to_all_single_bad_splits": lambda: dist.all_to_all_single(
            out, torch.ones(N), [1] * w, [N + 1] + [0] * (w - 1), group=g),
        "all_to_all_list_too_short": lambda: dist.all_to_all([out], [t], group=g),
        "scatter_list_too_long": lambda: dist.scatter(
            out, [torch.ones(N) for _ in range(w + 1)] if c.rank == 0 else None, src=0, group=g),
        "all_reduce_BAND_on_float": lambda: dist.all_reduce(out, op=dist.ReduceOp.BAND, group=g),
    }
    return calls[what], [out]


def argument_error(c: Ctx, what: str) -> None:
    g = c.short_group(list(range(c.world)))
    call, outputs = _bad_call(c, g, what)
    before = c.snapshot(outputs)
    try:
        call()
    except Exception:  # noqa: BLE001 (raising is the point)
        pass
    else:
        raise AssertionError(f"rank {c.rank}/{c.world}: {what.replace('_', ' ')}: the call returned; "
                             f"it must raise an error (naming the bad value)")
    c.unchanged(before, outputs, "the output of a rejected call")


ARGUMENT_ERRORS = {
    "broadcast_src_out_of_range": "broadcast", "reduce_dst_out_of_range": "reduce",
    "gather_dst_out_of_range": "gather", "scatter_src_out_of_range": "scatter",
    "recv_src_out_of_range": "send_recv", "send_dst_out_of_range": "send_recv",
    "all_gather_list_too_long": "all_gather", "all_gather_into_tensor_wrong_size": "all_gather_into_tensor",
    "all_gather_into_tensor_wrong_dtype": "all_gather_into_tensor",
    "reduce_scatter_tensor_wrong_size": "reduce_scatter_tensor",
    "all_to_all_single_bad_splits": "all_to_all_single", "all_to_all_list_too_short": "all_to_all",
    "scatter_list_too_long": "scatter", "all_reduce_BAND_on_float": "all_reduce",
}


def _register() -> None:
    p = functools.partial
    add("barrier", "waits_for_late_rank", p(barrier_waits, group="world"), tags={"barrier_waits"}, min_world=2)
    add("barrier", "waits_for_late_rank_subgroup", p(barrier_waits, group="subgroup"),
        tags={"barrier_waits", "subgroup"}, min_world=3)
    add("barrier", "repeated_and_async", barrier_repeated, tags={"async"})
    add("monitored_barrier", "all_ranks", monitored_barrier, requires=("monitored_barrier", "1.10"))
    for what in ("all_reduce", "recv"):
        add("timeouts", f"missing_peer_{what}", p(missing_peer, what=what), tags={"missing_peer", what}, min_world=2)
    for what in ("all_reduce", "broadcast", "irecv"):
        add("async_completion", f"{what}_waits_for_data", p(async_waits_for_data, what=what),
            tags={"async", "async_completion", what}, min_world=2)
    for what, collective in ARGUMENT_ERRORS.items():
        add(collective, f"rejects_{what}", p(argument_error, what=what), tags={"argument_errors", what}, min_world=2)


_register()
