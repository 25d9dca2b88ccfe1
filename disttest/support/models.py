"""The reference models and inputs of upstream's distributed tests.

Classes only at import: the shared instances (``DDP_NET``, ``BN_NET``,
``BN_NET_NO_AFFINE``, ``ONLY_SBN_NET``, ``COLLECTIVES_OBJECT_TEST_LIST``) are
built on first access, in the process that asks, so ``import disttest``
does no tensor work (a process that has run a parallel op must not fork).
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

__unittest = True

__all__ = [
    "BN_NET",
    "BN_NET_NO_AFFINE",
    "COLLECTIVES_OBJECT_TEST_LIST",
    "DDP_NET",
    "EXPECTED_FIELDS",
    "FC2",
    "ONLY_SBN_NET",
    "BatchNormNet",
    "ControlFlowToyModel",
    "DDPUnevenTestInput",
    "DictOutputModule",
    "EmbeddingNetDifferentParams",
    "Foo",
    "LargeNet",
    "Net",
    "NetWithBuffers",
    "SaveForwardInputsModel",
    "SaveForwardInputsModule",
    "Task",
    "TestNamedTupleInput_0",
    "TestNamedTupleInput_1",
    "TwoLinLayerNet",
    "UnusedParamTwoLinLayerNet",
    "create_collectives_object_test_list",
]


class NetWithBuffers(nn.Module):
    """Two bias-free linear layers and a buffer that forward increments."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 1, bias=False)
        self.register_buffer("buffer", torch.randn(1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buffer.add_(1)  # type: ignore[operator]
        return cast(torch.Tensor, self.b(self.a(x)))


class Foo:
    """A plain object for the object collectives; equal when every attribute is
    (tensors by ``torch.equal``)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Foo) or set(self.__dict__) != set(other.__dict__):
            return False
        for name, value in self.__dict__.items():
            theirs = other.__dict__[name]
            if isinstance(value, torch.Tensor):
                if not (isinstance(theirs, torch.Tensor) and torch.equal(value, theirs)):
                    return False
            elif value != theirs:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


def create_collectives_object_test_list() -> list[Any]:
    """Objects for the object collectives; call after seeding so that every
    rank builds the same random tensor."""
    f = Foo(10)
    f.bar = 1  # type: ignore[attr-defined]
    return [
        {"key1": 3, "key2": 4, "key3": {"nested": True}},
        f,
        Foo(torch.randn(3, 3)),
        "foo",
        [1, 2, True, "string", [4, 5, "nested"]],
    ]


EXPECTED_FIELDS = ("a", "b")
TestNamedTupleInput_0 = namedtuple("NamedTuple", ["a", "b"])  # type: ignore[name-match]
TestNamedTupleInput_0.__test__ = False  # type: ignore[attr-defined]


class TestNamedTupleInput_1(NamedTuple):
    """A typed NamedTuple input for DDP."""

    a: torch.Tensor
    b: torch.Tensor


TestNamedTupleInput_1.__test__ = False  # type: ignore[attr-defined]


class DDPUnevenTestInput(NamedTuple):
    """One case of DDP's uneven-inputs tests."""

    name: str
    model: nn.Module
    inp: torch.Tensor | tuple[Any, ...]
    sync_interval: int
    throw_on_early_termination: bool = False
    hook: Callable[..., Any] | None = None
    state: Any = None


class FC2(nn.Module):
    """Linear(10, 50) whose bias does not require grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.fc(x))


class Net(nn.Module):
    """The DDP reference net: 2 -> 10 -> 50 -> 4 with a frozen long parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = FC2()
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return F.softmax(self.fc3(x), dim=1)


class LargeNet(nn.Sequential):
    """1000 -> 2000 -> 500 (``fc1``, ``fc2``), bias-free: several MB of gradients."""

    def __init__(self) -> None:
        super().__init__(OrderedDict(fc1=nn.Linear(1000, 2000, bias=False), fc2=nn.Linear(2000, 500, bias=False)))


class Task(nn.Module):
    """One 2x2 parameter added to the input."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.p + x


class BatchNormNet(nn.Module):
    """2 -> 40, BatchNorm1d(4) over a (-1, 4, 10) view, 40 -> 4."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 40, bias=False)
        self.bn = nn.BatchNorm1d(4, affine=affine)
        self.fc2 = nn.Linear(40, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.reshape(self.fc1(x), (-1, 4, 10))
        x = torch.reshape(self.bn(x), (-1, 40))
        return F.softmax(self.fc2(x), dim=1)


class UnusedParamTwoLinLayerNet(nn.Module):
    """Two used linear layers and one (``c``) that forward never touches."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 10, bias=False)
        self.c = nn.Linear(5, 5, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


class DictOutputModule(nn.Module):
    """Returns ``{"predictions": (a, b), "loss": sum}``."""

    def __init__(self) -> None:
        super().__init__()
        self.module = UnusedParamTwoLinLayerNet()

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        predictions = self.module(x)
        return {"predictions": predictions, "loss": (predictions[0] + predictions[1]).sum()}


class TwoLinLayerNet(nn.Module):
    """Two linear heads on the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 1, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


class EmbeddingNetDifferentParams(nn.Module):
    """An embedding whose size (or parameter count) depends on the rank."""

    def __init__(self, rank: int, diff_num_params: bool = False) -> None:
        super().__init__()
        embedding_dim = 500 if diff_num_params or rank == 0 else 50
        self.embedding = nn.Embedding(num_embeddings=10, embedding_dim=embedding_dim)
        self.lin = nn.Linear(embedding_dim, 1)
        if diff_num_params:
            self.lin2 = nn.Linear(1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.lin(self.embedding(x)))


class ControlFlowToyModel(nn.Module):
    """Uses its second layer only when the input is all ones (20x10)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(10, 10, bias=False)
        self.lin2 = nn.Linear(10, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.equal(x, torch.ones(20, 10, device=x.device)):
            return cast(torch.Tensor, self.lin2(F.relu(self.lin1(x))))
        return F.relu(self.lin1(x))


class SaveForwardInputsModule(nn.Module):
    """Linear(100, 100) that records its input in ``forward_inputs[self]``."""

    def __init__(self, forward_inputs: dict[nn.Module, torch.Tensor], cast_forward_inputs: bool) -> None:
        super().__init__()
        self.l = nn.Linear(100, 100)  # noqa: E741 (upstream's name)
        self.forward_inputs = forward_inputs
        self.cast_forward_inputs = cast_forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return cast(torch.Tensor, self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x))


class SaveForwardInputsModel(nn.Module):
    """Two :class:`SaveForwardInputsModule` in a row, recording inputs too."""

    def __init__(self, forward_inputs: dict[nn.Module, torch.Tensor], cast_forward_inputs: bool) -> None:
        super().__init__()
        self.c1 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.c2 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.forward_inputs = forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return cast(torch.Tensor, self.c2(self.c1(x)))


_LAZY: dict[str, Callable[[], Any]] = {
    "DDP_NET": Net,
    "BN_NET": BatchNormNet,
    "BN_NET_NO_AFFINE": lambda: BatchNormNet(affine=False),
    "ONLY_SBN_NET": lambda: nn.SyncBatchNorm(2, momentum=0.99),
    "COLLECTIVES_OBJECT_TEST_LIST": create_collectives_object_test_list,
}
_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    # The shared instances, built once per process on first access.
    if name in _LAZY:
        if name not in _built:
            _built[name] = _LAZY[name]()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
