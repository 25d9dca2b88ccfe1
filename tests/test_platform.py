"""disttest.support.platform (upstream's machine-dependent names of
common_distributed) and the reductions and creator of the threaded and fake
groups, compared with upstream's where it has them."""

from __future__ import annotations

import queue
import sys
import threading
import types
import unittest
from unittest import mock

import torch

import disttest
from disttest.support import platform, skips


class FactsTest(unittest.TestCase):
    def setUp(self):
        saved = dict(platform._facts)
        self.addCleanup(lambda: (platform._facts.clear(), platform._facts.update(saved)))
        platform._facts.clear()

    def test_facts_are_read_when_asked_and_kept(self):
        self.assertNotIn("TORCHCOMM_HAS_NCCL", platform._facts)  # nothing at import
        self.assertIs(disttest.TORCHCOMM_HAS_NCCL, False)  # no torchcomms here
        self.assertIs(platform._facts["TORCHCOMM_HAS_NCCL"], False)
        self.assertIs(disttest.PLATFORM_SUPPORTS_SYMM_MEM, torch.cuda.is_available())

    def test_torchcomms_flags_ask_torchcomms(self):
        fake = types.SimpleNamespace(is_backend_built=lambda name: name in ("gloo", "ncclx"))
        with mock.patch.dict(sys.modules, {"torchcomms": fake}), \
                mock.patch("importlib.util.find_spec", return_value=object()):
            self.assertEqual([getattr(platform, f"TORCHCOMM_HAS_{b}") for b in ("GLOO", "NCCL", "NCCLX")],
                             [True, False, True])

    def test_unknown_names_are_attribute_errors(self):
        with self.assertRaises(AttributeError):
            platform.NOT_A_NAME  # noqa: B018


def outcome(decorated) -> tuple[str, str]:
    class Case(unittest.TestCase):
        @decorated
        def test_x(self):
            pass

    result = unittest.TestResult()
    Case("test_x").run(result)
    return ("skipped", result.skipped[0][1]) if result.skipped else ("ran", "")


class DecoratorsTest(unittest.TestCase):
    def test_gpu_requirements_skip_on_cpu_with_upstreams_reasons(self):
        if torch.cuda.is_available():
            self.skipTest("a CPU machine's answer")
        kind, reason = outcome(disttest.requires_multicast_support())
        self.assertEqual((kind, reason), ("skipped", "multicast support is not available"))
        kind, reason = outcome(disttest.requires_nccl_shrink())
        self.assertEqual(kind, "skipped")
        # as upstream says on a build without NCCL; on a CUDA build with no GPU, which GPU is missing
        self.assertEqual(reason, skips.NCCL_NO_GPU if torch.distributed.is_nccl_available() else skips.NCCL_NOT_BUILT)

    def test_rocm_decorators_skip_only_on_rocm(self):
        self.assertEqual(outcome(disttest.skip_if_rocm_arch_multiprocess(("gfx90a",)))[0], "ran")
        self.assertEqual(outcome(disttest.skip_if_rocm_ver_lessthan_multiprocess((6, 0)))[0], "ran")
        self.assertEqual(outcome(disttest.skip_if_rocm_ver_atleast_multiprocess((5, 0)))[0], "ran")
        props = types.SimpleNamespace(gcnArchName="gfx90a:sramecc+:xnack-")
        with mock.patch.object(platform, "_on_rocm", return_value=True), \
                mock.patch("torch.cuda.get_device_properties", return_value=props), \
                mock.patch.object(torch.version, "hip", "5.7.1-abc"):
            self.assertEqual(outcome(disttest.skip_if_rocm_arch_multiprocess(("gfx90a",))),
                             ("skipped", "skip_if_rocm_arch_multiprocess: test skipped on ('gfx90a',)"))
            self.assertEqual(outcome(disttest.skip_if_rocm_arch_multiprocess(("gfx942",)))[0], "ran")
            self.assertEqual(outcome(disttest.skip_if_rocm_ver_lessthan_multiprocess((6, 0))), (
                "skipped", "skip_if_rocm_ver_lessthan_multiprocess: ROCm (5, 7, 1) is available but (6, 0) required"))
            self.assertEqual(outcome(disttest.skip_if_rocm_ver_lessthan_multiprocess((5, 0)))[0], "ran")
            # torch 2.14's: a known failure from a ROCm version on.
            self.assertEqual(outcome(disttest.skip_if_rocm_ver_atleast_multiprocess((5, 7))), (
                "skipped", "skip_if_rocm_ver_atleast_multiprocess: known failure on ROCm (5, 7, 1) (>= (5, 7))"))
            self.assertEqual(outcome(disttest.skip_if_rocm_ver_atleast_multiprocess((5, 7, 2)))[0], "ran")
            self.assertEqual(outcome(disttest.skip_if_rocm_ver_atleast_multiprocess())[0], "ran")

    def test_small_answers(self):
        self.assertTrue(disttest.requires_ddp_rank("cuda"))
        self.assertFalse(disttest.requires_ddp_rank("cpu"))
        self.assertTrue(disttest.sm_is_or_higher_than(torch.device("cpu"), 9, 0))
        self.assertEqual(disttest.DDP_RANK_DEVICES, ["cuda", "xpu"])
        self.assertEqual(disttest.logger.name, "disttest")


