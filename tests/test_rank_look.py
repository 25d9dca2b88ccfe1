"""A rank looks like a rank of upstream's harness to the test (issue 25).

The probe (tests/rank_probe.py) runs once under each runner; each test
compares one item of what the ranks saw with what upstream's ranks see
(the audit: "What a rank looks like" in docs/explanation/design.rst).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import unittest
from unittest import mock

import rank_look_cases as cases
import rank_probe

import disttest

ARGV = ["suite.py", "-k", "look", "--rank-look"]
SIGNALS_OF_A_FRESH_INTERPRETER = {
    "SIGALRM": "SIG_DFL", "SIGCHLD": "SIG_DFL", "SIGHUP": "SIG_DFL", "SIGINT": "_signal.default_int_handler",
    "SIGPIPE": "SIG_IGN", "SIGQUIT": "SIG_DFL", "SIGTERM": "SIG_DFL", "SIGUSR1": "SIG_DFL", "SIGUSR2": "SIG_DFL",
}
#: What disttest adds to a rank process's environment, on purpose (see the audit).
DISTTEST_ENV = {"DISTTEST_RUN_TOKEN", "TORCH_FR_BUFFER_SIZE"}


def _parent_handler(signum, frame):  # a handler of the test process's own
    pass


class RankLookTest(unittest.TestCase):
    looks: dict[type, list[dict]]
    parent: dict
    env_after_threads: dict[str, str]

    @classmethod
    def setUpClass(cls):
        from disttest._runner import zygote

        cls.copy_possible = zygote.copy_safe(1)  # else ProcessLook's server is fresh too
        cls.looks = {}
        with tempfile.TemporaryDirectory() as out, \
                mock.patch.dict(os.environ, {cases.OUT_ENV: out}), mock.patch.object(sys, "argv", list(ARGV)):
            os.environ.pop("TORCH_SHOW_CPP_STACKTRACES", None)  # restored by patch.dict
            saved = {s: signal.signal(s, _parent_handler) for s in (signal.SIGUSR2, signal.SIGHUP)}
            try:
                cls.parent = rank_probe.look(None)
                for runner in cases.RUNNERS:
                    result = unittest.TestResult()
                    server = getattr(runner, "fork_server", None)
                    try:
                        with mock.patch.dict(os.environ, {"DISTTEST_FORK_SERVER": server} if server else {}):
                            runner("test_look").run(result)
                    finally:
                        if issubclass(runner, disttest.MultiProcContinousTest):
                            runner.tearDownClass()
                    problems = result.errors + result.failures + result.skipped
                    assert not problems and result.testsRun == 1, (runner, problems)
                    if runner is cases.ThreadLook:
                        cls.env_after_threads = dict(os.environ)
                    ranks = []
                    for rank in range(2):
                        with open(os.path.join(out, f"{runner.__name__}-{rank}.json")) as f:
                            ranks.append(json.load(f))
                    cls.looks[runner] = ranks
            finally:
                for s, h in saved.items():
                    signal.signal(s, h)

    def each(self, runners=cases.RUNNERS):
        """(subTest, rank, what the rank saw) for each rank of each of ``runners``."""
        for runner in runners:
            for rank, look in enumerate(self.looks[runner]):
                yield self.subTest(runner=runner.__name__, rank=rank), rank, look

    def test_seeded_as_upstream(self):
        # Upstream's ranks call set_rng_seed() (1234) before the test body.
        expected = rank_probe.seeded(1234)
        for sub, _, look in self.each():
            with sub:
                self.assertEqual({k: look[k] for k in expected}, expected)

    def test_torch_defaults_as_upstream(self):
        for sub, _, look in self.each():
            with sub:
                self.assertEqual(look["torch.default_device"], "cpu")
                self.assertEqual(look["torch.default_dtype"], "torch.float32")
                self.assertIs(look["torch.grad_enabled"], True)
                self.assertEqual(look["dist.debug_level"], self.parent["dist.debug_level"])

    def test_logging_and_cwd_are_the_test_process(self):
        for sub, _, look in self.each():
            with sub:
                for item in ("logging.root_level", "logging.torch_distributed_level", "cwd"):
                    self.assertEqual(look[item], self.parent[item], item)

    def test_a_rank_process_logs_to_its_output(self):
        # Not into a forked copy of pytest's capture (so: under pytest).
        handlers = self.parent["logging.root_handlers"]
        ours = [h for h in handlers if not h.startswith("_pytest.")]
        if ours == handlers:  # else it could not fail
            self.skipTest("the test process has no pytest logging handlers (run under pytest)")
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertEqual(look["logging.root_handlers"], ours)
        for sub, _, look in self.each((cases.ThreadLook,)):
            with sub:
                self.assertEqual(look["logging.root_handlers"], handlers)

    def test_no_logger_of_a_rank_process_keeps_pytests_handlers(self):
        # pytest attaches its handlers to every logger that does not
        # propagate too (c10d's: a test counting its handlers saw 5, not 1).
        if not self.parent["logging.runner_handlers_elsewhere"]:  # else it could not fail
            self.skipTest("no logger of the test process holds pytest's handlers (run under pytest)")
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertEqual(look["logging.runner_handlers_elsewhere"], [])

    def test_a_rank_process_shows_its_warnings(self):
        # Forked inside pytest's warning capture, a rank would append its
        # warnings to a copy of pytest's list instead of printing them.
        if not self.parent["warnings.recorded"]:  # else it could not fail
            self.skipTest("the test process does not record warnings (run under pytest)")
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertIs(look["warnings.recorded"], False)

    def test_argv_is_the_test_process(self):
        # Upstream's ranks are spawned: multiprocessing gives them the parent's argv.
        for sub, _, look in self.each():
            with sub:
                self.assertEqual(look["sys.argv"], ARGV)
        # Also the test module's top-level code, which a fresh fork server
        # runs when it imports the module for the ranks (a spawned rank
        # imports it with the parent's argv). A copy of the test process
        # has the module the test process imported, as upstream's forked
        # ranks do.
        for sub, _, look in self.each((cases.FreshServerLook,)):
            with sub:
                self.assertEqual(look["import_argv"], ARGV)
        for sub, _, look in self.each((cases.ProcessLook,)):
            with sub:
                self.assertEqual(look["import_argv"], cases.IMPORT_ARGV if self.copy_possible else ARGV)
                self.assertNotEqual(cases.IMPORT_ARGV, ARGV)  # else the two could not differ

    def test_signal_handlers_are_a_fresh_interpreter(self):
        # Not the fork server's (its SIGTERM made a rank exit 0) nor the test
        # process's (here SIGUSR2 and SIGHUP).
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertEqual(look["signals"], SIGNALS_OF_A_FRESH_INTERPRETER)

    def test_what_a_rank_process_starts_is_spawned(self):
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertEqual(look["torch.mp_start_method"], "spawn")

    def test_upstreams_backends_are_registered(self):
        # Importing upstream's helpers registers "fake" and "threaded".
        for sub, _, look in self.each():
            with sub:
                self.assertLessEqual({"fake", "threaded"}, set(look["dist.backend_list"]))
                self.assertLessEqual({"FAKE", "THREADED"}, set(look["dist.plugins"]))

    def test_autograd_stays_in_a_rank_thread(self):
        # Upstream's threaded group turns autograd's device threads off in
        # the rank thread (thread-local): backward sees the rank's group.
        for sub, _, look in self.each((cases.ThreadLook,)):
            with sub:
                self.assertIs(look["torch.autograd_multithreading"], False)
        for sub, _, look in self.each(cases.PROCESS_RUNNERS):
            with sub:
                self.assertIs(look["torch.autograd_multithreading"], True)

    def test_cpp_stack_traces_as_upstream(self):
        # Upstream sets it in a process rank, and in its thread test's setUp
        # for the rest of the process (here: for the test only).
        for sub, _, look in self.each((*cases.FRESH_RUNNERS, cases.ThreadLook)):
            with sub:
                self.assertEqual(look["env"].get("TORCH_SHOW_CPP_STACKTRACES"), "1")
        self.assertNotIn("TORCH_SHOW_CPP_STACKTRACES", self.env_after_threads)

    def test_environment_is_the_test_process(self):
        parent = self.parent["env"]
        # (and the variable that chose the fork server, which the test set)
        allowed = {runner: DISTTEST_ENV | {"TORCH_SHOW_CPP_STACKTRACES", "DISTTEST_FORK_SERVER"}
                   for runner in cases.FRESH_RUNNERS}
        allowed.update({
            # (the reaper's token, set for the test: what a rank starts carries it)
            cases.ThreadLook: {"TORCH_SHOW_CPP_STACKTRACES", "DISTTEST_RUN_TOKEN"},
            cases.PoolLook: DISTTEST_ENV | {"LOCAL_RANK"}})
        for runner, keys in allowed.items():
            for sub, rank, look in self.each((runner,)):
                with sub:
                    env = look["env"]
                    self.assertEqual({k: v for k, v in env.items() if k not in keys}, parent)
                    if runner is cases.PoolLook:  # as upstream's _init_pg
                        self.assertEqual(env["LOCAL_RANK"], str(rank))

    def test_case_attributes_as_upstream(self):
        for sub, rank, look in self.each():
            with sub:
                self.assertEqual((look["case.rank"], look["case.world_size"]), (rank, 2))
        for sub, rank, look in self.each(cases.FRESH_RUNNERS):
            with sub:
                self.assertIs(look["case.file_name_exists"], True)
                self.assertIs(look["case.destroy_pg_upon_exit"], True)
                self.assertIs(look["case.is_master"], rank == 0)
