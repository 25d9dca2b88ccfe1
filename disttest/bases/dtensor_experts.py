"""The expert-parallel styles of upstream's DTensor tests (``common_dtensor``).

Three ``ParallelStyle`` subclasses for :class:`~disttest.bases.dtensor.Experts`
and :class:`~disttest.bases.dtensor.ExpertLayer` (``disttest.bases.dtensor_models``), applied with
``parallelize_module`` (``Transformer.parallelize`` does so when the model
has experts):

- :class:`TensorParallelForExpert`: tensor parallelism inside each expert;
- :class:`ExpertParallel`: the experts split over the ranks;
- :class:`ExpertParallelWithTP`: both, on a 2-D (ep, tp) mesh.

Their hooks run collectives in every rank of the mesh, each time the module
runs forward (and backward). The classes are made when one is first asked
for (their base class is torch's: importing ``torch.distributed.tensor.parallel``
changes ``torch.distributed``, so it never happens at import).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from disttest import _compat

__unittest = True

__all__ = ["ExpertParallel", "ExpertParallelWithTP", "TensorParallelForExpert"]  # noqa: F822 (made on first use)

_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name in __all__:
        if not _built:
            _built.update(_build())
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build() -> dict[str, Any]:
    """The three styles (and their helpers), on torch's ``ParallelStyle``."""
    from torch.distributed.tensor import (
        DeviceMesh,
        DTensor,
        Partial,
        Replicate,
        Shard,
        distribute_module,
        distribute_tensor,
    )
    from torch.distributed.tensor.parallel import ParallelStyle

    def _all_gather_tokens(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        # Every rank's tokens, in rank order, with autograd (backward: reduce-scatter).
        funcol = _compat.functional_collectives()
        return _compat.wait_tensor(funcol.all_gather_single_autograd(x, gather_dim=0, group=mesh.get_group()))  # type: ignore[no-any-return]


    def _reduce_scatter_tokens(out: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        # The sum over ranks, each rank keeping its own tokens' rows.
        funcol = _compat.functional_collectives()
        return _compat.wait_tensor(  # type: ignore[no-any-return]
            funcol.reduce_scatter_single_autograd(out, "sum", scatter_dim=0, group=mesh.get_group()))


    class TensorParallelForExpert(ParallelStyle):
        """Tensor parallelism for :class:`~disttest.bases.dtensor.Experts`:
        ``w1`` sharded on its hidden dimension (``Shard(1)``), ``w2`` on its
        input dimension (``Shard(2)``); each rank's partial sums are reduced to
        ``output_layouts`` (default ``Replicate()``).

        For sequence parallelism pass ``input_layouts=Shard(0)`` and
        ``output_layouts=Shard(0)``: the tokens are all-gathered before the
        experts run and the outputs reduce-scattered after.
        """

        def __init__(self, *, input_layouts: Any = None, output_layouts: Any = None) -> None:
            super().__init__()
            self.input_layouts = input_layouts
            self.output_layouts = output_layouts or Replicate()

        def _partition_fn(self, name: str, mod: nn.Module, device_mesh: DeviceMesh) -> None:
            shard_dims = {"w1": 1, "w2": 2}
            for pn, p in list(mod.named_parameters(recurse=False)):
                if pn in shard_dims:
                    mod.register_parameter(pn, nn.Parameter(distribute_tensor(p, device_mesh, [Shard(shard_dims[pn])])))

        def _input_fn(self, mod: nn.Module, inputs: tuple[Any, ...], device_mesh: DeviceMesh) -> tuple[Any, ...]:
            if self.input_layouts is None:
                return inputs
            x = DTensor.from_local(inputs[0], device_mesh, [self.input_layouts])
            return (x.redistribute(device_mesh, [Replicate()]).to_local(),)

        def _output_fn(self, mod: nn.Module, outputs: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
            partial = DTensor.from_local(outputs, device_mesh, [Partial()])
            return partial.redistribute(device_mesh, [self.output_layouts]).to_local()

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            # NB: torch annotates input_fn/output_fn as returning None; what they
            # return replaces the module's inputs/outputs.
            return distribute_module(module, device_mesh, partition_fn=self._partition_fn,
                                     input_fn=self._input_fn, output_fn=self._output_fn)  # type: ignore[arg-type]


    class ExpertParallel(ParallelStyle):
        """Expert parallelism for :class:`~disttest.bases.dtensor.Experts`:
        every parameter sharded on the expert dimension (``Shard(0)``); the
        tokens of every rank are all-gathered before the experts run (dispatch)
        and their outputs reduce-scattered (summed) back to the rank that owns
        the tokens (combine)."""

        def _partition_fn(self, name: str, mod: nn.Module, device_mesh: DeviceMesh) -> None:
            for pn, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(pn, nn.Parameter(distribute_tensor(p, device_mesh, [Shard(0)])))

        def _token_dispatch(self, mod: nn.Module, inputs: tuple[Any, ...], device_mesh: DeviceMesh) -> tuple[torch.Tensor]:
            (x,) = inputs
            return (_all_gather_tokens(x, device_mesh),)

        def _token_combine(self, mod: nn.Module, output: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
            return _reduce_scatter_tokens(output, device_mesh)

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            return distribute_module(module, device_mesh, partition_fn=self._partition_fn,
                                     input_fn=self._token_dispatch, output_fn=self._token_combine)  # type: ignore[arg-type]


    class ExpertParallelWithTP(ParallelStyle):
        """Expert and tensor parallelism for an
        :class:`~disttest.bases.dtensor.ExpertLayer`.

        The experts' weights go on the 2-D mesh made of ``ep_mesh`` and
        ``tp_mesh`` (slices of one mesh) as ``[Shard(0), Shard(1)]`` (``w1``)
        and ``[Shard(0), Shard(2)]`` (``w2``). Hooks on the layer dispatch and
        combine tokens over ``ep_mesh``; hooks on its experts reduce the partial
        outputs over ``tp_mesh`` (and the input gradients in backward). Forward
        thus runs: EP dispatch, TP input, experts, TP reduce, EP combine. The
        mesh passed to ``parallelize_module`` is not used.
        """

        def __init__(self, ep_mesh: DeviceMesh, tp_mesh: DeviceMesh) -> None:
            super().__init__()
            self.ep_mesh = ep_mesh
            self.tp_mesh = tp_mesh
            self.ep_tp_mesh = _compat.concatenate_meshes([ep_mesh, tp_mesh])

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            experts: Any = module.experts
            placements = {"w1": [Shard(0), Shard(1)], "w2": [Shard(0), Shard(2)]}
            for pn, p in list(experts.named_parameters(recurse=False)):
                if pn in placements:
                    experts.register_parameter(pn, nn.Parameter(distribute_tensor(p, self.ep_tp_mesh, placements[pn])))
            ep_mesh, tp_mesh = self.ep_mesh, self.tp_mesh

            def ep_dispatch(mod: nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.Tensor]:
                (x,) = inputs
                return (_all_gather_tokens(x, ep_mesh),)

            def ep_combine(mod: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
                return _reduce_scatter_tokens(output, ep_mesh)

            def tp_input(mod: nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.Tensor]:
                # Forward: unchanged; backward: the input gradient summed over tp.
                (x,) = inputs
                return (DTensor.from_local(x, tp_mesh, [Replicate()]).to_local(grad_placements=[Partial()]),)

            def tp_reduce(mod: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
                partial = DTensor.from_local(output, tp_mesh, [Partial()])
                return partial.redistribute(tp_mesh, [Replicate()]).to_local()

            module.register_forward_pre_hook(ep_dispatch)
            module.register_forward_hook(ep_combine)
            experts.register_forward_pre_hook(tp_input)
            experts.register_forward_hook(tp_reduce)
            return module

    styles: dict[str, Any] = {"ExpertParallel": ExpertParallel, "ExpertParallelWithTP": ExpertParallelWithTP,
                              "TensorParallelForExpert": TensorParallelForExpert}
    for name, style in styles.items():
        # Found by pickle as this module's attribute (its __getattr__), not as a local of _build.
        style.__module__, style.__qualname__ = __name__, name
    return styles
