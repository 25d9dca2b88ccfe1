"""The plugin's function-style tests, report header and xdist GPU slicing
(disttest.runners._pytest), run through real pytest sessions."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import warnings
from unittest import mock

import torch

from disttest.config import ConfigError
from disttest.runners import _pytest as _pytest_support
from disttest.runners._pytest import (
    GPU_NO_CUDA_BUILD,
    GPU_NONE_VISIBLE,
    GPU_TOO_FEW,
    apply_xdist_gpu_slice,
    gpu_count,
    gpu_skip_reason,
    header_line,
    xdist_device_slice,
    xdist_visible_devices,
)

FUNCTIONS = textwrap.dedent("""
    import os
    import pytest
    import torch
    import torch.distributed as dist
    import disttest

    SEEN = os.environ["SEEN_FILE"]

    def note(line):
        with open(SEEN, "a") as f:
            f.write(line + "\\n")

    @pytest.fixture
    def label():
        return "fixture-value"

    @pytest.mark.world_size(3)
    def test_threads_sum(rank, world_size, label):
        t = torch.ones(1) * rank
        dist.all_reduce(t)
        assert t.item() == sum(range(world_size))
        note(f"threads {rank}/{world_size} {label} pid={os.getpid()}")

    @pytest.mark.world_size(2, mode="processes")
    def test_processes_sum(rank, world_size):
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        assert t.item() == 3
        note(f"processes {rank}/{world_size} backend={dist.get_backend()} pid={os.getpid()}")

    @pytest.mark.world_size(2, mode="processes")
    def test_processes_leave_together(rank):
        import time
        real = dist.destroy_process_group

        def leaving(*args, **kwargs):  # (in this forked rank only)
            note(f"left {rank} {time.monotonic()}")
            return real(*args, **kwargs)

        dist.destroy_process_group = leaving
        if rank == 1:
            time.sleep(0.5)  # a peer still busy (gloo: still connecting) when rank 0 returns

    @pytest.mark.world_size(2)
    def test_rank_one_fails(rank):
        assert rank == 0, f"rank {rank} says no"

    @pytest.mark.world_size(2, mode="processes")
    def test_rank_one_fails_in_processes(rank):
        assert rank == 0, f"rank {rank} says no"

    @pytest.mark.world_size(2)
    def test_skip_in_ranks(rank):
        pytest.skip("not on this torch")

    @pytest.fixture
    def per_rank_value(rank):
        return rank * 10

    @pytest.mark.world_size(2)
    def test_fixture_asks_for_rank(per_rank_value):
        pass

    @pytest.mark.world_size(2, mode="processes")
    def test_capsys_in_processes(rank, capsys):
        print("unseen")
        assert "unseen" in capsys.readouterr().out

    @pytest.mark.world_size(2)
    def test_capsys_in_threads(rank, capsys):
        print(f"seen {rank}")
        assert f"seen {rank}" in capsys.readouterr().out

    @pytest.mark.world_size(2)
    def test_error_in_a_thread_rank(rank):
        if rank == 1:
            raise ZeroDivisionError("an error, not a failure")

    @pytest.mark.world_size(2)
    def test_xfail_in_a_rank(rank):
        if rank == 1:
            pytest.xfail("known bug in rank 1")

    @pytest.mark.world_size(2, mode="processes")
    def test_fail_in_a_rank(rank):
        if rank == 1:
            pytest.fail("pytest.fail in rank 1")

    class InAPool(disttest.MultiProcContinousTest):
        def test_pool_skip(self):
            pytest.skip("pytest.skip in the pool's ranks")

        def test_pool_xfail(self):
            pytest.xfail("pytest.xfail in the pool's ranks")

        def test_pool_fail(self):
            if self.rank == 1:
                pytest.fail("pytest.fail in a pool rank")

    @pytest.mark.world_size(2)
    async def test_async_function(rank):
        assert False, "never awaited, so never failed"

    async def _coroutine():
        assert False, "never awaited"

    @pytest.mark.world_size(2, mode="processes")
    def test_returns_a_coroutine(rank):
        return _coroutine()

    @disttest.spawn_threads_and_init_comms(world_size=4)
    def test_decorated_function(label):
        assert dist.get_world_size() == 4
        note(f"decorated {dist.get_rank()} {label}")

    def test_unmarked_rank_fixture(rank, world_size):
        assert (rank, world_size) == (-1, -1)

    @pytest.mark.world_size(2)
    def test_threads_read_their_capsys(rank, capsys):
        print(f"hello {rank}")
        assert capsys.readouterr().out == f"hello {rank}\\n"

    @pytest.mark.world_size(2)
    def test_threads_print_and_fail(rank):
        print(f"shout from thread rank {rank}")
        assert rank == 0
