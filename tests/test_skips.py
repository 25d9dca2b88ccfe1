"""Every skip decorator on a plain test, its exit code, and the one mapping."""

from __future__ import annotations

import os
import re
import unittest
from unittest import mock

import torch

import disttest
from disttest import TEST_SKIPS, DistSkip, skip_for_exit_code
from disttest.config import ConfigError
from disttest.support.skips import precheck_skip

SKIP, RUN = "skip", "run"
ran: list[str] = []
#: NCCL's skip reason on this build: a CPU-only torch lacks NCCL; a CUDA build
#: on a host without GPUs has it but cannot use it (tests/test_cuda_build.py).
NCCL_REASON = disttest.support.skips.NCCL_NOT_BUILT if not torch.distributed.is_nccl_available() else disttest.support.skips.NCCL_NO_GPU
XCCL_REASON = disttest.support.skips.XCCL_NOT_BUILT if not torch.distributed.is_xccl_available() else disttest.support.skips.XCCL_NO_XPU

# (decorator, world size of the test class, env, expected outcome, upstream key
#  or message). This host has no accelerator and only gloo among the usable
#  backends (torch may be a CPU-only or a CUDA build).
CASES = [
    (disttest.skip_if_no_gpu, 2, {}, SKIP, "no_cuda"),
    (disttest.skip_if_small_worldsize, 4, {}, SKIP, "small_worldsize"),
    (disttest.skip_if_small_worldsize, 4, {"BACKEND": "mpi"}, RUN, None),
    (disttest.skip_if_small_worldsize, 4, {"BACKEND": "MPI"}, RUN, None),  # as c10d reads the name
    (disttest.skip_if_odd_worldsize, 3, {"BACKEND": " Mpi"}, RUN, None),
    (disttest.skip_if_small_worldsize, 8, {}, RUN, None),
    (disttest.skip_if_odd_worldsize, 3, {}, SKIP, "odd_worldsize"),
    (disttest.skip_if_odd_worldsize, 4, {}, RUN, None),
    (disttest.require_n_gpus_for_nccl_backend(2, "nccl"), 2, {}, SKIP, "multi-gpu-2"),
    (disttest.require_n_gpus_for_nccl_backend(2, "gloo"), 2, {}, RUN, None),
    (disttest.nccl_skip_if_lt_x_gpu("nccl", 3), 2, {}, SKIP, "multi-gpu-3"),
    (disttest.nccl_skip_if_lt_x_gpu("gloo", 3), 2, {}, RUN, None),
    (disttest.skip_if_lt_x_gpu(4), 2, {}, SKIP, "multi-gpu-4"),
    (disttest.skip_if_lt_x_gpu(4, allow_cpu=True), 2, {}, RUN, None),
    (disttest.skip_if_rocm, 2, {}, RUN, None),
    (disttest.requires_gloo(), 2, {}, RUN, None),
    (disttest.requires_nccl(), 2, {}, SKIP, NCCL_REASON),
    (disttest.requires_ucc(), 2, {}, SKIP, "c10d was not compiled with the UCC backend"),
    (disttest.requires_mpi(), 2, {}, SKIP, "c10d was not compiled with the MPI backend"),
    (disttest.requires_xccl(), 2, {}, SKIP, XCCL_REASON),
    (disttest.requires_nccl_version((2, 0), "x"), 2, {}, SKIP, NCCL_REASON),
    (disttest.requires_accelerator_dist_backend(), 2, {}, SKIP,
     "No accelerator communication backend available among ['nccl', 'xccl', 'hccl']"),
    (disttest.skip_if_rocm_multiprocess, 2, {}, RUN, None),
    (disttest.skip_if_win32(), 2, {}, RUN, None),
    (disttest.requires_world_size(2), 2, {}, SKIP, "requires 2 GPUs, found 0"),
    (disttest.requires_world_size(2, allow_cpu=True), 2, {}, RUN, None),
    (disttest.skip_but_pass_in_sandcastle("because"), 2, {}, SKIP, "because"),
    (disttest.skip_but_pass_in_sandcastle_if(True, "why"), 2, {}, SKIP, "why"),
    (disttest.skip_but_pass_in_sandcastle_if(False, "why"), 2, {}, RUN, None),
]


def make_case(decorator, world_size):
    class Case(disttest.TestCase):
        @decorator
        def test_body(self):
            ran.append(self.id())

    Case.world_size = world_size
    return Case("test_body")


