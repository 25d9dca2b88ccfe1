"""State-dict test helpers: upstream's ``common_state_dict`` for disttest's runners.

The names of ``torch.testing._internal.distributed.common_state_dict``, so a
distributed state-dict suite ports by changing one import:

- :class:`VerifyStateDictMixin`: the checks that a distributed (DTensor or
  ShardedTensor) model or optimizer state dict holds the same values as a
  plain model's, for a test case of any disttest runner;
- :class:`FusionEmbedding`, :class:`FusionEmbeddingWithHook`,
  :class:`FusionEmbeddingWithModifier`: the reference models whose state
  dict keys differ from their parameters' names;
- ``DTensor``, ``ShardedTensor``, ``StateDictOptions``, ``set_state_dict``:
  torch's, handed on as upstream does.

Importing this module does no tensor work and changes nothing in torch.
"""

from __future__ import annotations

import copy
import unittest
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from disttest import _compat

__unittest = True

__all__ = [  # noqa: F822 (torch's names come through __getattr__)
    "DTensor",
    "FusionEmbedding",
    "FusionEmbeddingWithHook",
    "FusionEmbeddingWithModifier",
    "ShardedTensor",
    "StateDictOptions",
    "VerifyStateDictMixin",
    "set_state_dict",
]

if TYPE_CHECKING:
    # These torch packages are imported when first needed, never at import
    # (importing them changes torch.distributed); ``torch.distributed._shard``
    # is private and reached through disttest._compat only.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    from torch.distributed.tensor import DTensor

    _Case = unittest.TestCase
else:
    _Case = object


def _distributed_types() -> tuple[type, ...]:
    from torch.distributed.tensor import DTensor

    return (DTensor, _compat.shard_api().sharded_tensor.ShardedTensor)


def __getattr__(name: str) -> Any:
    # torch's names handed on, as upstream's module does, imported when asked for.
    if name == "DTensor":
        from torch.distributed.tensor import DTensor

        return DTensor
    if name == "ShardedTensor":
        return _compat.shard_api().sharded_tensor.ShardedTensor
    if name in ("StateDictOptions", "set_state_dict"):
        import torch.distributed.checkpoint.state_dict as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The keys of an optimizer state dict (``torch.optim.Optimizer.state_dict``).
_STATE = "state"
_PG = "param_groups"

MISMATCH = "{fqn} has mismatched value {orig} {dist}"
NOT_CLOSE = (
    "the distributed value ({dist_type}, gathered: shape {dist_shape}) is not close to the "
    "original ({orig_shape}) (disttest)"
)


