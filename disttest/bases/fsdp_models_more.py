"""More reference models of upstream's FSDP tests (``common_fsdp``): the
variants of :class:`~disttest.bases.fsdp_models.NestedWrappedModule`, the
delayed models and the ``wrap()`` models of the auto-wrap tests.

Classes only at import: nothing is built, no tensor work is done, and
``torch.distributed.fsdp`` loads only when a model that wraps is built. On a
host without accelerators the FSDP units these models make get
``device_id="cpu"`` (unless the FSDP keyword arguments name one), so they
build under the CPU FSDP bases; upstream's never run there.

NB: the delays (``ModuleWithDelay``, ``MixtureOfExperts``) exist to expose
races between accelerator streams. As upstream, they hold the CUDA stream
(``torch.cuda._sleep``) on CUDA, sleep the thread on other accelerators,
and do nothing on CPU, where the ops they would delay are synchronous; there
no collective is patched either, so ranks as threads cannot leave each
other's patch in place.
"""

from __future__ import annotations

import contextlib
import functools
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn

from disttest import _compat
from disttest.bases import fsdp_models
from disttest.bases.fsdp_models import (
    UNSUPPORTED_INIT_MODE,
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTestModel,
    NestedWrappedModule,
    _device_kwargs,
    _to_device,
)

__unittest = True

__all__ = [
    "AlwaysWrapNestedWrappedModule",
    "DummyDDP",
    "MixtureOfExperts",
    "ModuleWithDelay",
    "NestedLinear",
    "NestedWrappedModuleWithDelay",
    "NonUniformReqGradNWM",
    "SkipModel",
    "SkipModule",
]


def _fsdp() -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel


def _wrap(module: nn.Module, **kwargs: Any) -> nn.Module:
    from torch.distributed.fsdp.wrap import wrap

    wrapped: nn.Module = wrap(module, **kwargs)
    return wrapped


@functools.cache
def _cuda_cycles_per_ms() -> float:
    """GPU cycles of ``torch.cuda._sleep`` per millisecond: the mean of ten
    measurements without the two fastest and two slowest (upstream's
    ``get_cycles_per_ms``), measured once per process."""
    cycles = 1_000_000

    def measure() -> float:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch: unannotated
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch: unannotated
        start.record()
        _compat.cuda_sleep(cycles)
        end.record()
        end.synchronize()
        return float(cycles / start.elapsed_time(end))

    return statistics.mean(sorted(measure() for _ in range(10))[2:8])


def _delays(ms: int) -> bool:
    """Whether a delay of ``ms`` does anything on ``DEVICE_TYPE``."""
    return ms > 0 and fsdp_models.DEVICE_TYPE != "cpu"


def _delay(ms: int) -> None:
    """Hold the device (CUDA: its current stream; another accelerator: this
    thread) for ``ms`` milliseconds; nothing on CPU."""
    if not _delays(ms):
        return
    if fsdp_models.DEVICE_TYPE == "cuda":
        _compat.cuda_sleep(int(ms * _cuda_cycles_per_ms()))
    else:
        time.sleep(ms / 1000)


class AlwaysWrapNestedWrappedModule(NestedWrappedModule):
    """:class:`NestedWrappedModule` whose ``RECURSIVE`` init wraps the whole
    model in FSDP with ``always_wrap_policy`` (every submodule its own unit)."""

    @staticmethod
    def init(group: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
             fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False) -> nn.Module:
        """Build one; ``NO_FSDP`` gives the plain :class:`NestedWrappedModule`,
        ``RECURSIVE`` a top-level FSDP over it (``fsdp_kwargs`` forwarded; the
        default group, as upstream)."""
        model = NestedWrappedModule.init(group=group, fsdp_init_mode=FSDPInitMode.NO_FSDP,
                                         device_init_mode=device_init_mode, fsdp_kwargs=fsdp_kwargs,
                                         deterministic=deterministic)
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            return model
        if fsdp_init_mode != FSDPInitMode.RECURSIVE:
            raise ValueError(UNSUPPORTED_INIT_MODE.format(mode=fsdp_init_mode,
                                                          model="AlwaysWrapNestedWrappedModule"))
        from torch.distributed.fsdp.wrap import always_wrap_policy

        wrapped: nn.Module = _fsdp()(model, auto_wrap_policy=always_wrap_policy,
                                     **_device_kwargs(fsdp_kwargs or {}))
        if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
            wrapped = wrapped.to(fsdp_models.DEVICE_TYPE)
        return wrapped