""")


def run_pytest(source: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "test_functions.py")
        with open(path, "w") as f:
            f.write(source)
        seen = os.path.join(tmp, "seen.txt")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", path, *args],
                              cwd=tmp, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, SEEN_FILE=seen, **(env or {})))
        lines = open(seen).read() if os.path.exists(seen) else ""
    return proc, lines


class FunctionTestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.seen = run_pytest(FUNCTIONS, "--disttest-timeout=60", "-v")
        cls.out = cls.proc.stdout

    def outcome(self, name):
        line = next((ln for ln in self.out.splitlines() if f"::{name} " in ln), "")
        found = re.search(r" (PASSED|FAILED|SKIPPED|ERROR|XFAIL)\b", line)
        return found.group(1) if found else f"{name} not in output:\n{self.out[-3000:]}"

    def test_threads_run_every_rank_with_fixtures(self):
        self.assertEqual(self.outcome("test_threads_sum"), "PASSED")
        lines = sorted(ln for ln in self.seen.splitlines() if ln.startswith("threads"))
        self.assertEqual([ln.split(" pid")[0] for ln in lines],
                         [f"threads {r}/3 fixture-value" for r in range(3)])
        self.assertEqual(len({ln.split("pid=")[1] for ln in lines}), 1)  # one process

    def test_processes_run_every_rank_in_its_own_process(self):
        self.assertEqual(self.outcome("test_processes_sum"), "PASSED")
        lines = sorted(ln for ln in self.seen.splitlines() if ln.startswith("processes"))
        self.assertEqual([ln.split(" pid")[0] for ln in lines],
                         ["processes 0/2 backend=gloo", "processes 1/2 backend=gloo"])
        self.assertEqual(len({ln.split("pid=")[1] for ln in lines}), 2)

    def test_process_ranks_leave_together(self):
        # A rank that destroyed its group first broke a peer's gloo connect
        # ("Connection closed by peer"): a test with no collective failed.
        self.assertEqual(self.outcome("test_processes_leave_together"), "PASSED")
        left = dict(ln.split()[1:] for ln in self.seen.splitlines() if ln.startswith("left "))
        self.assertGreater(float(left["0"]), float(left["1"]) - 0.1, left)

    def test_a_failing_rank_fails_the_test_naming_it(self):
        for name in ("test_rank_one_fails", "test_rank_one_fails_in_processes"):
            with self.subTest(name=name):
                self.assertEqual(self.outcome(name), "FAILED")
        self.assertIn("rank 1 says no", self.out)

    def test_skip_in_the_ranks_is_a_skip(self):
        self.assertEqual(self.outcome("test_skip_in_ranks"), "SKIPPED")
        # At the test's line (it was pytest's own unittest support's, _pytest/unittest.py:521).
        self.assertRegex(self.out, r"SKIPPED \[1\] test_functions.py:\d+: not on this torch")

    def test_a_fixture_that_asks_for_the_rank_is_refused(self):
        self.assertEqual(self.outcome("test_fixture_asks_for_rank"), "FAILED")
        self.assertIn(_pytest_support.FIXTURE_USES_RANK.format(where="test_functions.py::test_fixture_asks_for_rank",
                                                               fixtures="per_rank_value"), self.out)

    def test_a_capture_fixture_in_rank_processes_is_refused(self):
        # It was silently empty there (the rank's output is its process's): the test failed on ''.
        self.assertEqual(self.outcome("test_capsys_in_processes"), "FAILED")
        self.assertIn(_pytest_support.CAPTURE_IN_PROCESSES.format(where="test_functions.py::test_capsys_in_processes",
                                                                  fixtures="capsys"), self.out)
        self.assertEqual(self.outcome("test_capsys_in_threads"), "PASSED")

    def test_an_error_in_a_thread_rank_is_an_error_as_in_processes(self):
        self.assertEqual(self.outcome("test_error_in_a_thread_rank"), "FAILED")
        self.assertIn("RankError: 'test_error_in_a_thread_rank' errored (disttest): rank 1/2 raised ZeroDivisionError",
                      self.out)

    def test_pytest_outcomes_in_ranks_are_pytest_s(self):
        self.assertEqual(self.outcome("test_xfail_in_a_rank"), "XFAIL")
        self.assertEqual(self.outcome("InAPool::test_pool_xfail"), "XFAIL")
        self.assertEqual(self.outcome("InAPool::test_pool_skip"), "SKIPPED")
        self.assertIn("pytest.skip in the pool's ranks", self.out)
        for name in ("test_fail_in_a_rank", "InAPool::test_pool_fail"):
            with self.subTest(name=name):
                self.assertEqual(self.outcome(name), "FAILED")
        self.assertIn("rank 1/2 raised Failed", self.out)
        self.assertIn("'test_pool_fail' failed (disttest)", self.out)

    def test_async_functions_fail_instead_of_passing_unrun(self):
        self.assertEqual(self.outcome("test_async_function"), "FAILED")
        self.assertIn(_pytest_support.ASYNC_FUNCTION.format(where="test_functions.py::test_async_function"),
                      self.out)
        self.assertEqual(self.outcome("test_returns_a_coroutine"), "FAILED")
        self.assertIn("test_returns_a_coroutine returned coroutine in a rank, which nothing awaits", self.out)
        self.assertNotIn("was never awaited", self.proc.stdout + self.proc.stderr)

    # A bad mode= is a usage error: tests/test_pytest_plugin.py, MarkerErrorsTest.

    def test_decorator_on_a_plain_function(self):
        self.assertEqual(self.outcome("test_decorated_function"), "PASSED")
        self.assertEqual(sorted(ln for ln in self.seen.splitlines() if ln.startswith("decorated")),
                         [f"decorated {r} fixture-value" for r in range(4)])

    def test_rank_fixtures_outside_ranks(self):
        self.assertEqual(self.outcome("test_unmarked_rank_fixture"), "PASSED")

    def test_thread_ranks_output_is_prefixed_where_the_test_does_not_read_it(self):
        # DISTTEST_OUTPUT=stream (pytest's default) acts on thread ranks too;
        # a stream the test reads itself (capsys) gets the lines as written.
        self.assertEqual(self.outcome("test_threads_read_their_capsys"), "PASSED")
        self.assertEqual(self.outcome("test_threads_print_and_fail"), "FAILED")
        self.assertIn("[rank 0] shout from thread rank 0", self.out)
        self.assertIn("[rank 1] shout from thread rank 1", self.out)

    def test_report_header(self):
        self.assertIn(f"disttest: torch {torch.__version__}, start method ", self.out)
        self.assertIn("timeout 60s (--disttest-timeout)", self.out)  # (it said DISTTEST_TIMEOUT)


class ProcessesStartMethodTest(unittest.TestCase):
    """A processes-mode function's ranks are forked whatever the start
    method says; the variable is still read: a bad value is named, 'spawn'
    is warned about (both went unnoticed)."""

    def run_in_processes(self, method: str) -> list[str]:
        seen = []

        def body(rank):  # a closure: not importable, not picklable
            assert torch.distributed.get_world_size() == 2

        with mock.patch.dict(os.environ, {"DISTTEST_START_METHOD": method}), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _pytest_support.run_function(body, {"rank": _pytest_support.NOT_IN_A_RANK}, 2, "processes", "test_body")
        ours = [w for w in caught if "disttest" in str(w.message)]
        self.assertEqual({(w.filename, w.lineno) for w in ours} - {(__file__, body.__code__.co_firstlineno)}, set())
        seen.extend(str(w.message) for w in ours)
        return seen

    def test_spawn_is_warned_about_and_the_ranks_fork(self):
        self.assertEqual(self.run_in_processes("spawn"), [_pytest_support.FORKED_NOT_SPAWNED.format(
            name="test_body", where="environment variable DISTTEST_START_METHOD")])
        self.assertEqual(self.run_in_processes("zygote"), [])

    def test_a_bad_variable_is_named(self):
        with self.assertRaises(ConfigError) as caught:
            self.run_in_processes("sideways")
        self.assertIn("'sideways' from environment variable DISTTEST_START_METHOD", str(caught.exception))


class LoadingTest(unittest.TestCase):
    """The plugin loads by its entry point, by ``-p`` under either of its names
    and from a conftest's ``pytest_plugins``, with or without autoloading."""

    def pytest(self, *args: str, conftest: str = "", autoload: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
        if not autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_loaded.py"), "w") as f:
                f.write("def test_loaded(world_size):\n    assert world_size == -1\n")
            if conftest:
                with open(os.path.join(tmp, "conftest.py"), "w") as f:
                    f.write(conftest)
            return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "--disttest-timeout=7", *args, "test_loaded.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=120, env=env)

    def test_under_either_name_once(self):
        conftest = 'pytest_plugins = ["disttest.pytest_plugin"]\n'
        for args, kwargs in ((("-p", "disttest.pytest_plugin"), {}), ((), {"conftest": conftest}),
                             (("-p", "disttest.pytest_plugin"), {"autoload": False}),
                             (("-p", "disttest"), {"conftest": conftest, "autoload": False})):
            with self.subTest(args=args, **kwargs):
                proc = self.pytest(*args, **kwargs)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("1 passed", proc.stdout)

    def test_no_disttest_turns_it_off(self):
        proc = self.pytest("-p", "no:disttest")
        self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)  # a usage error: the option is unknown
        self.assertIn("--disttest-timeout", proc.stderr)


