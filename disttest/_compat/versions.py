"""Which torch is installed, and which version-dependent API it has.

``TORCH_FEATURES`` names each version-dependent API with the first torch
release that has it; ``missing_feature`` turns a missing one into the reason
a test skips ("needs torch >= 2.10").
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

__unittest = True

__all__ = [
    "FEATURE_MISSING",
    "TORCH_FEATURES",
    "has_feature",
    "missing_feature",
    "torch_at_least",
    "torch_version",
]


#: Version-dependent torch API: feature -> (the first torch release that has
#: it, the dotted name probed). Versions read from the released wheels
#: (2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0-2.13.0, 2.14.1). torch before
#: 2.7 is not supported (README, "Supported platforms"); the fallbacks below
#: for older releases only keep ``import disttest`` working there.
TORCH_FEATURES: dict[str, tuple[str, str]] = {
    "torch.accelerator": ("2.6", "torch.accelerator"),
    "dist.all_gather_single": ("2.13", "torch.distributed.all_gather_single"),
    "dist.reduce_scatter_single": ("2.13", "torch.distributed.reduce_scatter_single"),
    "funcol.all_gather_single": ("2.13", "torch.distributed._functional_collectives.all_gather_single"),
    "Backend.FAKE": ("2.11", "torch.distributed.Backend.FAKE"),
    "dist.get_default_backend_for_device": ("2.6", "torch.distributed.get_default_backend_for_device"),
    "dist.is_xccl_available": ("2.6", "torch.distributed.is_xccl_available"),
}


FEATURE_MISSING = "needs torch >= {version} ({feature}; this is torch {installed})"


def torch_version() -> str:
    """The installed torch's version, without a local part (``2.8.0``)."""
    import torch

    return str(torch.__version__).split("+")[0]


def torch_at_least(version: str) -> bool:
    """True when the installed torch is ``version`` (``"2.7"``) or newer."""
    import torch

    return _at_least(str(torch.__version__), version)


@functools.cache
def _at_least(installed: str, version: str) -> bool:
    # (Cached: a thread test asks twice.)
    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())

    return parts(installed) >= parts(version)


def _probe(dotted: str) -> bool:
    """Whether ``dotted`` (a module, or an attribute reached from one) exists.
    Walks down from the top, importing a submodule only where no attribute
    has the name: trying the longest name as a module first cost a failed
    import for each attribute part (a rank probes at every start)."""
    import importlib

    parts = dotted.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except ImportError:
        return False
    for i, name in enumerate(parts[1:], start=2):
        # NB: a submodule comes first, as an import of the dotted name would
        # give it: a package may shadow it with an attribute of the same name
        # (``from .fully_shard import fully_shard``).
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            continue
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        if not isinstance(obj, types.ModuleType):
            return False
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return False
    return True


_probed: dict[str, bool] = {}  # dotted name -> found (torch does not change in a process)


def has_feature(feature: str) -> bool:
    """True when the installed torch has ``feature`` (a key of TORCH_FEATURES)."""
    dotted = TORCH_FEATURES[feature][1]
    found = _probed.get(dotted)
    if found is None:  # NB: once per name: a threaded test asks at every start
        found = _probed[dotted] = _probe(dotted)
    return found


def missing_feature(feature: str) -> str | None:
    """None when the installed torch has ``feature``; else the skip reason,
    naming the torch version it needs (``FEATURE_MISSING``)."""
    if feature not in TORCH_FEATURES:
        raise KeyError(f"unknown torch feature {feature!r}; expected one of {sorted(TORCH_FEATURES)} (disttest)")
    if has_feature(feature):
        return None
    return FEATURE_MISSING.format(version=TORCH_FEATURES[feature][0], feature=feature, installed=torch_version())