class NonUniformReqGradNWM(NestedWrappedModule):
    """:class:`NestedWrappedModule` whose last two linears sit in one FSDP
    unit, and whose ``init`` freezes every parameter but theirs, so some
    ranks hold no (non-empty) shard of a trainable parameter: the case
    ``ShardedGradScaler`` must handle with ``use_orig_params=True``."""

    #: The names of the parameters ``init`` leaves trainable (``module.2.1``),
    #: with or without FSDP's ``_fsdp_wrapped_module`` between the parts.
    REQ_GRAD_PATTERN = re.compile(r"module\.2.*\.1.*")

    def __init__(self, group: Any, wrap_fsdp: bool, device_init_mode: DEVICEInitMode,
                 deterministic: bool, **fsdp_kwargs: Any) -> None:
        nn.Module.__init__(self)
        self.rank = group.rank()
        self.world_size = group.size()
        move = device_init_mode == DEVICEInitMode.DEVICE_BEFORE

        def maybe_wrap(layer: nn.Module) -> nn.Module:
            return _fsdp()(layer, group, **_device_kwargs(fsdp_kwargs)) if wrap_fsdp else layer

        if deterministic:
            torch.manual_seed(0)
        self.module = nn.Sequential(
            _to_device(nn.Linear(8, 4), move),
            maybe_wrap(nn.Sequential(maybe_wrap(_to_device(nn.Linear(4, 16), move)),
                                     _to_device(nn.Linear(16, 16), move))),
            maybe_wrap(nn.Sequential(_to_device(nn.Linear(16, 4), move),
                                     _to_device(nn.Linear(4, 8), move))),
        )

    @staticmethod
    def _set_nonuniform_req_grad(model: nn.Module, req_grad_mask: re.Pattern[str] | str) -> None:
        for name, param in model.named_parameters():
            if not re.match(req_grad_mask, name):
                param.requires_grad_(False)

    @staticmethod
    def init(group: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
             fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False) -> nn.Module:
        """Build one and freeze all parameters outside ``module.2.1``;
        ``RECURSIVE`` wraps the nested units (not the root) in FSDP."""
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            model: nn.Module = NonUniformReqGradNWM(group, wrap_fsdp=False, device_init_mode=device_init_mode,
                                                    deterministic=deterministic)
        elif fsdp_init_mode == FSDPInitMode.RECURSIVE:
            model = NonUniformReqGradNWM(group, wrap_fsdp=True, device_init_mode=device_init_mode,
                                         deterministic=deterministic, **(fsdp_kwargs or {}))
            if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
                model = model.to(fsdp_models.DEVICE_TYPE)
        else:
            raise ValueError(UNSUPPORTED_INIT_MODE.format(mode=fsdp_init_mode, model="NonUniformReqGradNWM"))
        NonUniformReqGradNWM._set_nonuniform_req_grad(model, NonUniformReqGradNWM.REQ_GRAD_PATTERN)
        return model


