"""TestDistBackend: BACKEND/WORLD_SIZE handling, skips, a real-suite subset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest
from unittest import mock

import backend_cases

import disttest
from disttest import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name: str, env: dict[str, str]) -> unittest.TestResult:
    result = unittest.TestResult()
    clean = {k: v for k, v in os.environ.items() if k not in ("BACKEND", "WORLD_SIZE")}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        backend_cases.Backend(name).run(result)
    return result


class TestDistBackendTest(unittest.TestCase):
    def test_runs_with_gloo(self):
        for size in ("2", "3"):
            with self.subTest(world_size=size):
                result = run("test_collective_between_barriers", {"BACKEND": "gloo", "WORLD_SIZE": size})
                self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
                self.assertNotIn("TEMP_DIR", os.environ)  # cleaned up after the test

    def test_decorators_skip_with_their_reason(self):
        env = {"BACKEND": "gloo", "WORLD_SIZE": "2"}
        self.assertEqual([r for _, r in run("test_needs_nccl", env).skipped],
                         ["Test requires backend gloo to be one of ['nccl']"])
        self.assertEqual([r for _, r in run("test_needs_four", env).skipped],
                         ["Test requires world size of 4"])
        self.assertTrue(run("test_exactly_two", env).wasSuccessful())
        self.assertEqual([r for _, r in run("test_exactly_two", {**env, "WORLD_SIZE": "3"}).skipped],
                         ["Test requires an exact world size of 2"])

    def test_unavailable_backend_is_a_skip_naming_it(self):
        result = run("test_collective_between_barriers", {"BACKEND": "nccl", "WORLD_SIZE": "2"})
        self.assertEqual([r for _, r in result.skipped], ["backend 'nccl' is not available on this host (disttest)"])

    def test_missing_or_bad_variables_are_named(self):
        cases = [
            ({"WORLD_SIZE": "2"}, "from environment variable BACKEND"),
            ({"BACKEND": "glooo", "WORLD_SIZE": "2"}, "Invalid backend 'glooo' from environment variable BACKEND"),
            ({"BACKEND": "gloo"}, "from environment variable WORLD_SIZE"),
            ({"BACKEND": "gloo", "WORLD_SIZE": "two"}, "Invalid world size 'two' from environment variable WORLD_SIZE"),
        ]
        for env, fragment in cases:
            with self.subTest(env=env):
                result = run("test_collective_between_barriers", env)
                self.assertEqual(len(result.errors), 1)
                self.assertIn(fragment, result.errors[0][1])
                self.assertIn("ConfigError", result.errors[0][1])

    def test_config_error_type(self):
        with mock.patch.dict(os.environ, {"BACKEND": ""}), self.assertRaises(ConfigError):
            disttest.bases.backend.backend_from_env()


class UpstreamSuiteSubsetTest(unittest.TestCase):
    def test_pytorchs_own_suite_on_disttest(self):
        env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2")
        proc = subprocess.run(
            [sys.executable, os.path.join(ROOT, "benchmarks", "distributed_suite.py"), "disttest",
             "-k", "test_[ab]*[rt]_*"],
            capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual((summary["failed"], summary["errors"]), (0, 0), summary["failed_names"])
        self.assertGreaterEqual(summary["passed"], 10)
