"""What a conformance case is, what it runs with in a rank, and what a
backend may declare it lacks.

A :class:`Case` is one reported row of the suite: a collective, its dtype
and reduce op where it has them, tags (size, layout, sync/async, group,
aspect) and a body that runs in every rank with a :class:`Ctx`. A body
raises ``AssertionError`` when the backend's result or behaviour is wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from disttest import _compat
from disttest.conformance import reference as ref

__unittest = True

__all__ = ["CASES", "Case", "Ctx", "Declaration", "torch_lacks"]

#: Seconds of a group made to watch a timeout (missing peers, argument errors).
SHORT_TIMEOUT = 2.0
SENTINEL = 99  # fills the gaps of non-contiguous views; a backend must not write there


@dataclass(frozen=True)
class Case:
    """One reported conformance case."""

    name: str
    collective: str
    body: Callable[[Ctx], None]
    dtype: str | None = None
    op: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    #: torch.distributed attribute the case needs, and the torch that has it
    requires: tuple[str, str] | None = None
    min_world: int = 1

    @property
    def all_tags(self) -> frozenset[str]:
        extra = {self.collective} | {x for x in (self.dtype, self.op) if x}
        return frozenset(t.lower() for t in self.tags | extra)


#: Every case of the suite, in the order added; the suite makes a test of each.
CASES: list[Case] = []


def add(collective: str, variant: str, body: Callable[[Ctx], None], *, dtype: str | None = None,
        op: str | None = None, tags: Iterable[str] = (), requires: tuple[str, str] | None = None,
        min_world: int = 1) -> None:
    """Register a case (names are unique)."""
    name = f"test_{collective}__{variant}"
    if any(c.name == name for c in CASES):
        raise ValueError(f"duplicate conformance case {name}")
    CASES.append(Case(name, collective, body, dtype, op, frozenset(tags), requires, min_world))


def torch_lacks(case: Case) -> str | None:
    """Why this torch cannot run ``case`` (a feature-detected collective), or None."""
    if case.requires is None:
        return None
    attr, version = case.requires
    if not hasattr(dist, attr):
        return f"unsupported by this torch {torch.__version__} (needs torch >= {version}: torch.distributed.{attr})"
    return None


class Declaration:
    """What a backend says it lacks: tokens matched against a case's tags
    (collective, dtype, op, and aspects such as ``noncontiguous`` or
    ``barrier_waits``), case-insensitively. ``a+b`` matches a case having
    both tags. Each token maps to the reason shown in the report."""

    def __init__(self, reasons: Mapping[str, str] | None = None) -> None:
        self.reasons: dict[str, str] = {}
        for token, why in (reasons or {}).items():
            self.add(token, why)

    def add(self, token: str, why: str) -> None:
        token = token.strip().lower()
        if not token:
            return
        self.reasons[token] = why

    def extend(self, tokens: Iterable[str] | Mapping[str, str] | str, why: str) -> None:
        if isinstance(tokens, str):
            tokens = tokens.split(",")
        if isinstance(tokens, Mapping):
            for token, reason in tokens.items():
                self.add(token, str(reason))
        else:
            for token in tokens:
                self.add(token, why)

    def match(self, case: Case) -> str | None:
        """The declared reason ``case`` is unsupported, or None."""
        tags = case.all_tags
        for token, why in self.reasons.items():
            if all(part in tags for part in token.split("+")):
                return f"declared unsupported: {token} ({why})"
        return None

    def __bool__(self) -> bool:
        return bool(self.reasons)


# --- in a rank --------------------------------------------------------------------


_GROUP_CACHE: dict[int, tuple[Any, dict[str, Any]]] = {}


class Ctx:
    """What a case body runs with in one rank: rank, world size, groups,
    tensors made from the reference inputs, and the checks."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        #: Each strided view's base as made, and a copy of it: a backend that
        #: rejects the view must leave it as it was.
        self.bases: list[tuple[torch.Tensor, torch.Tensor]] = []

    # -- groups --
    def subgroups(self) -> dict[str, Any]:
        """The suite's subgroups, made once per default group (every rank
        makes them in the same order): ``sub`` (even ranks), ``low`` (all but
        the last), ``high`` (all but the first; overlaps ``low``)."""
        default = _compat.default_group()
        cached = _GROUP_CACHE.get(id(default))
        if cached is not None and cached[0] is default:
            return cached[1]
        w = self.world
        spec = {"sub": list(range(0, w, 2)), "low": list(range(w - 1)), "high": list(range(1, w))}
        groups = {k: (ranks, dist.new_group(ranks)) for k, ranks in spec.items()}
        _GROUP_CACHE[id(default)] = (default, groups)
        return groups

    def groups(self, kind: str) -> list[tuple[list[int], Any, int]]:
        """``(ranks, group, salt)`` for each group a ``kind`` case runs on:
        ``world`` (the default group), ``subgroup``, ``overlapping`` (two
        groups sharing ranks; each with its own inputs)."""
        if kind == "world":
            return [(list(range(self.world)), None, 0)]
        if self.world < 3:
            raise AssertionError(f"{kind} cases need world size 3 (the runner skips them)")
        made = self.subgroups()
        if kind == "subgroup":
            return [(*made["sub"], 0)]
        return [(*made["low"], 1), (*made["high"], 2)]

    @staticmethod
    def short_group(ranks: list[int]) -> Any:
        """A fresh group over ``ranks`` with a timeout of SHORT_TIMEOUT s."""
        return dist.new_group(ranks, timeout=timedelta(seconds=SHORT_TIMEOUT))

    # -- tensors --
    def tensor(self, values: np.ndarray, dtype: str, layout: str = "contiguous") -> tuple[torch.Tensor, torch.Tensor | None]:
        """``values`` as a tensor; for ``noncontiguous``, a strided view whose
        gaps hold SENTINEL, and the base it views."""
        t = ref.to_torch(values, dtype)
        if layout == "contiguous":
            return t, None
        base = ref.to_torch(np.full(2 * len(values), SENTINEL if dtype != "bool" else True), dtype)
        view = base[::2]
        view.copy_(t)
        self.bases.append((base, base.clone()))
        return view, base

    def written_bases(self) -> int:
        """How many strided views' storage changed since it was made (byte
        for byte: NaN is not a change)."""
        return sum(not torch.equal(base.view(torch.uint8), made.view(torch.uint8)) for base, made in self.bases)

    def zeros(self, n: int, dtype: str, layout: str = "contiguous") -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.tensor(np.zeros(n, dtype=ref.DTYPES[dtype][1]), dtype, layout)

    # -- checks --
    def check(self, got: torch.Tensor, want: np.ndarray, dtype: str, what: str) -> None:
        problem = ref.mismatch(ref.to_numpy(got).reshape(want.shape) if got.numel() == want.size
                               else ref.to_numpy(got), want, dtype)
        if problem:
            raise AssertionError(f"rank {self.rank}/{self.world}: {what}: {problem}")

    def check_gaps(self, base: torch.Tensor | None, dtype: str, what: str) -> None:
        if base is None:
            return
        gaps = ref.to_numpy(base[1::2])
        fill = np.full(gaps.shape, SENTINEL if dtype != "bool" else True).astype(gaps.dtype)
        if not np.array_equal(gaps, fill):
            raise AssertionError(
                f"rank {self.rank}/{self.world}: {what}: the backend wrote between the elements of a "
                f"non-contiguous view (it must honour strides, or reject the tensor)")

    def unchanged(self, before: list[torch.Tensor], after: list[torch.Tensor], what: str) -> None:
        for i, (b, a) in enumerate(zip(before, after, strict=False)):
            if not torch.equal(b, a):
                raise AssertionError(f"rank {self.rank}/{self.world}: {what} {i} was modified; "
                                     f"it is an input and must be left as it was")

    @staticmethod
    def snapshot(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        return [t.detach().clone() for t in tensors]

    @staticmethod
    def finish(work: Any, mode: str) -> None:
        """Wait for ``work`` when the case is async (and check there is one)."""
        if mode == "async":
            if work is None:
                raise AssertionError("async_op=True returned no Work")
            work.wait()

    @staticmethod
    def elapsed(start: float) -> float:
        return time.monotonic() - start


def reduce_op(op: str) -> Any:
    """The c10d reduce op named ``op``."""
    if op == "PREMUL_SUM":
        return _compat.premul_sum(ref.PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)