class ModuleWithDelay(FSDPTestModel):
    """Wraps an :class:`~disttest.bases.fsdp_models.FSDPTestModel` and delays
    the device after computing the loss and/or before each gradient
    reduce-scatter (``dist.reduce_scatter_single``, patched in
    ``run_backward``). See the module's note on CPU."""

    #: The wrapped model (an ``FSDPTestModel``, possibly inside FSDP).
    module: Any

    def __init__(self, module: nn.Module, delay_after_loss_ms: int, delay_before_reduction_ms: int) -> None:
        super().__init__()
        self.delay_after_loss_ms = delay_after_loss_ms
        self.delay_before_reduction_ms = delay_before_reduction_ms
        self.module = module

    def get_input(self, device: Any) -> tuple[torch.Tensor, ...]:
        return cast(tuple[torch.Tensor, ...], self.module.get_input(device))

    def forward(self, x: torch.Tensor) -> Any:
        return self.module(x)

    def get_loss(self, input: Any, output: Any) -> torch.Tensor:
        loss = cast(torch.Tensor, self.module.get_loss(input, output))
        _delay(self.delay_after_loss_ms)
        return loss

    def run_backward(self, loss: torch.Tensor) -> None:
        if not _delays(self.delay_before_reduction_ms):
            self.module.run_backward(loss)
            return
        orig_reduce_scatter = dist.reduce_scatter_single

        def delayed_reduce_scatter(*args: Any, **kwargs: Any) -> Any:
            _delay(self.delay_before_reduction_ms)
            return orig_reduce_scatter(*args, **kwargs)

        with mock.patch.object(dist, "reduce_scatter_single", delayed_reduce_scatter):
            self.module.run_backward(loss)

    @staticmethod
    def init(module_class: type[FSDPTestModel], *model_args: Any, delay_after_loss_ms: int,
             delay_before_reduction_ms: int, **model_kwargs: Any) -> nn.Module:
        """``module_class.init(*model_args, **model_kwargs)`` wrapped with the
        delays (milliseconds)."""
        return ModuleWithDelay(module_class.init(*model_args, **model_kwargs), delay_after_loss_ms,
                               delay_before_reduction_ms)


class NestedWrappedModuleWithDelay(ModuleWithDelay):
    """:class:`ModuleWithDelay` over a :class:`NestedWrappedModule`."""

    @staticmethod
    def init(  # type: ignore[override]  # upstream's signature: the NestedWrappedModule's plus the delays
            group: Any, fsdp_init_mode: FSDPInitMode,
            device_init_mode: DEVICEInitMode = DEVICEInitMode.DEVICE_AFTER,
            fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False,
            delay_after_loss_ms: int = 0, delay_before_reduction_ms: int = 0) -> nn.Module:
        """Build the :class:`NestedWrappedModule` (as its ``init``) with the delays."""
        return ModuleWithDelay.init(NestedWrappedModule, group=group, fsdp_init_mode=fsdp_init_mode,
                                    device_init_mode=device_init_mode, fsdp_kwargs=fsdp_kwargs,
                                    deterministic=deterministic, delay_after_loss_ms=delay_after_loss_ms,
                                    delay_before_reduction_ms=delay_before_reduction_ms)