class ImportModeTest(unittest.TestCase):
    def test_spawned_ranks_import_a_package_test_under_importlib_mode(self):
        # pytest's --import-mode=importlib names the module tests.test_small
        # without putting its package's folder on sys.path: every spawned
        # rank failed with "No module named 'tests'"; and, where the folder
        # pytest runs in has a tests package of its own (on sys.path first),
        # with "No module named 'tests.test_small'".
        for other_tests in (False, True):
            with self.subTest(other_tests=other_tests):
                self.run_package_test_under_importlib_mode(other_tests)

    def run_package_test_under_importlib_mode(self, other_tests: bool) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            package = os.path.join(tmp, "proj", "tests")
            os.makedirs(package)
            os.mkdir(os.path.join(tmp, "elsewhere"))
            if other_tests:
                os.mkdir(os.path.join(tmp, "elsewhere", "tests"))
                open(os.path.join(tmp, "elsewhere", "tests", "__init__.py"), "w").close()
            for name, text in (("__init__.py", ""), ("helper.py", "VALUE = 3\n"), ("test_small.py", textwrap.dedent("""
                    import disttest
                    from .helper import VALUE

                    class Small(disttest.MultiProcessTestCase):
                        world_size = 2
                        start_method = "spawn"

                        def setUp(self):
                            super().setUp()
                            self._spawn_processes()

                        def test_ok(self):
                            assert VALUE == 3
                    """))):
                with open(os.path.join(package, name), "w") as f:
                    f.write(text)
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "--import-mode=importlib", os.path.join("..", "proj", "tests", "test_small.py")],
                                  cwd=os.path.join(tmp, "elsewhere"), capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("1 passed", proc.stdout)


