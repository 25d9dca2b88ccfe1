"""The disttest/_compat/ package is the one place that touches private torch
API, and importing disttest leaves torch as it found it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap
import unittest

import torch.distributed as dist

from disttest import _compat
from disttest.pg.fake import BACKEND as MOCK_BACKEND
from disttest.pg.fake import with_dist
from disttest.pg.threaded import BACKEND as THREADED_BACKEND
from disttest.pg.threaded import install_threaded_pg, uninstall_threaded_pg

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "disttest"
COMPAT = PACKAGE / "_compat"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_torch_uses(source: str) -> list[str]:
    """Where ``source`` reaches a private torch name: a private module in an
    import, a private name imported from torch, or ``x._name`` on a name
    bound to a torch module or object."""
    tree = ast.parse(source)
    bound: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    bound.add(alias.asname or "torch")
                    if any(map(_private, alias.name.split("."))):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            module = node.module or ""
            if any(map(_private, module.split("."))):
                found.append(f"line {node.lineno}: from {module}")
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def exempt(path: pathlib.Path) -> bool:
    """Whether ``path`` is a module of the ``disttest/_compat/`` package,
    the one place allowed to touch private torch API."""
    return path.parent == COMPAT and path.suffix == ".py"


class PrivateApiTest(unittest.TestCase):
    def test_only_compat_touches_private_torch_names(self):
        offenders = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            if not exempt(path):
                uses = private_torch_uses(path.read_text())
                if uses:
                    offenders[str(path.relative_to(PACKAGE.parent))] = uses
        self.assertEqual(offenders, {}, "private torch API outside disttest/_compat/")

    def test_the_exemption_is_exactly_the_compat_package(self):
        # The package's own modules, and no file elsewhere that shares a
        # name with it or with one of its modules.
        files = sorted(PACKAGE.rglob("*.py"))
        self.assertEqual(sorted(p for p in files if exempt(p)), sorted(COMPAT.glob("*.py")))
        self.assertIn(COMPAT / "__init__.py", files)
        self.assertFalse((PACKAGE / "_compat.py").exists(), "a _compat.py beside the package")
        for path in (PACKAGE / "_compat.py", PACKAGE / "pg" / "_compat.py", PACKAGE / "bases" / "local_speedups.py",
                     PACKAGE / "_compat" / "inner" / "deeper.py", PACKAGE.parent / "tests" / "_compat" / "c10d.py"):
            self.assertFalse(exempt(path), path)

    def test_the_compat_package_is_scanned_and_uses_private_names(self):
        # The exemption is needed: the scan finds private use in the package
        # (were it empty, the exemption would hide nothing and prove nothing).
        found = {p.name for p in COMPAT.glob("*.py") if private_torch_uses(p.read_text())}
        self.assertIn("local_speedups.py", found)
        self.assertIn("backends.py", found)

    def test_the_scan_finds_each_kind_of_use(self):
        source = textwrap.dedent("""
            import torch._dynamo
            import torch.distributed as dist
            from torch._C import _distributed_c10d
            from torch.distributed import _functional_collectives
            x = dist.distributed_c10d._get_default_group()
            y = dist.Backend.__name__
        """)
        uses = private_torch_uses(source)
        self.assertEqual(len(uses), 5, uses)
        self.assertIn("line 6: dist.distributed_c10d._get_default_group", uses)

    def test_the_scan_finds_use_in_a_function_and_through_an_alias(self):
        # Lazy imports inside functions, as the compat modules write them.
        source = textwrap.dedent("""
            def f():
                import torch.distributed as dist
                from torch.distributed import distributed_c10d as c10d
                from torch._C._distributed_c10d import FakeProcessGroup
                from torch.utils import _pytree
                return dist.Backend._plugins, c10d._world, torch.ok
        """)
        uses = private_torch_uses(source)
        self.assertEqual(uses, [
            "line 5: from torch._C._distributed_c10d",
            "line 6: from torch.utils import _pytree",
            "line 7: dist.Backend._plugins",
            "line 7: c10d._world",
        ])


class CompatFunctionsTest(unittest.TestCase):
    """Each private API that _compat reaches exists in the installed torch."""

    def test_register_backend_undo_restores_everything(self):
        def state():
            b = dist.Backend
            return (list(b.backend_list), dict(b.backend_type_map), dict(b.backend_capability),
                    dict(b._plugins), dict(b.default_device_backend_map), "DISTTEST_PROBE" in b.__dict__)

        before = state()
        undo = _compat.register_backend("disttest_probe", lambda *a: None, ["cpu"])
        self.assertIn("disttest_probe", dist.Backend.backend_list)
        self.assertIsNotNone(_compat.backend_creator("disttest_probe"))
        self.assertIn("disttest_probe", _compat.registered_backend_names())
        undo()
        self.assertEqual(state(), before)
        self.assertIsNone(_compat.backend_creator("disttest_probe"))

    def test_register_backend_undo_puts_back_a_previous_plugin(self):
        first = _compat.register_backend("disttest_probe", "first", ["cpu"])
        try:
            second = _compat.register_backend("disttest_probe", "second", ["cpu"])
            self.assertEqual(_compat.backend_creator("disttest_probe"), "second")
            second()
            self.assertEqual(_compat.backend_creator("disttest_probe"), "first")
        finally:
            first()

    def test_threaded_backend_exists_only_while_a_world_is_installed(self):
        from disttest.pg.threaded import _create

        # (torch's own multi_threaded_pg, if a test imported it, registers "threaded" too)
        before = (THREADED_BACKEND in dist.Backend.backend_list, _compat.backend_creator(THREADED_BACKEND))
        self.assertIsNot(before[1], _create)
        install_threaded_pg()
        try:
            self.assertIn(THREADED_BACKEND, dist.Backend.backend_list)
            self.assertIs(_compat.backend_creator(THREADED_BACKEND), _create)
        finally:
            uninstall_threaded_pg()
        after = (THREADED_BACKEND in dist.Backend.backend_list, _compat.backend_creator(THREADED_BACKEND))
        self.assertEqual(after, before)

    def test_fake_backend_and_wrappers_exist_only_inside_with_dist(self):
        original = dist.broadcast_object_list
        with with_dist(rank=0, world_size=2):
            self.assertIn(MOCK_BACKEND, dist.Backend.backend_list)
            self.assertIsNot(dist.broadcast_object_list, original)
        self.assertNotIn(MOCK_BACKEND, dist.Backend.backend_list)
        self.assertIs(dist.broadcast_object_list, original)

    def test_lazy_dtensor_comparison(self):
        # assert_close leaves torch.distributed.tensor unloaded while nothing
        # imported it, and compares DTensors as torch does once it is loaded.
        script = textwrap.dedent("""
            import sys, tempfile, torch, torch.distributed as dist
            from torch.testing._comparison import _unwrap_dtensor_for_comparison as original
            import torch.testing._comparison as comparison
            from disttest import _compat
            undo = _compat.lazy_dtensor_comparison()
            assert _compat.lazy_dtensor_comparison()() is None  # installed once
            torch.testing.assert_close(torch.ones(2), torch.ones(2))
            print("loaded after a plain comparison:", "torch.distributed.tensor" in sys.modules)
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Replicate, distribute_tensor
            with tempfile.NamedTemporaryFile() as f:
                dist.init_process_group("gloo", store=dist.FileStore(f.name, 1), rank=0, world_size=1)
                d = distribute_tensor(torch.ones(2), init_device_mesh("cpu", (1,)), [Replicate()])
                torch.testing.assert_close(d, distribute_tensor(torch.ones(2), d.device_mesh, [Replicate()]))
                try:
                    torch.testing.assert_close(d, torch.ones(2))
                except TypeError as e:
                    print("DTensor against a tensor:", str(e).split(".")[0])
                dist.destroy_process_group()
            undo()
            print("undone:", comparison._unwrap_dtensor_for_comparison is original)
        """)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertEqual(proc.stdout.splitlines(), [
            "loaded after a plain comparison: False",
            "DTensor against a tensor: Comparing a DTensor to a non-DTensor is ambiguous",
            "undone: True",
        ])

    def test_group_and_op_helpers(self):
        kind, factor = _compat.reduce_op_parts(_compat.premul_sum(2.0))
        self.assertEqual(kind, dist.ReduceOp.RedOpType.PREMUL_SUM)
        self.assertEqual(factor, 2.0)
        world = _compat.new_c10d_world()
        self.assertEqual(world.pg_map, {})
        self.assertIsNot(world.pg_map, _compat.new_c10d_world().pg_map)
        self.assertTrue(issubclass(_compat.work_base(), dist.Work))


class PackageTest(unittest.TestCase):
    """_compat is a package of modules by concern; the rest of disttest and
    the tests use the package's names only."""

    def modules(self):
        import importlib

        return {p.stem: importlib.import_module(f"disttest._compat.{p.stem}")
                for p in sorted(COMPAT.glob("*.py")) if p.stem != "__init__"}

    def test_the_package_offers_every_name_of_its_modules(self):
        offered = {}
        for name, module in self.modules().items():
            self.assertIs(vars(module).get("__unittest"), True, name)
            for attr in module.__all__:
                with self.subTest(module=name, name=attr):
                    self.assertNotIn(attr, offered, f"{attr} in both {offered.get(attr)} and {name}")
                    offered[attr] = name
                    self.assertIs(getattr(_compat, attr), getattr(module, attr))
        self.assertEqual(sorted(set(offered) - {"FEATURE_MISSING"}), sorted(_compat.__all__))

    def test_no_module_is_shadowed_by_a_name(self):
        # A module named like a function would be replaced by it on the package.
        self.assertEqual(sorted(set(self.modules()) & set(_compat.__all__)), [])

    def test_each_module_stays_under_600_lines(self):
        for path in sorted(COMPAT.glob("*.py")):
            self.assertLess(len(path.read_text().splitlines()), 600, path.name)

    @unittest.skipIf(_compat.local_tensor() is None, "this torch has no LocalTensorMode")
    def test_a_patch_of_local_tensor_reaches_the_readers_in_the_package(self):
        # Tests run as on a torch without the mode by patching the package's
        # name; the modules that read it inside the package see the patch too.
        from unittest import mock

        import torch

        lt = _compat.local_tensor()
        with lt.LocalTensorMode(2):
            value = lt.LocalTensor({0: torch.zeros(1), 1: torch.ones(1)})
        self.assertIsNotNone(_compat.local_tensor_shards(value))
        self.assertNotEqual(_compat.local_tensor_speedups_available(), ())
        with mock.patch.object(_compat, "local_tensor", return_value=None):
            self.assertIsNone(_compat.local_tensor_shards(value))
            self.assertIsNone(_compat.local_int_values(torch.SymInt(lt.LocalIntNode({0: 1, 1: 2}))))
            self.assertEqual(_compat.local_tensor_speedups_available(), ())


