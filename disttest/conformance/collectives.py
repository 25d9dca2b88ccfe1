"""The value cases: every collective's result, against numpy.

Each body runs in every rank: it builds the rank's input from
:func:`~disttest.conformance.reference.rank_input`, calls the collective,
and compares what it got with the result numpy computes from every rank's
input; inputs that a collective only reads must come back unchanged, and
the gaps of a non-contiguous view untouched.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from disttest.conformance import reference as ref
from disttest.conformance.cases import Ctx, add, reduce_op

__unittest = True

__all__: list[str] = []

N = 7  # an odd prime: no backend can get by with even chunks
LARGE = 1 << 20  # about 1M elements
SIZE_TAGS = {0: "size0", 1: "size1", N: "size7", LARGE: "size1M"}


def _shared(c: Ctx, n: int, share: bool) -> int:
    """With ``share``: ``n`` elements in all, split over the world (a chunk
    per peer), for collectives whose data grows with the world squared: 1M
    elements from each of 64 ranks to each is 16 GB in one process."""
    return max(1, n // c.world) if share else n


def _members(c: Ctx, group: str) -> list[tuple[list[int], Any, int]]:
    return [(ranks, g, salt) for ranks, g, salt in c.groups(group) if c.rank in ranks]


# --- reductions ---------------------------------------------------------------------


def all_reduce(c: Ctx, dtype: str, op: str, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        t, base = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        work = dist.all_reduce(t, op=reduce_op(op), group=g, async_op=mode == "async")
        c.finish(work, mode)
        want = ref.expected_reduce_of(op, tuple(ranks), n, dtype, salt)
        c.check(t, want, dtype, f"all_reduce {op} on {dtype}")
        c.check_gaps(base, dtype, "all_reduce")


def reduce(c: Ctx, dtype: str, op: str, root: int, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        dst = ranks[root % len(ranks)]
        t, base = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        work = dist.reduce(t, dst=dst, op=reduce_op(op), group=g, async_op=mode == "async")
        c.finish(work, mode)
        if c.rank == dst:  # the others' tensors are undefined after reduce
            want = ref.expected_reduce_of(op, tuple(ranks), n, dtype, salt)
            c.check(t, want, dtype, f"reduce {op} to rank {dst}")
            c.check_gaps(base, dtype, "reduce")


def _scatter_inputs(rank: int, ranks: list[int], n: int, dtype: str, salt: int) -> list[np.ndarray]:
    # Rank ``rank``'s piece for each group member: salted by the receiver.
    return [ref.rank_input(rank, n, dtype, 10 + salt + j) for j in range(len(ranks))]


def reduce_scatter(c: Ctx, dtype: str, op: str, n: int, layout: str, mode: str, group: str, form: str,
        share: bool = False) -> None:
    n = _shared(c, n, share)
    for ranks, g, salt in _members(c, group):
        me = ranks.index(c.rank)
        pieces = _scatter_inputs(c.rank, ranks, n, dtype, salt)
        out, base = c.zeros(n, dtype, layout)
        if form == "list":
            inputs = [c.tensor(p, dtype, layout)[0] for p in pieces]
            before = c.snapshot(inputs)
            work = dist.reduce_scatter(out, inputs, op=reduce_op(op), group=g, async_op=mode == "async")
        else:
            inputs = [ref.to_torch(np.concatenate(pieces), dtype)]
            before = c.snapshot(inputs)
            call = dist.reduce_scatter_single if form == "single" else dist.reduce_scatter_tensor
            work = call(out, inputs[0], op=reduce_op(op), group=g, async_op=mode == "async")
        c.finish(work, mode)
        want = ref.expected_reduce_of(op, tuple(ranks), n, dtype, 10 + salt + me)
        c.check(out, want, dtype, f"reduce_scatter {op} on {dtype}")
        c.check_gaps(base, dtype, "reduce_scatter output")
        c.unchanged(before, inputs, "reduce_scatter input")


def all_reduce_coalesced(c: Ctx, dtype: str, op: str) -> None:
    ts = [ref.to_torch(ref.rank_input(c.rank, k, dtype, k), dtype) for k in (N, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated, still public
        dist.all_reduce_coalesced(ts, op=reduce_op(op))
    for k, t in zip((N, 3), ts, strict=True):
        want = ref.expected_reduce_of(op, tuple(range(c.world)), k, dtype, k)
        c.check(t, want, dtype, f"all_reduce_coalesced {op} (tensor of {k})")


# --- one to all, all to one ---------------------------------------------------------


def broadcast(c: Ctx, dtype: str, src: int, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        root = ranks[src % len(ranks)]
        t, base = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        work = dist.broadcast(t, src=root, group=g, async_op=mode == "async")
        c.finish(work, mode)
        c.check(t, ref.rank_input(root, n, dtype, salt), dtype, f"broadcast from rank {root}")
        c.check_gaps(base, dtype, "broadcast")


def gather(c: Ctx, dtype: str, dst: int, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        root = ranks[dst % len(ranks)]
        t, tbase = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        before = c.snapshot([t])
        outs = [c.zeros(n, dtype, layout) for _ in ranks] if c.rank == root else None
        work = dist.gather(t, [o for o, _ in outs] if outs else None, dst=root, group=g,
                           async_op=mode == "async")
        c.finish(work, mode)
        c.unchanged(before, [t], "gather input")
        for i, (o, base) in enumerate(outs or []):
            c.check(o, ref.rank_input(ranks[i], n, dtype, salt), dtype, f"gather slot {i}")
            c.check_gaps(base, dtype, "gather output")


def scatter(c: Ctx, dtype: str, src: int, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        root = ranks[src % len(ranks)]
        out, base = c.zeros(n, dtype, layout)
        pieces = ([c.tensor(p, dtype, layout)[0] for p in _scatter_inputs(c.rank, ranks, n, dtype, salt)]
                  if c.rank == root else None)
        before = c.snapshot(pieces or [])
        work = dist.scatter(out, pieces, src=root, group=g, async_op=mode == "async")
        c.finish(work, mode)
        me = ranks.index(c.rank)
        c.check(out, ref.rank_input(root, n, dtype, 10 + salt + me), dtype, f"scatter from rank {root}")
        c.check_gaps(base, dtype, "scatter output")
        c.unchanged(before, pieces or [], "scatter input")


# --- gathers and all-to-all ---------------------------------------------------------


def all_gather(c: Ctx, dtype: str, n: int, layout: str, mode: str, group: str, form: str,
        share: bool = False) -> None:
    n = _shared(c, n, share)
    for ranks, g, salt in _members(c, group):
        t, _ = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        before = c.snapshot([t])
        want = [ref.rank_input(r, n, dtype, salt) for r in ranks]
        if form == "list":
            outs = [c.zeros(n, dtype, layout) for _ in ranks]
            work = dist.all_gather([o for o, _ in outs], t, group=g, async_op=mode == "async")
            c.finish(work, mode)
            for i, (o, base) in enumerate(outs):
                c.check(o, want[i], dtype, f"all_gather slot {i}")
                c.check_gaps(base, dtype, "all_gather output")
        elif form == "coalesced":
            outs2 = [[c.zeros(n, dtype)[0]] for _ in ranks]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated, still public
                work = dist.all_gather_coalesced(outs2, [t], group=g, async_op=mode == "async")
            c.finish(work, mode)
            for i, slot in enumerate(outs2):
                c.check(slot[0], want[i], dtype, f"all_gather_coalesced slot {i}")
        else:
            shape = (len(ranks), n) if form == "stacked" else (len(ranks) * n,)
            out = ref.to_torch(np.zeros(shape, dtype=ref.DTYPES[dtype][1]), dtype)
            call = dist.all_gather_single if form == "single" else dist.all_gather_into_tensor
            work = call(out, t, group=g, async_op=mode == "async")
            c.finish(work, mode)
            c.check(out, np.stack(want).reshape(shape), dtype, "all_gather_into_tensor")
        c.unchanged(before, [t], "all_gather input")


def all_to_all(c: Ctx, dtype: str, n: int, layout: str, mode: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        me = ranks.index(c.rank)
        ins = [c.tensor(p, dtype, layout)[0] for p in _scatter_inputs(c.rank, ranks, n, dtype, salt)]
        before = c.snapshot(ins)
        outs = [c.zeros(n, dtype, layout) for _ in ranks]
        work = dist.all_to_all([o for o, _ in outs], ins, group=g, async_op=mode == "async")
        c.finish(work, mode)
        for i, (o, base) in enumerate(outs):
            c.check(o, ref.rank_input(ranks[i], n, dtype, 10 + salt + me), dtype, f"all_to_all slot {i}")
            c.check_gaps(base, dtype, "all_to_all output")
        c.unchanged(before, ins, "all_to_all input")


def _split(src: int, dst: int, n: int, uneven: bool) -> int:
    # Elements group rank ``src`` sends to group rank ``dst``.
    return (src + 2 * dst) % 3 + 1 if uneven else n


def all_to_all_single(c: Ctx, dtype: str, n: int, mode: str, group: str, form: str,
        share: bool = False) -> None:
    n = _shared(c, n, share)
    for ranks, g, salt in _members(c, group):
        me, k = ranks.index(c.rank), len(ranks)
        uneven = form != "even"
        send = [ref.rank_input(c.rank, _split(me, j, n, uneven), dtype, 30 + salt + j) for j in range(k)]
        inp = ref.to_torch(np.concatenate(send), dtype)
        before = c.snapshot([inp])
        out_sizes = [_split(i, me, n, uneven) for i in range(k)]
        in_sizes = [_split(me, j, n, uneven) for j in range(k)]
        out = ref.to_torch(np.zeros(sum(out_sizes), dtype=ref.DTYPES[dtype][1]), dtype)
        splits: dict[str, Any] = {
            "even": (None, None), "list": (out_sizes, in_sizes), "tuple": (tuple(out_sizes), tuple(in_sizes)),
            "tensor": (torch.tensor(out_sizes, dtype=torch.int64), torch.tensor(in_sizes, dtype=torch.int64)),
        }
        osz, isz = splits[form]
        work = dist.all_to_all_single(out, inp, osz, isz, group=g, async_op=mode == "async")
        c.finish(work, mode)
        want = np.concatenate([ref.rank_input(r, _split(i, me, n, uneven), dtype, 30 + salt + me)
                               for i, r in enumerate(ranks)])
        c.check(out, want, dtype, f"all_to_all_single ({form} splits)")
        c.unchanged(before, [inp], "all_to_all_single input")


# --- point to point -------------------------------------------------------------


def send_recv(c: Ctx, dtype: str, n: int, layout: str, style: str, group: str) -> None:
    for ranks, g, salt in _members(c, group):
        k, me = len(ranks), ranks.index(c.rank)
        nxt, prv = ranks[(me + 1) % k], ranks[(me - 1) % k]
        t, _ = c.tensor(ref.rank_input(c.rank, n, dtype, salt), dtype, layout)
        before = c.snapshot([t])
        got, base = c.zeros(n, dtype, layout)
        if style == "blocking":
            order = [("send", nxt), ("recv", prv)] if me % 2 == 0 else [("recv", prv), ("send", nxt)]
            for what, peer in order:
                if what == "send":
                    dist.send(t, peer, group=g)
                else:
                    dist.recv(got, peer, group=g)
        elif style == "nonblocking":
            works: list[Any] = [dist.irecv(got, prv, group=g), dist.isend(t, nxt, group=g)]
            for w in works:
                w.wait()
        else:
            ops = [dist.P2POp(dist.irecv, got, prv, group=g), dist.P2POp(dist.isend, t, nxt, group=g)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        c.check(got, ref.rank_input(prv, n, dtype, salt), dtype, f"{style} recv from rank {prv}")
        c.check_gaps(base, dtype, "recv")
        c.unchanged(before, [t], "sent tensor")


def recv_any_source(c: Ctx) -> None:
    if c.rank != 0:
        dist.send(ref.to_torch(ref.rank_input(c.rank, N, "float32"), "float32"), 0)
        return
    seen: set[int] = set()
    for _ in range(c.world - 1):
        got = torch.zeros(N)
        sender = dist.recv(got)
        if sender in seen or not 0 < sender < c.world:
            raise AssertionError(f"recv from any source returned sender {sender!r} (seen {sorted(seen)})")
        seen.add(sender)
        c.check(got, ref.rank_input(sender, N, "float32"), "float32", f"recv from any source (sender {sender})")


def tags(c: Ctx) -> None:
    # Rank 1 sends tag 1 then tag 2; rank 0 receives tag 2 first.
    if c.rank == 1:
        sends: list[Any] = [dist.isend(ref.to_torch(ref.rank_input(1, N, "float32", s), "float32"), 0, tag=s)
                            for s in (1, 2)]
        for w in sends:
            w.wait()
    elif c.rank == 0:
        for s in (2, 1):
            got = torch.zeros(N)
            dist.recv(got, 1, tag=s)
            c.check(got, ref.rank_input(1, N, "float32", s), "float32", f"recv with tag {s}")


# --- objects --------------------------------------------------------------------


def objects(c: Ctx, which: str) -> None:
    mine = {"rank": c.rank, "data": [c.rank] * 3, "text": "x" * c.rank}
    every = [{"rank": r, "data": [r] * 3, "text": "x" * r} for r in range(c.world)]
    if which == "all_gather_object":
        got: list[Any] = [None] * c.world
        dist.all_gather_object(got, mine)
        want: Any = every
    elif which == "broadcast_object_list":
        got = [mine, c.rank]
        dist.broadcast_object_list(got, src=c.world - 1)
        want = [every[-1], c.world - 1]
    elif which == "gather_object":
        got = [None] * c.world if c.rank == 0 else None  # type: ignore[assignment]
        dist.gather_object(mine, got, dst=0)
        want = every if c.rank == 0 else None
    else:
        got = [None]
        dist.scatter_object_list(got, every if c.rank == 0 else None, src=0)
        want = [every[c.rank]]
    if got != want:
        raise AssertionError(f"rank {c.rank}/{c.world}: {which} gave {got!r}, expected {want!r}")


# --- the cases ------------------------------------------------------------------


def _add(*args: Any, tags: Any = (), **kwargs: Any) -> None:
    add(*args, tags={"values", *tags}, **kwargs)


def _register() -> None:
    p = functools.partial
    sync, world, contig = "sync", "world", "contiguous"
    # all_reduce: the full dtype x op matrix, then sizes, layout, async, groups.
    for dtype in ref.DTYPES:
        for op in ref.OPS:
            if ref.op_defined(op, dtype):
                _add("all_reduce", f"{dtype}_{op}", p(all_reduce, dtype=dtype, op=op, n=N, layout=contig,
                                                     mode=sync, group=world), dtype=dtype, op=op)
    for n in (0, 1, LARGE):
        _add("all_reduce", f"float32_SUM_{SIZE_TAGS[n]}", p(all_reduce, dtype="float32", op="SUM", n=n,
            layout=contig, mode=sync, group=world), dtype="float32", op="SUM", tags=[SIZE_TAGS[n]])
    variants = [("noncontiguous", "noncontiguous", sync, world),
                ("async", contig, "async", world), ("subgroup", contig, sync, "subgroup"),
                ("overlapping", contig, sync, "overlapping"), ("overlapping_async", contig, "async", "overlapping")]
    for tag, layout, mode, group in variants:
        tagset = {t for t in (layout, mode, group) if t not in (contig, sync, world)}
        mw = 1 if group == world else 3
        _add("all_reduce", f"float32_SUM_{tag}", p(all_reduce, dtype="float32", op="SUM", n=N, layout=layout,
            mode=mode, group=group), dtype="float32", op="SUM", tags=tagset, min_world=mw)
        _add("broadcast", f"float32_{tag}", p(broadcast, dtype="float32", src=1, n=N, layout=layout, mode=mode,
            group=group), dtype="float32", tags=tagset, min_world=max(mw, 2))
        _add("reduce", f"float32_SUM_{tag}", p(reduce, dtype="float32", op="SUM", root=1, n=N, layout=layout,
            mode=mode, group=group), dtype="float32", op="SUM", tags=tagset, min_world=max(mw, 2))
        _add("all_gather", f"float32_{tag}", p(all_gather, dtype="float32", n=N, layout=layout, mode=mode,
            group=group, form="list"), dtype="float32", tags=tagset, min_world=mw)
        _add("gather", f"float32_{tag}", p(gather, dtype="float32", dst=1, n=N, layout=layout, mode=mode,
            group=group), dtype="float32", tags=tagset, min_world=max(mw, 2))
        _add("scatter", f"float32_{tag}", p(scatter, dtype="float32", src=1, n=N, layout=layout, mode=mode,
            group=group), dtype="float32", tags=tagset, min_world=max(mw, 2))
        _add("reduce_scatter", f"float32_SUM_{tag}", p(reduce_scatter, dtype="float32", op="SUM", n=N,
            layout=layout, mode=mode, group=group, form="list"), dtype="float32", op="SUM", tags=tagset, min_world=mw)
        _add("all_to_all", f"float32_{tag}", p(all_to_all, dtype="float32", n=N, layout=layout, mode=mode,
            group=group), dtype="float32", tags=tagset, min_world=mw)
        if layout == contig:
            _add("all_gather_into_tensor", f"float32_{tag}", p(all_gather, dtype="float32", n=N, layout=layout,
                mode=mode, group=group, form="flat"), dtype="float32", tags=tagset, min_world=mw)
            _add("reduce_scatter_tensor", f"float32_SUM_{tag}", p(reduce_scatter, dtype="float32", op="SUM", n=N,
                layout=layout, mode=mode, group=group, form="tensor"), dtype="float32", op="SUM",
                tags=tagset, min_world=mw)
            _add("all_to_all_single", f"float32_{tag}", p(all_to_all_single, dtype="float32", n=2, mode=mode,
                group=group, form="list"), dtype="float32", tags=tagset | {"uneven"}, min_world=mw)
            if mode == sync:
                _add("send_recv", f"float32_{tag}", p(send_recv, dtype="float32", n=N, layout=layout,
                    style="blocking", group=group), dtype="float32", tags=tagset, min_world=max(mw, 2))
    _add("send_recv", "float32_noncontiguous", p(send_recv, dtype="float32", n=N, layout="noncontiguous",
        style="blocking", group=world), dtype="float32", tags={"noncontiguous"}, min_world=2)
    # dtypes for the data movers; every root.
    for dtype in ref.DTYPES:
        _add("broadcast", dtype, p(broadcast, dtype=dtype, src=1, n=N, layout=contig, mode=sync, group=world),
            dtype=dtype, min_world=2)
        _add("all_gather", dtype, p(all_gather, dtype=dtype, n=N, layout=contig, mode=sync, group=world,
            form="list"), dtype=dtype)
        _add("all_gather_into_tensor", dtype, p(all_gather, dtype=dtype, n=N, layout=contig, mode=sync,
            group=world, form="flat"), dtype=dtype)
        _add("all_to_all_single", dtype, p(all_to_all_single, dtype=dtype, n=3, mode=sync, group=world,
            form="even"), dtype=dtype)
    for dtype in ("float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "bool"):
        _add("reduce_scatter_tensor", f"{dtype}_SUM", p(reduce_scatter, dtype=dtype, op="SUM", n=N, layout=contig,
            mode=sync, group=world, form="tensor"), dtype=dtype, op="SUM")
    for dtype in ("float64", "int64", "bool"):
        _add("gather", dtype, p(gather, dtype=dtype, dst=0, n=N, layout=contig, mode=sync, group=world), dtype=dtype)
        _add("scatter", dtype, p(scatter, dtype=dtype, src=0, n=N, layout=contig, mode=sync, group=world), dtype=dtype)
        _add("all_to_all", dtype, p(all_to_all, dtype=dtype, n=N, layout=contig, mode=sync, group=world), dtype=dtype)
        _add("send_recv", dtype, p(send_recv, dtype=dtype, n=N, layout=contig, style="blocking", group=world),
            dtype=dtype, min_world=2)
    for root in (0, 2):
        _add("broadcast", f"float32_src{root}", p(broadcast, dtype="float32", src=root, n=N, layout=contig,
            mode=sync, group=world), dtype="float32")
        _add("reduce", f"float32_SUM_dst{root}", p(reduce, dtype="float32", op="SUM", root=root, n=N, layout=contig,
            mode=sync, group=world), dtype="float32", op="SUM")
        _add("gather", f"float32_dst{root}", p(gather, dtype="float32", dst=root, n=N, layout=contig, mode=sync,
            group=world), dtype="float32")
        _add("scatter", f"float32_src{root}", p(scatter, dtype="float32", src=root, n=N, layout=contig, mode=sync,
            group=world), dtype="float32")
    # reduce ops of the other reductions.
    for op, dtype in (("PRODUCT", "float32"), ("MIN", "int64"), ("MAX", "float64"), ("AVG", "float32"),
                      ("PREMUL_SUM", "float32"), ("BAND", "int64"), ("BOR", "int32"), ("BXOR", "uint8")):
        _add("reduce", f"{dtype}_{op}", p(reduce, dtype=dtype, op=op, root=0, n=N, layout=contig, mode=sync,
            group=world), dtype=dtype, op=op)
        _add("reduce_scatter", f"{dtype}_{op}", p(reduce_scatter, dtype=dtype, op=op, n=N, layout=contig, mode=sync,
            group=world, form="list"), dtype=dtype, op=op)
        _add("reduce_scatter_tensor", f"{dtype}_{op}", p(reduce_scatter, dtype=dtype, op=op, n=N, layout=contig,
            mode=sync, group=world, form="tensor"), dtype=dtype, op=op)
    # sizes: empty, one element, about 1M.
    for n in (0, 1, LARGE):
        st = SIZE_TAGS[n]
        _add("broadcast", f"float32_{st}", p(broadcast, dtype="float32", src=0, n=n, layout=contig, mode=sync,
            group=world), dtype="float32", tags=[st])
        # The large cases move about 1M elements per rank whatever the world size.
        share = n == LARGE
        _add("all_gather_into_tensor", f"float32_{st}", p(all_gather, dtype="float32", n=n, layout=contig,
            mode=sync, group=world, form="flat", share=share), dtype="float32", tags=[st])
        _add("reduce_scatter_tensor", f"float32_SUM_{st}", p(reduce_scatter, dtype="float32", op="SUM", n=n,
            layout=contig, mode=sync, group=world, form="tensor", share=share), dtype="float32", op="SUM", tags=[st])
        _add("all_to_all_single", f"float32_{st}", p(all_to_all_single, dtype="float32", n=n, mode=sync,
            group=world, form="even", share=share), dtype="float32", tags=[st])
        if n != LARGE:
            _add("all_gather", f"float32_{st}", p(all_gather, dtype="float32", n=n, layout=contig, mode=sync,
                group=world, form="list"), dtype="float32", tags=[st])
            _add("send_recv", f"float32_{st}", p(send_recv, dtype="float32", n=n, layout=contig, style="blocking",
                group=world), dtype="float32", tags=[st], min_world=2)
    # the *_single names (torch >= 2.13; all_gather_into_tensor & co. are deprecated there).
    single = {"requires": ("all_gather_single", "2.13")}
    for dtype in ("float32", "bfloat16", "int64"):
        _add("all_gather_single", dtype, p(all_gather, dtype=dtype, n=N, layout=contig, mode=sync, group=world,
             form="single"), dtype=dtype, **single)
    for tag, mode, group in (("async", "async", world), ("subgroup", sync, "subgroup")):
        _add("all_gather_single", f"float32_{tag}", p(all_gather, dtype="float32", n=N, layout=contig, mode=mode,
             group=group, form="single"), dtype="float32", tags={tag}, min_world=3 if group != world else 1,
             **single)
        _add("reduce_scatter_single", f"float32_SUM_{tag}", p(reduce_scatter, dtype="float32", op="SUM", n=N,
             layout=contig, mode=mode, group=group, form="single"), dtype="float32", op="SUM", tags={tag},
             min_world=3 if group != world else 1, requires=("reduce_scatter_single", "2.13"))
    for op, dtype in (("SUM", "float32"), ("MAX", "int64"), ("AVG", "float64")):
        _add("reduce_scatter_single", f"{dtype}_{op}", p(reduce_scatter, dtype=dtype, op=op, n=N, layout=contig,
             mode=sync, group=world, form="single"), dtype=dtype, op=op, requires=("reduce_scatter_single", "2.13"))
    for op, dtype in (("SUM", "float32"), ("MIN", "int32")):
        _add("all_reduce_coalesced", f"{dtype}_{op}", p(all_reduce_coalesced, dtype=dtype, op=op), dtype=dtype, op=op)
    # other forms.
    _add("all_gather_into_tensor", "float32_stacked", p(all_gather, dtype="float32", n=N, layout=contig, mode=sync,
        group=world, form="stacked"), dtype="float32", tags={"stacked"})
    _add("all_gather_coalesced", "float32", p(all_gather, dtype="float32", n=N, layout=contig, mode=sync,
        group=world, form="coalesced"), dtype="float32")
    for form in ("even", "list", "tuple", "tensor"):
        _add("all_to_all_single", f"float32_splits_{form}", p(all_to_all_single, dtype="float32", n=2, mode=sync,
            group=world, form=form), dtype="float32", tags={f"splits_{form}"})
    for style in ("nonblocking", "batch_isend_irecv"):
        _add("send_recv", f"float32_{style}", p(send_recv, dtype="float32", n=N, layout=contig, style=style,
            group=world), dtype="float32", tags={style}, min_world=2)
    _add("send_recv", "recv_any_source", recv_any_source, tags={"recv_any_source"}, min_world=2)
    _add("send_recv", "tags", tags, tags={"tags"}, min_world=2)
    for which in ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        _add("objects", which, p(objects, which=which), tags={which})


_register()
