"""A deliberately broken backend, "toybroken", for the conformance tests.

Each rank's group talks to nobody: all_reduce leaves tensors unchanged
(wrong for two ranks), broadcast says it is not supported, all_gather
raises. Importing this module registers it.
"""

from __future__ import annotations

import torch.distributed as dist

from disttest.threaded_pg import completed_work


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


def _create(opts, backend_opts):
    return ToyBroken(opts.group_rank, opts.group_size, str(opts.group_id))


if "TOYBROKEN" not in dist.Backend._plugins:
    dist.Backend.register_backend("toybroken", _create, extended_api=True, devices=["cpu"])