class _Process:
    def __init__(self, alive: bool, exitcode: int | None = None) -> None:
        self._alive, self.exitcode = alive, exitcode

    def is_alive(self) -> bool:
        return self._alive


class CompletionQueueTest(unittest.TestCase):
    def test_the_result(self):
        q: queue.Queue = queue.Queue()
        threading.Timer(0.1, q.put, args=("done",)).start()
        self.assertEqual(disttest.retrieve_result_from_completion_queue(_Process(True), q), "done")

    def test_a_process_that_ended_without_one(self):
        got = disttest.retrieve_result_from_completion_queue(_Process(False, 3), queue.Queue())
        self.assertIsInstance(got, RuntimeError)
        self.assertEqual(str(got), "Exited with 3")

    def test_a_timeout_is_bounded(self):
        got = disttest.retrieve_result_from_completion_queue(_Process(True), queue.Queue(), timeout=1)
        self.assertIsInstance(got, RuntimeError)
        self.assertIn("Process timed out after", str(got))


class TempDirTest(unittest.TestCase):
    def test_tmp_dir_is_the_directory_initialize_made(self):
        path = disttest.initialize_temp_directories()
        try:
            self.assertEqual(disttest.tmp_dir.name, path)
        finally:
            disttest.tmp_dir.cleanup()
        self.assertIsNone(disttest.tmp_dir)


class GroupsTest(unittest.TestCase):
    def test_reductions_match_upstreams(self):
        from torch.testing._internal.distributed import multi_threaded_pg as upstream

        tensors = [torch.tensor([1, 6, 3]), torch.tensor([4, 2, 5])]
        for op in (torch.sum, torch.prod, torch.min, torch.max):
            with self.subTest(op=op.__name__):
                self.assertTrue(torch.equal(disttest.binop_reduce(tensors, op), upstream.binop_reduce(tensors, op)))
        for op in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
            with self.subTest(op=op.__name__):
                self.assertTrue(torch.equal(disttest.bitwise_reduce(tensors, op),
                                            upstream.bitwise_reduce(tensors, op)))

    def test_the_fake_creator_makes_a_fake_group(self):
        options = disttest.FakeProcessGroup.Options()
        group = disttest._create_fake_pg(types.SimpleNamespace(group_rank=1, group_size=4), options)
        self.assertIsInstance(group, disttest.FakeProcessGroup)
        self.assertEqual((group.rank(), group.size()), (1, 4))


if __name__ == "__main__":
    unittest.main()


class TorchcommsTest(unittest.TestCase):
    def test_without_torchcomms_the_group_and_the_base_skip_naming_the_backend(self):
        from disttest.bases.torchcomms import C10dTorchCommsTestBase

        with self.assertRaises(unittest.SkipTest) as cm:
            disttest.setup_torchcomms_pg("nccl", 0, 1, torch.device("cpu"), "/nonexistent", "g")
        self.assertEqual(str(cm.exception), "torchcomms nccl backend is not available")

        class Suite(C10dTorchCommsTestBase):
            world_size = 2

            def test_x(self):
                raise AssertionError("must not run")

        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Suite).run(result)
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual([reason for _, reason in result.skipped], ["torchcomms gloo backend is not available"])
        # instantiate_device_type_tests makes device_type a string on its classes
        # (TypeError: 'str' object is not callable, an error where upstream skips).
        Suite.device_type = "cpu"  # type: ignore[assignment]
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Suite).run(result)
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual([reason for _, reason in result.skipped], ["torchcomms gloo backend is not available"])

    def test_backend_by_device(self):
        from disttest.bases.torchcomms import C10dTorchCommsTestBase as Base

        self.assertEqual([Base.backend(d) for d in ("cuda:1", "xpu", "hpu", "cpu")], ["nccl", "xccl", "hccl", "gloo"])
