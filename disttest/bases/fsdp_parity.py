"""FSDP1's parity check of upstream's ``FSDPTestMixin``: a model trained for
a few steps under FSDP against the same model trained under DDP (or a
reference wrapper the test gives), their losses and parameters compared.

:class:`~disttest.bases.fsdp.FSDPTestMixin` takes the two functions below as
its methods ``_train_for_several_steps`` and ``_test_fsdp_parity``, under
upstream's names and arguments, so an FSDP1 suite that calls them ports by
its imports. They run inside a rank, in the test's default group; on a host
without accelerators the models live on the CPU (gloo), where upstream's
``FSDPTest`` skips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from disttest import _compat
from disttest.bases import fsdp_models
from disttest.bases.fsdp_helpers import get_full_params
from disttest.bases.fsdp_models import DEVICEInitMode, FSDPInitMode

__unittest = True

__all__ = ["NO_FSDP_MODE", "OFFLOADED_ON_DEVICE", "test_fsdp_parity", "train_for_several_steps"]

#: Why ``_test_fsdp_parity`` refuses ``FSDPInitMode.NO_FSDP``.
NO_FSDP_MODE = "Expects an FSDP init mode that wraps with FSDP"
#: What FSDP raises (and the check expects) for parameters offloaded to the
#: CPU that were moved to the device after wrapping.
OFFLOADED_ON_DEVICE = "An FSDP-managed module with parameter CPU offloading enabled has parameters on {device}"


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _halved(inputs: Any) -> Any:
    return inputs.half() if isinstance(inputs, torch.Tensor) else tuple(x.half() for x in inputs)


def _zero_and_reload(model: nn.Module) -> None:
    """Save ``model``'s state, zero its parameters (all of them, unsharded)
    and load the state back: a save and load that lost anything breaks the
    parity that follows."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    state = {name: value.clone() for name, value in model.state_dict().items()}
    gather = FullyShardedDataParallel.summon_full_params(model) if _is_fsdp(model) else contextlib.nullcontext()
    with gather, torch.no_grad():
        for param in model.parameters():
            param.zero_()
    model.load_state_dict(state)


