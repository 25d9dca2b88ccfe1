"""python -m disttest.migrate: the rewrite on source text, and the command
on files (a migrated suite runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from disttest.migrate._cli import HOMES, NEEDS_LIBCST
from disttest.migrate._rewrite import module_names, rewrite

OFFERED = {
    "disttest": {"MultiProcessTestCase", "skip_if_lt_x_gpu", "find_free_port", "FakeStore", "TestCase"},
    "disttest.bases.dtensor": {"DTensorTestBase", "with_comms", "skip_if_lt_x_gpu"},
    "disttest.bases.fsdp": {"FSDPTest"},
}


def offers(home: str, name: str) -> bool:
    return home in OFFERED if name == "*" else name in OFFERED.get(home, set())


def migrated(source: str) -> tuple[str, list[str]]:
    result = rewrite(textwrap.dedent(source), offers)
    return result.source, [c.describe() for c in result.changes]


class RewriteTest(unittest.TestCase):
    def test_offered_names_move_to_their_home_and_the_rest_stay(self):
        out, changes = migrated("""
            from torch.testing._internal.common_distributed import MultiProcessTestCase, not_offered as n
            from torch.testing._internal.distributed._tensor.common_dtensor import with_comms, skip_if_lt_x_gpu as s
        """)
        self.assertEqual(out, textwrap.dedent("""
            from disttest import MultiProcessTestCase
            from torch.testing._internal.common_distributed import not_offered as n
            from disttest.bases.dtensor import with_comms, skip_if_lt_x_gpu as s
        """))
        self.assertIn("line 2: not_offered from common_distributed kept (disttest has no such name; "
                      "upstream's is used)", changes)

    def test_a_name_handed_on_by_another_module_finds_disttests(self):
        out, _ = migrated("from torch.testing._internal.common_fsdp import FSDPTest, skip_if_lt_x_gpu\n")
        self.assertEqual(out, "from disttest.bases.fsdp import FSDPTest\nfrom disttest import skip_if_lt_x_gpu\n")

    def test_only_the_distributed_names_of_common_utils_move(self):
        out, _ = migrated("from torch.testing._internal.common_utils import TestCase, find_free_port\n")
        # disttest.TestCase exists, but common_utils' TestCase is upstream's general framework.
        self.assertEqual(out, "from disttest import find_free_port\n"
                              "from torch.testing._internal.common_utils import TestCase\n")

    def test_module_imports_move_when_every_attribute_read_is_offered(self):
        out, _ = migrated("""
            import torch.testing._internal.common_distributed as cd
            from torch.testing._internal import common_distributed
            from torch.testing._internal.distributed._tensor import common_dtensor
            cd.MultiProcessTestCase, common_distributed.skip_if_lt_x_gpu, common_dtensor.with_comms
        """)
        self.assertIn("import disttest as cd\n", out)
        self.assertIn("import disttest as common_distributed\n", out)
        self.assertIn("from disttest.bases import dtensor as common_dtensor\n", out)
        out, changes = migrated("""
            import torch.testing._internal.common_distributed as cd
            cd.not_offered
        """)
        self.assertIn("import torch.testing._internal.common_distributed as cd\n", out)
        self.assertIn("line 2: module as cd from common_distributed kept", "\n".join(changes))

    def test_star_imports_and_what_a_person_must_change(self):
        out, changes = migrated("""
            from torch.testing._internal.common_distributed import *
            from torch.testing._internal.distributed.checkpoint_utils import *
            from torch.testing._internal.distributed.rpc_utils import *
            import torch.testing._internal.common_distributed
            patch = "torch.testing._internal.common_distributed.TIMEOUT_DEFAULT"
        """)
        self.assertIn("from disttest import *\n", out)
        self.assertIn("from torch.testing._internal.distributed.checkpoint_utils import *\n", out)  # no home here
        self.assertIn("from torch.testing._internal.distributed.rpc_utils import *\n", out)  # no home at all
        self.assertIn("import torch.testing._internal.common_distributed\n", out)
        self.assertIn('patch = "torch.testing._internal.common_distributed.TIMEOUT_DEFAULT"', out)
        self.assertTrue(any("left as it is: change it by hand" in c and "TIMEOUT_DEFAULT" in c for c in changes))

    def test_everything_else_is_left_byte_for_byte(self):
        source = textwrap.dedent("""
            # a comment
            from .local import thing  # relative
            from torch.testing import assert_close
            import torch.distributed as dist


            def f(x):   # odd spacing kept
                return x
        """)
        result = rewrite(source, offers)
        self.assertEqual(result.source, source)
        self.assertFalse(result.changed)

    def test_running_it_twice_changes_nothing_more(self):
        once, _ = migrated("from torch.testing._internal.common_distributed import MultiProcessTestCase, x\n")
        self.assertEqual(rewrite(once, offers).source, once)


SUITE = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
from torch.testing._internal.common_utils import run_tests


class Sum(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_sum(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0

    @skip_if_lt_x_gpu(8)
    def test_eight_gpus(self):
        raise AssertionError("skipped by the parent")


if __name__ == "__main__":
    run_tests()
"""


class CommandTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.mkdtemp(prefix="disttest-migrate-test-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.folder])
        self.path = os.path.join(self.folder, "test_sum.py")
        with open(self.path, "w") as f:
            f.write(SUITE)

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "disttest.migrate", *args], capture_output=True, text=True,
                              timeout=120, cwd=self.folder)

    def test_check_and_diff_change_nothing(self):
        proc = self.command("--check", self.folder)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("test_sum.py: would change", proc.stdout)
        proc = self.command("--diff", self.path)
        self.assertEqual(proc.returncode, 0)
        self.assertIn("+from disttest import MultiProcessTestCase, skip_if_lt_x_gpu", proc.stdout)
        with open(self.path) as f:
            self.assertEqual(f.read(), SUITE)

    def test_the_migrated_suite_runs_on_disttest(self):
        proc = self.command(self.folder)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("1 file(s) read, 1 changed", proc.stdout)
        self.assertIn("run_tests from common_utils kept", proc.stdout)
        with open(self.path) as f:
            text = f.read()
        self.assertIn("from disttest import MultiProcessTestCase, skip_if_lt_x_gpu\n", text)
        run = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_sum"], capture_output=True, text=True,
                             timeout=120, cwd=self.folder)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertIn("test_sum (test_sum.Sum.test_sum) ... ok", run.stderr)
        self.assertIn("skipped", run.stderr)
        self.assertIn("disttest", run.stderr + open(self.path).read())
        again = self.command("--check", self.folder)
        self.assertEqual(again.returncode, 0, again.stdout)

    def test_bad_input_is_named(self):
        proc = self.command(os.path.join(self.folder, "missing.py"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no such file or folder", proc.stderr)
        self.assertIn("missing.py", proc.stderr)
        broken = os.path.join(self.folder, "test_broken.py")
        with open(broken, "w") as f:
            f.write("from torch.testing._internal.common_distributed import (\n")
        proc = self.command(self.folder)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("test_broken.py: not migrated: ParserSyntaxError", proc.stderr)
        self.assertIn("test_sum.py: changed", proc.stdout)  # the others still are

    def test_without_libcst_it_says_what_to_install(self):
        code = ("import sys; sys.modules['libcst'] = None; from disttest.migrate import main; "
                "sys.exit(main(['.']))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              cwd=self.folder)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(NEEDS_LIBCST, proc.stderr)


class HomesTest(unittest.TestCase):
    def test_the_lookup_reads_the_installed_package(self):
        look = module_names(HOMES)
        self.assertTrue(look("disttest", "MultiProcessTestCase"))
        self.assertTrue(look("disttest.bases.dtensor", "DTensorTestBase"))
        self.assertFalse(look("disttest", "fake"))  # an old module path, not a name
        self.assertFalse(look("os", "path"))  # not a home


if __name__ == "__main__":
    unittest.main()