class VerifyStateDictMixin(_Case):
    """Checks of distributed state dicts against a plain model's, for a test
    case (mix it into any disttest base, before the base).

    Each check runs in the rank that calls it; a DTensor or ShardedTensor is
    gathered into a full tensor first, which is a collective over its group:
    call the checks in every rank. A difference fails the test with an
    AssertionError that names the key.
    """

    def _compare_tensor(self, orig_tensor: torch.Tensor, dist_tensor: Any,
                        offload_to_cpu: bool = False) -> None:
        """Check that ``dist_tensor`` (gathered if distributed) is a tensor close
        to ``orig_tensor`` (both moved to CPU first if ``offload_to_cpu``)."""
        dist_type = type(dist_tensor).__name__
        if isinstance(dist_tensor, _distributed_types()):
            dist_tensor = _compat.gather_state_dict({"mykey": dist_tensor}).pop("mykey")
        if offload_to_cpu:
            orig_tensor = orig_tensor.cpu()
            dist_tensor = dist_tensor.cpu()
        self.assertTrue(isinstance(dist_tensor, torch.Tensor),
                        f"expected a tensor, got {dist_type} (disttest)")
        self.assertTrue(
            torch.allclose(orig_tensor, dist_tensor),
            NOT_CLOSE.format(dist_type=dist_type, dist_shape=tuple(dist_tensor.shape),
                             orig_shape=tuple(orig_tensor.shape)),
        )

    def _verify_msd(self, msd: dict[str, Any], dist_msd: dict[str, Any],
                    options: StateDictOptions | None = None, offload_to_cpu: bool = False) -> None:
        """Check a distributed model state dict against the plain one ``msd``.

        With ``options.ignore_frozen_params`` a key missing from ``dist_msd``
        must be a frozen parameter; otherwise both hold the same keys.
        """
        ignore_frozen = options is not None and options.ignore_frozen_params
        if not ignore_frozen:
            self.assertEqual(len(msd), len(dist_msd))
        for fqn, param in msd.items():
            dist_param = dist_msd.get(fqn)
            if not ignore_frozen:
                self.assertIsNotNone(dist_param, f"{fqn=}")
                try:
                    self._compare_tensor(param, dist_param, offload_to_cpu)
                except AssertionError as e:
                    raise AssertionError(MISMATCH.format(fqn=fqn, orig=param, dist=dist_param)) from e
            elif dist_param is None:
                self.assertFalse(param.requires_grad, f"{fqn=}")

    def _verify_osd(self, model: nn.Module, optim: torch.optim.Optimizer,
                    osd: dict[str, Any], dist_osd: dict[str, Any]) -> None:
        """Check a distributed optimizer state dict (keyed by parameter name)
        against ``osd``, the plain ``optim.state_dict()`` of ``model``
        (keyed by parameter index).

        NB: upstream's compares each plain state with itself (it looks the
        key up in the plain states), so its values are never checked; this
        compares each with the distributed one, gathered, on the CPU (the
        two may live on different devices, as with ``cpu_offload``). A
        suite whose distributed optimizer state differs from the plain one
        passes upstream and fails here, naming the parameter and state."""
        params = list(chain.from_iterable(g["params"] for g in optim.param_groups))
        param_pid_mapping = dict(zip(params, range(len(params)), strict=True))
        fqn_pid_mapping: dict[Any, Any] = {}
        for fqn, param in model.named_parameters():
            pid = param_pid_mapping[param]
            fqn_pid_mapping[fqn] = pid
            fqn_pid_mapping[pid] = fqn

        self.assertEqual(len(osd[_STATE]), len(dist_osd[_STATE]))
        for pid, states in osd[_STATE].items():
            fqn = fqn_pid_mapping[pid]
            dist_states = dist_osd[_STATE].get(fqn, None)
            self.assertIsNotNone(dist_states, fqn)
            self.assertEqual(len(states), len(dist_states))
            for key, state in states.items():
                # NB: upstream looks the key up in ``states`` (so compares
                # each value with itself); this compares with the
                # distributed one.
                dist_state = dist_states.get(key, None)
                self.assertIsNotNone(dist_state, f"{fqn}: {key}")
                try:
                    self._compare_tensor(state, dist_state, offload_to_cpu=isinstance(state, torch.Tensor)
                                         and isinstance(dist_state, torch.Tensor))
                except AssertionError as e:  # which parameter, which state
                    raise self.failureException(f"{fqn}: {key}: {e}") from None

        # Several distributed param groups may stand for one plain group.
        old_dist_osd_pg = dist_osd[_PG]
        if len(osd[_PG]) != len(dist_osd[_PG]):
            self.assertTrue(len(dist_osd[_PG]) > len(osd[_PG]))
            new_pg = copy.deepcopy(dist_osd[_PG][0])
            new_pg["params"] = []
            for dist_group in dist_osd[_PG]:
                new_pg["params"].extend(dist_group["params"])
            dist_osd[_PG] = [new_pg]
        try:
            self.assertEqual(len(osd[_PG]), len(dist_osd[_PG]))
            for group, dist_group in zip(osd[_PG], dist_osd[_PG], strict=True):
                self.assertEqual(len(group), len(dist_group))
                for key, value in group.items():
                    # NB: not dist_group.get(key): param groups may hold None.
                    dist_value = dist_group[key]
                    if key == "params":
                        fqns = [fqn_pid_mapping[pid] for pid in value]
                        self.assertEqual(sorted(fqns), sorted(dist_value))
                    else:
                        self.assertEqual(value, dist_value)
        finally:
            dist_osd[_PG] = old_dist_osd_pg

    def _verify_osd_by_load(self, model: nn.Module, optim: torch.optim.Optimizer,
                            new_optim: torch.optim.Optimizer, dist_osd: dict[str, Any]) -> None:
        """Check ``dist_osd`` by loading it (gathered) into ``new_optim`` with
        ``set_state_dict``: its state dict must then equal ``optim``'s."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        new_dist_osd = _compat.gather_state_dict(dist_osd)
        set_state_dict(model, optimizers=new_optim, model_state_dict={}, optim_state_dict=new_dist_osd)
        self.assertEqual(optim.state_dict(), new_optim.state_dict())


class FusionEmbedding(nn.Module):
    """Two embeddings in one module: ``embedding`` (``vocab_size`` rows) and
    ``fusion_embedding`` (``fusion_vocab_size`` rows), of ``embed_dim``."""

    def __init__(self, vocab_size: int, fusion_vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.fusion_embedding = nn.Embedding(fusion_vocab_size, embed_dim)


class FusionEmbeddingWithHook(nn.Module):
    """:class:`FusionEmbedding` whose state dict keeps the key of the embedding
    it replaced: ``weight``, not ``embedding.weight`` (state-dict hooks map
    the key both ways)."""

    def __init__(self, vocab_size: int, fusion_vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.fusion_embedding = nn.Embedding(fusion_vocab_size, embed_dim)
        # (torch's hook registrations are unannotated)
        self.register_state_dict_post_hook(FusionEmbeddingWithHook._state_dict_hook)  # type: ignore[no-untyped-call]
        self.register_load_state_dict_pre_hook(  # type: ignore[no-untyped-call]
            FusionEmbeddingWithHook._load_state_dict_hook)

    def _state_dict_hook(self, destination: dict[str, Any], prefix: str, *args: Any) -> None:
        """Rename ``embedding.weight`` to ``weight``: the key from before the fusion."""
        key = prefix + "embedding.weight"
        destination[prefix + "weight"] = destination.pop(key)

    def _load_state_dict_hook(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Rename ``weight`` back to ``embedding.weight`` before loading."""
        if state_dict:
            key = prefix + "weight"
            state_dict[prefix + "embedding.weight"] = state_dict.pop(key)


class FusionEmbeddingWithModifier(FusionEmbeddingWithHook):
    """:class:`FusionEmbeddingWithHook` that also tells distributed state dict
    how its keys map to parameter names (``_fqn_modifiers``, the contract of
    ``torch.distributed.checkpoint.state_dict``)."""

    def _fqn_modifiers(self) -> dict[str, str]:
        """``{state dict key: the submodule name it drops}``."""
        return {"weight": "embedding"}
