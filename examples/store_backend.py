"""A c10d backend in pure Python, over the rendezvous store: copy it to start your own.

Every collective is one exchange through the store (each rank writes its
payload under the collective's sequence number and reads its peers'), then
local torch work. Slow, but complete enough to pass disttest's conformance
suite, and small enough to read in one sitting::

    python -m disttest.conformance --backend storepg --world-size 3 --import store_backend

(run from this directory). What it lacks is declared in
``CONFORMANCE_UNSUPPORTED`` below, which the suite reads; anything else it
gets wrong is a failure.
"""

from __future__ import annotations

import functools
import pickle
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

BACKEND = "storepg"
R = dist.ReduceOp.RedOpType

# What the conformance suite should count as unsupported, and why.
CONFORMANCE_UNSUPPORTED = {
    BACKEND: {
        "PREMUL_SUM": "not implemented in this example",
        "monitored_barrier": "c10d implements monitored_barrier for gloo only",
        "recv_any_source": "not implemented in this example",
    },
}
if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
    # torch 2.14's batch_isend_irecv asks the group for its C++ backend (to
    # see whether it coalesces); a group written in Python has none.
    CONFORMANCE_UNSUPPORTED[BACKEND]["batch_isend_irecv"] = (
        "torch >= 2.14 needs a C++ backend on the group for it; this example has none")


class StoreWork(dist._Work):
    """A Work that is complete when it is made (every call here blocks)."""

    def __init__(self, result: Any = None, source: int | None = None) -> None:
        super().__init__()
        self._future: Future[Any] = Future()
        self._future.set_result(result)
        self._source = source

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def _source_rank(self) -> int:
        return -1 if self._source is None else self._source


