"""The whole upstream testing surface (issue 25): every public name of
torch's private distributed testing modules, as the installed wheel defines
them, has a home in disttest that ``python -m disttest.migrate`` finds."""

from __future__ import annotations

import ast
import os
import unittest

import torch

from disttest.migrate._cli import HOMES
from disttest.migrate._homes import PREFIX
from disttest.migrate._rewrite import _home_for, module_names

INTERNAL = os.path.join(os.path.dirname(torch.__file__), "testing", "_internal")
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


def _path(module: str) -> str:
    base = os.path.join(INTERNAL, *module.split("."))
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def upstream_names(module: str) -> set[str]:
    """The names ``module`` defines, and those it hands on from the other
    modules of the list, read from its source (nothing of it is imported)."""
    with open(_path(module)) as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    for node in tree.body:
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


class SurfaceTest(unittest.TestCase):
    def test_every_public_name_has_a_disttest_home(self):
        offers = module_names(HOMES)
        missing = {}
        for module in MODULES:
            if not os.path.exists(_path(module)):
                continue  # not in this torch
            lost = sorted(n for n in upstream_names(module) if _home_for(module, n, offers) is None)
            if lost:
                missing[module] = lost
        self.assertEqual(missing, {}, "names without a disttest home")

    def test_the_enumeration_reads_what_it_should(self):
        self.assertIn("MultiProcessTestCase", upstream_names("common_distributed"))
        self.assertIn("skip_if_lt_x_gpu", upstream_names("distributed._tensor.common_dtensor"))  # handed on
        self.assertNotIn("AllReduce", upstream_names("distributed.multi_threaded_pg"))
        self.assertNotIn("torch", upstream_names("common_fsdp"))


if __name__ == "__main__":
    unittest.main()