@unittest.skipIf(disttest.HAS_ACCELERATOR, "the table is written for a host without accelerators")
class DecoratorTableTest(unittest.TestCase):
    def test_each_decorator_on_a_plain_test(self):
        for decorator, world_size, env, outcome, expected in CASES:
            name = getattr(decorator, "__qualname__", repr(decorator))
            with self.subTest(decorator=name, world_size=world_size, env=env):
                ran.clear()
                result = unittest.TestResult()
                with mock.patch.dict(os.environ, env):
                    make_case(decorator, world_size).run(result)
                self.assertEqual(result.errors + result.failures, [])
                if outcome == RUN:
                    self.assertEqual(len(ran), 1)
                    self.assertEqual(result.skipped, [])
                    continue
                self.assertEqual(ran, [])
                message = TEST_SKIPS[expected].message if expected in TEST_SKIPS else expected
                self.assertEqual([reason for _, reason in result.skipped], [message])

    def test_call_time_skips_carry_the_upstream_exit_code(self):
        for decorator, world_size, env, outcome, key in CASES:
            if outcome != SKIP or key not in TEST_SKIPS:
                continue
            with self.subTest(key=key):
                case = make_case(decorator, world_size)
                with mock.patch.dict(os.environ, env), self.assertRaises(DistSkip) as ctx:
                    case.test_body()
                self.assertEqual(ctx.exception.exit_code, TEST_SKIPS[key].exit_code)
                # The exit-code form maps back to the same skip.
                self.assertEqual(skip_for_exit_code(ctx.exception.exit_code), TEST_SKIPS[key])

    def test_rocm_and_transformers_checks(self):
        with mock.patch.object(torch.version, "hip", "6.0"):
            with self.assertRaises(DistSkip) as ctx:
                make_case(disttest.skip_if_rocm, 2).test_body()
        self.assertEqual(ctx.exception.exit_code, 78)
        with mock.patch("importlib.util.find_spec", return_value=None):
            with self.assertRaises(DistSkip) as ctx:
                make_case(disttest.import_transformers_or_skip(), 2).test_body()
        self.assertEqual(ctx.exception.exit_code, TEST_SKIPS["importerror"].exit_code)


class XcclTest(unittest.TestCase):
    def test_requires_xccl_needs_the_build_and_an_xpu(self):
        skips = disttest.support.skips
        for built, xpus, expected in ((False, 1, skips.XCCL_NOT_BUILT), (True, 0, skips.XCCL_NO_XPU), (True, 2, None)):
            with self.subTest(built=built, xpus=xpus), \
                    mock.patch.object(torch.distributed, "is_xccl_available", return_value=built), \
                    mock.patch.object(torch.xpu, "device_count", return_value=xpus):
                ran.clear()
                result = unittest.TestResult()
                make_case(disttest.requires_xccl(), 2).run(result)
                self.assertEqual([reason for _, reason in result.skipped], [] if expected is None else [expected])
                self.assertEqual(len(ran), int(expected is None))


class ExitCodeMappingTest(unittest.TestCase):
    def test_table_matches_upstream(self):
        codes = sorted(skip.exit_code for skip in TEST_SKIPS.values())
        self.assertEqual(codes, list(range(72, 90)))
        self.assertEqual(TEST_SKIPS["generic"].exit_code, 86)

    def test_every_code_maps_back(self):
        for key, skip in TEST_SKIPS.items():
            with self.subTest(key=key):
                self.assertIs(skip_for_exit_code(skip.exit_code), skip)

    def test_the_table_is_read_as_it_is_now(self):
        # (a suite may reword an entry; upstream reads TEST_SKIPS when it judges)
        from unittest import mock

        with mock.patch.dict(TEST_SKIPS, {"generic": disttest.TestSkip(86, "the suite's words")}):
            self.assertEqual(skip_for_exit_code(86).message, "the suite's words")
        self.assertEqual(skip_for_exit_code(86).message, TEST_SKIPS["generic"].message)

    def test_other_codes_are_not_skips(self):
        for code in (0, 1, 10, 71, 90, None, "74"):
            self.assertIsNone(skip_for_exit_code(code))


class PrecheckTest(unittest.TestCase):
    def test_parent_decides_without_running_the_body(self):
        case = make_case(disttest.skip_if_lt_x_gpu(2), 2)
        method = type(case).test_body
        skip = precheck_skip(case, method)
        self.assertIsInstance(skip, DistSkip)
        self.assertEqual(skip.exit_code, 77)
        self.assertIsNone(precheck_skip(case, make_case(disttest.skip_if_odd_worldsize, 2).test_body))

    def test_stacked_checks_are_all_recorded(self):
        class Case(disttest.TestCase):
            world_size = 3

            @disttest.skip_if_odd_worldsize
            @disttest.skip_if_lt_x_gpu(1, allow_cpu=True)
            def test_body(self):
                pass

        self.assertEqual(len(Case.test_body.__disttest_skip_checks__), 2)
        self.assertEqual(precheck_skip(Case("test_body"), Case.test_body).exit_code, 87)


