"""Start methods with CUDA: a module that touches CUDA at import, a test
process that initialised CUDA, and whether importing disttest leaves a
process able to fork ranks that use CUDA. Each case runs in an interpreter
of its own, so that its CUDA stays out of this one. Run by ``make
gpu-check``; skipped where CUDA is absent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest

import pytest

from disttest._runner import cuda_fork

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))


def run_module(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "always", "-m", "unittest", "-v", name], cwd=HERE,
                          capture_output=True, text=True, timeout=600)


def one_line(text: str) -> str:
    return " ".join(text.split())


class CudaAtImportTest(unittest.TestCase):
    def test_fresh_and_pooled_tests_of_a_module_that_touches_cuda_at_import(self):
        # The fork server refuses to fork once the module's import initialised
        # CUDA in it; the class that asked for fork, and the pool, fork from a
        # test process that initialised CUDA: every test's ranks are spawned.
        proc = run_module("cuda_at_import_cases")
        self.assertEqual(proc.returncode, 0, proc.stderr[-6000:])
        self.assertNotIn("Cannot re-initialize CUDA", proc.stderr)
        text = one_line(proc.stderr)
        server = cuda_fork.SERVER_INITIALISED.format(module="cuda_at_import_cases")
        for test, method, source, reason, cls in (
                ("Fresh.test_nccl", "zygote", "Fresh.start_method", server, "Fresh"),
                ("Forked.test_gloo_cuda", "fork", "Forked.start_method", cuda_fork.PARENT_INITIALISED, "Forked"),
                ("the pool of Pooled", "fork", "Pooled.start_method", cuda_fork.PARENT_INITIALISED, "Pooled")):
            with self.subTest(test=test):
                self.assertIn(cuda_fork.FELL_BACK.format(test=test, method=method, source=source, reason=reason,
                                                         cls=cls), text)
        self.assertIn("learned: ['cuda_at_import_cases']", text)

    def test_the_fork_server_is_unaffected_by_cuda_in_the_test_process(self):
        proc = run_module("parent_cuda_cases")
        self.assertEqual(proc.returncode, 0, proc.stderr[-6000:])
        text = one_line(proc.stderr)
        self.assertNotIn("instead of 'zygote'", text)
        self.assertIn(cuda_fork.FELL_BACK.format(
            test="Forked.test_spawned_instead", method="fork", source="Forked.start_method",
            reason=cuda_fork.PARENT_INITIALISED, cls="Forked"), text)


FORK_AFTER_IMPORT = textwrap.dedent("""
    import os, sys
    import torch
    import disttest, disttest.bases.dtensor, disttest.bases.fsdp
    from disttest import requires_nccl, skip_if_lt_x_gpu

    pid = os.fork()
    if pid == 0:
        try:
            torch.ones(1, device="cuda").sum().item()
        except BaseException as e:
            sys.stderr.write(repr(e))
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


class ForkAfterImportTest(unittest.TestCase):
    """A process that imported disttest (and its DTensor/FSDP bases) can
    still fork children that use CUDA: disttest's own device queries must not
    poison fork (``torch.cuda.is_available()`` does; NVML does not)."""

    def fork_after_import(self, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k != cuda_fork.NVML_CHECK_ENV}
        return subprocess.run([sys.executable, "-c", FORK_AFTER_IMPORT], capture_output=True, text=True,
                              timeout=300, env={**environ, **env})

    # NB: _compat.accelerator_type/accelerator_count count through NVML, never
    # torch.accelerator.is_available() (cudaGetDeviceCount poisons fork), and
    # importing disttest counts nothing (HAS_ACCELERATOR counts at its first
    # read); tests/test_cuda_fork.py pins the same on CPU.
    def test_importing_disttest_leaves_fork_usable(self):
        proc = self.fork_after_import()
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])

    def test_with_the_nvml_check_fork_stays_usable(self):
        # The documented way out for a test process (docs/howto/gpu.rst).
        proc = self.fork_after_import(**{cuda_fork.NVML_CHECK_ENV: "1"})
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
