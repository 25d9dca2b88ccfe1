"""The public names of torch's private distributed testing modules (issue 25),
read from their source, never imported: one enumeration for the installed
wheel and for any other torch's sources.

``tests/surface_names.json`` records the names of every torch release in
disttest's supported range (``{torch_version: {module: [names]}}``, names
only); ``tests/test_surface.py`` checks that each has a disttest home.

Regenerate it from a directory holding one folder per release, each the root
of that release's files (``<dir>/<version>/torch/testing/_internal/...``)::

    python tests/surface_names.py /tmp/torchsrc            # rewrites the JSON
    python tests/surface_names.py /tmp/torchsrc --check    # exits 1 if stale

The sources need not be installed. A wheel carries them; the macOS arm64
wheels are CPU-only (70 to 130 MB), and only ``torch/testing/_internal`` is
read, for example::

    pip download torch==2.8.0 --no-deps --only-binary=:all: \\
        --platform macosx_14_0_arm64 --python-version 3.11 -d /tmp/whl
    unzip -q /tmp/whl/torch-2.8.0-*.whl 'torch/testing/_internal/*' -d /tmp/torchsrc/2.8.0

(2.7 to 2.11 ship for ``macosx_11_0_arm64``, 2.12 on for ``macosx_14_0_arm64``.)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

from disttest.migrate._homes import PREFIX

#: The recorded names, next to this file.
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "surface_names.json")
#: The modules of the issue, as paths under torch/testing/_internal.
MODULES = (
    "common_distributed", "dist_utils", "common_fsdp", "common_dist_composable",
    "distributed.distributed_utils", "distributed.fake_pg", "distributed.multi_threaded_pg",
    "distributed._tensor.common_dtensor", "distributed.checkpoint_utils", "distributed.common_state_dict",
    "distributed._shard.sharded_tensor", "distributed._shard.sharded_tensor._test_st_common",
    "distributed._shard.sharded_tensor._test_ops_common", "distributed._shard.test_common",
)
#: Names no test imports: the threaded group's collective implementations.
NOT_OFFERED = {
    "distributed.multi_threaded_pg": {"AllGather", "AllReduce", "AllToAll", "AllToAllBase", "Barrier",
                                      "Broadcast", "Collective", "Gather", "ReduceScatter", "Scatter",
                                      "bitwise_reduce_ops", "flatten_list", "ret_work", "ThreadLocalWorld",
                                      "WorldData"},
}
#: Underscored names that upstream's tests import, so they count.
UNDERSCORED = {"_chunk_sharding_specs_list_for_test", "_install_threaded_pg", "_uninstall_threaded_pg",
               "_create_fake_pg", "_dynamo_dist_per_rank_init"}


def installed_root() -> str:
    """The folder that holds the installed torch package (``<root>/torch``)."""
    import torch

    return os.path.dirname(os.path.dirname(torch.__file__))


def module_path(module: str, root: str | None = None) -> str:
    """The source file of ``module`` under ``root`` (default: the installed torch's)."""
    base = os.path.join(root or installed_root(), "torch", "testing", "_internal", *module.split("."))
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def names_in_source(module: str, source: str) -> set[str]:
    """The names ``module``'s ``source`` defines, and those it hands on from
    the other modules of the list."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX + "."):
            if node.module[len(PREFIX) + 1:] in MODULES:
                names |= {a.asname or a.name for a in node.names if a.name != "*"}
    return {n for n in names if not n.startswith("_") or n in UNDERSCORED} - NOT_OFFERED.get(module, set())


def upstream_names(module: str, root: str | None = None) -> set[str] | None:
    """The names of ``module`` in the torch under ``root`` (default: the
    installed one), read from its source; None where that torch lacks it."""
    path = module_path(module, root)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return names_in_source(module, f.read())


def surface(root: str | None = None) -> dict[str, list[str]]:
    """``{module: sorted names}`` for every module of the list that the torch under ``root`` has."""
    found = {m: upstream_names(m, root) for m in MODULES}
    return {m: sorted(names) for m, names in found.items() if names is not None}


def recorded() -> dict[str, dict[str, list[str]]]:
    """The names recorded in ``surface_names.json``, by torch version."""
    with open(DATA) as f:
        data: dict[str, dict[str, list[str]]] = json.load(f)
    return data


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split("."))


def enumerate_sources(sources: str) -> dict[str, dict[str, list[str]]]:
    """``{version: surface}`` for every ``<sources>/<version>/`` that holds torch's testing modules."""
    versions = [v for v in os.listdir(sources)
                if os.path.isdir(os.path.join(sources, v, "torch", "testing", "_internal"))]
    return {v: surface(os.path.join(sources, v)) for v in sorted(versions, key=_version_key)}


def _dumps(data: dict[str, dict[str, list[str]]]) -> str:
    """JSON with one line per module, so a diff shows which module changed."""
    versions = []
    for version, modules in data.items():
        lines = [f"  {json.dumps(m)}: {json.dumps(names)}" for m, names in modules.items()]
        versions.append(f" {json.dumps(version)}: {{\n" + ",\n".join(lines) + "\n }")
    return "{\n" + ",\n".join(versions) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", help="a folder of <version>/torch/testing/_internal/ trees")
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON differs, write nothing")
    parser.add_argument("--output", default=DATA, help=f"where to write (default: {DATA})")
    args = parser.parse_args(argv)
    data = enumerate_sources(args.sources)
    if not data:
        parser.error(f"no <version>/torch/testing/_internal/ under {args.sources}")
    text = _dumps(data)
    if args.check:
        with open(args.output) as f:
            stale = f.read() != text
        print(f"{args.output} is {'stale' if stale else 'up to date'} for {', '.join(data)}")
        return int(stale)
    with open(args.output, "w") as f:
        f.write(text)
    for version, modules in data.items():
        print(version, sum(len(n) for n in modules.values()), "names in", len(modules), "modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
