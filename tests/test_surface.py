"""The whole upstream testing surface (issue 25): every public name of
torch's private distributed testing modules has a home in disttest that
``python -m disttest.migrate`` finds, for the installed wheel and for every
torch release of the supported range (the names recorded in
``tests/surface_names.json``; ``tests/surface_names.py`` enumerates both,
read from source, and regenerates the record)."""

from __future__ import annotations

import os
import tempfile
import unittest
from collections.abc import Iterable, Mapping

import torch
from surface_names import (
    DATA,
    MODULES,
    _dumps,
    main,
    names_in_source,
    recorded,
    surface,
    upstream_names,
)

from disttest.migrate._cli import HOMES
from disttest.migrate._survey import _home_for, module_names

#: The releases of disttest's supported range (torch >= 2.7) the record must cover.
SUPPORTED_MINORS = ("2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14")


def missing(modules: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """``{module: names}`` of the names that have no disttest home."""
    offers = module_names(HOMES)
    lost = {m: sorted(n for n in names if _home_for(m, n, offers) is None) for m, names in modules.items()}
    return {m: names for m, names in lost.items() if names}


def _renamed_model_ddp(model_ddp, err_substr):  # (a stand-in with a renamed parameter)
    pass


def keywords_not_taken(modules: Mapping[str, Iterable[str]], home_of=None) -> list[tuple[str, str, list[str]]]:
    """``(module, name, keywords)`` for each upstream function or class of
    the installed torch whose disttest home does not take some of the
    parameters upstream's takes by keyword (``home_of(module, name)``: the
    disttest object; by default the one migrate maps the name to)."""
    import importlib
    import inspect

    offers = module_names(HOMES)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    lost = []
    for module, names in modules.items():
        try:
            up = importlib.import_module(f"torch.testing._internal.{module}")
        except Exception:  # noqa: BLE001 (a module this torch cannot import: nothing to compare)
            continue
        for name in names:
            theirs = getattr(up, name, None)
            if not (inspect.isfunction(theirs) or inspect.isclass(theirs)):
                continue
            if home_of is not None:
                ours = home_of(module, name)
            else:
                home = _home_for(module, name, offers)
                ours = getattr(importlib.import_module(home), name, None) if home else None
            try:
                upstream_sig, our_sig = inspect.signature(theirs), inspect.signature(ours)
            except (TypeError, ValueError):
                continue
            takes = {p.name for p in our_sig.parameters.values() if p.kind in named}
            if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in our_sig.parameters.values()):
                continue
            missing_keywords = [p.name for p in upstream_sig.parameters.values() if p.kind in named
                                and p.name not in takes]
            if missing_keywords:
                lost.append((module, name, missing_keywords))
    return lost