class WarningsAsErrorsTest(unittest.TestCase):
    def test_a_start_warning_raised_as_an_error_leaves_no_ranks_unowned(self):
        # Under -W error the fall-back warning was raised before the test took
        # its launcher: its socket was never closed (ResourceWarning, an
        # ExceptionGroup as pytest ended).
        source = textwrap.dedent("""
            import threading, time
            import torch
            import disttest

            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
            torch.set_num_threads(2)
            torch.ones(300, 300) @ torch.ones(300, 300)  # OpenMP's pool: no fork server for this module

            class T(disttest.MultiProcessTestCase):
                world_size = 2
                rank_threads = 2

                def setUp(self):
                    super().setUp()
                    self._spawn_processes()

                def test_a(self):
                    pass
        """)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_thr_import.py"), "w") as f:
                f.write(source)
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                                   "test_thr_import.py"], cwd=tmp, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        self.assertIn("its ranks start with 'spawn' instead of 'zygote'", out)  # (the warning, as the test's error)
        self.assertIn("1 failed", out)
        self.assertNotIn("unclosed", out)


class HeaderTest(unittest.TestCase):
    def test_header_names_torch_method_and_timeout(self):
        line = header_line({"DISTTEST_START_METHOD": "spawn", "DISTTEST_TIMEOUT": "12"})
        self.assertEqual(line, f"disttest: torch {torch.__version__}, start method spawn, timeout 12s (DISTTEST_TIMEOUT)")
        self.assertTrue(header_line({}).endswith("timeout 300s (default)"))
        # Set by the option: the option is its source (the header said DISTTEST_TIMEOUT).
        self.assertTrue(header_line({"DISTTEST_TIMEOUT": "12"}, {"DISTTEST_TIMEOUT": "--disttest-timeout"})
                        .endswith("timeout 12s (--disttest-timeout)"))
        self.assertIn("invalid: Invalid timeout 'soon' from environment variable DISTTEST_TIMEOUT",
                      header_line({"DISTTEST_TIMEOUT": "soon"}))


