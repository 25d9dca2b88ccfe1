"""README.rst stays true: the quickstart runs, every name of the migration
list imports from disttest (and exists upstream), the sed line ports imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

import disttest
from disttest import _compat

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.rst")


def readme() -> str:
    with open(README) as f:
        return f.read()


def section(start: str, end: str) -> str:
    text = readme()
    return text[text.index(start):text.index(end)]


def migration_map() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in section("By upstream module", "What behaves differently").splitlines()[1:]:
        if line and not line.startswith(" "):
            current = line
            out[current] = []
        elif current and line.strip():
            out[current] += re.findall(r"``([A-Za-z_][A-Za-z_0-9]*)``", line)
    return out


class ReadmeTest(unittest.TestCase):
    def test_readme_is_valid_restructuredtext(self):
        import docutils.core

        docutils.core.publish_string(readme(), writer="null",
                                     settings_overrides={"report_level": 2, "halt_level": 2})

    def test_quickstart_runs(self):
        block = section("Quickstart\n", "``TestCase``\n------------")
        code = textwrap.dedent(block.split(".. code-block:: python\n", 1)[1])
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_quick.py"), "w") as f:
                f.write(code)
            proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_quick.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        self.assertIn("test_sum (test_quick.AllReduce.test_sum) ... ok", proc.stderr)

    def test_every_migration_name_imports_from_disttest(self):
        names = [n for names in migration_map().values() for n in names]
        self.assertGreater(len(names), 110)
        self.assertEqual([n for n in names if not hasattr(disttest, n)], [])

    # NB: the list was checked against torch 2.13's harness; older ones lack
    # some names (MultiProcContinuousTest, requires_world_size...).
    @unittest.skipUnless(_compat.torch_at_least("2.13"), "needs torch >= 2.13 (the upstream names listed)")
    def test_names_exist_upstream(self):
        import torch.testing._internal.common_distributed as upstream

        listed = migration_map()["``common_distributed``"]
        # Upstream's own spelling of the pool is MultiProcContinuousTest only.
        missing = [n for n in listed if not hasattr(upstream, n) and n != "MultiProcContinousTest"]
        self.assertEqual(missing, [])

    def test_sed_line_ports_imports(self):
        command = next(line.strip() for line in readme().splitlines() if line.strip().startswith("sed -i -E"))
        sources = textwrap.dedent("""\
            from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
            from torch.testing._internal.distributed.fake_pg import FakeStore
            from torch.testing._internal.dist_utils import dist_init
            from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import RpcAgentTestFixture
            from torch.testing._internal.common_utils import run_tests
            from torch.testing._internal.distributed._tensor.common_dtensor import (
            from torch.testing._internal.common_fsdp import FSDPTest, MLP
        """)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "test_port.py")
            with open(path, "w") as f:
                f.write(sources)
            subprocess.run(command.replace("test_*.py", path), shell=True, check=True, timeout=60)
            with open(path) as f:
                ported = f.read().splitlines()
        self.assertEqual(ported[:4], [
            "from disttest import MultiProcessTestCase, skip_if_lt_x_gpu",
            "from disttest import FakeStore",
            "from disttest import dist_init",
            "from disttest import RpcAgentTestFixture",
        ])
        self.assertEqual(ported[4], "from torch.testing._internal.common_utils import run_tests")
        self.assertEqual(ported[5:], ["from disttest.dtensor import (", "from disttest.fsdp import FSDPTest, MLP"])
