"""Deliberately wrong backends for the conformance tests (importing this
module registers them):

- ``toybroken``: each rank talks to nobody; all_reduce leaves tensors as
  they are, broadcast says it is "not supported", all_gather raises.
- ``toynothing``: every call completes at once and touches no tensor.
- ``lazybarrier``: gloo, except that barrier returns at once.
- ``toyscribble``: as ``toynothing``, except that all_reduce writes over
  its tensors' whole storage and then raises, and broadcast raises an
  error that says nothing of the tensor's layout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from disttest._compat import torch_at_least
from disttest.conformance import UNSUPPORTED
from disttest.pg.threaded import completed_work


class ToyBroken(dist.ProcessGroup):
    def __init__(self, rank, size, name):
        super().__init__(rank, size)
        self._name = name

    @property
    def group_name(self):
        return self._name

    def getBackendName(self):
        return "toybroken"

    def allreduce(self, tensors, opts=None):
        return completed_work(tensors)  # forgets to reduce

    def broadcast(self, tensors, opts=None):
        raise RuntimeError("broadcast is not supported by toybroken")

    def allgather(self, outputs, inputs, opts=None):
        raise RuntimeError("toy allgather exploded")

    def barrier(self, opts=None):
        return completed_work(None)


class ToyNothing(ToyBroken):
    def getBackendName(self):
        return "toynothing"


def _nothing(self, *args, **kwargs):
    return completed_work(None)


for _name in ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather", "_allgather_base",
              "allgather_coalesced", "allgather_into_tensor_coalesced", "gather", "scatter", "reduce_scatter",
              "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "barrier",
              "send", "recv", "recv_anysource", "monitored_barrier"):
    setattr(ToyNothing, _name, _nothing)


class ToyScribble(ToyNothing):
    def getBackendName(self):
        return "toyscribble"

    def allreduce(self, tensors, opts=None):
        for t in tensors:
            torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()).fill_(7)  # the gaps of a view too
        raise RuntimeError("toyscribble: the tensor has to be contiguous")  # (after writing)

    def broadcast(self, tensors, opts=None):
        raise RuntimeError("toyscribble: connection reset by peer")


class LazyBarrier(dist.ProcessGroup):
    """gloo, delegated to method by method, with a barrier that does not wait."""

    def __init__(self, inner, rank, size, name):
        super().__init__(rank, size)
        self._inner = inner
        self._name = name

    @property
    def group_name(self):
        return self._name

    def getBackendName(self):
        return "lazybarrier"

    def barrier(self, opts=None):
        return completed_work(None)


def _delegate(name):
    def method(self, *args):
        return getattr(self._inner, name)(*args)

    method.__name__ = name
    return method


for _name in ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather", "_allgather_base",
              "allgather_coalesced", "allgather_into_tensor_coalesced", "gather", "scatter", "reduce_scatter",
              "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base",
              "send", "recv", "recv_anysource", "monitored_barrier"):
    setattr(LazyBarrier, _name, _delegate(_name))


LazyBarrier.all_gather_single = _delegate("_allgather_base")
LazyBarrier.reduce_scatter_single = _delegate("_reduce_scatter_base")


def _lazy(opts, backend_opts):
    inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return LazyBarrier(inner, opts.group_rank, opts.group_size, str(opts.group_id))


for _backend, _create in (
    ("toybroken", lambda o, b: ToyBroken(o.group_rank, o.group_size, str(o.group_id))),
    ("toynothing", lambda o, b: ToyNothing(o.group_rank, o.group_size, str(o.group_id))),
    ("toyscribble", lambda o, b: ToyScribble(o.group_rank, o.group_size, str(o.group_id))),
    ("lazybarrier", _lazy),
):
    if _backend.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(_backend, _create, extended_api=True, devices=["cpu"])

# The declaration mechanism: what these backends say they lack.
CONFORMANCE_UNSUPPORTED = {
    "lazybarrier": {**UNSUPPORTED["gloo"], "monitored_barrier": "c10d runs it on gloo by name only"},
}
if torch_at_least("2.14"):
    # (torch 2.14 coalesces the batch through the group's backend for the
    # device, which a ProcessGroup subclass has none of)
    CONFORMANCE_UNSUPPORTED["lazybarrier"]["batch_isend_irecv"] = (
        "torch 2.14: 'No backend type associated with device type cpu' for a ProcessGroup subclass")