def train_for_several_steps(self: Any, model: nn.Module, num_steps: int, autocast: bool, lr: float = 0.01,
                            fsdp_cpu_offload: Any = None, save_model: bool = False, mixed_precision: Any = None,
                            enable_sharded_grad_scaler: bool = False, use_pure_fp16: bool = False,
                            sharded_grad_scaler_kwargs: dict[str, Any] | None = None) -> torch.Tensor:
    """Train ``model`` (an FSDP or DDP wrapper of an ``FSDPTestModel``) for
    ``num_steps`` steps of SGD with momentum; return the last loss, detached.

    Checks on the way, as upstream's: parameters offloaded to the CPU stay
    there after forward (unless the strategy keeps them unsharded) and
    after backward; the loss is float32, float16 under ``use_pure_fp16``,
    and FSDP's under mixed precision the precision's parameter dtype. With
    ``save_model`` each step ends by saving the state, zeroing the
    parameters and loading the state back. An FSDP model ends idle."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    device = torch.device(fsdp_models.DEVICE_TYPE)
    offloaded = bool(fsdp_cpu_offload is not None and fsdp_cpu_offload.offload_params)
    is_fsdp = _is_fsdp(model)
    model_device = next(model.parameters()).device
    scaler = ShardedGradScaler(enabled=enable_sharded_grad_scaler, **(sharded_grad_scaler_kwargs or {}))
    # (SGD with momentum: Adam is invariant to the loss's scale, which would hide differences)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    inner: Any = model.module
    loss: torch.Tensor | None = None
    for _ in range(num_steps):
        optimizer.zero_grad()
        with torch.amp.autocast(device.type, enabled=autocast):
            inputs = inner.get_input(device)  # on the device, offloaded or not
            if use_pure_fp16 or (mixed_precision is not None and not is_fsdp):
                inputs = _halved(inputs)
            output = model(*inputs)
            if offloaded and is_fsdp and model.sharding_strategy not in _compat.no_reshard_after_forward_strategies():
                for param in model.parameters():
                    self.assertEqual(param.device, torch.device("cpu"))
            loss = inner.get_loss(inputs, output).to(model_device)
        loss = scaler.scale(loss)
        if use_pure_fp16:
            self.assertEqual(loss.dtype, torch.float16)
        elif mixed_precision is not None and is_fsdp:
            self.assertEqual(loss.dtype, mixed_precision.param_dtype)
        elif loss.dtype != torch.float32:
            raise AssertionError("loss data type should be float32, as the original parameter data type is float32.")
        inner.run_backward(loss)
        if offloaded and is_fsdp:
            for param in model.parameters():
                self.assertEqual(param.device, torch.device("cpu"))
        scaler.step(optimizer)
        scaler.update()
        if save_model:
            _zero_and_reload(model)
    if is_fsdp:
        _compat.assert_fsdp_idle(model)
    if loss is None:
        raise ValueError(f"_train_for_several_steps: num_steps={num_steps!r}, expected at least 1 (disttest)")
    return loss.detach()


def _reference(model: nn.Module, rank: int, ref_init_fn: Callable[[nn.Module], nn.Module] | None) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    if ref_init_fn is not None:
        return ref_init_fn(model)
    device_type = fsdp_models.DEVICE_TYPE
    if device_type == "cpu":
        return DistributedDataParallel(model)
    if device_type == "hpu":
        return DistributedDataParallel(model, device_ids=[device_type], output_device=device_type)
    return DistributedDataParallel(model, device_ids=[rank], output_device=rank)


def test_fsdp_parity(self: Any, model_class: Any, fsdp_init_mode: FSDPInitMode, device_init_mode: DEVICEInitMode,
                     ref_init_fn: Callable[[nn.Module], nn.Module] | None = None, num_iters: int = 2,
                     save_model: bool = True, cpu_offload: Any = None, backward_prefetch: Any = None,
                     sharding_strategy: Any = None, mixed_precision: Any = None, forward_prefetch: bool = False,
                     use_orig_params: bool = False, enable_sharded_grad_scaler: bool = False,
                     use_pure_fp16: bool = False, init_kwargs: dict[str, Any] | None = None,
                     sharded_grad_scaler_kwargs: dict[str, Any] | None = None, **fsdp_kwargs: Any) -> None:
    """Train ``model_class`` (an ``FSDPTestModel``) for ``num_iters`` steps
    under DDP (or ``ref_init_fn``'s wrapper) and under FSDP built with
    ``fsdp_init_mode``, ``device_init_mode`` and the FSDP options given;
    fail unless the losses match and, without mixed precision or pure fp16,
    the parameters (FSDP's unsharded) match DDP's (``assertEqual``'s tolerances), devices
    included. Offloaded parameters must be on the CPU; offloaded ones moved
    to the device after wrapping must make FSDP raise, and then nothing is
    compared."""
    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel

    if fsdp_init_mode == FSDPInitMode.NO_FSDP:
        raise AssertionError(NO_FSDP_MODE)
    cpu_offload = CPUOffload() if cpu_offload is None else cpu_offload
    init_kwargs = init_kwargs or {}
    lr = 1e-2
    group = self.process_group
    train = dict(lr=lr, fsdp_cpu_offload=cpu_offload, mixed_precision=mixed_precision,
                 enable_sharded_grad_scaler=enable_sharded_grad_scaler, use_pure_fp16=use_pure_fp16,
                 sharded_grad_scaler_kwargs=sharded_grad_scaler_kwargs)
    plain = model_class.init(group, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE, deterministic=True,
                             **init_kwargs)
    reference = _reference(plain, group.rank(), ref_init_fn)
    if use_pure_fp16:
        reference = reference.half()
    ref_loss = self._train_for_several_steps(reference, num_iters, autocast=mixed_precision is not None, **train)
    ref_params = list(reference.parameters())

    fsdp_kwargs.update(cpu_offload=cpu_offload, backward_prefetch=backward_prefetch,
                       sharding_strategy=sharding_strategy, mixed_precision=mixed_precision,
                       forward_prefetch=forward_prefetch, use_orig_params=use_orig_params)
    try:
        wrapped = model_class.init(group, fsdp_init_mode, device_init_mode, fsdp_kwargs, deterministic=True,
                                   **init_kwargs)
    except Exception as e:
        raise ValueError(f"Initializing {model_class} raised error {e}") from e
    if not isinstance(wrapped, FullyShardedDataParallel):
        # (compared as data parallel: the root must be FSDP, which some models' init() leaves out)
        wrapped = FullyShardedDataParallel(wrapped, group, **fsdp_models._device_kwargs(fsdp_kwargs))
    if use_pure_fp16:
        wrapped = wrapped.half()
    if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
        wrapped = wrapped.to(fsdp_models.DEVICE_TYPE)
    offloaded = bool(cpu_offload.offload_params)
    raises = offloaded and device_init_mode == DEVICEInitMode.DEVICE_AFTER
    if offloaded and not raises:
        for param in wrapped.parameters():
            self.assertEqual(param.device, torch.device("cpu"))
    expected = (self.assertRaisesRegex(RuntimeError, OFFLOADED_ON_DEVICE.format(device=fsdp_models.DEVICE_TYPE))
                if raises else contextlib.nullcontext())
    with expected:
        fsdp_loss = self._train_for_several_steps(wrapped, num_iters, autocast=False, save_model=save_model, **train)
    if raises:
        return
    if offloaded:
        for param in wrapped.parameters():
            self.assertEqual(param.device, torch.device("cpu"))
        fsdp_loss = fsdp_loss.to(fsdp_models.DEVICE_TYPE)
    unsharded = get_full_params(wrapped)
    # (dtypes may differ: DDP's loss under autocast is float32, FSDP's the precision's)
    torch.testing.assert_close(ref_loss, fsdp_loss, check_dtype=False)
    # (not under mixed precision or pure fp16: the two keep and step their
    # parameters in different dtypes)
    if mixed_precision is None and not use_pure_fp16:
        self.assertEqual(ref_params, unsharded, exact_device=True, msg="FSDP did not match DDP")
