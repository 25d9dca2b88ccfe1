"""pytest-xdist with GPUs: each worker sees its own slice of the GPUs
(``CUDA_VISIBLE_DEVICES``), and so do the ranks it starts. The documented
policy (docs/howto/gpu.rst): contiguous, disjoint slices; with more workers
than GPUs the extra workers get none, and their GPU tests skip, saying so.
Run by ``make gpu-check``; skipped where CUDA is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import pytest
import torch

from disttest.runners._pytest import GPU_NONE_VISIBLE, xdist_visible_devices

pytestmark = pytest.mark.gpu

WORKER_TESTS = textwrap.dedent("""
    import json
    import os

    import pytest
    import torch

    import disttest

    pytestmark = pytest.mark.gpu
    SEEN = os.environ["SEEN_DIR"]


    class Ranks(disttest.MultiProcessTestCase):
        timeout = 120

        @property
        def world_size(self):
            return 1

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_rank_sees_the_slice(self):
            seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
                    "tensor": str(torch.ones(1, device="cuda").device)}
            with open(os.path.join(SEEN, os.environ["PYTEST_XDIST_WORKER"]), "w") as f:
                json.dump(seen, f)
""")


class XdistSliceTest(unittest.TestCase):
    WORKERS = 2

    def test_each_worker_and_its_ranks_see_their_slice(self):
        base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_slices.py"), "w") as f:
                f.write(WORKER_TESTS)
            seen_dir = os.path.join(tmp, "seen")
            os.mkdir(seen_dir)
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-n", str(self.WORKERS),
                 "--dist", "each", "test_slices.py"],
                cwd=tmp, capture_output=True, text=True, timeout=600, env={**base, "SEEN_DIR": seen_dir})
            self.assertEqual(proc.returncode, 0, proc.stdout[-5000:])
            seen = {name: json.load(open(os.path.join(seen_dir, name))) for name in os.listdir(seen_dir)}
        skipped = 0
        for w in range(self.WORKERS):
            worker = f"gw{w}"
            env = {**base, "PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": str(self.WORKERS)}
            expected = xdist_visible_devices(env, torch.cuda.device_count)
            with self.subTest(worker=worker, expected=expected):
                if expected:
                    self.assertEqual(seen[worker], {"visible": expected, "count": len(expected.split(",")),
                                                    "tensor": "cuda:0"})
                else:  # more workers than GPUs: this worker got none, and its GPU test skipped
                    self.assertNotIn(worker, seen)
                    skipped += 1
        if skipped:
            reason = GPU_NONE_VISIBLE.format(version=torch.__version__, visible=", CUDA_VISIBLE_DEVICES=''")
            self.assertIn(reason, " ".join(proc.stdout.split()))
            self.assertIn(f"{skipped} skipped", proc.stdout)