class XdistGpuSliceTest(unittest.TestCase):
    def test_slices_are_disjoint_and_cover_the_devices(self):
        for n_devices in range(0, 9):
            for workers in range(1, 6):
                devices = [str(i) for i in range(n_devices)]
                slices = [xdist_device_slice(w, workers, devices) for w in range(workers)]
                with self.subTest(devices=n_devices, workers=workers):
                    self.assertEqual(sum(slices, []), devices)  # disjoint, in order, all used
                    self.assertLessEqual(max(map(len, slices)) - min(map(len, slices)), 1)

    def test_from_a_faked_device_count(self):
        env = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
        self.assertEqual(xdist_visible_devices(env, lambda: 4), "2,3")
        self.assertEqual(xdist_visible_devices(dict(env, PYTEST_XDIST_WORKER="gw0"), lambda: 4), "0,1")
        self.assertEqual(xdist_visible_devices(dict(env, PYTEST_XDIST_WORKER_COUNT="4", PYTEST_XDIST_WORKER="gw3"),
                                               lambda: 2), "")  # more workers than GPUs: none
        self.assertIsNone(xdist_visible_devices(env, lambda: 0))
        self.assertIsNone(xdist_visible_devices({}, lambda: 4))
        # A worker started in place of a crashed one is numbered past the count:
        # it was refused, so every replacement died and the run's rest was lost.
        self.assertEqual(xdist_visible_devices(dict(env, PYTEST_XDIST_WORKER="gw2"), lambda: 4), "0,1")
        self.assertEqual(xdist_visible_devices(dict(env, PYTEST_XDIST_WORKER="gw5"), lambda: 4), "2,3")
        self.assertIsNone(xdist_visible_devices(dict(env, PYTEST_XDIST_WORKER="gw5"), lambda: 0))

    def test_an_existing_mask_is_sliced(self):
        env = {"PYTEST_XDIST_WORKER": "gw2", "PYTEST_XDIST_WORKER_COUNT": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7,8,9"}
        self.assertEqual(xdist_visible_devices(env, lambda: 99), "8,9")

    def test_apply_uses_torch_device_count(self):
        env = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
        with mock.patch.object(torch.cuda, "device_count", return_value=8):
            self.assertEqual(apply_xdist_gpu_slice(env), "4,5,6,7")
        self.assertEqual(env["CUDA_VISIBLE_DEVICES"], "4,5,6,7")

    def test_bad_worker_variables_are_named(self):
        for env, variable in [({"PYTEST_XDIST_WORKER": "w1", "PYTEST_XDIST_WORKER_COUNT": "2"}, "PYTEST_XDIST_WORKER"),
                              ({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "x"},
                               "PYTEST_XDIST_WORKER_COUNT")]:
            with self.subTest(env=env), self.assertRaises(ConfigError) as ctx:
                xdist_visible_devices(env, lambda: 4)
            self.assertIn(f"environment variable {variable}", str(ctx.exception))

    SEEN_CONFTEST = textwrap.dedent("""
        import os
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            worker = getattr(config, "workerinput", {}).get("workerid", "main")
            with open(os.environ["SEEN_FILE"] + "." + worker, "w") as f:
                f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    """)

    def devices_seen(self, *args: str, **environ: str) -> dict[str, str]:
        """Run a one-test pytest with ``args`` and four "GPUs" through the mask
        (this host has none); what each process (``gw<N>`` or ``main``) sees
        once configured, after the plugin."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (("conftest.py", self.SEEN_CONFTEST), ("test_gpus.py", "def test_nothing():\n    pass\n")):
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            seen = os.path.join(tmp, "seen")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
            env.update(environ, SEEN_FILE=seen, CUDA_VISIBLE_DEVICES="0,1,2,3")
            proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test_gpus.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300, env=env)
            self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
            return {name.rsplit(".", 1)[1]: open(os.path.join(tmp, name)).read()
                    for name in os.listdir(tmp) if name.startswith("seen.")}

    def test_each_xdist_worker_gets_its_own_gpus(self):
        self.assertEqual(self.devices_seen("-n", "2"), {"main": "0,1,2,3", "gw0": "0,1", "gw1": "2,3"})

    def test_a_pytest_inside_a_worker_is_not_a_worker(self):
        # A pytest started by a test that runs in worker gw1 inherits its
        # PYTEST_XDIST_* variables; it took them as its own and kept half the
        # devices, handing its own workers slices of that half.
        # (Its own workers then slice the devices it kept, all four, as
        # test_each_xdist_worker_gets_its_own_gpus shows.)
        inherited = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
        self.assertEqual(self.devices_seen(**inherited), {"main": "0,1,2,3"})


class XdistControllerTest(unittest.TestCase):
    SLEEPER = textwrap.dedent("""
        import os
        import time
        import disttest

        class T(disttest.MultiProcessTestCase):
            world_size = 2
            timeout = 120

            def setUp(self):
                super().setUp()
                self._spawn_processes()

            def test_sleep(self):
                with open(os.path.join(os.environ["PIDS"], str(os.getpid())), "w"):
                    pass
                time.sleep(100)
    """)

    def test_the_worker_and_its_ranks_end_with_the_controller(self):
        # A SIGKILLed controller left its worker and ranks running 15 s:
        # execnet's SIGINT, which ends a worker late, is ignored by xdist's.
        import psutil

        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_sleeper.py"), "w") as f:
                f.write(self.SLEEPER)
            pids = os.path.join(tmp, "pids")
            os.mkdir(pids)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
            controller = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1",
                                           "test_sleeper.py"], cwd=tmp, env=dict(env, PIDS=pids),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            tree: list[psutil.Process] = []
            try:
                deadline = time.monotonic() + 120
                while len(os.listdir(pids)) < 2 and time.monotonic() < deadline and controller.poll() is None:
                    time.sleep(0.1)
                self.assertEqual(len(os.listdir(pids)), 2, "the ranks did not start")
                tree = psutil.Process(controller.pid).children(recursive=True)
                self.assertTrue({int(p) for p in os.listdir(pids)} <= {p.pid for p in tree})
                controller.kill()
                controller.wait()
                start = time.monotonic()
                _, alive = psutil.wait_procs(tree, timeout=10)
                self.assertEqual(alive, [], f"left running {time.monotonic() - start:.1f}s after the controller")
                self.assertLess(time.monotonic() - start, 6)
            finally:
                with contextlib.suppress(psutil.Error):
                    tree += psutil.Process(controller.pid).children(recursive=True)
                for proc in tree:  # (only what this test started)
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
                controller.kill()
                controller.wait()


class GpuMarkerTest(unittest.TestCase):
    """``@pytest.mark.gpu(count=1)``: skipped, saying why, without the GPUs."""

    def test_reasons(self):
        version = torch.__version__
        with mock.patch.object(torch.backends.cuda, "is_built", return_value=False):
            self.assertEqual(gpu_skip_reason(1, {}), GPU_NO_CUDA_BUILD.format(version=version))
        with mock.patch.object(torch.backends.cuda, "is_built", return_value=True):
            with mock.patch.object(torch.cuda, "device_count", return_value=0):
                self.assertEqual(gpu_skip_reason(1, {}), GPU_NONE_VISIBLE.format(version=version, visible=""))
                # An xdist worker that got no GPU (more workers than GPUs) says so.
                self.assertEqual(gpu_skip_reason(1, {"CUDA_VISIBLE_DEVICES": ""}),
                                 f"CUDA is not available (torch {version} sees no GPU, "
                                 f"CUDA_VISIBLE_DEVICES='') (disttest)")
            with mock.patch.object(torch.cuda, "device_count", return_value=1):
                self.assertIsNone(gpu_skip_reason(1, {}))
                self.assertEqual(gpu_skip_reason(2, {"CUDA_VISIBLE_DEVICES": "3"}), GPU_TOO_FEW.format(
                    count=2, found=1, version=version, visible=", CUDA_VISIBLE_DEVICES='3'"))

    def test_this_host(self):
        if torch.backends.cuda.is_built():
            self.skipTest("a CUDA build of torch")
        self.assertEqual(gpu_skip_reason(1), f"CUDA is not available (torch {torch.__version__}, "
                                             "a build without CUDA) (disttest)")

    def test_count(self):
        self.assertEqual(gpu_count((), {}, "here"), 1)
        self.assertEqual(gpu_count((2,), {}, "here"), 2)
        self.assertEqual(gpu_count((), {"count": 4}, "here"), 4)
        for bad in (0, -1, "2", True, 1.5):
            with self.subTest(bad=bad), self.assertRaises(ConfigError) as caught:
                gpu_count((bad,), {}, "@pytest.mark.gpu on t")
            self.assertIn("@pytest.mark.gpu on t", str(caught.exception))
        # anything else given is refused, not read as one GPU (a typo ran on a host with one)
        for args, kwargs, named in (((), {"cuont": 4}, "'cuont='"), ((2, 3), {}, "'3'"),
                                    ((2,), {"count": 3}, "'2'")):
            with self.subTest(args=args, kwargs=kwargs), self.assertRaises(ConfigError) as caught:
                gpu_count(args, kwargs, "@pytest.mark.gpu on t")
            self.assertIn(f"Invalid gpu marker {named} from @pytest.mark.gpu on t (disttest): takes one count",
                          str(caught.exception))

    MARKED = textwrap.dedent("""
        import unittest
        import pytest

        pytestmark = pytest.mark.gpu

        def test_function():
            raise AssertionError("ran without a GPU")

        class Case(unittest.TestCase):
            def test_method(self):
                raise AssertionError("ran without a GPU")

        @pytest.mark.gpu(2)
        def test_two():
            raise AssertionError("ran without a GPU")
    """)

    def pytest(self, source: str, *args: str) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_marked.py"), "w") as f:
                f.write(source)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
            return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args,
                                   "test_marked.py"], cwd=tmp, capture_output=True, text=True, timeout=300, env=env)

    def test_marked_tests_skip_with_the_reason(self):
        with mock.patch.object(torch.backends.cuda, "is_built", return_value=False):
            reason = gpu_skip_reason(1, {})
        if torch.backends.cuda.is_built():
            self.skipTest("a CUDA build of torch")
        proc = self.pytest(self.MARKED, "-m", "gpu")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
        self.assertIn("3 skipped", proc.stdout)
        # -rs: "SKIPPED [2] test_marked.py: <reason>", counts grouped by place
        counts = re.findall(rf"^SKIPPED \[(\d+)\] [^:]+(?::\d+)?: {re.escape(reason)}$", proc.stdout, re.M)
        self.assertEqual(sum(map(int, counts)), 3, proc.stdout[-3000:])

    def test_a_bad_count_is_a_usage_error(self):
        proc = self.pytest("import pytest\n\n@pytest.mark.gpu(0)\ndef test_x():\n    pass\n")
        self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)
        self.assertIn("@pytest.mark.gpu on test_marked.py::test_x", proc.stderr)


if __name__ == "__main__":
    unittest.main()
