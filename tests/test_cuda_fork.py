"""Start methods and CUDA (disttest._runner.cuda_fork): ranks that could not
use CUDA when forked start with spawn instead, with a warning that says why.

This host has no GPU: ``torch.cuda.is_initialized`` is mocked in the test
process, and faked at import in a module run in an interpreter of its own
(cuda_import_cases.py) for the fork server's side. tests/gpu/ runs the same
paths with real CUDA (``make gpu-check``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest
import warnings
from unittest import mock

import cuda_fork_cases as cases
import psutil
import torch
from runner_cases import live_ranks

from disttest import _compat
from disttest._runner import cuda_fork, zygote

HERE = os.path.dirname(os.path.abspath(__file__))


def cuda_initialised(value: bool = True) -> mock._patch:
    return mock.patch.object(torch.cuda, "is_initialized", return_value=value)


def one_thread() -> mock._patch:
    """The pool forks only from a process with no other thread (an xdist
    worker has one); else it uses the fork server, which CUDA cannot reach."""
    return mock.patch("threading.active_count", return_value=1)


def run(test: unittest.TestCase) -> tuple[unittest.TestResult, list[str]]:
    """Run ``test`` (with its class's fixtures); the result and the warnings."""
    result = unittest.TestResult()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unittest.TestSuite([test]).run(result)
    return result, [str(w.message) for w in caught]


class Mixin:
    def assertPassed(self, result: unittest.TestResult) -> None:
        self.assertEqual(result.errors + result.failures + result.skipped, [])
        self.assertEqual(result.testsRun, 1)

    def tearDown(self) -> None:
        deadline = time.monotonic() + 5
        while live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(live_ranks(), [], "a rank outlived its test")
        super().tearDown()  # type: ignore[misc]


class ForkFromACudaProcessTest(Mixin, unittest.TestCase):
    def test_fresh_processes_fall_back_to_spawn(self):
        with cuda_initialised():
            result, caught = run(cases.Fresh("test_spawned"))
        self.assertPassed(result)
        self.assertIn(cuda_fork.FELL_BACK.format(
            test="Fresh.test_spawned", method="fork", source="Fresh.start_method",
            reason=cuda_fork.PARENT_INITIALISED, cls="Fresh"), caught)

    def test_the_variable_is_named_as_the_source(self):
        with cuda_initialised(), mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "fork"}):
            method, note = cuda_fork.choose("fork", cases.Fresh, "t", "environment variable DISTTEST_START_METHOD",
                                            importable=True)
        self.assertEqual(method, "spawn")
        self.assertIn("instead of 'fork' (from environment variable DISTTEST_START_METHOD)", note)

    def test_without_cuda_fork_stays(self):
        with cuda_initialised(False):
            result, caught = run(cases.Fresh("test_forked"))
        self.assertPassed(result)
        self.assertEqual([w for w in caught if "(disttest)" in w], [])

    def test_a_class_spawn_cannot_import_is_forked_with_a_warning(self):
        class Local(cases.Fresh):
            pass

        with cuda_initialised():
            result, caught = run(Local("test_forked"))
        self.assertPassed(result)
        self.assertIn(cuda_fork.FORKED_ANYWAY.format(
            test=f"{Local.__qualname__}.test_forked", reason=cuda_fork.PARENT_INITIALISED, cls=Local.__qualname__),
            caught)

    def test_the_fork_server_is_not_reached_by_the_test_processs_cuda(self):
        # A fresh interpreter (subprocess), not a fork of the test process:
        # whenever the test process initialised CUDA, its ranks stay forked.
        with cuda_initialised(), mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "zygote"}):
            result, caught = run(cases.Fresh("test_forked"))
        self.assertPassed(result)
        self.assertEqual([w for w in caught if "(disttest)" in w], [])
        server = psutil.Process(zygote._client().proc.pid)
        self.assertEqual(server.cmdline()[:2], [sys.executable, "-c"])

    def test_the_pool_falls_back_to_spawn(self):
        with cuda_initialised(), one_thread():
            result, caught = run(cases.Pooled("test_spawned"))
        self.assertPassed(result)
        self.assertIn(cuda_fork.FELL_BACK.format(
            test="the pool of Pooled", method="fork", source="Pooled.start_method",
            reason=cuda_fork.PARENT_INITIALISED, cls="Pooled"), caught)


