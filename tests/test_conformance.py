"""The backend conformance suite and its command line.

Each full run (every case, world size 3) happens once per backend in a
class fixture; the tests assert on its JSON, its table and its exit status.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import torch.distributed as dist

from disttest.conformance import CASES, UNSUPPORTED, Case, CollectiveConformance, Declaration
from disttest.conformance.cases import torch_lacks
from disttest.conformance.suite import _skip_for

HERE = os.path.dirname(os.path.abspath(__file__))
ALL = len(CASES)


def cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "disttest.conformance", *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def main_here(*args: str) -> tuple[int, str, str]:
    """``python -m disttest.conformance ARGS`` run in this process: its exit
    status, output and error output."""
    from disttest.conformance.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def full_run(*args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        proc = cli("--world-size", "3", "--json", path, *args)
        with open(path, encoding="utf-8") as f:
            return proc, json.load(f)


def table_rows(table: str) -> dict[str, list[int]]:
    rows = {}
    for line in table.split("reduce ops by dtype")[0].splitlines():
        m = re.match(r"^(\w+) +(\d+) +(\d+) +(\d+) +(\d+)$", line)
        if m:
            rows[m.group(1)] = [int(x) for x in m.groups()[1:]]
    return rows


def statuses(report: dict, status: str) -> set[str]:
    return {c["name"] for c in report["cases"] if c["status"] == status}


class Agreement:
    """Checks shared by the full runs: the table, the JSON and the summary agree."""

    proc: subprocess.CompletedProcess[str]
    report: dict
    assertEqual: object

    def test_table_and_json_agree(self):
        rows = table_rows(self.proc.stdout)
        counts = self.report["counts"]
        self.assertEqual(rows.pop("total"), [counts[s] for s in ("passed", "failed", "unsupported", "skipped")])
        self.assertEqual(rows, {k: [v[s] for s in ("passed", "failed", "unsupported", "skipped")]
                                for k, v in self.report["collectives"].items()})
        self.assertEqual(len(self.report["cases"]), ALL)
        self.assertIn(f"{counts['passed']} passed, {counts['failed']} failed, {counts['unsupported']} unsupported, "
                      f"{counts['skipped']} skipped ({ALL} cases", self.proc.stdout.splitlines()[-1])
        for case in self.report["cases"]:
            if case["status"] == "failed":
                self.assertIn(f"FAILED {case['name']}:", self.proc.stdout)
            if case["status"] == "unsupported":
                self.assertIn(f"UNSUPPORTED {case['name']}: declared unsupported", self.proc.stdout)


class ThreadedRunTest(Agreement, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.report = full_run("--backend", "threaded")

    def test_every_case_passes_but_the_declared(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout[-3000:] + self.proc.stderr[-3000:])
        self.assertGreaterEqual(self.report["counts"]["passed"], 200)
        self.assertEqual(statuses(self.report, "unsupported"), {"test_monitored_barrier__all_ranks"})
        self.assertEqual(self.report["counts"]["failed"], 0)

    def test_the_matrix(self):
        matrix = self.proc.stdout.split("reduce ops by dtype")[1]
        self.assertRegex(matrix, r"\nint8 +ok +ok +ok +ok +\. +\. +ok +ok +ok\n")
        self.assertRegex(matrix, r"\ncomplex64 +ok +\. +\. +\. +ok +ok +\. +\. +\.\n")


class GlooRunTest(Agreement, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.report = full_run("--backend", "gloo")

    def test_every_case_passes_but_the_declared(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout[-3000:] + self.proc.stderr[-3000:])
        self.assertGreaterEqual(self.report["counts"]["passed"], 200)
        self.assertEqual(self.report["counts"]["failed"], 0)
        declared = Declaration(UNSUPPORTED["gloo"])
        expected = {c.name for c in CASES if declared.match(c)}
        self.assertEqual(statuses(self.report, "unsupported"), expected)
        self.assertIn("test_all_reduce__float32_PREMUL_SUM", expected)
        self.assertIn("test_all_reduce__float32_SUM_noncontiguous", expected)
        self.assertNotIn("test_send_recv__float32_noncontiguous", expected)  # gloo rejects it: conforming


class FakeRunTest(unittest.TestCase):
    def test_fake_declares_what_it_cannot_do(self):
        proc, report = full_run("--backend", "fake")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
        self.assertEqual(report["counts"]["failed"], 0)
        self.assertIn("test_barrier__repeated_and_async", statuses(report, "passed"))
        self.assertIn("test_gather__rejects_gather_dst_out_of_range", statuses(report, "passed"))
        unsupported = [c for c in report["cases"] if c["status"] == "unsupported"]
        self.assertGreater(len(unsupported), 200)
        self.assertTrue(all("fake completes every collective at once" in c["message"]
                            or "fake checks no arguments" in c["message"] for c in unsupported))


class WrongBackendsTest(unittest.TestCase):
    def test_a_backend_that_does_nothing_fails(self):
        proc, report = full_run("--backend", "toynothing", "--import", "toy_backend")
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:])
        failed, passed = statuses(report, "failed"), statuses(report, "passed")
        behaviour = {c.name for c in CASES if c.collective in ("timeouts", "async_completion")
                     or "barrier_waits" in c.tags}
        self.assertLessEqual(behaviour, failed)
        values = {c.name for c in CASES if "values" in c.tags and "size0" not in c.tags}
        # Every value case fails, but those where leaving the tensors alone happens to be right.
        self.assertLessEqual(values - {"test_all_to_all__bool", "test_all_to_all_single__bool"}, failed)
        # What it passes: empty tensors, repeated barriers, and the argument errors
        # that c10d's Python layer catches before any backend.
        for name in passed:
            case = next(c for c in CASES if c.name == name)
            self.assertTrue("size0" in case.tags or "argument_errors" in case.tags
                            or name == "test_barrier__repeated_and_async", name)
        self.assertIn("FAILED test_barrier__waits_for_late_rank:", proc.stdout)
        self.assertIn("a barrier must hold every rank until the last arrives", proc.stdout)
        self.assertIn("returned although rank 1 never called it", proc.stdout)

    def test_a_strided_view_is_rejected_only_by_saying_so_and_leaving_it_alone(self):
        # Any error passed a non-contiguous case: one raised after writing
        # into the view's storage, and one that says nothing of the layout.
        from disttest.conformance.suite import NOT_A_REJECTION, WROTE_THEN_RAISED

        proc = cli("--backend", "toyscribble", "--import", "toy_backend", "--world-size", "2",
                   "-k", "*_float32*noncontiguous")
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
        out = " ".join(proc.stdout.split())
        self.assertIn(WROTE_THEN_RAISED.format(rank=0, world=2, error="RuntimeError: toyscribble: the tensor "
                                                                       "has to be contiguous"), out)
        self.assertIn(NOT_A_REJECTION.format(error="RuntimeError: toyscribble: connection reset by peer"), out)
        self.assertIn(" 0 passed,", out)

    def test_gloo_whose_barrier_does_not_wait_fails_the_barrier_rows(self):
        proc, report = full_run("--backend", "lazybarrier", "--import", "toy_backend")
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:])
        barrier_rows = {"test_barrier__waits_for_late_rank", "test_barrier__waits_for_late_rank_subgroup"}
        failed = statuses(report, "failed")
        self.assertLessEqual(barrier_rows, failed)
        # NB: once in a CI run gloo's send/recv of a strided tensor failed here
        # too (not reproduced in about ten reruns); any other extra failure is real.
        self.assertLessEqual(failed - barrier_rows, {"test_send_recv__float32_noncontiguous"})
        self.assertEqual(table_rows(proc.stdout)["barrier"], [1, 2, 0, 0])
        self.assertIn("barrier returned after 0.0", proc.stdout)
        # its module's declaration (CONFORMANCE_UNSUPPORTED) counts
        self.assertIn("test_all_reduce__float32_PREMUL_SUM", statuses(report, "unsupported"))


class StrictnessTest(unittest.TestCase):
    K = ("-k", "test_broadcast__float32_src0")

    def test_not_supported_is_a_failure_unless_declared(self):
        proc = cli("--backend", "toybroken", "--world-size", "2", "--import", "toy_backend", *self.K)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("RuntimeError: broadcast is not supported by toybroken -- if toybroken lacks this by "
                      "design, declare it: --unsupported broadcast", proc.stdout)

    def test_declared_on_the_command_line(self):
        proc = cli("--backend", "toybroken", "--world-size", "2", "--import", "toy_backend", *self.K,
                   "--unsupported", "all_to_all,broadcast")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("UNSUPPORTED test_broadcast__float32_src0: declared unsupported: broadcast (--unsupported)",
                      proc.stdout)

    def test_lenient_keeps_the_old_rule(self):
        proc = cli("--backend", "toybroken", "--world-size", "2", "--import", "toy_backend", *self.K, "--lenient")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("broadcast is not supported by toybroken", proc.stdout)
        self.assertEqual(table_rows(proc.stdout)["broadcast"], [0, 0, 1, 0])

    def test_a_backend_name_in_capitals_is_the_backend(self):
        # "GLOO" ran gloo without gloo's declaration: 8 failed where gloo has 8 unsupported.
        proc = cli("--backend", "GLOO", "--world-size", "2", "-k", "PREMUL_SUM")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertIn("conformance of backend 'gloo', world size 2: 0 passed, 0 failed, 8 unsupported", proc.stdout)

    def test_a_run_that_checked_nothing_is_not_ok(self):
        proc = cli("--backend", "gloo", "--world-size", "1", "-k", "overlapping")
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertIn("0 passed, 0 failed, 0 unsupported, 23 skipped (23 cases", proc.stdout)
        self.assertIn("-- NOTHING CHECKED: every case skipped", proc.stdout)

    def test_small_worlds_skip_the_group_cases(self):
        proc = cli("--backend", "threaded", "--world-size", "2", "-k", "test_all_reduce__float32_SUM_*")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertEqual(table_rows(proc.stdout)["all_reduce"], [5, 0, 0, 3])


class DeclarationTest(unittest.TestCase):
    def case(self, **kw):
        fields = {"name": "test_x__y", "collective": "all_reduce", "body": lambda c: None, "dtype": "float32",
                  "op": "SUM", "tags": frozenset({"noncontiguous"})}
        fields.update(kw)
        return Case(**fields)

    def test_tokens(self):
        d = Declaration()
        d.extend("PREMUL_SUM, noncontiguous+broadcast", "--unsupported")
        self.assertIsNone(d.match(self.case()))
        self.assertEqual(d.match(self.case(collective="broadcast")),
                         "declared unsupported: noncontiguous+broadcast (--unsupported)")
        self.assertEqual(d.match(self.case(op="PREMUL_SUM")), "declared unsupported: premul_sum (--unsupported)")

    def test_collectives_this_torch_lacks_are_unsupported_not_failed(self):
        case = self.case(requires=("all_gather_in_the_future", "9.1"))
        self.assertIn("needs torch >= 9.1: torch.distributed.all_gather_in_the_future", torch_lacks(case))
        skip = _skip_for(None, case)
        self.assertTrue(skip.message.startswith("unsupported: unsupported by this torch"), skip)
        self.assertIsNone(torch_lacks(self.case(requires=("all_reduce", "1.0"))))


class CliArgumentsTest(unittest.TestCase):
    def test_bad_arguments(self):
        for args, fragment in (
            (("--backend", "gloo", "--world-size", "zero"), "Invalid world size 'zero' from --world-size"),
            (("--backend", "gloo", "--world-size", "2", "--import", "no_such_module_here"),
             "--import 'no_such_module_here': no such module"),
            (("--backend", "nosuchbackend", "--world-size", "2"), "--backend 'nosuchbackend': no such c10d backend"),
            *([(("--backend", "mpi", "--world-size", "2"), "--backend 'mpi': c10d knows it, but this torch")]
              if not dist.is_mpi_available() else []),
            (("--backend", "threaded", "--world-size", "2", "-k", "nothing*"), "-k 'nothing*' matches no case"),
            (("--backend", "threaded", "--world-size", "2", "-k", "no*", "-k", "none*"),
             "-k 'no*' -k 'none*' matches no case"),
            # (argparse kept the last: nccl alone ran)
            (("--backend", "gloo", "--world-size", "2", "--backend", "nccl"),
             "--backend given twice ('gloo' and 'nccl') (disttest): give it once"),
            (("--backend", "gloo", "--world-size", "2", "--timeout", "5", "--timeout", "9"),
             "--timeout given twice ('5' and '9')"),
            (("--backend", "threaded", "--world-size", "2", "--unsupported", " , "),
             "--unsupported ' , ': no tag in it"),  # (it declared nothing, and ran on)
            (("--backend", "threaded", "--world-size", "2", "--unsupported", "PREMUL_SUM,all_to_al"),
             "--unsupported 'all_to_al': 'all_to_al' is no tag of any case"),
            (("--backend", "gloo", "--world-size", "2", "--device", "bogus"), "--device 'bogus': not a torch device"),
            # (xpu: absent from this host, and from a CUDA host too)
            (("--backend", "gloo", "--world-size", "2", "--device", "xpu"),
             "--device 'xpu': this host has no xpu device"),
        ):
            with self.subTest(args=args):
                code, out, err = main_here(*args)
                self.assertEqual(code, 2, out + err)
                self.assertIn(fragment, err)
                self.assertEqual(out, "")  # no case ran

    def test_the_command_exits_2_on_a_bad_argument(self):
        # (the cases above run main() in this process: an interpreter with
        # torch per case cost 4 s each)
        proc = cli("--backend", "gloo", "--world-size", "zero")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("Invalid world size 'zero' from --world-size", proc.stderr)

    def test_what_fails_before_any_case_runs_names_itself(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "needs_missing.py"), "w") as f:
                f.write("import no_such_dependency_here\n")
            with open(os.path.join(tmp, "raises_at_import.py"), "w") as f:
                f.write("raise RuntimeError('backend library not found')\n")
            base = ("--backend", "threaded", "--world-size", "2")
            for args, fragment in (
                (("--import", "needs_missing"),
                 "--import 'needs_missing': importing it failed: ModuleNotFoundError: "
                 "No module named 'no_such_dependency_here'"),
                (("--import", "raises_at_import"),
                 "--import 'raises_at_import': importing it failed: RuntimeError: backend library not found"),
                (("--json", os.path.join(tmp, "no", "such", "report.json")),
                 f"--json {os.path.join(tmp, 'no', 'such', 'report.json')!r}: its folder "
                 f"{os.path.join(tmp, 'no', 'such')} does not exist"),
                (("--json", tmp), f"--json {tmp!r}: it is a folder; name a file"),
            ):
                with self.subTest(args=args), mock.patch.object(sys, "path", [tmp, *sys.path]):
                    code, out, err = main_here(*base, *args)
                    self.assertEqual(code, 2, out + err)
                    self.assertIn(fragment, err)
                    self.assertEqual(out, "")  # no case ran


class RunApiTest(unittest.TestCase):
    def test_run_from_a_process_with_threads(self):
        # The pool forks its ranks; a thread alive here must not send it to
        # a fork server that cannot import the class run() makes.
        import threading

        from disttest.conformance import run

        stop = threading.Event()
        helper = threading.Thread(target=stop.wait, args=(60,), daemon=True)
        helper.start()
        self.addCleanup(stop.set)
        result = run("gloo", 2, pattern="test_broadcast__float32_src*")
        self.assertEqual(result.counts(), {"passed": 2, "failed": 0, "unsupported": 0, "skipped": 0},
                         [r.message for r in result.cases])
        # Without a wildcard, a part of the name, as unittest's -k (it matched only a whole name).
        # Several patterns: a case matching any runs (as unittest's -k given twice).
        both = run("gloo", 2, pattern=["test_barrier", "broadcast__float32_src0"])
        self.assertEqual(sorted(r.case.name for r in both.cases),
                         sorted(c.name for c in CASES if c.name.startswith("test_barrier")
                                or "broadcast__float32_src0" in c.name))
        self.assertEqual([r.case.name for r in run("gloo", 2, pattern="broadcast__float32_src").cases],
                         [r.case.name for r in result.cases])

    def test_a_malformed_module_declaration(self):
        import types

        from disttest.conformance import module_declaration

        module = types.ModuleType("mine")
        module.CONFORMANCE_UNSUPPORTED = ["all_to_all"]
        with self.assertRaisesRegex(TypeError, r"mine.CONFORMANCE_UNSUPPORTED must map backend names"):
            module_declaration(module, "mine")
        module.CONFORMANCE_UNSUPPORTED = {"mine": ["all_to_all", "PREMUL_SUM"], "other": ["x"]}
        self.assertEqual(module_declaration(module, "mine").reasons,
                         {"all_to_all": "declared by mine", "premul_sum": "declared by mine"})


class MixinTest(unittest.TestCase):
    def test_mixin_in_a_users_class(self):
        import disttest

        class Mine(CollectiveConformance, disttest.MultiThreadedTestCase):
            world_size = 3

            def setUp(self):
                super().setUp()
                self._spawn_threads()

        result = unittest.TestResult()
        unittest.TestSuite([Mine("test_all_reduce__int8_BXOR"), Mine("test_barrier__waits_for_late_rank"),
                            Mine("test_monitored_barrier__all_ranks")]).run(result)
        self.assertEqual((result.testsRun, result.failures, result.errors), (3, [], []))
        self.assertEqual([r for _, r in result.skipped],
                         ["unsupported: declared unsupported: monitored_barrier "
                          "(c10d implements monitored_barrier for gloo only)"])
        self.assertFalse(dist.is_initialized())


class ReferenceTest(unittest.TestCase):
    """The expected values: folded one input at a time, once per process."""

    def test_the_fold_agrees_with_a_stack_of_every_input(self):
        import numpy as np

        from disttest.conformance import reference as ref

        for dtype in ref.DTYPES:
            for op in ref.OPS:
                if not ref.op_defined(op, dtype):
                    continue
                arrays = [ref.rank_input(r, 11, dtype, 3) for r in range(5)]
                wide = (np.bool_ if dtype == "bool" else np.complex128 if dtype == "complex64"
                        else np.float64 if dtype in ref.FLOATS else np.int64)
                stacked = np.stack([np.asarray(a, dtype=wide) for a in arrays])
                want = {"SUM": stacked.sum(0), "AVG": stacked.sum(0) / 5, "PRODUCT": stacked.prod(0),
                        "MIN": stacked.min(0), "MAX": stacked.max(0),
                        "PREMUL_SUM": (stacked * ref.PREMUL_FACTOR).sum(0)}.get(op)
                if dtype == "bool":
                    want = {"BXOR": stacked.sum(0) % 2 == 1}.get(op, stacked.any(0) if op in ("SUM", "MAX", "BOR")
                                                              else stacked.all(0))
                elif want is None:
                    fn = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
                    want = fn.reduce(stacked, axis=0)
                with self.subTest(dtype=dtype, op=op):
                    got = ref.expected_reduce(op, iter(arrays), dtype)
                    np.testing.assert_array_equal(got, np.asarray(want).astype(ref.DTYPES[dtype][1]))

    def test_a_wide_world_costs_one_input_of_memory_once(self):
        # Issue 26: 64 thread ranks, each with a list of every rank's input
        # of 1M elements, took 24 GB and 49 s.
        import tracemalloc

        from disttest.conformance import reference as ref

        ref.expected_reduce_of.cache_clear()
        n, world = 100_000, 64
        tracemalloc.start()
        try:
            first = ref.expected_reduce_of("SUM", tuple(range(world)), n, "float32", 7)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 8 * n * 8)  # a few wide arrays, not 64 of them (64 * 8 * n)
        self.assertIs(ref.expected_reduce_of("SUM", tuple(range(world)), n, "float32", 7), first)
        self.assertFalse(first.flags.writeable)  # shared by every rank: nobody may change it


class DeviceTest(unittest.TestCase):
    """``--device``: where the cases' tensors live (tests/gpu/ runs it on CUDA)."""

    def test_tensors_follow_the_device_of_the_case(self):
        import numpy as np
        import torch

        from disttest.conformance import reference as ref
        from disttest.conformance.suite import _method

        seen = []

        def body(c):
            seen.append((torch.empty(0).device.type, ref.to_torch(np.arange(3), "float32").device.type))

        class Probe:
            conformance_backend = "gloo"
            world_size = 1

        test = _method(Case("test_probe__x", "all_reduce", body))
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            for device in ("meta", "cpu"):
                probe = Probe()
                probe.conformance_device = device
                test(probe)
        finally:
            dist.destroy_process_group()
        self.assertEqual(seen, [("meta", "meta"), ("cpu", "cpu")])

    def test_defaults_and_declarations_by_device(self):
        from disttest.conformance import default_device
        from disttest.conformance.suite import declaration_for

        self.assertEqual(default_device("nccl"), "cuda")
        self.assertEqual(default_device("gloo"), "cpu")
        on_cpu, on_cuda = declaration_for("gloo").reasons, declaration_for("gloo", None, "cuda").reasons
        self.assertNotIn("all_reduce_coalesced", on_cpu)
        self.assertIn("unsupported device type cuda", on_cuda["all_reduce_coalesced"])
        self.assertEqual(set(on_cuda) - {"all_reduce_coalesced"}, set(on_cpu))  # gloo's own row stays
        bitwise = Case("test_x__y", "all_reduce", lambda c: None, dtype="int32", op="BAND")
        self.assertIn("Cannot use ReduceOp.BAND with NCCL", declaration_for("nccl", None, "cuda").match(bitwise))

    def test_a_device_the_host_lacks_is_refused_naming_it_and_where_it_came_from(self):
        import torch

        from disttest import conformance
        from disttest.conformance import conformance_class

        lacks = conformance.NO_SUCH_DEVICE.format(kind="xpu", version=torch.__version__)
        with self.assertRaises(ValueError) as caught:
            conformance_class("threaded", 2, device="xpu")
        self.assertEqual(str(caught.exception), conformance.DEVICE_REFUSED.format(
            source="device", device="xpu", problem=lacks))
        with mock.patch.object(conformance, "default_device", return_value="xpu"), self.assertRaises(ValueError) as caught:
            conformance_class("threaded", 2)
        self.assertEqual(str(caught.exception), conformance.DEFAULT_DEVICE_REFUSED.format(
            device="xpu", backend="threaded", problem=lacks))
        with self.assertRaisesRegex(ValueError, re.escape(conformance.ONE_DEVICE.format(kind="cuda"))):
            conformance_class("threaded", 2, device="cuda:1")
        self.assertEqual(conformance_class("threaded", 2).conformance_device, "cpu")
        self.assertEqual(conformance_class("threaded", 2, device="cpu:0").conformance_device, "cpu")

    def test_the_pools_rank_r_takes_device_r_modulo_the_count(self):
        from disttest import _compat, conformance
        from disttest.runners.continuous import MultiProcContinousTest

        with mock.patch.object(conformance, "device_problem", return_value=None):
            cls = conformance.conformance_class("gloo", 3, device="cuda")
        self.assertEqual(cls.conformance_device, "cuda")
        for count, want in ((2, 1), (0, 0)):  # (0: none visible in the rank; no division by zero)
            with self.subTest(count=count), mock.patch.object(_compat, "accelerator_count", return_value=count), \
                    mock.patch.object(_compat, "set_device_index") as set_index, \
                    mock.patch.object(MultiProcContinousTest, "_init_pg") as init:
                cls._init_pg(3, 3, "/nonexistent")
            set_index.assert_called_once_with(want)
            init.assert_called_once()

