"""The reference models of upstream's FSDP tests (``common_fsdp``).

Classes only at import: nothing is built, no tensor work is done, and
``torch.distributed.fsdp`` and the tensor-parallel styles load only when a
model that uses them is built (``init(...)`` with ``FSDPInitMode.RECURSIVE``,
``MLPStack.parallelize``).
"""

from __future__ import annotations

import abc
from enum import Enum, auto
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from disttest import _compat
from disttest.support.devices import accelerator_type

__unittest = True

__all__ = [
    "DEVICE_TYPE",
    "DEVICEInitMode",
    "DoubleLinear",
    "FSDPInitMode",
    "FSDPTestModel",
    "MLP",
    "MLPStack",
    "NestedWrappedModule",
    "TransformerWithSharedParams",
    "get_devtype",
]

#: The device type FSDP tests run on, the accelerator's ("cuda", "xpu"...) else "cpu".
DEVICE_TYPE: str = accelerator_type() or "cpu"

UNSUPPORTED_INIT_MODE = "unsupported FSDP init mode {mode!r} for {model} (disttest)"


class FSDPInitMode(Enum):
    """How a reference model is wrapped."""

    #: No FSDP wrapping.
    NO_FSDP = auto()
    #: FSDP recursive wrapping.
    RECURSIVE = auto()


class DEVICEInitMode(Enum):
    """When a reference model moves to ``DEVICE_TYPE``."""

    #: Before it is passed to FSDP.
    DEVICE_BEFORE = auto()
    #: After it is passed to FSDP.
    DEVICE_AFTER = auto()
    #: Never; it stays on CPU.
    DEVICE_NEVER = auto()


def get_devtype() -> torch.device:
    """``torch.device(DEVICE_TYPE)``."""
    return torch.device(DEVICE_TYPE)


class FSDPTestModel(nn.Module, abc.ABC):
    """The interface of the FSDP reference models."""

    @abc.abstractmethod
    def get_input(self, device: Any) -> tuple[torch.Tensor, ...]:
        """An input for the model, as a tuple."""

    @abc.abstractmethod
    def get_loss(self, input: Any, output: Any) -> torch.Tensor:
        """The loss for ``input`` and ``output``."""

    @abc.abstractmethod
    def run_backward(self, loss: torch.Tensor) -> None:
        """The backward pass."""

    @staticmethod
    @abc.abstractmethod
    def init(*args: Any, **kwargs: Any) -> nn.Module:
        """Build an instance."""


def _to_device(module: nn.Module, move: bool) -> nn.Module:
    return module.to(DEVICE_TYPE) if move else module