class WorldSizeSourceTest(unittest.TestCase):
    def test_missing_world_size_is_a_named_error(self):
        class Case(unittest.TestCase):
            @disttest.skip_if_odd_worldsize
            def test_body(self):
                pass

        env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
        with mock.patch.dict(os.environ, env, clear=True):
            with self.assertRaisesRegex(ConfigError, "skip_if_odd_worldsize"):
                Case("test_body").test_body()
        with mock.patch.dict(os.environ, {"WORLD_SIZE": "three"}):
            with self.assertRaisesRegex(ConfigError, "'three' from environment variable WORLD_SIZE"):
                Case("test_body").test_body()
        with mock.patch.dict(os.environ, {"WORLD_SIZE": "3"}), self.assertRaises(DistSkip):
            Case("test_body").test_body()

    def test_required_world_size_is_recorded(self):
        class Case(disttest.TestCase):
            @disttest.requires_world_size(3, allow_cpu=True)
            def test_body(self):
                pass

            def test_plain(self):
                pass

        self.assertEqual(disttest.get_required_world_size(Case("test_body"), 4), 3)
        self.assertEqual(disttest.get_required_world_size(Case("test_plain"), 4), 4)
        # As upstream's: the name from _current_test_name() where there is
        # one, and the default for what is not a test case.
        self.assertEqual(disttest.get_required_world_size(object(), 5), 5)
        named = Case("test_plain")
        named._current_test_name = lambda: "test_body"
        self.assertEqual(disttest.get_required_world_size(named, 4), 3)
        with self.assertRaises(ConfigError):
            disttest.requires_world_size(0)


class FeatureTablesTest(unittest.TestCase):
    def test_upstream_tables(self):
        self.assertIn("nccl", disttest.DistTestCases.skip_collective["allgather_coalesced"])
        self.assertIn("gloo", disttest.DistTestCases.backend_feature["subgroup"])
        self.assertEqual(disttest.ACCELERATOR_DIST_BACKENDS, ["nccl", "xccl", "hccl"])

class GpuCountTest(unittest.TestCase):
    def test_a_bad_count_is_named_where_the_decorator_is_applied(self):
        for make, where in ((lambda n: disttest.skip_if_lt_x_gpu(n), "skip_if_lt_x_gpu(x=...)"),
                            (lambda n: disttest.skip_if_lt_x_gpu(n, allow_cpu=True), "skip_if_lt_x_gpu(x=...)"),
                            (lambda n: disttest.nccl_skip_if_lt_x_gpu("nccl", n), "nccl_skip_if_lt_x_gpu(x=...)"),
                            (lambda n: disttest.require_n_gpus_for_nccl_backend(n, "gloo"),
                             "require_n_gpus_for_nccl_backend(n=...)")):
            for bad in ("2", 2.0, None, -1, True):
                with self.subTest(where=where, bad=bad), self.assertRaises(disttest.ConfigError) as ctx:
                    make(bad)
                self.assertIn(f"Invalid GPU count {bad!r} from {where} (disttest): expected an int >= 0",
                              str(ctx.exception))
        disttest.skip_if_lt_x_gpu(0)  # none needed: runs everywhere

    def test_backend_names_as_c10d_reads_them(self):
        # " gloo" and "gloo,gloo" passed the name check and then skipped every
        # test as "not available"; c10d refuses both.
        from disttest.support.skips import backend_skip_reason, check_backend_name

        for bad in (" gloo", "gloo ", "gloo,gloo", "cpu:gloo,cuda", "cpu: gloo", ":gloo", "", "cpu:gloo:x"):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(ConfigError, f"Invalid backend {bad!r} from P.backend_str\\(\\)"):
                    check_backend_name(bad, "P.backend_str()")
        for good in ("gloo", "GLOO", "cpu:gloo", "cpu:gloo,cuda:nccl"):
            check_backend_name(good, "P.backend_str()")
        self.assertIsNone(backend_skip_reason("cpu:gloo"))
        if backend_skip_reason("nccl") is not None:  # (this host: no nccl, or no GPU)
            self.assertRegex(backend_skip_reason("cpu:gloo,cuda:nccl"),
                             r"^Backend 'nccl' \(of 'cpu:gloo,cuda:nccl'\) is not available")

    def test_a_name_these_decorators_cannot_use_is_refused(self):
        from disttest.bases.backend import (
            require_backend_is_available,
            require_exact_world_size,
            require_world_size,
        )

        for make, bad, where in ((require_world_size, "2", "require_world_size(world_size=...)"),
                                 (require_world_size, 0, "require_world_size(world_size=...)"),
                                 (require_exact_world_size, 2.0, "require_exact_world_size(world_size=...)")):
            with self.subTest(make=make.__name__, bad=bad):
                with self.assertRaisesRegex(ConfigError, f"Invalid world size {bad!r} from {re.escape(where)}"):
                    make(bad)
        # (a typo skipped the test every time, as upstream's does)
        with self.assertRaisesRegex(ConfigError, r"Invalid backends \['nccll'\] from "
                                                 r"requires_accelerator_dist_backend\(backends=...\)"):
            disttest.requires_accelerator_dist_backend(["nccll"])
        decorated = require_backend_is_available(["gloo", "glo"])(lambda *a: None)
        with mock.patch.dict(os.environ, {"BACKEND": "gloo", "WORLD_SIZE": "2"}):
            with self.assertRaisesRegex(ConfigError, r"Invalid backend 'glo' from require_backend_is_available"):
                decorated(None)
            require_backend_is_available("gloo")(lambda *a: None)(None)  # (one name, not its letters)

    def test_one_backend_name_is_one_name(self):
        from disttest.support import skips

        decorated = skips.requires_accelerator_dist_backend("nccl")(lambda: None)
        with self.assertRaises(unittest.SkipTest) as ctx:
            decorated()
        self.assertIn("among ['nccl']", str(ctx.exception))
