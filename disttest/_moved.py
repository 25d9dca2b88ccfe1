"""The flat module paths of disttest 0.1 (``disttest.multiprocess``,
``disttest.fake``, ``disttest.dtensor``...), kept working after the modules
moved into the packages that show the architecture.

``import disttest.fake`` gives the very module object of
``disttest.pg.fake`` (not a copy): ``mock.patch("disttest.fake.X")``,
``isinstance`` and pickling behave as with the new path. An import finder of
disttest's own answers for these names only; it touches nothing of torch's.

NB: the finder is for the interpreter; a static type checker resolves module
paths by files, so typed code should import from ``disttest`` or the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

__unittest = True

__all__ = ["MOVED", "install"]

#: Old flat path (under ``disttest.``) -> the module's home now.
MOVED: dict[str, str] = {
    # the runners
    "case": "disttest.runners.case",
    "multiprocess": "disttest.runners.multiprocess",
    "multithread": "disttest.runners.multithread",
    "continuous": "disttest.runners.continuous",
    "modes": "disttest.runners.modes",
    # the spec's sibling helpers
    "skips": "disttest.support.skips",
    "barrier": "disttest.support.barrier",
    "tempdirs": "disttest.support.tempdirs",
    "stores": "disttest.support.stores",
    "devices": "disttest.support.devices",
    "helpers": "disttest.support.helpers",
    "models": "disttest.support.models",
    "tensors": "disttest.support.tensors",
    "launchers": "disttest.support.launchers",
    # the process groups
    "threaded_pg": "disttest.pg.threaded",
    "fake": "disttest.pg.fake",
    # the bases for torch subsystems
    "backend": "disttest.bases.backend",
    "dtensor": "disttest.bases.dtensor",
    "dtensor_models": "disttest.bases.dtensor_models",
    "fsdp": "disttest.bases.fsdp",
    "fsdp_models": "disttest.bases.fsdp_models",
    "rpc": "disttest.bases.rpc",
    "dynamo": "disttest.bases.dynamo",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # Executed once, under its own name. NB: importlib sets __spec__ to
        # the alias's spec on whatever create_module returned (the other
        # attributes only where missing): the module's own spec goes back, or
        # importlib.reload would do nothing and rename it.
        if self.spec is not None:
            module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != "disttest" or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(MOVED[name]))


_FINDER = _Finder()


def install() -> None:
    """Answer imports of the old paths (once per interpreter)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_FINDER)