def _device_kwargs(fsdp_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fsdp_kwargs`` with ``device_id="cpu"`` added on a host without
    accelerators, where FSDP (1) refuses a CPU module without a device; a
    ``device_id`` given is kept. Upstream never builds these models on CPU."""
    if DEVICE_TYPE == "cpu" and "device_id" not in fsdp_kwargs:
        return {**fsdp_kwargs, "device_id": "cpu"}
    return fsdp_kwargs


class TransformerWithSharedParams(FSDPTestModel):
    """A small ``nn.Transformer`` whose embedding and output projection share
    their weight, with a float and a long buffer (and optionally BatchNorm)."""

    def __init__(self, group: Any, device_init_mode: DEVICEInitMode, add_bn: bool,
                 deterministic: bool) -> None:
        super().__init__()
        self.rank = group.rank()
        self.world_size = group.size()
        if deterministic:
            torch.manual_seed(0)
        d_vocab, d_model = 23, 16
        self.embed_tokens = nn.Embedding(d_vocab, d_model)
        self.transformer = nn.Transformer(d_model=d_model, num_encoder_layers=2, num_decoder_layers=2,
                                          dim_feedforward=8, dropout=0.1)
        self.output_proj = nn.Linear(d_model, d_vocab)
        self.output_proj.weight = self.embed_tokens.weight
        vocab_bias = self.embed_tokens.weight.new_ones((d_model,))
        self.register_buffer("vocab_bias", vocab_bias)
        self.register_buffer("long_buffer", torch.zeros_like(vocab_bias, dtype=torch.long))
        self.bs = 2
        self.bn: nn.Module = nn.BatchNorm1d(self.bs) if add_bn else nn.Identity()
        if device_init_mode == DEVICEInitMode.DEVICE_BEFORE:
            self.to(DEVICE_TYPE)
        if deterministic:
            self.eval()

    def get_input(self, device: Any) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(1 + self.rank)
        src = torch.arange(12, device=device).view(6, self.bs)
        tgt = torch.arange(self.bs * 4, device=device).view(4, self.bs)
        return (src, tgt)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        src = self.embed_tokens(src_ids)
        src = src + self.vocab_bias + self.long_buffer.type_as(src)  # type: ignore[operator]
        tgt = self.bn(self.embed_tokens(tgt_ids))
        return cast(torch.Tensor, self.output_proj(self.transformer(src, tgt)))

    def get_loss(self, input: Any, output: Any) -> torch.Tensor:
        _, tgt = input
        return F.cross_entropy(output.view(-1, output.size(-1)), tgt.view(-1), reduction="sum")

    def run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated

    @staticmethod
    def init(group: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
             fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False,
             add_bn: bool = True) -> nn.Module:
        """Build one; ``RECURSIVE`` wraps it in FSDP (``ModuleWrapPolicy`` over
        the encoder and decoder layers unless ``fsdp_kwargs`` gives a policy)."""
        fsdp_kwargs = dict(fsdp_kwargs or {})
        tformer_pg = group[0] if isinstance(group, tuple) else group
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            return TransformerWithSharedParams(tformer_pg, device_init_mode, add_bn, deterministic)
        if fsdp_init_mode != FSDPInitMode.RECURSIVE:
            raise ValueError(UNSUPPORTED_INIT_MODE.format(mode=fsdp_init_mode, model="TransformerWithSharedParams"))
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policy = fsdp_kwargs.pop("auto_wrap_policy", None) or ModuleWrapPolicy(
            {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
        hybrid = _compat.hybrid_sharding_strategies()
        fsdp_pg = None if fsdp_kwargs.get("sharding_strategy") in hybrid and not isinstance(group, tuple) else group
        model = TransformerWithSharedParams(tformer_pg, device_init_mode, add_bn, deterministic)
        wrapped: nn.Module = FSDP(model, fsdp_pg, auto_wrap_policy=policy, **_device_kwargs(fsdp_kwargs))
        if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
            wrapped = wrapped.to(DEVICE_TYPE)
        return wrapped

    def get_ignored_modules(self) -> list[nn.Module]:
        return [self.transformer]


class NestedWrappedModule(FSDPTestModel):
    """8 -> 4 -> 16 -> 16 -> 4 -> 8 linears, the middle ones FSDP-wrapped
    (nested) when ``wrap_fsdp``."""

    def __init__(self, group: Any, wrap_fsdp: bool, device_init_mode: DEVICEInitMode,
                 deterministic: bool, **fsdp_kwargs: Any) -> None:
        super().__init__()
        self.rank = group.rank()
        self.world_size = group.size()
        move = device_init_mode == DEVICEInitMode.DEVICE_BEFORE

        def maybe_wrap(layer: nn.Module) -> nn.Module:
            if not wrap_fsdp:
                return layer
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            return FSDP(layer, group, **_device_kwargs(fsdp_kwargs))

        if deterministic:
            torch.manual_seed(0)
        self.module = nn.Sequential(
            _to_device(nn.Linear(8, 4), move),
            maybe_wrap(nn.Sequential(maybe_wrap(_to_device(nn.Linear(4, 16), move)),
                                     _to_device(nn.Linear(16, 16), move))),
            maybe_wrap(_to_device(nn.Linear(16, 4), move)),
            _to_device(nn.Linear(4, 8), move),
        )

    def get_input(self, device: Any) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(1 + self.rank)
        return (torch.rand(4, 8, device=device),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.module(x))

    def get_loss(self, input: Any, output: torch.Tensor) -> torch.Tensor:
        return output.sum()

    def run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated

    @staticmethod
    def init(group: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
             fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False) -> nn.Module:
        """Build one; ``RECURSIVE`` wraps the nested layers (not the root)."""
        fsdp_kwargs = fsdp_kwargs or {}
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            return NestedWrappedModule(group, wrap_fsdp=False, device_init_mode=device_init_mode,
                                       deterministic=deterministic)
        if fsdp_init_mode != FSDPInitMode.RECURSIVE:
            raise ValueError(UNSUPPORTED_INIT_MODE.format(mode=fsdp_init_mode, model="NestedWrappedModule"))
        model: nn.Module = NestedWrappedModule(group, wrap_fsdp=True, device_init_mode=device_init_mode,
                                               deterministic=deterministic, **fsdp_kwargs)
        if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
            model = model.to(DEVICE_TYPE)
        return model


class MLP(nn.Module):
    """dim -> dim_multiplier*dim -> ReLU -> dim -> ReLU (+ a buffer)."""

    def __init__(self, dim: int, device: torch.device | None = None, *, bias: bool = True,
                 with_buffer: bool = False, dim_multiplier: int = 4) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, dim_multiplier * dim, device=device, bias=bias)
        self.out_proj = nn.Linear(dim_multiplier * dim, dim, device=device, bias=bias)
        self.buffer: torch.Tensor | None
        if with_buffer:
            self.register_buffer("buffer", torch.randn((dim,), device=device))
        else:
            self.buffer = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.relu(self.out_proj(F.relu(self.in_proj(x))))
        return z + self.buffer if self.buffer is not None else z

    def reset_parameters(self) -> None:
        if self.buffer is not None:
            nn.init.normal_(self.buffer)


class MLPStack(nn.Sequential):
    """Three :class:`MLP` (multipliers 3, 4, 3: uneven shards), and a
    LayerNorm with ``with_seq_parallel``."""

    def __init__(self, mlp_dim: int, *, with_seq_parallel: bool = False) -> None:
        modules: list[nn.Module] = [MLP(mlp_dim, dim_multiplier=3), MLP(mlp_dim), MLP(mlp_dim, dim_multiplier=3)]
        if with_seq_parallel:
            modules.append(nn.LayerNorm(mlp_dim, bias=False))
        super().__init__(*modules)
        self.with_seq_parallel = with_seq_parallel

    def parallelize(self, tp_mesh: Any, dp_mesh: Any, use_activation_checkpointing: bool,
                    **fsdp_kwargs: Any) -> MLPStack:
        """Tensor-parallel over ``tp_mesh``, then ``fully_shard`` over ``dp_mesh``."""
        checkpoint = _compat.activation_checkpoint()
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        plan: dict[str, Any] = {
            "0.in_proj": ColwiseParallel(use_local_output=False),
            "0.out_proj": RowwiseParallel(use_local_output=False),
            "1.in_proj": ColwiseParallel(use_local_output=False),
            "1.out_proj": RowwiseParallel(use_local_output=False),
            "2.in_proj": ColwiseParallel(use_local_output=False),
            "2.out_proj": RowwiseParallel(output_layouts=Shard(1)) if self.with_seq_parallel
            else RowwiseParallel(),
        }
        if self.with_seq_parallel:
            plan["3"] = SequenceParallel(sequence_dim=1)
        parallelize_module(self, device_mesh=tp_mesh, parallelize_plan=plan)
        for module in self:
            if isinstance(module, nn.LayerNorm):
                continue
            if use_activation_checkpointing:
                checkpoint(module)
            fully_shard(module, mesh=dp_mesh, **fsdp_kwargs)
        fully_shard(self, mesh=dp_mesh, **fsdp_kwargs)
        return self


class DoubleLinear(nn.Module):
    """Two linears on one input: two outputs, or (``use_second_linear=False``)
    one output and an unused module."""

    def __init__(self, dim: int, use_second_linear: bool = True) -> None:
        super().__init__()
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)
        self.relu = nn.ReLU()
        self.use_second_linear = use_second_linear

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        if self.use_second_linear:
            return cast(torch.Tensor, self.relu(self.lin1(x))), cast(torch.Tensor, self.relu(self.lin2(x)))
        return cast(torch.Tensor, self.relu(self.lin1(x)))
