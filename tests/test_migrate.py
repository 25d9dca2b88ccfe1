"""python -m disttest.migrate: the rewrite on source text, and the command
on files (a migrated suite runs)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from disttest.migrate._cli import HOMES, NEEDS_LIBCST
from disttest.migrate._rewrite import module_names, rewrite

OFFERED = {
    "disttest": {"MultiProcessTestCase", "skip_if_lt_x_gpu", "find_free_port", "FakeStore", "TestCase", "run_tests",
                 "FaultyRpcAgentTestFixture", "TensorPipeRpcAgentTestFixture"},
    "disttest.bases.dtensor": {"DTensorTestBase", "with_comms", "skip_if_lt_x_gpu"},
    "disttest.bases.fsdp": {"FSDPTest"},
}


def offers(home: str, name: str, star: bool = False) -> bool:
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
        self.assertIn("not_offered from common_distributed kept (disttest has no such name; "
                      "upstream's is used)", changes)

    def test_a_name_handed_on_by_another_module_finds_disttests(self):
        out, _ = migrated("from torch.testing._internal.common_fsdp import FSDPTest, skip_if_lt_x_gpu\n")
        self.assertEqual(out, "from disttest.bases.fsdp import FSDPTest\nfrom disttest import skip_if_lt_x_gpu\n")

    def test_only_the_distributed_names_of_common_utils_move(self):
        out, _ = migrated("from torch.testing._internal.common_utils import TestCase, find_free_port, run_tests\n")
        # disttest.TestCase exists, but common_utils' TestCase is upstream's general framework.
        # Its run_tests moves: upstream's refuses classes not derived from its TestCase.
        self.assertEqual(out, "from disttest import find_free_port, run_tests\n"
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
        self.assertIn("module as cd from common_distributed kept (cd.not_offered is not in disttest; ", changes[0])

    def test_rpc_fixtures_stay_upstream_where_upstream_s_suites_do(self):
        # (upstream's suites derive from upstream's fixture: with disttest's,
        # the generated classes stayed abstract and no test was collected)
        source = """
            from torch.testing._internal.common_distributed import MultiProcessTestCase
            from torch.testing._internal.distributed.rpc.faulty_rpc_agent_test_fixture import (
                FaultyRpcAgentTestFixture,
            )
            from torch.testing._internal.distributed.rpc_utils import FAULTY_AGENT_TESTS, generate_tests
        """
        out, changes = migrated(source)
        self.assertIn("from disttest import MultiProcessTestCase\n", out)
        self.assertIn("from torch.testing._internal.distributed.rpc.faulty_rpc_agent_test_fixture import (", out)
        self.assertTrue(any("FaultyRpcAgentTestFixture" in c and "FAULTY_AGENT_TESTS, generate_tests" in c
                            and "abstract" in c for c in changes), changes)
        # A file with its own tests on the fixture (no upstream suite) moves it.
        out, _ = migrated("from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture "
                          "import TensorPipeRpcAgentTestFixture\n")
        self.assertEqual(out, "from disttest import TensorPipeRpcAgentTestFixture\n")

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
        # A dotted read in code too (it was not reported).
        out, changes = migrated("""
            import torch
            x = torch.testing._internal.common_distributed.TIMEOUT_DEFAULT
            mock.patch.object(torch.testing._internal.common_utils, "TEST_WITH_ROCM", True)
        """)
        self.assertIn("x = torch.testing._internal.common_distributed.TIMEOUT_DEFAULT\n", out)
        self.assertEqual(changes, [
            "attribute read (torch.testing._internal.common_distributed.TIMEOUT_DEFAULT) left as it is: change it "
            "by hand", "attribute read (torch.testing._internal.common_utils) left as it is: change it by hand"])

    def test_a_star_import_moves_only_when_the_file_uses_nothing_the_home_lacks(self):
        # Upstream's modules have no __all__: their star gives TEST_WITH_ROCM, os, torch...
        star = "from torch.testing._internal.common_distributed import *\n"
        out, _ = migrated(star + "class T(MultiProcessTestCase):\n    pass\n")
        self.assertTrue(out.startswith("from disttest import *\n"))
        out, changes = migrated(star + "x = MultiProcessTestCase, TEST_WITH_ROCM\n")
        self.assertTrue(out.startswith(star))
        self.assertEqual(changes, ["* from common_distributed kept (the file uses TEST_WITH_ROCM, which disttest "
                                   "lacks; import the names it uses one by one; upstream's is used)"])
        # Nor when disttest's star would rebind a name the file keeps from
        # upstream above it (the report said upstream's TestCase was used).
        kept = "from torch.testing._internal.common_utils import TestCase\n"
        out, changes = migrated(kept + star + "x = MultiProcessTestCase, TestCase\n")
        self.assertTrue(out.startswith(kept + star))
        self.assertEqual(changes[-1], "* from common_distributed kept (disttest's would rebind TestCase, which the "
                                      "file binds above it; import the names it uses one by one; "
                                      "upstream's is used)")
        # So with a name of the file's own (upstream's star holds no FakeStore).
        own = "from mylib import FakeStore\n"
        out, changes = migrated(own + star + "x = MultiProcessTestCase, FakeStore\n")
        self.assertTrue(out.startswith(own + star), out)
        # A kept star rebinds what an import above it moved: the report said
        # disttest's MultiProcessTestCase, and upstream's was used.
        moved = "from torch.testing._internal.common_distributed import MultiProcessTestCase\n"
        out, changes = migrated(moved + star + "x = MultiProcessTestCase, TEST_WITH_ROCM\n")
        self.assertTrue(out.startswith("from disttest import MultiProcessTestCase\n" + star))
        self.assertEqual(changes[-1], "import * (common_distributed) left as it is: change it by hand (it rebinds "
                                      "MultiProcessTestCase, moved to disttest above it, to upstream's: import the "
                                      "names the file uses one by one)")
        # Upstream's module holds what it imports: common_distributed's star
        # holds common_utils' find_free_port too.
        moved = "from torch.testing._internal.common_utils import find_free_port\n"
        out, changes = migrated(moved + star + "x = find_free_port, TEST_WITH_ROCM\n")
        self.assertTrue(out.startswith("from disttest import find_free_port\n" + star))
        self.assertEqual(changes[-1], "import * (common_distributed) left as it is: change it by hand (it may "
                                      "rebind find_free_port, moved to disttest above it, to upstream's: import the "
                                      "names the file uses one by one)")

    def test_a_star_moves_by_what_the_homes_star_binds(self):
        # Upstream's star binds every name its module holds; disttest's
        # homes bind their __all__. getattr found skip_if_lt_x_gpu on
        # disttest.bases.dtensor (imported there, not in its __all__): the
        # star moved and the name was a NameError.
        look = module_names(HOMES)
        for upstream, home, uses, after in (
                ("distributed._tensor.common_dtensor", "disttest.bases.dtensor", "DTensorTestBase, skip_if_lt_x_gpu",
                 "from disttest import skip_if_lt_x_gpu\n"),
                ("common_fsdp", "disttest.bases.fsdp", "FSDPTest, TEST_SKIPS", "from disttest import TEST_SKIPS\n")):
            with self.subTest(upstream=upstream):
                source = f"from torch.testing._internal.{upstream} import *\nx = {uses}\n"
                result = rewrite(source, look)
                self.assertEqual(result.source, f"from {home} import *\n{after}x = {uses}\n")
                namespace: dict[str, object] = {}
                exec(result.source, namespace)  # every name the file uses is bound
        # A name no home binds keeps upstream's star (Any is only imported by disttest).
        source = "from torch.testing._internal.common_distributed import *\nx = MultiProcessTestCase, Any\n"
        result = rewrite(source, look)
        self.assertEqual(result.source, source)
        self.assertIn("the file uses Any, which disttest lacks", result.changes[0].describe())

    def test_a_suite_module_imported_whole_keeps_the_fixture_upstreams(self):
        # Upstream's RPC suites derive from upstream's fixture; a file that
        # imports rpc_test as a module got disttest's: its classes stayed abstract.
        fixture = ("from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import "
                   "TensorPipeRpcAgentTestFixture\n")
        for suite in ("from torch.testing._internal.distributed.rpc import rpc_test\n",
                      "from torch.testing._internal.distributed.rpc import rpc_test as r, dist_autograd_test\n",
                      "import torch.testing._internal.distributed.rpc.rpc_test as rpc_test\n",
                      "from torch.testing._internal.distributed import rpc_utils\n"):
            with self.subTest(suite=suite):
                out, changes = migrated(fixture + suite)
                self.assertTrue(out.startswith(fixture), out)
                self.assertTrue(any("abstract" in c for c in changes), changes)
        # The fixtures' own package is not a suite.
        out, _ = migrated(fixture + "from torch.testing._internal.distributed.rpc import "
                                    "faulty_rpc_agent_test_fixture\n")
        self.assertTrue(out.startswith("from disttest import TensorPipeRpcAgentTestFixture\n"), out)

    def test_a_split_line_s_comment_is_kept_once_or_on_each_line_for_a_tool(self):
        # The comment was repeated on every line of a split.
        out, _ = migrated("from torch.testing._internal.common_distributed import MultiProcessTestCase, "
                          "not_offered  # the base\n")
        self.assertEqual(out, "from disttest import MultiProcessTestCase  # the base\n"
                              "from torch.testing._internal.common_distributed import not_offered\n")
        out, _ = migrated("from torch.testing._internal.common_distributed import MultiProcessTestCase, "
                          "skip_if_lt_x_gpu, not_offered  # the base\n")
        self.assertEqual(out, "from disttest import MultiProcessTestCase, skip_if_lt_x_gpu  # the base\n"
                              "from torch.testing._internal.common_distributed import not_offered\n")
        out, _ = migrated("from torch.testing._internal.common_distributed import MultiProcessTestCase, "
                          "not_offered  # noqa: F401\n")
        self.assertEqual(out, "from disttest import MultiProcessTestCase  # noqa: F401\n"
                              "from torch.testing._internal.common_distributed import not_offered  # noqa: F401\n")
        out, _ = migrated("import os, torch.testing._internal.common_distributed as cd  # type: ignore\n"
                          "cd.MultiProcessTestCase\n")
        self.assertEqual(out, "import os  # type: ignore\nimport disttest as cd  # type: ignore\n"
                              "cd.MultiProcessTestCase\n")

    def test_a_name_beside_a_module_moves_as_a_name(self):
        # ShardedTensorTestBase was taken for a module ("module
        # ShardedTensorTestBase ... kept") and moved only on a second run.
        source = ("from torch.testing._internal.distributed._shard.sharded_tensor import ShardedTensorTestBase, "
                  "_test_st_common\nx = _test_st_common.generate_chunk_sharding_specs_for_test\n")
        look = module_names(HOMES)
        result = rewrite(source, look)
        self.assertEqual(result.source, "from disttest.bases.sharded_tensor import ShardedTensorTestBase\n"
                                        "from disttest.bases import sharded_tensor as _test_st_common\n"
                                        "x = _test_st_common.generate_chunk_sharding_specs_for_test\n")
        self.assertEqual(rewrite(result.source, look).source, result.source)

    def test_comments_inside_a_parenthesised_import_stay(self):
        source = textwrap.dedent("""
            from torch.testing._internal.common_distributed import (
                MultiProcessTestCase,  # base for 2-rank tests
                # TODO: drop after 2.9
                skip_if_lt_x_gpu,
            )
        """)
        out, _ = migrated(source)  # one home: only the module changes
        self.assertEqual(out, source.replace("torch.testing._internal.common_distributed", "disttest"))
        out, _ = migrated(textwrap.dedent("""
            from torch.testing._internal.common_fsdp import (  # the FSDP bases
                FSDPTest,  # fsdp
                # next: a gpu check
                skip_if_lt_x_gpu,
                not_offered  # stays upstream's
            )
        """))
        self.assertEqual(out, textwrap.dedent("""
            from disttest.bases.fsdp import (
                # the FSDP bases
                FSDPTest,  # fsdp
            )
            from disttest import (
                # next: a gpu check
                skip_if_lt_x_gpu,
            )
            from torch.testing._internal.common_fsdp import (
                not_offered,  # stays upstream's
            )
        """))

    def test_a_parenthesised_import_on_one_line_splits_into_lines_of_its_own(self):
        out, _ = migrated("from torch.testing._internal.common_fsdp import (FSDPTest, skip_if_lt_x_gpu)\n")
        self.assertEqual(out, "from disttest.bases.fsdp import FSDPTest\nfrom disttest import skip_if_lt_x_gpu\n")

    def test_a_module_used_whole_or_assigned_stays(self):
        for use, why in (("getattr(cd, 'TEST_WITH_ROCM')", "cd is used as a whole, not only as cd.<name>"),
                         ("cd.MultiProcessTestCase\ncd.TIMEOUT_DEFAULT = 1",
                          "cd.TIMEOUT_DEFAULT is assigned, which would not set disttest's")):
            with self.subTest(use=use):
                source = "import torch.testing._internal.common_distributed as cd\n" + use + "\n"
                out, changes = migrated(source)
                self.assertEqual(out, source)
                self.assertEqual(changes, [f"module as cd from common_distributed kept ({why}; upstream's is used)"])

    def test_modules_outside_the_distributed_surface_stay(self):
        source = "from torch.testing._internal.common_device_type import TestCase\n"
        out, _ = migrated(source)  # common_device_type's TestCase is upstream's framework, not disttest's
        self.assertEqual(out, source)

    def test_a_statement_of_several_modules_is_split_where_one_moves(self):
        # (it was left as it was, "change it by hand")
        source = """\
            import os, torch.testing._internal.common_distributed as cd  # why
            from torch.testing._internal import common_distributed as cd2, common_utils
            from torch.testing._internal import common_utils, common_methods_invocations
            from torch.testing._internal import (  # a comment a split would lose
                common_distributed as cd3,
                common_utils,
            )
            print(cd.MultiProcessTestCase, cd2.skip_if_lt_x_gpu, cd3.find_free_port)
        """
        out, changes = migrated(source)
        self.assertEqual(out, textwrap.dedent("""\
            import os
            import disttest as cd  # why
            import disttest as cd2
            from torch.testing._internal import common_utils
            from torch.testing._internal import common_utils, common_methods_invocations
            from torch.testing._internal import (  # a comment a split would lose
                common_distributed as cd3,
                common_utils,
            )
            print(cd.MultiProcessTestCase, cd2.skip_if_lt_x_gpu, cd3.find_free_port)
        """))
        self.assertIn("module common_distributed from common_distributed -> disttest", changes)
        self.assertIn("module common_utils from common_utils kept (no disttest module stands for it; "
                      "upstream's is used)", changes)
        self.assertIn("import (torch.testing._internal.common_distributed) left as it is: change it by hand "
                      "(several modules in one statement, with a comment inside)", changes)
        self.assertEqual(migrated(out)[0], out)

    def test_imports_it_cannot_rewrite_in_place_are_noted(self):
        out, changes = migrated("""
            import os; from torch.testing._internal.common_distributed import MultiProcessTestCase
            if True: from torch.testing._internal.common_fsdp import FSDPTest
            name = f"torch.testing._internal.common_distributed.{1}"
        """)
        self.assertIn("import os; from torch.testing._internal.common_distributed import MultiProcessTestCase", out)
        self.assertEqual([c.split(" left as it is")[0] for c in changes],
                         ["import (torch.testing._internal.common_distributed)",
                          "import (torch.testing._internal.common_fsdp)",
                          "f-string (torch.testing._internal.common_distributed.)"])
        self.assertIn("(one of several statements on a line)", changes[0])

    def test_an_import_that_registered_a_backend_is_noted(self):
        _, changes = migrated("from torch.testing._internal.distributed.distributed_utils import mock_init_dist\n")
        self.assertTrue(any("the 'mock_process_group' backend" in c and "disttest.mock_init_dist" in c
                            for c in changes))

    def test_the_fake_backend_is_registered_where_upstream_s_import_registered_it(self):
        # A "fake" group made in a script, setUpClass or a pytest function
        # failed after migration ("Unknown c10d backend type FAKE"): importing
        # upstream's fake_pg had registered the backend.
        added = ("from disttest import register_fake_backend  # importing upstream's fake_pg registered the "
                 "'fake' backend (disttest.migrate)\nregister_fake_backend()\n")
        out, changes = migrated("from torch.testing._internal.distributed.fake_pg import FakeStore\n")
        self.assertEqual(out, "from disttest import FakeStore\n" + added)
        self.assertIn("register_fake_backend() added after it (importing upstream's fake_pg registered the 'fake' "
                      "backend (disttest.migrate))", changes)
        self.assertEqual(migrated(out)[0], out)  # once
        out, _ = migrated("""
            from torch.testing._internal.distributed import fake_pg
            try:
                import torch.testing._internal.distributed.fake_pg as fpg
            except ImportError:
                pass
            fake_pg.FakeStore, fpg.FakeStore
        """)
        self.assertEqual(out, textwrap.dedent("""
            import disttest as fake_pg
            """) + added + textwrap.dedent("""\
            try:
                import disttest as fpg
            """) + textwrap.indent(added, "    ") + textwrap.dedent("""\
            except ImportError:
                pass
            fake_pg.FakeStore, fpg.FakeStore
        """))
        # Where upstream's module is still imported, it still registers it.
        out, changes = migrated("from torch.testing._internal.distributed.fake_pg import FakeStore, not_offered\n")
        self.assertNotIn("register_fake_backend", out)
        self.assertIn("from torch.testing._internal.distributed.fake_pg import not_offered", out)

    def test_the_fake_backend_registration_binds_nothing_of_the_file_s(self):
        why = "  # importing upstream's fake_pg registered the 'fake' backend (disttest.migrate)\n"
        # Once a block; not under TYPE_CHECKING (the import never ran there);
        # in a class body, no name is left behind (it would be a method).
        out, changes = migrated("""
            from typing import TYPE_CHECKING
            from torch.testing._internal.distributed.fake_pg import FakeStore
            from torch.testing._internal.distributed.fake_pg import FakeStore as F2
            if TYPE_CHECKING:
                from torch.testing._internal.distributed.fake_pg import FakeStore as F3
            else:
                from torch.testing._internal.distributed.fake_pg import FakeStore as F4

            class T:
                from torch.testing._internal.distributed.fake_pg import FakeStore as F5
        """)
        added = "from disttest import register_fake_backend" + why + "register_fake_backend()\n"
        self.assertEqual(out, "\n".join([
            "",
            "from typing import TYPE_CHECKING",
            "from disttest import FakeStore",
            added + "from disttest import FakeStore as F2",
            "if TYPE_CHECKING:",
            "    from disttest import FakeStore as F3",
            "else:",
            "    from disttest import FakeStore as F4",
            textwrap.indent(added, "    "),
            "class T:",
            "    from disttest import FakeStore as F5",
            textwrap.indent(added + "del register_fake_backend\n", "    ")]))
        self.assertEqual(sum("register_fake_backend() added" in c for c in changes), 3)
        # A block in a class body is the class's too; a method's is not.
        out, _ = migrated("""
            class T:
                try:
                    from torch.testing._internal.distributed.fake_pg import FakeStore
                except ImportError:
                    pass

                def f(self):
                    from torch.testing._internal.distributed.fake_pg import FakeStore
        """)
        self.assertEqual(out.count("del register_fake_backend"), 1)
        self.assertIn("        register_fake_backend()\n        del register_fake_backend\n    except", out)
        # A file with a name of its own that the added line would bind:
        # disttest's is imported under another.
        out, _ = migrated("""
            from torch.testing._internal.distributed.fake_pg import FakeStore

            def register_fake_backend():
                pass
        """)
        self.assertEqual(out, textwrap.dedent("""
            from disttest import FakeStore
            from disttest import register_fake_backend as disttest_register_fake_backend""") + why + textwrap.dedent("""            disttest_register_fake_backend()

            def register_fake_backend():
                pass
        """))
        self.assertEqual(migrated(out)[0], out)

    def test_the_files_encoding_bom_and_line_endings_are_kept(self):
        line = b"from torch.testing._internal.common_distributed import MultiProcessTestCase  # c"
        new = b"from disttest import MultiProcessTestCase  # c"
        for before in (b"import os\r\n" + line + b"\r\nx = 1\r\n",
                       b"\xef\xbb\xbf" + line + b"\n",
                       b"# -*- coding: latin-1 -*-\n" + line + b'\ns = "caf\xe9"\n',
                       # (libcst drops the last CR of a file whose lines end in CR alone)
                       b"import os\r" + line + b"\rx = 1\r",
                       b"import os\r" + line + b"\rx = 1"):
            with self.subTest(before=before[:12], end=before[-2:]):
                self.assertEqual(rewrite(before, offers).data, before.replace(line, new))
                if before.startswith(b"import os\r"):  # (and as text)
                    text = before.decode()
                    self.assertEqual(rewrite(text, offers).source, text.replace(line.decode(), new.decode()))

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

    def test_a_file_that_names_no_upstream_module_is_not_parsed(self):
        # (the syntax tree is most of the cost; most files of a suite need none)
        import libcst

        source = b"import os\r\n\ndef f(x):   # kept\n    return x\n"
        with mock.patch.object(libcst, "parse_module", side_effect=AssertionError("parsed")):
            result = rewrite(source, offers)
        self.assertEqual((result.data, result.changes, result.changed), (source, (), False))
        with self.assertRaises(libcst.ParserSyntaxError):  # what does not parse still says so
            rewrite("def f(:\n", offers)

    def test_strings_anywhere_in_a_statement_are_noted_at_their_lines(self):
        # The walk skips what holds no import, except what holds such a string.
        _, changes = migrated("""
            from torch.testing._internal.common_distributed import MultiProcessTestCase

            @mock.patch(
                "torch.testing._internal.common_distributed.TIMEOUT")
            def f(x=lambda: g(["torch.testing._internal.common_fsdp.y"])):
                class C(Base, key=f"{1}torch.testing.{sep}_internal.dist_utils"):
                    pass
                return [h(z) for z in ("torch.testing._internal.common_utils.q",)]
        """)
        self.assertEqual([c.split(" left as it is")[0] for c in changes[1:]], [
            "string (torch.testing._internal.common_distributed.TIMEOUT)",
            "string (torch.testing._internal.common_fsdp.y)",
            "f-string (torch.testing._internal.dist_utils)",  # (joined across the {sep})
            "string (torch.testing._internal.common_utils.q)"])
        lines = [c.line for c in rewrite(textwrap.dedent("""
            @mock.patch(
                "torch.testing._internal.common_distributed.TIMEOUT")
            def f(x=lambda: g(["torch.testing._internal.common_fsdp.y"])):
                return 1
        """), offers).changes]
        self.assertEqual(lines, [3, 4])

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
        """``python -m disttest.migrate ARGS`` in the suite's folder, run by
        its main() in this process (an interpreter per call, with torch, cost
        4 s each; test_check_and_diff_change_nothing and the console script's
        test start the real commands)."""
        from disttest.migrate import main

        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(self.folder)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(args))
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
        finally:
            os.chdir(cwd)
        return subprocess.CompletedProcess(["disttest.migrate", *args], code, out.getvalue(), err.getvalue())

    def test_check_and_diff_change_nothing(self):
        proc = subprocess.run([sys.executable, "-m", "disttest.migrate", "--check", self.folder],
                              capture_output=True, text=True, timeout=120, cwd=self.folder)
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
        self.assertIn("run_tests from common_utils -> disttest", proc.stdout)
        with open(self.path) as f:
            text = f.read()
        self.assertIn("from disttest import MultiProcessTestCase, skip_if_lt_x_gpu\n", text)
        self.assertIn("from disttest import run_tests\n", text)
        # Run as PyTorch's files are, through its run_tests line (upstream's
        # would exit before any test: Sum does not derive from its TestCase).
        run = subprocess.run([sys.executable, "test_sum.py", "-v"], capture_output=True, text=True,
                             timeout=120, cwd=self.folder)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertIn("test_sum (__main__.Sum.test_sum) ... ok", run.stderr)
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
        self.assertIn("test_broken.py: not migrated: SyntaxError at line 1: '(' was never closed", proc.stderr)
        self.assertIn("test_sum.py: changed", proc.stdout)  # the others still are

    def test_a_file_that_is_no_text_or_no_file_is_named_so(self):
        fifo = os.path.join(self.folder, "test_fifo.py")
        os.mkfifo(fifo)
        proc = self.command(fifo)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not a regular file or folder: ", proc.stderr)  # (it said "no such file")
        os.unlink(fifo)
        for name, data in (("test_nul.py", b"from torch.testing._internal.common_distributed import *\x00\n"),
                           ("test_cookie.py", b"# -*- coding: bogus -*-\n"
                                              b"from torch.testing._internal.common_distributed import *\n")):
            path = os.path.join(self.folder, name)
            with open(path, "wb") as f:
                f.write(data)
            proc = self.command(path)
            with self.subTest(name):
                self.assertEqual(proc.returncode, 1)
                self.assertIn(f"{name}: not migrated: SyntaxError: ", proc.stderr)  # (no "at line None" or 0)
                self.assertNotIn("at line", proc.stderr)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(), data)

    def test_check_with_diff_fails_and_findings_are_file_line(self):
        proc = self.command("--check", "--diff", self.path)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("+from disttest import MultiProcessTestCase, skip_if_lt_x_gpu", proc.stdout)
        self.assertIn(f"{self.path}:5: run_tests from common_utils -> disttest", proc.stdout)
        with open(self.path) as f:
            self.assertEqual(f.read(), SUITE)

    def test_a_diff_applies_to_a_file_without_a_last_newline(self):
        with open(self.path, "w") as f:
            f.write("from torch.testing._internal.common_distributed import MultiProcessTestCase")
        proc = self.command("--diff", self.path)
        self.assertIn("+from disttest import MultiProcessTestCase\n\\ No newline at end of file\n", proc.stdout)
        patch = subprocess.run(["patch", "--dry-run", self.path], input=proc.stdout.split("\n1 file(s)")[0] + "\n",
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(patch.returncode, 0, patch.stdout + patch.stderr)

    def test_a_file_it_cannot_parse_or_write_does_not_stop_the_others(self):
        deep = os.path.join(self.folder, "a_deep.py")
        with open(deep, "w") as f:
            f.write(SUITE.splitlines()[3] + "\nx = " + "+".join(["1"] * 600) + "\n")
        from disttest.migrate._cli import main

        real_replace = os.replace

        def refusing_replace(source, target):
            if str(target).endswith("test_sum.py"):
                raise PermissionError(13, "Permission denied")
            return real_replace(source, target)

        second = os.path.join(self.folder, "z_other.py")
        with open(second, "w") as f:
            f.write(SUITE)
        with mock.patch("os.replace", refusing_replace), contextlib.redirect_stdout(io.StringIO()) as out, \
                contextlib.redirect_stderr(io.StringIO()) as err:
            status = main([self.folder])
        self.assertEqual(status, 1)
        self.assertIn("a_deep.py: not migrated: RecursionError: nested too deeply for the parser", err.getvalue())
        self.assertIn("test_sum.py: not migrated: PermissionError: Permission denied (not written)", err.getvalue())
        self.assertIn("3 file(s) read, 1 changed", out.getvalue())
        with open(second) as f:
            self.assertIn("from disttest import MultiProcessTestCase", f.read())

    def test_a_failed_write_leaves_the_file_as_it_was(self):
        # A full disk: the file was truncated while the report said "not written".
        from disttest.migrate._cli import main

        with open(self.path, "rb") as f:
            before = f.read()
        os.chmod(self.path, 0o640)
        real_fdopen = os.fdopen

        def full_disk(fd, mode="r", *args, **kwargs):
            stream = real_fdopen(fd, mode, *args, **kwargs)
            if mode == "wb":
                def write(data):
                    stream.raw.write(data[:10])
                    raise OSError(28, "No space left on device")
                stream.write = write
            return stream

        with mock.patch("os.fdopen", full_disk), contextlib.redirect_stdout(io.StringIO()) as out, \
                contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(main([self.path]), 1)
        self.assertIn("test_sum.py: not migrated: OSError: No space left on device (not written)", err.getvalue())
        self.assertNotIn("changed\n", out.getvalue().replace("0 changed\n", ""))  # (not said before the write)
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(os.listdir(self.folder), ["test_sum.py"])  # no temporary file left
        # Written, the file keeps its permissions (and a link stays a link).
        link = os.path.join(self.folder, "link.py")
        os.symlink(self.path, link)
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(main([link]), 0)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o640)
        with open(self.path) as f:
            self.assertIn("from disttest import MultiProcessTestCase", f.read())

    def test_what_cpython_refuses_is_not_migrated(self):
        # libcst's parser took 300 nested parentheses, which CPython refuses:
        # the file was rewritten and reported as changed.
        source = SUITE.splitlines()[3] + "\nx = " + "(" * 300 + "1" + ")" * 300 + "\n"
        with open(self.path, "w") as f:
            f.write(source)
        proc = self.command(self.path)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("test_sum.py: not migrated: SyntaxError at line 2: too many nested parentheses", proc.stderr)
        with open(self.path) as f:
            self.assertEqual(f.read(), source)

    def test_a_diff_applies_to_a_file_with_a_bom_or_bare_carriage_returns(self):
        line = "from torch.testing._internal.common_distributed import MultiProcessTestCase"
        for name, data in (("bom.py", b"\xef\xbb\xbf" + line.encode() + b"\nx = 1\n"),
                           ("cr.py", line.encode() + b"\rx = 1\r"),
                           ("feed.py", b"# a form feed \x0c in a comment\n" + line.encode() + b"\n")):
            with self.subTest(file=name):
                path = os.path.join(self.folder, name)
                with open(path, "wb") as f:
                    f.write(data)
                proc = self.command("--diff", "-q", path)
                diff = proc.stdout.split("\n1 file(s)")[0] + "\n"
                patch = subprocess.run(["patch", "--dry-run", path], input=diff.encode(),
                                       capture_output=True, timeout=60)
                self.assertEqual(patch.returncode, 0, diff + (patch.stdout + patch.stderr).decode())

    def test_a_diff_is_printed_in_the_file_s_encoding(self):
        # A latin-1 file's diff was printed in UTF-8, which patch (comparing bytes) refused.
        from disttest.migrate._cli import main

        line = b"from torch.testing._internal.common_distributed import MultiProcessTestCase  # caf\xe9\n"
        with open(self.path, "wb") as f:
            f.write(b"# -*- coding: latin-1 -*-\n" + line)
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(main(["--diff", "-q", self.path]), 0)
        out.flush()
        diff = out.buffer.getvalue().split(b"\n1 file(s)")[0] + b"\n"
        self.assertIn(b"+from disttest import MultiProcessTestCase  # caf\xe9\n", diff)
        patch = subprocess.run(["patch", "--dry-run", self.path], input=diff, capture_output=True, timeout=60)
        self.assertEqual(patch.returncode, 0, (diff + patch.stdout + patch.stderr).decode("latin-1"))

    def test_a_reader_that_stops_early_gets_no_traceback(self):
        # python -m disttest.migrate --diff ... | head -5
        from disttest.migrate._cli import main_piped

        read, write = os.pipe()
        os.close(read)  # (a write raises BrokenPipeError: Python ignores SIGPIPE)
        with os.fdopen(write, "w") as stream, contextlib.redirect_stdout(stream), \
                contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(main_piped(["--diff", self.path]), 1)

    def test_a_walk_skips_what_is_not_the_suites(self):
        venv = os.path.join(self.folder, "venv")
        os.makedirs(os.path.join(venv, "lib"))
        open(os.path.join(venv, "pyvenv.cfg"), "w").close()
        with open(os.path.join(venv, "lib", "test_installed.py"), "w") as f:
            f.write(SUITE)
        os.mkfifo(os.path.join(self.folder, "test_fifo.py"))  # reading it would wait forever
        elsewhere = tempfile.mkdtemp(prefix="disttest-migrate-elsewhere-")
        self.addCleanup(subprocess.run, ["rm", "-rf", elsewhere])
        with open(os.path.join(elsewhere, "test_there.py"), "w") as f:
            f.write(SUITE)
        os.symlink(elsewhere, os.path.join(self.folder, "linked"))
        # A link to a file elsewhere: the walk wrote through it, outside the folder.
        os.symlink(os.path.join(elsewhere, "test_there.py"), os.path.join(self.folder, "test_link.py"))
        proc = self.command(self.folder, self.path)  # the file named twice is read once
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("1 file(s) read, 1 changed", proc.stdout)
        self.assertIn("linked: a link to a folder, not followed; name its target to migrate it", proc.stderr)
        self.assertIn("test_link.py: a link to a file, not followed; name it to migrate its target", proc.stderr)
        with open(os.path.join(elsewhere, "test_there.py")) as f:
            self.assertEqual(f.read(), SUITE)

    def test_the_console_script(self):
        from importlib.metadata import entry_points

        (script,) = [e for e in entry_points(group="console_scripts") if e.name == "disttest-migrate"]
        self.assertEqual(script.value, "disttest.migrate._cli:run")
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "disttest-migrate"), "--check",
                               self.path], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("test_sum.py: would change", proc.stdout)

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