class PoolOnACudaHostTest(unittest.TestCase):
    """The pool's default fork becomes the fork server where CUDA devices
    exist: the test process has most likely poisoned fork already."""

    def test_default_fork_becomes_the_fork_server(self):
        # Asked through NVML only: where NVML counts a device, and where it
        # cannot count (the driver, which would poison fork, is never asked).
        from disttest import _compat

        driver = AssertionError("torch.cuda.device_count() asked the driver: fork is poisoned")
        for nvml in (1, -1):
            with self.subTest(nvml=nvml), mock.patch.object(cuda_fork, "_no_device", {}), \
                    mock.patch.object(torch.backends.cuda, "is_built", return_value=True), \
                    mock.patch.object(cuda_fork.glob, "glob", return_value=["/dev/nvidia0"]), \
                    mock.patch.object(_compat, "nvml_device_count", return_value=nvml), \
                    mock.patch.object(torch.cuda, "device_count", side_effect=driver), \
                    cuda_initialised(False), one_thread():
                self.assertEqual(cases.Pooled._start_choice(),
                                 ("zygote", "disttest's fork server in place of Pooled.start_method 'fork'", None))
                with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": "fork"}):  # the user's choice stays
                    self.assertEqual(cases.Pooled._start_choice()[0], "fork")
                # Not where the fork server could not start (the fallback's fork).
                self.assertEqual(cuda_fork.choose("fork", cases.Pooled, "t", "Pooled.start_method", True,
                                                  server=False), ("fork", None))

    def test_not_on_a_host_without_cuda(self):
        with one_thread():
            self.assertEqual(cases.Pooled._start_choice(), ("fork", "Pooled.start_method", None))

    def test_only_disttest_defaults_count_as_defaults(self):
        self.assertTrue(cuda_fork.chosen_by_disttest(cases.Pooled, "Pooled.start_method"))
        self.assertFalse(cuda_fork.chosen_by_disttest(cases.Fresh, "Fresh.start_method"))
        self.assertFalse(cuda_fork.chosen_by_disttest(cases.Pooled, "environment variable DISTTEST_START_METHOD"))


class ForkServerTest(unittest.TestCase):
    def test_a_module_that_initialises_cuda_at_import(self):
        # The fork server imports the module, finds CUDA initialised, refuses
        # and retires; the fresh test's ranks and the pool's are spawned.
        proc = subprocess.run([sys.executable, "-W", "always", "-m", "unittest", "-v", "cuda_import_cases"],
                              cwd=HERE, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
        text = " ".join(proc.stderr.split())
        server = cuda_fork.SERVER_INITIALISED.format(module="cuda_import_cases")
        self.assertIn(cuda_fork.FELL_BACK.format(
            test="Fresh.test_spawned", method="zygote", source="Fresh.start_method", reason=server, cls="Fresh"), text)
        self.assertIn(cuda_fork.FELL_BACK.format(
            test="the pool of Pooled", method="fork", source="Pooled.start_method",
            reason=cuda_fork.PARENT_INITIALISED, cls="Pooled"), text)
        self.assertIn("learned: ['cuda_import_cases']", text)
        self.assertIn("servers: 0 retired: 0", text)

    def test_the_server_checks_availability_through_nvml(self):
        # So that torch.cuda.is_available() in a test module it imports does
        # not poison its forks.
        server = zygote._client().proc.pid
        self.assertEqual(psutil.Process(server).environ().get(cuda_fork.NVML_CHECK_ENV), "1")

    def test_a_known_module_goes_to_spawn_without_asking(self):
        module = cases.Fresh.__module__
        self.assertEqual(cuda_fork.choose("zygote", cases.Fresh, "t", "s", True), ("zygote", None))
        with mock.patch.object(cuda_fork, "_cuda_at_import", {module}):
            method, note = cuda_fork.choose("zygote", cases.Fresh, "t", "s", True)
        self.assertEqual(method, "spawn")
        self.assertIn(cuda_fork.SERVER_INITIALISED.format(module=module), note)


class DeviceHelpersTest(unittest.TestCase):
    def test_counting_devices_does_not_poison_fork(self):
        """torch.cuda.is_available() poisons fork on a CUDA host (it calls
        cuInit); disttest.HAS_ACCELERATOR counts through
        _compat.accelerator_count. torch.cuda.device_count() asks NVML instead."""
        poison = AssertionError("torch.cuda.is_available() poisons fork")
        with mock.patch.object(torch.accelerator, "current_accelerator", return_value=torch.device("cuda")), \
                mock.patch.object(torch.cuda, "is_available", side_effect=poison), \
                mock.patch.object(torch.cuda, "device_count", return_value=2):
            self.assertEqual(_compat.accelerator_count(), 2)
            self.assertEqual(_compat.accelerator_type(), "cuda")

    def test_importing_disttest_counts_no_device(self):
        """Where NVML cannot count, torch's count falls back to the driver,
        which would poison fork: importing disttest, its runners and skips
        must not count; HAS_ACCELERATOR counts at its first read, once."""
        script = (
            "import torch\n"
            "calls = []\n"
            "real = torch.accelerator.device_count\n"
            "torch.accelerator.device_count = lambda: calls.append(1) or real()\n"
            "import disttest, disttest.support.skips, disttest.runners.case\n"
            "from disttest import skip_if_lt_x_gpu, TestCase\n"
            "print(len(calls))\n"
            "print(disttest.HAS_ACCELERATOR, disttest.HAS_ACCELERATOR)\n"
            "from disttest import HAS_ACCELERATOR\n"
            "print(len(calls))\n"
        )
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertEqual(proc.stdout.split("\n")[:3], ["0", "False False", "1"])


if __name__ == "__main__":
    unittest.main()