class SurfaceTest(unittest.TestCase):
    def test_every_public_name_has_a_disttest_home(self):
        self.assertEqual(missing(surface()), {}, "names without a disttest home")

    def test_every_recorded_release_has_a_disttest_home_for_every_name(self):
        for version, modules in recorded().items():
            with self.subTest(torch=version):
                self.assertEqual(missing(modules), {}, f"names of torch {version} without a disttest home")

    def test_every_keyword_upstream_takes_is_taken(self):
        # (a suite calls the helpers by keyword: verify_ddp_error_logged(model_DDP=...)
        # failed where disttest spelt the parameter model_ddp)
        # NB: in a process of its own: importing upstream's distributed_utils
        # registers a backend for the rest of the process.
        import json
        import subprocess
        import sys

        code = ("import json, surface_names, test_surface as t; print(json.dumps([t.keywords_not_taken("
                "surface_names.surface()), t.keywords_not_taken({'common_distributed': ['verify_ddp_error_logged']}, "
                "lambda module, name: t._renamed_model_ddp)]))")
        proc = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        lost, control = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(lost, [])
        self.assertEqual(control, [["common_distributed", "verify_ddp_error_logged", ["model_DDP"]]])

    def test_a_name_disttest_lacks_is_reported(self):
        lost = missing({"common_distributed": ["MultiProcessTestCase", "no_such_helper_anywhere"]})
        self.assertEqual(lost, {"common_distributed": ["no_such_helper_anywhere"]})

    def test_the_enumeration_reads_what_it_should(self):
        self.assertIn("MultiProcessTestCase", upstream_names("common_distributed"))
        self.assertIn("skip_if_lt_x_gpu", upstream_names("distributed._tensor.common_dtensor"))  # handed on
        self.assertNotIn("AllReduce", upstream_names("distributed.multi_threaded_pg"))
        self.assertNotIn("torch", upstream_names("common_fsdp"))
        self.assertIsNone(upstream_names("distributed.no_such_module"))

    def test_the_enumeration_reads_source_text(self):
        source = ("import torch\nEFA_PROBE_RESULT = None\ndef _private(): pass\n"
                  "from torch.testing._internal.common_utils import TestCase\n"
                  "from torch.testing._internal.common_distributed import MultiProcessTestCase as MPTC\n"
                  "class AllReduce: pass\n")
        self.assertEqual(names_in_source("common_distributed", source), {"EFA_PROBE_RESULT", "MPTC", "AllReduce"})
        self.assertEqual(names_in_source("distributed.multi_threaded_pg", source), {"EFA_PROBE_RESULT", "MPTC"})

    def test_the_record_covers_the_supported_range(self):
        minors = {".".join(v.split(".")[:2]) for v in recorded()}
        self.assertLessEqual(set(SUPPORTED_MINORS), minors)
        for modules in recorded().values():
            self.assertLessEqual(set(modules), set(MODULES))
            self.assertIn("common_distributed", modules)

    def test_the_record_has_names_only_older_releases_define(self):
        names = recorded()
        # has_efa's cache is gone from torch 2.10 on; the misspelled base from common_distributed from 2.9 on.
        self.assertIn("EFA_PROBE_RESULT", names["2.7.0"]["common_distributed"])
        self.assertNotIn("EFA_PROBE_RESULT", names["2.13.0"]["common_distributed"])
        self.assertIn("MultiProcContinousTest", names["2.8.0"]["common_distributed"])
        self.assertNotIn("MultiProcContinousTest", names["2.9.0"]["common_distributed"])

    def test_the_record_matches_the_installed_torch(self):
        # The same rules read the installed wheel: a changed rule needs a regenerated record.
        version = torch.__version__.split("+")[0]
        if version not in recorded():
            self.skipTest(f"torch {version} is not recorded in {DATA}")
        self.assertEqual(recorded()[version], surface())

    def test_the_record_is_as_the_script_writes_it(self):
        with open(DATA) as f:
            self.assertEqual(f.read(), _dumps(recorded()))


    def test_the_script_regenerates_and_checks_the_record(self):
        with tempfile.TemporaryDirectory() as sources:
            for version, body in (("2.10.0", "def has_efa(): pass\n"), ("2.9.1", "EFA_PROBE_RESULT = None\n")):
                internal = os.path.join(sources, version, "torch", "testing", "_internal")
                os.makedirs(internal)
                with open(os.path.join(internal, "common_distributed.py"), "w") as f:
                    f.write(body)
            out = os.path.join(sources, "names.json")
            self.assertEqual(main([sources, "--output", out]), 0)
            with open(out) as f:
                self.assertEqual(f.read(), _dumps({"2.9.1": {"common_distributed": ["EFA_PROBE_RESULT"]},
                                                   "2.10.0": {"common_distributed": ["has_efa"]}}))
            self.assertEqual(main([sources, "--output", out, "--check"]), 0)
            with open(os.path.join(internal, "common_distributed.py"), "a") as f:
                f.write("def requires_xccl(): pass\n")
            self.assertEqual(main([sources, "--output", out, "--check"]), 1)


if __name__ == "__main__":
    unittest.main()
