"""The pytest plugin: --disttest-timeout, --disttest-mode, the world_size marker."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import pytest

SUITE = textwrap.dedent("""
    import time
    import pytest
    import torch.distributed as dist
    import disttest

    class Threads(disttest.MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_hang(self):
            if self.rank == 1:
                while True:
                    time.sleep(0.01)
            dist.barrier()

        @pytest.mark.world_size(3)
        def test_three(self):
            assert (dist.get_world_size(), self.world_size) == (3, 3)

    @pytest.mark.world_size(5)
    class Five(disttest.MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_five(self):
            assert (dist.get_world_size(), self.world_size) == (5, 5)

    class Procs(disttest.MultiProcessTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

        @pytest.mark.world_size(3)
        def test_three_processes(self):
            # The README's pattern: it hangs if self.world_size is not the ranks started.
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    init_method=f"file://{self.file_name}")
            assert (dist.get_world_size(), self.world_size) == (3, 3)

        def test_hang_in_a_rank(self):
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    init_method=f"file://{self.file_name}")
            if self.rank == 1:
                time.sleep(600)
            dist.barrier()

    class Talky(disttest.MultiProcessTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_talk(self):
            print(f"a note from rank {self.rank}", flush=True)
            if self.rank == 1:
                raise AssertionError("rank 1 fails after printing")

    @pytest.mark.world_size(3)
    class Pooled(disttest.MultiProcContinousTest):
        def test_three_pooled(self):
            assert (dist.get_world_size(), self.world_size) == (3, 3)

    class Mixin:
        def test_mixin_size(self):
            assert (dist.get_world_size(), self.world_size) == (self.expected, self.expected)

    @pytest.mark.world_size(3)
    class MixinMarked(Mixin, disttest.MultiProcContinousTest):
        expected = 3

    class MixinPlain(Mixin, disttest.MultiThreadedTestCase):
        expected = 4

        def setUp(self):
            super().setUp()
            self._spawn_threads()

    @disttest.run_in("threads", "processes", "pool")
    class Body:
        world_size = 2

        @pytest.mark.world_size(3)
        def test_three_run_in(self):
            # (processes: 3 ranks started in a group of the body's 2; rank 2 failed)
            assert (dist.get_world_size(), self.world_size) == (3, 3)
""")


def pytest_run(*args: str, junit: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_plugin_suite.py"), "w") as f:
            f.write(SUITE)
        extra = ["--junitxml", os.path.join(tmp, "junit.xml")] if junit is not None else []
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "test_plugin_suite.py", *args, *extra],
                              cwd=tmp, capture_output=True, text=True, timeout=300)
        if junit is not None:
            with open(os.path.join(tmp, "junit.xml")) as f:
                junit.append(f.read())
        return proc


SHARED_BODY = textwrap.dedent("""
    import pytest
    import torch.distributed as dist

    import disttest


    @disttest.run_in("threads")
    @disttest.run_simulated
    class Body(disttest.SpmdMixin):
        world_size = 2

        @pytest.mark.world_size(8)
        def test_eight(self):
            assert dist.get_world_size() == 8
            self.assertRanksEqual(self.rank, lambda r: r)
            assert len(self.rank_values(self.rank)) in (1, 8)
""")


INHERITED = textwrap.dedent("""
    import pytest
    from disttest import MultiThreadedTestCase


    class TestA(MultiThreadedTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        @pytest.mark.world_size(4)
        def test_x(self):
            assert self.world_size == 4


    class TestB(TestA):
        def test_x(self):  # (overridden, without the marker)
            assert self.world_size == 2


    @pytest.mark.world_size(3)
    class TestC(TestA):
        def test_y(self):  # (the class's own marker, not its base's: pytest's closest is the base's)
            assert self.world_size == 3


    @pytest.mark.world_size(2)
    class Marked(MultiThreadedTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_threads()


    @pytest.mark.world_size(3)
    class TestD(Marked):
        def test_z(self):
            assert self.world_size == 3
""")
DOCTESTED = textwrap.dedent('''
    """A module with a doctest.

    >>> 1 + 1
    2
    """
    import pytest

    pytestmark = pytest.mark.world_size(2)


    def test_f(rank, world_size):
        assert world_size == 2
''')


class CollectionFindingsTest(unittest.TestCase):
    def run_pytest(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (("test_inherited.py", INHERITED), ("test_doctested.py", DOCTESTED)):
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                                  cwd=tmp, capture_output=True, text=True, timeout=300)

    def test_a_subclass_s_override_has_its_own_size_and_a_doctest_takes_no_marker(self):
        # TestB's own test_x ran with its base's marked 4 ranks, unless -k
        # selected TestB alone; a module's pytestmark reached its doctest and
        # stopped the session ("a method of a plain class starts no ranks").
        proc = self.run_pytest("--doctest-modules")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("7 passed", proc.stdout)
        proc = self.run_pytest("-k", "TestB")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_a_usage_error_under_xdist_is_the_test_s_error(self):
        # In an xdist worker it was xdist's INTERNALERROR ("assert not
        # crashitem"), and disttest's message was nowhere.
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_ws.py"), "w") as f:
                f.write("import pytest\n\n@pytest.mark.world_size(0)\ndef test_f(rank):\n    pass\n\n"
                        "def test_ok():\n    pass\n")
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                                   "test_ws.py"], cwd=tmp, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertNotIn("INTERNALERROR", proc.stdout + proc.stderr)
        self.assertIn("usage error: Invalid world size 0 from @pytest.mark.world_size on test_ws.py::test_f",
                      proc.stdout)
        self.assertIn("1 passed, 1 error", proc.stdout)

    def test_a_bad_variable_is_one_usage_error(self):
        # Each made every test fail alone, in its setUp ("6 failed").
        for variable, value, message in (
                ("DISTTEST_TIMEOUT", "abc", "Invalid timeout 'abc' from environment variable DISTTEST_TIMEOUT"),
                ("DISTTEST_OUTPUT", "x", "Invalid output mode 'x' from environment variable DISTTEST_OUTPUT"),
                ("DISTTEST_KEEP_LOGS", "maybe", "Invalid flag 'maybe' from environment variable DISTTEST_KEEP_LOGS"),
                ("DISTTEST_CHAOS", "x", "Invalid chaos seed 'x' from DISTTEST_CHAOS")):
            with self.subTest(variable=variable), mock.patch.dict(os.environ, {variable: value}):
                proc = self.run_pytest("-k", "TestB")
                self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)
                self.assertIn(message, proc.stderr)

    def test_pytest_timeout_s_environment_variable_is_read(self):
        # disttest kept its limit below pytest-timeout's from the marker, the
        # option and the ini, not from PYTEST_TIMEOUT: pytest-timeout won.
        from disttest.pytest_plugin import _pytest_timeout

        config = mock.Mock()
        config.pluginmanager.hasplugin.return_value = True
        config.getoption.return_value = None
        config.getini.return_value = "30"
        item = mock.Mock(config=config)
        item.get_closest_marker.return_value = None
        with mock.patch.dict(os.environ, {"PYTEST_TIMEOUT": "8"}):
            self.assertEqual(_pytest_timeout(item), 8.0)
        with mock.patch.dict(os.environ, {"PYTEST_TIMEOUT": ""}):
            self.assertEqual(_pytest_timeout(item), 30.0)
        config.getoption.return_value = 5
        with mock.patch.dict(os.environ, {"PYTEST_TIMEOUT": "8"}):
            self.assertEqual(_pytest_timeout(item), 5.0)  # (the command line first)


class SharedBodyMarkerTest(unittest.TestCase):
    def test_a_marker_sets_the_simulated_world_too(self):
        # The simulated class of a body read no marker: the marker on the
        # body's test stopped the whole session as a usage error.
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_body.py"), "w") as f:
                f.write(SHARED_BODY)
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_body.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("2 passed", proc.stdout)


class PluginTest(unittest.TestCase):
    def test_timeout_option_bounds_disttest_tests(self):
        proc = pytest_run("--disttest-timeout=2", "-k", "Threads and hang")
        self.assertIn("rank 1/4 did not finish 'test_hang' within 2s", proc.stdout)
        self.assertIn("1 failed", proc.stdout)

    def test_options_leave_the_environment_as_they_found_it(self):
        script = textwrap.dedent("""
            import os, sys, pytest
            os.environ["DISTTEST_OUTPUT"] = "tail"
            before = dict(os.environ)
            import signal
            handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
            pytest.main(["-q", "-p", "no:cacheprovider", "--disttest-timeout=7",
                         "--disttest-keep-logs", "--disttest-output=stream", "--disttest-chaos=3", "-l",
                         sys.argv[1]])
            changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
            print("CHANGED", changed)
            print("SIGNALS", handlers == [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)])
        """)
        with tempfile.TemporaryDirectory() as tmp:
            test_file = os.path.join(tmp, "test_empty.py")
            with open(test_file, "w") as f:  # (a disttest test: its run folder took SIGTERM over)
                f.write("import disttest\n\nclass T(disttest.MultiProcessTestCase):\n    world_size = 1\n\n"
                        "    def setUp(self):\n        super().setUp()\n        self._spawn_processes()\n\n"
                        "    def test_x(self):\n        pass\n")
            # (this pytest's PYTEST_CURRENT_TEST: the inner pytest removes it after its test)
            env = {k: v for k, v in os.environ.items() if not k.startswith("DISTTEST_") and k != "PYTEST_CURRENT_TEST"}
            proc = subprocess.run([sys.executable, "-c", script, test_file], capture_output=True, text=True,
                                  timeout=120, env=env, cwd=tmp)
        self.assertIn("CHANGED []", proc.stdout, proc.stdout + proc.stderr)
        self.assertIn("SIGNALS True", proc.stdout, proc.stdout + proc.stderr)

    def test_bad_timeout_is_a_usage_error_naming_it(self):
        proc = pytest_run("--disttest-timeout=soon")
        self.assertEqual(proc.returncode, 4)
        self.assertIn("Invalid timeout 'soon' from --disttest-timeout", proc.stderr)

    def test_world_size_marker_on_methods_and_classes(self):
        proc = pytest_run("--disttest-timeout=30", "-k", "three or five")
        self.assertIn("7 passed", proc.stdout, proc.stdout[-2000:])

    def test_a_marker_on_one_class_leaves_a_method_it_shares_alone(self):
        # (the marker's size was written on the function, which both classes share)
        proc = pytest_run("--disttest-timeout=30", "-k", "mixin")
        self.assertIn("2 passed", proc.stdout, proc.stdout[-2000:])
        proc = pytest_run("--disttest-timeout=30", "-k", "MixinPlain")
        self.assertIn("1 passed", proc.stdout, proc.stdout[-2000:])

    def test_a_hang_is_reported_with_stacks_before_pytest_timeout_fires(self):
        proc = pytest_run("--timeout=15", "-k", "hang_in_a_rank")
        out = proc.stdout
        self.assertIn("1 failed", out, out[-3000:])
        # disttest's limit (below what is left of pytest-timeout's 15 s, 5 s
        # kept back: 10 s on a quiet machine, less where starting the ranks
        # took long) fired first...
        self.assertRegex(out, r"did not finish 'test_hang_in_a_rank' within (10|\d(\.\d+)?)s")
        self.assertNotIn("from pytest-timeout", out)
        # ...with the stack of the rank that hangs, not pytest's selectors.py frame.
        self.assertRegex(out, r'test_plugin_suite.py", line \d+ in test_hang_in_a_rank')


def usage_errors(files: dict[str, str]) -> dict[str, tuple[int, str]]:
    """pytest run on each of ``files`` (name: source) apart, all in one
    interpreter (one ``pytest.main`` each: an interpreter with torch costs
    4 s); the exit status and output of each."""
    driver = textwrap.dedent("""
        import sys
        import pytest
        for name in sys.argv[1:]:
            code = pytest.main(["-q", "-p", "no:cacheprovider", name])
            for stream in (sys.stdout, sys.stderr):
                print(f"\\n@@@ {name} {int(code)}", file=stream, flush=True)
    """)
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(source)
        proc = subprocess.run([sys.executable, "-c", driver, *files], cwd=tmp, capture_output=True, text=True,
                              timeout=300)
    runs: dict[str, tuple[int, str]] = {}
    for stream in (proc.stdout, proc.stderr):
        parts = re.split(r"^@@@ (\S+) (\d+)$", stream, flags=re.M)
        # (the text after the last run's mark is nobody's)
        for text, name, code in zip(parts[0::3], parts[1::3], parts[2::3], strict=False):
            runs[name] = (int(code), runs.get(name, (0, ""))[1] + text)
    return runs


class MarkerErrorsTest(unittest.TestCase):
    def test_what_a_world_size_marker_does_not_take_or_a_bad_mode_is_a_usage_error(self):
        from disttest.pytest_plugin import (
            MARKER_AND_REQUIRES,
            MARKER_AND_SPAWNS,
            MARKER_EXTRA,
            MARKER_IGNORED,
            MARKERS_TWICE,
        )

        head = "import pytest\nimport disttest\n\n"
        cases = {
            "test_typo.py": ('@pytest.mark.world_size(2, mdoe="processes")\ndef test_x():\n    pass\n',
                             MARKER_EXTRA.format(extra="mdoe=", where="test_typo.py::test_x")),
            "test_two_sizes.py": ("@pytest.mark.world_size(2, 3)\ndef test_x():\n    pass\n",
                                  MARKER_EXTRA.format(extra="3", where="test_two_sizes.py::test_x")),
            "test_twice.py": ("@pytest.mark.world_size(2)\n@pytest.mark.world_size(3)\ndef test_x():\n    pass\n",
                              MARKERS_TWICE.format(markers="world_size(3,), world_size(2,)",
                                                   where="test_twice.py::test_x")),
            # Values that cannot be hashed: pytest's INTERNALERROR before.
            "test_list_size.py": ("@pytest.mark.world_size([2])\ndef test_x():\n    pass\n",
                                  "Invalid world size [2] from @pytest.mark.world_size on test_list_size.py::test_x"),
            "test_dict_mode.py": ("@pytest.mark.world_size(2, mode={'x': 1})\ndef test_x(rank):\n    pass\n",
                                  "Invalid mode {'x': 1} from @pytest.mark.world_size on test_dict_mode.py::test_x"),
            "test_mode.py": ("@pytest.mark.world_size(2, mode='pool')\ndef test_bad_mode(rank):\n    pass\n",
                             "Invalid mode 'pool' from @pytest.mark.world_size on test_mode.py::test_bad_mode"),
            "test_class_mode.py": (
                "class T(disttest.MultiThreadedTestCase):\n    @pytest.mark.world_size(2, mode='processes')\n"
                "    def test_method(self):\n        pass\n",
                "Invalid mode 'processes' from @pytest.mark.world_size on test_class_mode.py::T::test_method "
                "(disttest): mode= applies to plain test functions only"),
            # Where nothing reads the marker it did nothing: the test ran once, as it was.
            "test_plain_case.py": (
                "import unittest\n@pytest.mark.world_size(3)\nclass Plain(unittest.TestCase):\n"
                "    def test_once(self):\n        pass\n",
                MARKER_IGNORED.format(where="test_plain_case.py::Plain::test_once",
                                      what="Plain, a TestCase,")),
            # Two on one class: one was used, silently.
            "test_class_twice.py": (
                "@pytest.mark.world_size(2)\n@pytest.mark.world_size(3)\nclass T(disttest.MultiThreadedTestCase):\n"
                "    def test_x(self):\n        pass\n",
                MARKERS_TWICE.format(markers="world_size(3,), world_size(2,)", where="test_class_twice.py::T")),
            # A simulated test takes the marker's size (None: no usage error).
            "test_simulated_case.py": (
                "class Sim(disttest.SimulatedTestCase):\n    @pytest.mark.world_size(8)\n"
                "    def test_sim(self):\n        assert self.world_size == 8\n", None),
            # A function that starts its own 2 ranks ran 3 times, in 3 worlds of 2.
            "test_spawns.py": (
                "@pytest.mark.world_size(3)\n@disttest.spawn_threads_and_init_comms(world_size=2)\n"
                "def test_nested():\n    pass\n",
                MARKER_AND_SPAWNS.format(where="test_spawns.py::test_nested")),
            # The marker's size ran (2 ranks), the skip was decided on the decorator's 3.
            "test_requires.py": (
                "class T(disttest.MultiThreadedTestCase):\n    @pytest.mark.world_size(2)\n"
                "    @disttest.requires_world_size(3, allow_cpu=True)\n    def test_x(self):\n        pass\n",
                MARKER_AND_REQUIRES.format(marker=2, required=3, where="test_requires.py::T::test_x")),
            # The same size in both is one size: it runs (None: no usage error).
            "test_requires_agree.py": (
                "class T(disttest.MultiThreadedTestCase):\n    def setUp(self):\n        super().setUp()\n"
                "        self._spawn_threads()\n\n    @pytest.mark.world_size(3)\n"
                "    @disttest.requires_world_size(3, allow_cpu=True)\n    def test_x(self):\n"
                "        assert self.world_size == 3\n",
                None),
        }
        runs = usage_errors({name: head + source for name, (source, _) in cases.items()})
        self.assertEqual(sorted(runs), sorted(cases), runs)
        for name, (_, message) in cases.items():
            with self.subTest(file=name):
                code, out = runs[name]
                self.assertEqual(code, 0 if message is None else 4, out[-2000:])
                if message is not None:
                    self.assertIn(message, out)
                else:
                    self.assertIn("1 passed", out)


class DeselectedMarkerTest(unittest.TestCase):
    def test_a_bad_marker_on_a_deselected_test_stops_nothing(self):
        # (it stopped the session, "-k good" too, as a usage error)
        source = textwrap.dedent("""
            import pytest
            import disttest

            class T(disttest.MultiThreadedTestCase):
                def setUp(self):
                    super().setUp()
                    self._spawn_threads()

                @pytest.mark.world_size(-1)
                def test_bad(self):
                    pass

                @pytest.mark.world_size(3)
                def test_good(self):
                    assert self.world_size == 3
        """)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_marks.py"), "w") as f:
                f.write(source)

            def pytest(*args):
                return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_marks.py",
                                       *args], cwd=tmp, capture_output=True, text=True, timeout=300)

            selected = pytest("-k", "good")
            self.assertEqual(selected.returncode, 0, selected.stdout + selected.stderr)
            self.assertIn("1 passed, 1 deselected", selected.stdout)
            whole = pytest()
            self.assertEqual(whole.returncode, 4, whole.stdout + whole.stderr)
            self.assertIn("Invalid world size -1 from @pytest.mark.world_size on test_marks.py::T::test_bad",
                          whole.stdout + whole.stderr)


class HarnessErrorsTest(unittest.TestCase):
    def test_an_error_raised_in_disttest_alone_points_at_the_test(self):
        # A pool's bad setting has no frame of the user's: pytest, which hides
        # disttest's and unittest's frames unless nothing is left, showed
        # about 70 lines of disttest's source.
        source = textwrap.dedent("""
            import disttest

            class BadBackend(disttest.MultiProcContinousTest):
                @classmethod
                def backend_str(cls):
                    return "glooo"

                def test_x(self):
                    pass
        """)
        code, out = usage_errors({"test_bad_pool.py": source})["test_bad_pool.py"]
        self.assertEqual(code, 1, out)
        self.assertIn("Invalid backend 'glooo' from BadBackend.backend_str() (disttest)", out)
        self.assertIn("test_bad_pool.py:9: ConfigError", out)
        self.assertNotIn("continuous.py", out)
        self.assertNotIn("settings.py", out)


class OuterLimitTest(unittest.TestCase):
    def test_the_report_names_the_limit_the_join_kept(self):
        # Under pytest-timeout disttest's limit is a share of what is left: the
        # report worked it out again after the join had used it up
        # ("within 1.75s" for a join that waited 10 s).
        source = textwrap.dedent("""
            import time

            import pytest
            import disttest

            class Hangs(disttest.MultiProcessTestCase):
                world_size = 2

                def setUp(self):
                    super().setUp()
                    self._spawn_processes()

                @pytest.mark.timeout(20)
                def test_hang(self):
                    if self.rank == 0:
                        time.sleep(60)
        """)
        code, out = usage_errors({"test_outer.py": source})["test_outer.py"]
        self.assertEqual(code, 1, out)
        limits = [float(x) for x in re.findall(r"did not finish 'test_hang' within ([\d.]+)s", out)]
        self.assertTrue(limits, out[-3000:])
        self.assertGreaterEqual(min(limits), 6, out[-3000:])  # (about 14 s where starting took a few)
        self.assertNotIn("Timeout (>20.0s) from pytest-timeout", out)


class ModeVariableTest(unittest.TestCase):
    def test_a_bad_disttest_mode_is_a_usage_error(self):
        # (It was an error collecting each file that uses run_in, with disttest's frames.)
        import pytest

        from disttest import pytest_plugin

        config = mock.Mock(spec=["getoption", "addinivalue_line"])
        config.getoption.return_value = None
        with mock.patch.dict(os.environ, {"DISTTEST_MODE": "bogus"}), \
                self.assertRaisesRegex(pytest.UsageError, r"^Invalid mode 'bogus' from environment variable "
                                                          r"DISTTEST_MODE \(disttest\): expected one of"):
            pytest_plugin.pytest_configure(config)


class RankOutputTest(unittest.TestCase):
    """A failing rank's output reaches the user: in its report section, the
    captured output, the JUnit XML, live with -s, and kept whole on request."""

    def test_report_sections_and_junit_properties(self):
        junit: list[str] = []
        proc = pytest_run("-k", "talk", junit=junit)
        out = proc.stdout
        self.assertIn("1 failed", out, out[-3000:])
        self.assertIn("disttest rank 1/2 (failed)", out)  # the rank's own section
        self.assertIn("[rank 1] a note from rank 1", out)  # streamed, captured by pytest
        import xml.etree.ElementTree as ET

        props = {p.get("name"): p.get("value") for p in ET.fromstring(junit[0]).iter("property")}
        self.assertEqual(props["disttest_failing_ranks"], "1")
        self.assertEqual(props["disttest_rank_1"], "failed")
        self.assertIn("a note from rank 1", props["disttest_rank_1_output"])

    def test_a_rerun_drops_the_properties_of_the_run_before(self):
        # pytest-rerunfailures runs the item again, properties kept: a passing
        # rerun still named the ranks that failed the run before.
        from disttest import pytest_plugin

        item = mock.Mock(user_properties=[("disttest_failing_ranks", "1"), ("disttest_rank_1", "failed"),
                                          ("mine", "kept")])
        hook = pytest_plugin.pytest_runtest_makereport(item, mock.Mock(when="call", excinfo=None))
        next(hook)
        with contextlib.suppress(StopIteration):
            hook.send(mock.Mock())
        self.assertEqual(item.user_properties, [("mine", "kept")])

    def test_dash_s_streams_every_rank_live(self):
        proc = pytest_run("-s", "-k", "talk")
        self.assertIn("[rank 0] a note from rank 0", proc.stdout)
        self.assertIn("[rank 1] a note from rank 1", proc.stdout)

    def test_keep_logs_names_a_folder_with_every_rank_s_log(self):
        proc = pytest_run("--disttest-keep-logs", "-k", "talk")
        match = re.search(r"kept in (\S+) \(disttest", proc.stdout)
        self.assertIsNotNone(match, proc.stdout[-3000:])
        folder = match.group(1)
        self.addCleanup(shutil.rmtree, folder, True)
        with open(os.path.join(folder, "rank1.log")) as f:
            self.assertIn("a note from rank 1", f.read())
        self.assertTrue(os.path.exists(os.path.join(folder, "rank0.log")))


class SummaryOnlyTest(unittest.TestCase):
    """What the plugin shows as a report's failure: its header, with the
    user's frames only (also under --tb=native, which filters nothing)."""

    # Functions of a module that sets __unittest (disttest's, unittest's):
    # the exception is caught there, as unittest catches a test's.
    HARNESS = textwrap.dedent("""
        def run(f):
            try:
                f()
            except BaseException as e:
                return e

        def fail():
            raise RankError("no ranks", "t", 0, None, [])
    """)

    def harness(self):
        from disttest import RankError

        namespace = {"__unittest": True, "RankError": RankError}
        exec(self.HARNESS, namespace)
        return namespace

    def raised(self, user):
        return self.harness()["run"](user)

    @staticmethod
    def names(tb):
        out = []
        while tb is not None:
            out.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        return out

    def test_the_harness_frames_are_dropped_and_the_sections_left_out(self):
        from disttest import RankError
        from disttest.pytest_plugin import _summary_only

        def user():
            raise RankError("head\n\nrank 1/2: boom", "t", 2, 1.0, [], [("disttest rank 1/2", "rank 1/2: boom")])

        short = _summary_only(self.raised(user), user)
        self.assertEqual(str(short), "head")
        self.assertEqual(self.names(short.__traceback__), ["user"])

    def test_a_report_with_only_harness_frames_points_at_the_test(self):
        from disttest.pytest_plugin import _summary_only

        def user():
            pass

        harness = self.harness()
        exc = harness["run"](harness["fail"])
        self.assertEqual(self.names(exc.__traceback__), ["run", "fail"])
        short = _summary_only(exc, user)
        self.assertEqual(self.names(short.__traceback__), ["user"])

    def test_a_test_method_of_harness_code_keeps_the_report_s_own_frames(self):
        # The conformance suite's test methods are disttest's own code: with
        # no user frame anywhere, the traceback stays the report's own
        # (pytest's ExceptionInfo refuses an exception without one).
        from disttest.conformance import CollectiveConformance
        from disttest.pytest_plugin import _summary_only

        harness = self.harness()
        exc = harness["run"](harness["fail"])
        short = _summary_only(exc, CollectiveConformance.test_all_gather__float32)
        self.assertEqual(self.names(short.__traceback__), ["run", "fail"])
        pytest.ExceptionInfo.from_exception(short)  # what the plugin does with it