class DummyDDP(nn.Module):
    """A stand-in for DDP: holds ``module`` and forwards to it, nothing else."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class MixtureOfExperts(NestedWrappedModule):
    """8 -> 12 (shared) -> 23 (expert) -> 12 -> 8 linears: the ``shared``
    layer is the same on every rank, the ``expert`` differs per rank (with
    ``deterministic``; its parameters carry ``.expert = True``).

    With ``wrap_fsdp`` the shared layer is sharded over ``group`` and the
    expert wrapped over a group of this rank alone; without it,
    ``run_backward`` all-reduces the non-expert gradients over ``group``
    itself. ``delay_before_free_ms`` delays FSDP's reshard of the expert.
    """

    def __init__(self, group: Any, wrap_fsdp: bool, device_init_mode: DEVICEInitMode,
                 delay_before_free_ms: int, deterministic: bool, **fsdp_kwargs: Any) -> None:
        super().__init__(group=group, wrap_fsdp=wrap_fsdp, device_init_mode=device_init_mode,
                         deterministic=deterministic)
        self.group = group
        self.delay_before_free_ms = delay_before_free_ms
        self.wrap_fsdp = wrap_fsdp
        self.move_to_device = device_init_mode == DEVICEInitMode.DEVICE_BEFORE
        if deterministic:
            torch.manual_seed(42 + self.rank)  # expert parameters differ per rank
        d_expert, d_shared, d_input = 23, 12, 8
        expert = _to_device(nn.Linear(d_expert, d_shared), self.move_to_device)
        self.num_expert_params = sum(p.numel() for p in expert.parameters())
        for p in expert.parameters():
            p.expert = True  # type: ignore[attr-defined]  # the mark run_backward and upstream tests read
        if deterministic:
            torch.manual_seed(0)  # every other parameter is the same on every rank
        shared = _to_device(nn.Linear(d_shared, d_expert), self.move_to_device)
        if wrap_fsdp:
            expert_group = dist.new_group([group.rank()])  # a group of one: the expert is not sharded
            expert = _fsdp()(expert, expert_group, **_device_kwargs(fsdp_kwargs))
            shared = _fsdp()(shared, group, **_device_kwargs(fsdp_kwargs))
        self.module = nn.Sequential(
            _to_device(nn.Linear(d_input, d_shared), self.move_to_device),
            shared,
            expert,
            _to_device(nn.Linear(d_shared, d_input), self.move_to_device),
        )

    @contextlib.contextmanager
    def _delayed_reshard(self) -> Iterator[None]:
        runtime = _compat.fsdp_runtime_utils()
        orig_reshard = runtime._reshard

        def delayed_reshard(*args: Any, **kwargs: Any) -> Any:
            _delay(self.delay_before_free_ms)
            return orig_reshard(*args, **kwargs)

        with mock.patch.object(runtime, "_reshard", delayed_reshard):
            yield

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _delays(self.delay_before_free_ms) and isinstance(self.module[2], _fsdp()):
            with self._delayed_reshard():
                return cast(torch.Tensor, self.module(x))
        return cast(torch.Tensor, self.module(x))

    def run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
        if self.wrap_fsdp:
            return
        # Not FSDP-wrapped: average the shared gradients by hand.
        with torch.no_grad():
            for p in self.parameters():
                if hasattr(p, "expert") or p.grad is None:
                    continue
                p.grad.div_(self.world_size)
                dist.all_reduce(p.grad, group=self.group)

    @staticmethod
    def init(group: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
             fsdp_kwargs: dict[str, Any] | None = None, deterministic: bool = False,
             delay_before_free_ms: int = 0) -> nn.Module:
        """Build one; ``RECURSIVE`` wraps the expert and shared layers (not
        the root) in FSDP. NB: ``RECURSIVE`` calls ``dist.new_group``, so
        every rank of the default group must build it."""
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            return MixtureOfExperts(group, wrap_fsdp=False, device_init_mode=device_init_mode,
                                    delay_before_free_ms=delay_before_free_ms, deterministic=deterministic)
        if fsdp_init_mode != FSDPInitMode.RECURSIVE:
            raise ValueError(UNSUPPORTED_INIT_MODE.format(mode=fsdp_init_mode, model="MixtureOfExperts"))
        model: nn.Module = MixtureOfExperts(group, wrap_fsdp=True, device_init_mode=device_init_mode,
                                            delay_before_free_ms=delay_before_free_ms,
                                            deterministic=deterministic, **(fsdp_kwargs or {}))
        if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
            model = model.to(fsdp_models.DEVICE_TYPE)
        return model


class SkipModule(nn.Module):
    """One bias-free 10 -> 10 linear (``lin``), never wrapped."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.lin(x))


class NestedLinear(nn.Module):
    """One bias-free 10 -> 10 linear on ``DEVICE_TYPE``, passed to
    ``wrap()`` when ``fsdp_wrap`` (FSDP inside an ``enable_wrap`` block,
    itself outside one)."""

    def __init__(self, fsdp_wrap: bool) -> None:
        super().__init__()
        linear = nn.Linear(10, 10, bias=False).to(fsdp_models.DEVICE_TYPE)
        self.nested_linear = _wrap(linear, **_device_kwargs({})) if fsdp_wrap else linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.nested_linear(x))


class SkipModel(nn.Module):
    """``linear`` -> :class:`SkipModule` -> :class:`NestedLinear` (passed to
    ``wrap()``, its linear too when ``double_nest``), on ``DEVICE_TYPE``."""

    def __init__(self, double_nest: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(10, 10, bias=False).to(fsdp_models.DEVICE_TYPE)
        self.linear_skip = SkipModule().to(fsdp_models.DEVICE_TYPE)
        self.nested_linear = _wrap(NestedLinear(fsdp_wrap=double_nest), device_id=fsdp_models.DEVICE_TYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.nested_linear(self.linear_skip(self.linear(x))))