IMPORT_CHECK = textwrap.dedent("""
    import importlib, pkgutil, sys
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def snapshot():
        names = {f"{m.__name__}.{k}": id(getattr(m, k)) for m in (dist, c10d) for k in dir(m)}
        return names, list(dist.Backend.backend_list), sorted(dist.Backend._plugins)

    before = snapshot()
    import disttest
    for info in pkgutil.walk_packages(disttest.__path__, "disttest."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    after = snapshot()
    changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
    print("changed:", changed, before[1:] == after[1:])
""")


class ImportTest(unittest.TestCase):
    def test_import_disttest_leaves_torch_unchanged(self):
        out = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True,
                             timeout=240, check=True).stdout
        self.assertEqual(out.strip().splitlines()[-1], "changed: [] True")


BOTH_HARNESSES = textwrap.dedent("""
    import sys, unittest
    import torch, torch.distributed as dist
    import disttest
    from torch.testing._internal.common_distributed import MultiThreadedTestCase as UpstreamThreaded

    class Bodies:
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_pass(self):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2, t

        def test_fail(self):
            t = torch.ones(1)
            dist.all_reduce(t)
            self.assertEqual(t.item(), 3)

    class Ours(Bodies, disttest.MultiThreadedTestCase):
        pass

    class Theirs(Bodies, UpstreamThreaded):
        pass

    order = [Ours, Theirs] if sys.argv[1] == "ours-first" else [Theirs, Ours]
    for cls in order + order:  # twice: each after the other
        for name in ("test_pass", "test_fail"):
            result = unittest.TestResult()
            cls(name).run(result)
            bad = len(result.failures) + len(result.errors)
            print(cls.__name__, name, "ok" if bad == 0 else "fail")
""")


class BothHarnessesTest(unittest.TestCase):
    """disttest's threaded tests and torch's own can share one process, in
    either order, and each keeps its own outcomes."""

    def check(self, order: str) -> None:
        proc = subprocess.run([sys.executable, "-c", BOTH_HARNESSES, order], capture_output=True,
                              text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(("Ours", "Theirs"))]
        expected = ["ok", "fail"] * 4
        self.assertEqual([line.split()[-1] for line in lines], expected, proc.stdout + proc.stderr[-3000:])

    def test_ours_first(self):
        self.check("ours-first")

    def test_theirs_first(self):
        self.check("theirs-first")


if __name__ == "__main__":
    unittest.main()
