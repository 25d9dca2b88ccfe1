"""The reference models of upstream's composable-API tests (``common_dist_composable``).

The names of ``torch.testing._internal.common_dist_composable``, so a suite
of ``fully_shard``/``replicate``/``checkpoint`` tests ports by changing one
import. Every model takes the ``device`` its layers are built on, and builds
nothing until it is instantiated; importing this module does no tensor work.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

__unittest = True

__all__ = [
    "CompositeModel",
    "CompositeParamModel",
    "FakeSequential",
    "NestedSequentialModel",
    "UnitModule",
    "UnitParamModule",
]


class UnitModule(nn.Module):
    """``l1`` -> ``seq`` (ReLU, linear, ReLU) -> ``l2``, all 100 -> 100 linears."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.l1 = nn.Linear(100, 100, device=device)
        self.seq = nn.Sequential(nn.ReLU(), nn.Linear(100, 100, device=device), nn.ReLU())
        self.l2 = nn.Linear(100, 100, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.l2(self.seq(self.l1(x))))


class CompositeModel(nn.Module):
    """``l1`` -> two :class:`UnitModule` (``u1``, ``u2``) -> ``l2``: the
    model for nested ``fully_shard``/``replicate`` of submodules."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.l1 = nn.Linear(100, 100, device=device)
        self.u1 = UnitModule(device)
        self.u2 = UnitModule(device)
        self.l2 = nn.Linear(100, 100, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.l2(self.u2(self.u1(self.l1(x)))))


class UnitParamModule(nn.Module):
    """``l`` -> ``seq`` (ReLU, linear, ReLU), then a matmul with a bare
    100x100 parameter ``p`` (a parameter owned by no submodule)."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.l = nn.Linear(100, 100, device=device)
        self.seq = nn.Sequential(nn.ReLU(), nn.Linear(100, 100, device=device), nn.ReLU())
        self.p = nn.Parameter(torch.randn((100, 100), device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.seq(self.l(x)), self.p)


class CompositeParamModel(nn.Module):
    """``l`` -> two :class:`UnitModule` -> a matmul with a bare parameter
    ``p``; it also holds a persistent 100x100 ``buffer``."""

    buffer: torch.Tensor

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.l = nn.Linear(100, 100, device=device)
        self.u1 = UnitModule(device)
        self.u2 = UnitModule(device)
        self.p = nn.Parameter(torch.randn((100, 100), device=device))
        self.register_buffer("buffer", torch.randn((100, 100), device=device), persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.u2(self.u1(self.l(x))), self.p)


class FakeSequential(nn.Module):
    """Calls ``modules`` in order, like ``nn.Sequential``, but holds them in
    a plain list: they are *not* registered submodules (their parameters are
    not this module's), which gives a nesting a ``ModuleWrapPolicy`` over
    ``nn.Sequential`` does not wrap. As upstream."""

    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self._module_sequence = list(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self._module_sequence:
            x = module(x)
        return x


class NestedSequentialModel(nn.Module):
    """``nn.Sequential`` and :class:`FakeSequential` nested three deep, so
    that traversal orders (BFS and DFS variants) of its modules differ.

    Input of width 1, output of width 4. Upstream's ``forward`` is a local
    function inside ``__init__`` and never reachable (calling the model
    raises); here it is the method, so the model also runs.
    """

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.seq1 = nn.Sequential(
            nn.Linear(1, 1, device=device),
            FakeSequential(
                nn.Linear(1, 1, device=device),
                nn.ReLU(),
                FakeSequential(nn.Linear(1, 1, device=device)),
                nn.ReLU(),
            ),
            nn.Linear(1, 2, device=device),
        )
        self.lin = nn.Linear(2, 2, device=device)
        self.seq2 = nn.Sequential(
            nn.ReLU(),
            nn.Linear(2, 3, device=device),
            FakeSequential(
                nn.Linear(3, 2, bias=False, device=device),
                nn.Linear(2, 4, bias=False, device=device),
            ),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.seq2(self.lin(self.seq1(x))))