def _reduce(op: Any, tensors: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(tensors)
    kind = op if isinstance(op, R) else op.__getstate__()[0]
    if kind in (R.BAND, R.BOR, R.BXOR):
        if stacked.dtype.is_floating_point or stacked.dtype.is_complex:
            raise ValueError(f"storepg: {kind.name} needs integer or bool tensors, got {stacked.dtype}")
        fn = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[kind]
        return functools.reduce(fn, tensors)
    if kind == R.SUM:
        return stacked.sum(0).to(stacked.dtype)
    if kind == R.PRODUCT:
        return stacked.prod(0).to(stacked.dtype)
    if kind == R.MIN:
        return stacked.amin(0)
    if kind == R.MAX:
        return stacked.amax(0)
    if kind == R.AVG:
        return stacked.mean(0)
    raise ValueError(f"storepg: reduce op {kind} is not implemented")


class StoreProcessGroup(dist.ProcessGroup):
    """One rank's view of a group whose data travels through ``store``."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, name: str) -> None:
        super().__init__(rank, size)
        self._store, self._timeout, self._name = store, timeout, name
        self._seq = 0
        self._sent: dict[tuple[int, int], int] = {}
        self._received: dict[tuple[int, int], int] = {}

    @property
    def group_name(self) -> str:
        return self._name

    def getBackendName(self) -> str:
        return BACKEND

    # -- the one primitive ------------------------------------------------------
    def _exchange(self, payload: Any) -> list[Any]:
        """Every rank's ``payload``, by rank (an all-gather of Python objects)."""
        self._seq += 1
        key = f"c{self._seq}/"
        self._store.set(key + str(self.rank()), pickle.dumps(payload))
        peers = [key + str(r) for r in range(self.size())]
        self._store.wait(peers, self._timeout)  # raises after the group's timeout
        got = [pickle.loads(self._store.get(k)) for k in peers]
        if self._seq > 2:  # every rank has read exchange seq-2 once it wrote seq-1
            self._store.delete_key(f"c{self._seq - 2}/{self.rank()}")
        return got

    def _root(self, root: int, what: str) -> int:
        if not 0 <= root < self.size():
            raise ValueError(f"storepg {what}: root {root} is not a rank (0 to {self.size() - 1})")
        return root

    # -- collectives ------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> StoreWork:
        op = opts.reduceOp if opts is not None else R.SUM
        every = self._exchange([t.cpu() for t in tensors])
        for i, t in enumerate(tensors):
            t.copy_(_reduce(op, [ts[i] for ts in every]))
        return StoreWork(tensors)

    allreduce_coalesced = allreduce

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> StoreWork:
        root = self._root(opts.rootRank, "reduce")
        every = self._exchange(tensors[0].cpu())
        if self.rank() == root:
            tensors[0].copy_(_reduce(opts.reduceOp, every))
        return StoreWork(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> StoreWork:
        root = self._root(opts.rootRank, "broadcast")
        every = self._exchange(tensors[0].cpu() if self.rank() == root else None)
        tensors[0].copy_(every[root])
        return StoreWork(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> StoreWork:
        if len(outputs[0]) != self.size():
            raise ValueError(f"storepg all_gather: {len(outputs[0])} outputs for {self.size()} ranks")
        for out, t in zip(outputs[0], self._exchange(inputs[0].cpu()), strict=False):
            out.copy_(t)
        return StoreWork(outputs)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> StoreWork:
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(f"storepg all_gather_into_tensor: output {output.dtype} {list(output.shape)} "
                             f"does not hold {self.size()} x {input.dtype} {list(input.shape)}")
        output.copy_(torch.cat([t.reshape(-1) for t in self._exchange(input.cpu())]).reshape(output.shape))
        return StoreWork([output])

    all_gather_single = _allgather_base

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> StoreWork:
        for out, ts in zip(outputs, self._exchange([t.cpu() for t in inputs]), strict=False):
            for o, t in zip(out, ts, strict=False):
                o.copy_(t)
        return StoreWork(outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> StoreWork:
        root = self._root(opts.rootRank, "gather")
        every = self._exchange(inputs[0].cpu())
        if self.rank() == root:
            for out, t in zip(outputs[0], every, strict=False):
                out.copy_(t)
        return StoreWork(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> StoreWork:
        root = self._root(opts.rootRank, "scatter")
        if self.rank() == root and len(inputs[0]) != self.size():
            raise ValueError(f"storepg scatter: {len(inputs[0])} inputs for {self.size()} ranks")
        every = self._exchange([t.cpu() for t in inputs[0]] if self.rank() == root else None)
        outputs[0].copy_(every[root][self.rank()])
        return StoreWork(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> StoreWork:
        every = self._exchange([t.cpu() for t in inputs[0]])
        outputs[0].copy_(_reduce(opts.reduceOp, [pieces[self.rank()] for pieces in every]))
        return StoreWork(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> StoreWork:
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"storepg reduce_scatter_tensor: input of {input.numel()} elements for "
                             f"{self.size()} x {output.numel()}")
        total = _reduce(opts.reduceOp, [t.reshape(-1) for t in self._exchange(input.cpu())])
        output.copy_(total.chunk(self.size())[self.rank()].reshape(output.shape))
        return StoreWork([output])

    reduce_scatter_single = _reduce_scatter_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> StoreWork:
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(f"storepg all_to_all: needs {self.size()} inputs and outputs")
        every = self._exchange([t.cpu() for t in inputs])
        for src, out in enumerate(outputs):
            out.copy_(every[src][self.rank()])
        return StoreWork(outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: Any,
                      input_splits: Any, opts: Any = None) -> StoreWork:
        n = self.size()

        def splits(sizes: Any, total: int) -> list[int]:
            sizes = [int(s) for s in (sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes or [])]
            sizes = sizes or [total // n] * n
            if len(sizes) != n or sum(sizes) != total:
                raise ValueError(f"storepg all_to_all_single: split sizes {sizes} do not cover {total}")
            return sizes

        pieces = input.split(splits(input_splits, input.size(0)))
        outs = output.split(splits(output_splits, output.size(0)))
        every = self._exchange([p.cpu() for p in pieces])
        for src, out in enumerate(outs):
            out.copy_(every[src][self.rank()])
        return StoreWork([output])

    all_to_all_single = alltoall_base

    def barrier(self, opts: Any = None) -> StoreWork:
        self._exchange(None)
        return StoreWork()

    # -- point to point ---------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> StoreWork:
        self._root(dst, "send")
        k = self._sent[dst, tag] = self._sent.get((dst, tag), 0) + 1
        self._store.set(f"p{self.rank()}>{dst}/{tag}/{k}", pickle.dumps(tensors[0].cpu()))
        return StoreWork(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> RecvWork:
        # NB: irecv must not block (its peer may post its isend after it):
        # the data is fetched when the Work is waited on or polled.
        self._root(src, "recv")
        k = self._received[src, tag] = self._received.get((src, tag), 0) + 1
        return RecvWork(self, tensors[0], src, f"p{src}>{self.rank()}/{tag}/{k}")


class RecvWork(StoreWork):
    """A receive that completes once its message is in the store."""

    def __init__(self, group: StoreProcessGroup, tensor: torch.Tensor, src: int, key: str) -> None:
        super().__init__([tensor], source=src)
        self._group, self._tensor, self._key, self._done = group, tensor, key, False

    def _take(self) -> None:
        store = self._group._store
        self._tensor.copy_(pickle.loads(store.get(self._key)))
        store.delete_key(self._key)
        self._done = True

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._group._store.wait([self._key], self._group._timeout)
            self._take()
        return True

    def is_completed(self) -> bool:
        if not self._done and self._group._store.check([self._key]):
            self._take()
        return self._done


def _create(opts: Any, backend_opts: Any) -> StoreProcessGroup:
    return StoreProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id))


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
