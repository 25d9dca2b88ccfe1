"""disttest.TestCase has what upstream's common_utils.TestCase adds to
unittest's (case_parity, case_guards, case_sparse), with the same results
and messages as upstream's for the same inputs."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import types
import unittest
import warnings
from unittest import mock

import expecttest
import numpy as np
import torch
from torch.testing._internal import common_utils as upstream

import disttest
from disttest import _compat
from disttest.runners import case_expect, case_guards, case_parity

#: Upstream's private run machinery (disabled-test lists, dynamo/inductor
#: test modes, reruns) and its bookkeeping attributes: not offered.
LEFT_OUT = {"_run_custom"}


def upstream_additions() -> list[str]:
    """Every name upstream's TestCase defines that unittest's lacks."""
    return sorted(n for n in vars(upstream.TestCase)
                  if not (n.startswith("__") and n.endswith("__")) and not hasattr(unittest.TestCase, n))


def failure(fn, *args, **kwargs) -> str:
    """The text of the AssertionError ``fn`` raises."""
    try:
        fn(*args, **kwargs)
    except AssertionError as e:
        return str(e)
    raise AssertionError(f"{fn} did not fail")


def run_case(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class Cases:
    """One ours and one upstream's, with no test method."""

    ours = disttest.TestCase()
    theirs = upstream.TestCase()


class ExistenceTest(unittest.TestCase):
    def test_every_upstream_addition_is_on_disttest_testcase(self):
        names = upstream_additions()
        self.assertGreater(len(names), 40)
        for expected in ("assertEqualIgnoreType", "assertWarnsOnceRegex", "genSparseBSCTensor",
                         "_attempt_load_from_subprocess", "wrap_with_cuda_policy", "precision"):
            self.assertIn(expected, names)
        missing = [n for n in names if n not in LEFT_OUT and not hasattr(disttest.TestCase, n)]
        self.assertEqual(missing, [])

    def test_upstream_overrides_of_unittest_are_overridden_too(self):
        for name in ("assertRaises", "assertRaisesRegex", "assertLogs", "assertNoLogs", "setUp", "tearDown"):
            self.assertIn(name, vars(case_parity.CaseParityMixin), name)

    def test_left_out_names_still_exist_upstream(self):
        self.assertEqual(sorted(LEFT_OUT - set(upstream_additions())), [])

    def test_the_mixin_comes_before_expecttest(self):
        mro = disttest.TestCase.__mro__
        self.assertLess(mro.index(case_parity.CaseParityMixin), mro.index(expecttest.TestCase))


class AssertionsTest(unittest.TestCase, Cases):
    def both(self, name, *args, **kwargs):
        """Call ``name`` on ours and upstream's; return both outcomes."""
        outcomes = []
        for case in (self.ours, self.theirs):
            try:
                getattr(case, name)(*args, **kwargs)
            except AssertionError as e:
                outcomes.append(("fail", str(e)))
            else:
                outcomes.append(("pass", None))
        return outcomes

    def assertSame(self, name, *args, outcome="pass", same_text=True, **kwargs):
        ours, theirs = self.both(name, *args, **kwargs)
        self.assertEqual(ours[0], outcome, ours[1])
        self.assertEqual(theirs[0], outcome, theirs[1])
        if same_text:
            self.assertEqual(ours[1], theirs[1])
        return ours[1]

    def test_assert_equal_ignore_type(self):
        a, b = torch.zeros(2), torch.zeros(2, dtype=torch.float64)
        self.assertSame("assertEqualIgnoreType", a, b)
        self.assertIn("dtype", failure(self.ours.assertEqual, a, b))
        self.assertSame("assertEqualIgnoreType", a, torch.ones(2, dtype=torch.float64), outcome="fail",
                        same_text=False)

    def test_assert_equal_broadcasting(self):
        x = torch.full((2, 3), 2.0)
        self.assertSame("assertEqualBroadcasting", x, 2.0)
        self.assertSame("assertEqualBroadcasting", x, [2.0, 2.0, 2.0])
        self.assertSame("assertEqualBroadcasting", x, torch.full((3,), 2.0), outcome="fail", same_text=False)
        self.assertSame("assertEqualBroadcasting", x, 3.0, outcome="fail", same_text=False)

    def test_assert_equal_type_string(self):
        self.assertSame("assertEqualTypeString", torch.zeros(1), torch.ones(3))
        self.assertSame("assertEqualTypeString", torch.zeros(1), torch.zeros(1).to_sparse(), outcome="fail",
                        same_text=False)
        self.assertSame("assertEqualTypeString", torch.zeros(1), torch.zeros(1, dtype=torch.int8), outcome="fail",
                        same_text=False)

    def test_assert_raises_regex_with_a_device_type_of_none_matches_any_message(self):
        for case in (self.ours, self.theirs):
            case.device_type = None
        try:
            self.assertSame("assertRaisesRegex", ValueError, "not this text", int, "x")
        finally:
            del self.ours.device_type, self.theirs.device_type

    def test_assert_object_in_is_by_identity(self):
        a = [1]
        self.assertSame("assertObjectIn", a, [[0], a])
        text = self.assertSame("assertObjectIn", a, [[1]], outcome="fail")
        self.assertEqual(text, case_parity.OBJECT_NOT_FOUND)

    def test_assert_no_unraisable(self):
        class Loud:
            def __del__(self):
                raise ValueError("from __del__")

        self.assertSame("assertNoUnraisable", lambda x: x + 1, 1)
        self.assertSame("assertNoUnraisable", lambda: Loud(), outcome="fail", same_text=False)
        self.assertTrue(__import__("gc").isenabled())

    def test_assert_not_warn(self):
        self.assertSame("assertNotWarn", lambda: None)
        text = self.assertSame("assertNotWarn", lambda: warnings.warn("w", UserWarning, stacklevel=1),
                               "no warnings please", outcome="fail")
        self.assertIn("no warnings please", text)

    def test_assert_warns_once_regex(self):
        def warns(category, text):
            with self.ours.assertWarnsOnceRegex(category, text[:3]):
                warnings.warn(text, category, stacklevel=1)

        def run(case, category, regex, text):
            with case.assertWarnsOnceRegex(category, regex):
                if text is not None:
                    warnings.warn(text, UserWarning, stacklevel=1)

        warns(UserWarning, "abcdef")
        for args, outcome in [((UserWarning, "ab", "abc"), "pass"), ((UserWarning, "zz", "abc"), "fail"),
                              ((DeprecationWarning, "ab", "abc"), "fail"), ((UserWarning, "", None), "fail")]:
            texts = []
            for case in (self.ours, self.theirs):
                try:
                    run(case, *args)
                except AssertionError as e:
                    texts.append(("fail", str(e)))
                else:
                    texts.append(("pass", None))
            self.assertEqual(texts[0], texts[1], args)
            self.assertEqual(texts[0][0], outcome, args)
        self.assertEqual(failure(run, self.ours, UserWarning, "", None), case_parity.NO_WARNING_CAUGHT)

    def test_assert_warns_once_regex_counts_torch_warn_once_every_time(self):
        with self.ours.assertWarnsOnceRegex(UserWarning, ""):
            self.assertTrue(torch.is_warn_always_enabled())
            warnings.warn("x", UserWarning, stacklevel=1)
        self.assertFalse(torch.is_warn_always_enabled())

    def test_assert_aten_op(self):
        def model(*nodes):
            def node(op_type, domain, **attrs):
                return types.SimpleNamespace(op_type=op_type, domain=domain, attribute=[
                    types.SimpleNamespace(name=k, s=v.encode()) for k, v in attrs.items()])
            return types.SimpleNamespace(graph=types.SimpleNamespace(node=[node(*n[:2], **n[2]) for n in nodes]))

        aten = ("ATen", "org.pytorch.aten")
        good = model((*aten, {"operator": "add", "overload_name": "Tensor"}), ("Relu", "", {}))
        self.assertSame("assertAtenOp", good, "add", "Tensor")
        self.assertSame("assertAtenOp", good, "add", outcome="fail", same_text=False)
        self.assertSame("assertAtenOp", model(("Relu", "", {})), "add", outcome="fail")

    def test_assert_greater_almost_equal_passes_as_upstream(self):
        for args in [(2.0, 1.0), (1.0, 1.0 + 1e-9), (0.9, 1.0, None, None, 0.2)]:
            self.assertSame("assertGreaterAlmostEqual", *args)
        self.assertSame("assertGreaterAlmostEqual", 0.5, 1.0, None, None, 0.2, outcome="fail", same_text=False)

    def test_assert_logs_listens_to_torch_by_default(self):
        for case in (self.ours, self.theirs):
            with case.assertLogs() as logs:
                logging.getLogger("torch.disttest_probe").warning("hello")
            self.assertEqual(logs.output, ["WARNING:torch.disttest_probe:hello"])
            with case.assertNoLogs():
                logging.getLogger("other.disttest_probe").warning("elsewhere")

    def test_precision_and_rel_tol(self):
        case = disttest.TestCase()
        self.assertEqual((case.precision, case.rel_tol), (0, 0))
        case.precision, case.rel_tol = 1e-3, 1e-2
        self.assertEqual((case._precision, case._rel_tol), (1e-3, 1e-2))
        self.assertEqual(disttest.TestCase().precision, 0)

    def test_full_diffs(self):
        self.assertIsNone(disttest.TestCase.maxDiff)
        self.assertEqual(disttest.TestCase._diffThreshold, upstream.TestCase._diffThreshold)

    def test_dynamo_test_key(self):
        self.assertEqual(disttest.TestCase("assertTrue")._dynamo_test_key(), "TestCase.assertTrue")


class ComparisonsTest(unittest.TestCase, Cases):
    def test_compare_with_numpy(self):
        for case in (self.ours, self.theirs):
            case.compare_with_numpy(torch.sin, np.sin, torch.arange(4.0))
            case.compare_with_numpy(torch.sin, np.sin, [0.0, 1.0, 2.0], dtype=torch.float64)
            case.compare_with_numpy(torch.exp, np.exp, torch.arange(3.0, dtype=torch.bfloat16), atol=0.1, rtol=0.1)
            case.compare_with_numpy(lambda t: t.flip(0), lambda a: a[::-1], torch.arange(3.0))
            with self.assertRaises(AssertionError):
                case.compare_with_numpy(torch.sin, np.cos, torch.arange(4.0))
            with self.assertRaisesRegex(AssertionError, "device must be None when tensor_like is a Tensor"):
                case.compare_with_numpy(torch.sin, np.sin, torch.arange(4.0), device="cpu")

    def test_compare_with_reference(self):
        def sample(x):
            return types.SimpleNamespace(input=x, args=(2,), kwargs={})

        s = sample(torch.arange(3.0))
        s.numpy = lambda: sample(np.arange(3.0, dtype=np.float32))
        for case in (self.ours, self.theirs):
            case.compare_with_reference(torch.pow, np.power, s)
            with self.assertRaises(AssertionError):
                case.compare_with_reference(torch.pow, lambda a, b: a, s)

    def test_check_nondeterministic_alert(self):
        def alerting(name):
            def fn():
                if torch.are_deterministic_algorithms_enabled():
                    text = f"{name} does not have a deterministic implementation, but you set it"
                    if torch.is_deterministic_algorithms_warn_only_enabled():
                        warnings.warn(text, UserWarning, stacklevel=1)
                    else:
                        raise RuntimeError(text)
            return fn

        before = torch.are_deterministic_algorithms_enabled()
        for case in (self.ours, self.theirs):
            case.check_nondeterministic_alert(alerting("my_op"), "my_op")
            case.check_nondeterministic_alert(lambda: None, "my_op", should_alert=False)
            with self.assertRaisesRegex(AssertionError, "expected a non-deterministic error"):
                case.check_nondeterministic_alert(lambda: None, "my_op")
            with self.assertRaisesRegex(AssertionError, 'did not expect non-deterministic error message, but got'):
                case.check_nondeterministic_alert(alerting("my_op"), "my_op", should_alert=False)
        self.assertEqual(torch.are_deterministic_algorithms_enabled(), before)

    def test_deterministic_guard_restores(self):
        with case_guards.DeterministicGuard(True, warn_only=True):
            self.assertTrue(torch.is_deterministic_algorithms_warn_only_enabled())
        self.assertFalse(torch.are_deterministic_algorithms_enabled())


ACCEPTED_IN_RANKS = '''
import unittest

import disttest


class Expect(disttest.MultiProcessTestCase):
    world_size = 3

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_it(self):
        self.assertExpectedInline("new output", """old output""")


if __name__ == "__main__":
    unittest.main()
'''


class ExpectedTest(unittest.TestCase, Cases):
    def test_accepting_in_rank_processes_rewrites_the_file_once(self):
        # (every rank rewrote it: ranks 1 and 2 failed "Failed to substitute
        # string", their own copies of the source holding the old text)
        import subprocess

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "test_accepted_in_ranks.py")
            with open(path, "w") as f:
                f.write(ACCEPTED_IN_RANKS)
            env = dict(os.environ, EXPECTTEST_ACCEPT="1",
                       PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), os.getcwd()) if p))
            proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120, env=env,
                                  cwd=tmp)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            with open(path) as f:
                source = f.read()
            self.assertIn('self.assertExpectedInline("new output", """new output""")', source)
            self.assertEqual(source.count("new output"), 2)
            # Without the variable, the rewritten test passes on every rank.
            env.pop("EXPECTTEST_ACCEPT")
            proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120, env=env,
                                  cwd=tmp)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])

    def test_text_helpers_match_upstream(self):
        text = "a\n  # comment\n\n   \nb # not a comment\n"
        for name in ("remove_comment_lines", "remove_empty_lines", "_remove_ansi_escape"):
            self.assertEqual(getattr(self.ours, name)(text), getattr(self.theirs, name)(text), name)
        self.assertEqual(self.ours.remove_comment_lines(text), "a\n\n   \nb # not a comment\n")
        self.assertEqual(self.ours.remove_empty_lines(text), "a\n  # comment\nb # not a comment")
        self.assertEqual(self.ours._remove_ansi_escape("\x1b[31mred\x1b[0m"), "red")

    def test_assert_expected_inline_options(self):
        self.ours.assertExpectedInline("\x1b[1mbold\x1b[0m", """bold""")
        self.ours.assertExpectedInline("a\n# c\nb", """a\nb""", ignore_comments=True)
        self.ours.assertExpectedInline("a\n\nb", """a\nb""", ignore_empty_lines=True)
        self.ours.assertExpectedInline(12, """12""")
        with self.assertRaises(AssertionError):
            self.ours.assertExpectedInline("a\n# c\nb", """a\nb""")

    def test_munge_exc_matches_upstream(self):
        try:
            exec(compile("def f():\n    raise ValueError('at x.py:12, line 40  ')\nf()", "/elsewhere/other.py", "exec"))
        except ValueError as e:
            import traceback
            text = "".join(traceback.format_exception(e)) + "\nSet TORCH_LOGS=+dynamo for more"
        ours = case_guards.munge_exc(text, file=__file__)
        self.assertEqual(ours, upstream.munge_exc(text, file=__file__))
        self.assertNotIn("other.py\", line", ours)
        self.assertIn("x.py:N, line N", ours)
        self.assertNotIn("TORCH_LOGS", ours)

    def test_assert_expected_inline_munged(self):
        def boom():
            raise ValueError("bad at foo.py:3\nSet TORCH_LOGS=+dynamo for more")

        self.ours.assertExpectedInlineMunged(ValueError, boom, """bad at foo.py:N""")
        self.assertEqual(failure(self.ours.assertExpectedInlineMunged, ValueError, lambda: None, ""),
                         case_expect.DID_NOT_RAISE)

    @contextlib.contextmanager
    def expect_module(self):
        """A test module in a temporary directory; yields (cases, expect dir)."""
        with tempfile.TemporaryDirectory() as tmp:
            module = types.ModuleType("disttest_expect_probe")
            module.__file__ = os.path.join(tmp, "probe.py")
            sys.modules[module.__name__] = module
            try:
                made = []
                for base in (disttest.TestCase, upstream.TestCase):
                    cls = type("Probe", (base,), {"__module__": module.__name__, "test_x": lambda self: None})
                    made.append(cls("test_x"))
                yield made, os.path.join(tmp, "expect")
            finally:
                del sys.modules[module.__name__]

    def test_assert_expected_reads_the_expect_file(self):
        # Upstream's message reads __main__.__file__, which a pytest-xdist
        # worker's __main__ lacks; ours falls back. Pin it to compare the two.
        main = sys.modules["__main__"]
        with self.expect_module() as (cases, expect), \
                mock.patch.object(main, "__file__", getattr(main, "__file__", "probe_main.py"), create=True):
            for case in cases:
                with self.assertRaises(RuntimeError) as ctx:
                    case.assertExpected("output")
                texts = getattr(self, "_texts", [])
                texts.append(str(ctx.exception))
                self._texts = texts
            self.assertEqual(self._texts[0], self._texts[1])
            self.assertIn("No expect file exists", self._texts[0])
            self.assertIn("Probe.test_x --accept", self._texts[0])
            os.makedirs(expect)
            with open(os.path.join(expect, "Probe.test_x-sub.expect"), "w") as f:
                f.write("output")
            for case in cases:
                case.assertExpected("output", "sub")
                case.assertExpectedStripMangled("output__torch__.mangled.X", "sub")
                with self.assertRaises(AssertionError):
                    case.assertExpected("other", "sub")
                case.assertExpectedRaises(ValueError, lambda: (_ for _ in ()).throw(ValueError("output")),
                                          subname="sub")
                with self.assertRaisesRegex(AssertionError, case_expect.DID_NOT_RAISE):
                    case.assertExpectedRaises(ValueError, lambda: None, subname="sub")
                with self.assertRaisesRegex(TypeError, case_expect.STRINGS_ONLY):
                    case.assertExpected(1)

    def test_assert_expected_accepts(self):
        with self.expect_module() as (cases, expect), mock.patch.object(expecttest, "ACCEPT", True):
            os.makedirs(expect)
            with contextlib.redirect_stdout(None):
                cases[0].assertExpected("new output")
            with open(os.path.join(expect, "Probe.test_x.expect")) as f:
                self.assertEqual(f.read(), "new output")


class PoliciesTest(unittest.TestCase):
    def test_wrap_with_policy_runs_the_method_inside(self):
        seen = []

        @contextlib.contextmanager
        def policy():
            seen.append("enter")
            yield
            seen.append("exit")

        class Case(disttest.TestCase):
            def test_body(self):
                seen.append("body")

        case = Case("test_body")
        case.wrap_with_policy("test_body", policy)
        self.assertTrue(run_case(case).wasSuccessful())
        self.assertEqual(seen, ["enter", "body", "exit"])
        wrapped = case.wrap_method_with_policy(lambda: seen.append("lambda"), policy)
        wrapped()
        self.assertEqual(seen[-3:], ["enter", "lambda", "exit"])

    def test_cuda_policies_wrap_nothing_without_cuda(self):
        class CudaCase(disttest.TestCase):
            _do_cuda_non_default_stream = True

            def test_cuda(self):
                pass

        case = CudaCase("test_cuda")
        case.wrap_with_cuda_policy("test_cuda", lambda: self.fail("policy used"))
        if not torch.cuda.is_available():
            self.assertEqual(vars(case).get("test_cuda"), None)
        self.assertTrue(run_case(case).wasSuccessful())

    @unittest.skipIf(torch.cuda.is_available(), "checks the skip on a host without CUDA")
    def test_cuda_helpers_skip_without_cuda(self):
        class Case(disttest.TestCase):
            def test_leaks(self):
                with self.assertLeaksNoCudaTensors():
                    pass

            def test_stream(self):
                with self.enforceNonDefaultStream():
                    pass

            def test_memory_check(self):
                self.wrap_with_cuda_memory_check(lambda: None)()

        reasons = {}
        for name in ("test_leaks", "test_stream", "test_memory_check"):
            result = run_case(Case(name))
            reasons[name] = [r for _, r in result.skipped]
        self.assertEqual(reasons, {
            "test_leaks": [case_guards.NEEDS_CUDA.format(helper="assertLeaksNoCudaTensors")],
            "test_stream": [case_guards.NEEDS_CUDA.format(helper="enforceNonDefaultStream")],
            "test_memory_check": [case_guards.NEEDS_CUDA.format(helper="assertLeaksNoCudaTensors")],
        })

    def test_leak_check_env_flag_wraps_nothing_without_cuda(self):
        class Case(disttest.TestCase):
            _do_cuda_memory_leak_check = True

            def test_gpu(self):
                pass

        with mock.patch.dict(os.environ, {"PYTORCH_TEST_CUDA_MEM_LEAK_CHECK": "1"}):
            case = Case("test_gpu")
        if not torch.cuda.is_available():
            self.assertNotIn("test_gpu", vars(case))

    def test_before_cuda_memory_leak_check_resets_dynamo(self):
        with mock.patch.object(_compat, "reset_dynamo") as reset:
            disttest.TestCase().before_cuda_memory_leak_check()
        reset.assert_called_once_with()

    def test_ignore_not_implemented_error_skips_as_upstream(self):
        reasons = []
        for base in (disttest.TestCase, upstream.TestCase):
            class Case(base):
                _ignore_not_implemented_error = True

                def test_in_assert_raises(self):
                    with self.assertRaises(RuntimeError):
                        raise NotImplementedError("x")

                def test_in_assert_raises_regex(self):
                    self.assertRaisesRegex(RuntimeError, "x", self.raise_ni)

                def test_in_body(self):
                    self.raise_ni()

                def test_other_errors_still_count(self):
                    with self.assertRaises(ValueError):
                        raise ValueError("fine")

                def raise_ni(self):
                    raise NotImplementedError("y")

            names = ["test_in_assert_raises", "test_in_assert_raises_regex", "test_in_body",
                     "test_other_errors_still_count"]
            result = unittest.TestResult()
            unittest.TestSuite([Case(n) for n in names]).run(result)
            self.assertEqual((result.errors, result.failures), ([], []))
            reasons.append(sorted(r for _, r in result.skipped))
        self.assertEqual(reasons[0], ["not implemented: y", "not_implemented: x", "not_implemented: y"])
        self.assertEqual(reasons[0], reasons[1])

    def test_assert_raises_regex_ignores_the_message_for_a_foreign_device(self):
        for base in (disttest.TestCase, upstream.TestCase):
            case = base()
            case.device_type = "lazy"
            with case.assertRaisesRegex(ValueError, "not this"):
                raise ValueError("message")
            case.device_type = "cpu"
            with self.assertRaises(AssertionError), case.assertRaisesRegex(ValueError, "not this"):
                raise ValueError("message")

    def test_compile_fn(self):
        fn = disttest.TestCase().compile_fn(lambda x: x * 2 + 1, "eager", True)
        self.assertEqual(fn(torch.ones(2)).tolist(), [3.0, 3.0])


class SetUpTest(unittest.TestCase):
    def test_sparse_invariants_on_in_the_test_and_restored(self):
        seen = []

        class Case(disttest.TestCase):
            def test_x(self):
                seen.append(torch.sparse.check_sparse_tensor_invariants.is_enabled())
                torch.set_grad_enabled(False)

        before = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        self.assertTrue(run_case(Case("test_x")).wasSuccessful())
        self.assertEqual(seen, [True])
        self.assertEqual(torch.sparse.check_sparse_tensor_invariants.is_enabled(), before)
        self.assertTrue(torch.is_grad_enabled())

    def test_default_dtype_check(self):
        class Case(disttest.TestCase):
            _default_dtype_check_enabled = True

            def test_x(self):
                torch.set_default_dtype(torch.float64)

        try:
            result = run_case(Case("test_x"))
        finally:
            torch.set_default_dtype(torch.float32)
        self.assertEqual(len(result.failures), 1)
        self.assertIn("expected default dtype to be torch.float, got torch.float64", result.failures[0][1])


    def leak_outcomes(self, body):
        """The last line of each failure of ``body`` as a test of ours and
        of upstream's, and the function-mode depth after each."""
        texts, depths = [], []
        for base in (disttest.TestCase, upstream.TestCase):
            case = type("Case", (base,), {"test_x": lambda self: body()})
            result = run_case(case("test_x"))
            texts.append([text.strip().splitlines()[-1] for _, text in result.failures + result.errors])
            depths.append(_compat.function_mode_depth())
        return texts, depths

    def test_leaked_default_device_fails_and_is_undone(self):
        texts, depths = self.leak_outcomes(lambda: torch.set_default_device("meta"))
        self.assertEqual(texts[0], ["AssertionError: " + case_parity.FUNCTION_MODES_LEAKED.format(before=0, after=1)])
        self.assertEqual(texts[0], texts[1])
        self.assertEqual(depths, [0, 0])
        self.assertEqual(torch.empty(1).device.type, "cpu")

    def test_leaked_function_state_fails_and_is_undone(self):
        disabled = torch._C._TorchFunctionState.SUBCLASSES_DISABLED
        texts, _ = self.leak_outcomes(lambda: torch._C._set_torch_function_state(disabled))
        self.assertEqual(len(texts[0]), 1)
        self.assertIn("torch function state was leaked: changed from _TorchFunctionState.ENABLED", texts[0][0])
        self.assertEqual(texts[0], texts[1])
        self.assertEqual(_compat.function_state(), torch._C._TorchFunctionState.ENABLED)

    def test_a_set_up_without_super_still_has_its_leaks_caught(self):
        # upstream checks against its class defaults then: so does disttest
        class Case(disttest.TestCase):
            def setUp(self):
                pass

            def test_x(self):
                torch.set_default_device("meta")

        result = run_case(Case("test_x"))
        self.assertEqual(len(result.failures), 1)
        self.assertIn(case_parity.FUNCTION_MODES_LEAKED.format(before=0, after=1), result.failures[0][1])
        self.assertEqual(_compat.function_mode_depth(), 0)

    def test_compiler_stance_and_suppress_errors_end_with_the_test(self):
        import torch._dynamo
        from torch._dynamo import eval_frame

        seen = []

        class Case(disttest.TestCase):
            def test_1_sets(self):
                torch.compiler.set_stance("force_eager")
                torch._dynamo.config.suppress_errors = True

            def test_2_sees(self):
                seen.append((eval_frame._stance.stance, torch._dynamo.config.suppress_errors))

        before = torch._dynamo.config.suppress_errors
        try:
            for name in ("test_1_sets", "test_2_sees"):
                self.assertTrue(run_case(Case(name)).wasSuccessful())
        finally:
            torch.compiler.set_stance("default")
            torch._dynamo.config.suppress_errors = before
        self.assertEqual(seen, [("default", before)])

    def test_everything_is_put_back_before_the_first_failure(self):
        # upstream raises for the dtype first and leaves the device mode pushed
        class Case(disttest.TestCase):
            _default_dtype_check_enabled = True

            def test_x(self):
                torch.set_default_dtype(torch.float64)
                torch.set_default_device("meta")
                torch.set_grad_enabled(False)

        try:
            result = run_case(Case("test_x"))
        finally:
            torch.set_default_dtype(torch.float32)
        self.assertEqual(len(result.failures), 1)
        self.assertEqual(_compat.function_mode_depth(), 0)
        self.assertTrue(torch.is_grad_enabled())


class TorchTwoFourteenTest(unittest.TestCase):
    """What upstream's TestCase does from torch 2.14 on: the same as the
    installed upstream's here, and with the check turned on by version."""

    FLAG = "torch.backends.mkldnn.matmul.fp32_precision"

    def setUp(self):
        if self.FLAG not in _compat.fp32_precision():
            self.skipTest("this torch has no fp32 precision settings")
        before = torch.backends.mkldnn.matmul.fp32_precision
        self.other = "bf16" if before != "bf16" else "tf32"
        self.addCleanup(setattr, torch.backends.mkldnn.matmul, "fp32_precision", before)

    def leak(self, base, checks_from):
        """The failures of a test of ``base`` that leaves a precision changed,
        and the setting after it."""
        other = self.other
        case = type("Case", (base,), {"test_x": lambda self: setattr(torch.backends.mkldnn.matmul,
                                                                      "fp32_precision", other)})
        before = torch.backends.mkldnn.matmul.fp32_precision
        with mock.patch.object(case_parity, "CHECKS_FROM", checks_from):
            result = run_case(case("test_x"))
        after = torch.backends.mkldnn.matmul.fp32_precision
        torch.backends.mkldnn.matmul.fp32_precision = before
        return [text.strip() for _, text in result.failures + result.errors], after

    def test_a_leaked_fp32_precision_fails_and_is_put_back(self):
        texts, after = self.leak(disttest.TestCase, "2.0")
        self.assertEqual(len(texts), 1)
        line = f"  {self.FLAG}: was {torch.backends.mkldnn.matmul.fp32_precision!r}, became {self.other!r}"
        self.assertTrue(texts[0].endswith(
            "AssertionError: " + case_parity.FP32_PRECISION_LEAKED.format(flags=line)), texts[0])
        self.assertEqual(after, torch.backends.mkldnn.matmul.fp32_precision)

    def test_the_check_is_upstream_s_own_on_the_installed_torch(self):
        ours, _ = self.leak(disttest.TestCase, case_parity.CHECKS_FROM)
        theirs, _ = self.leak(upstream.TestCase, case_parity.CHECKS_FROM)
        self.assertEqual(bool(ours), bool(theirs))
        self.assertEqual(bool(ours), _compat.torch_at_least(case_parity.CHECKS_FROM))

    def test_the_check_is_off_with_upstream_s_variable(self):
        with mock.patch.dict(os.environ, {"PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK": "1"}):
            texts, after = self.leak(disttest.TestCase, "2.0")
        self.assertEqual((texts, after), ([], self.other))

    def test_dynamo_is_reset_before_and_after_each_test(self):
        import torch._dynamo

        def calls(base, checks_from):
            case = type("Case", (base,), {"test_x": lambda self: None})
            with mock.patch.object(torch._dynamo, "reset") as reset, \
                    mock.patch.object(case_parity, "CHECKS_FROM", checks_from):
                self.assertTrue(run_case(case("test_x")).wasSuccessful())
            return reset.call_count

        self.assertEqual(calls(disttest.TestCase, "2.0"), 2)
        installed = calls(disttest.TestCase, case_parity.CHECKS_FROM)
        self.assertEqual(installed, calls(upstream.TestCase, case_parity.CHECKS_FROM))
        self.assertEqual(installed, 2 if _compat.torch_at_least(case_parity.CHECKS_FROM) else 0)

    def test_a_callable_msg_makes_the_message_from_torch_2_14_on(self):
        def failure(base, checks_from):
            case = type("Case", (base,), {
                "test_x": lambda self: self.assertTrue(False, msg=lambda standard: f"mine ({standard})")})
            with mock.patch.object(case_parity, "CHECKS_FROM", checks_from):
                result = run_case(case("test_x"))
            # (upstream's adds a line on how to repeat the test)
            return [line for line in result.failures[0][1].splitlines() if line.startswith("AssertionError")][-1]

        self.assertEqual(failure(disttest.TestCase, "2.0"), "AssertionError: mine (False is not true)")
        # Before it, unittest's: the callable's repr after the standard message, as upstream's then.
        self.assertRegex(failure(disttest.TestCase, "99.0"), r"^AssertionError: False is not true : <function ")
        installed = failure(disttest.TestCase, case_parity.CHECKS_FROM)
        theirs = failure(upstream.TestCase, case_parity.CHECKS_FROM)
        self.assertEqual(installed.split(" at 0x")[0], theirs.split(" at 0x")[0])

    def test_should_stop_test_suite_asks_cuda_only_where_it_was_used(self):
        ours = disttest.TestCase()
        self.assertFalse(ours._should_stop_test_suite())
        with mock.patch.object(torch.cuda, "is_initialized", return_value=True), \
                mock.patch.object(torch.cuda, "synchronize", side_effect=RuntimeError("device-side assert")), \
                self.assertWarnsRegex(UserWarning, "EARLY TERMINATION.*device-side assert"):
            self.assertTrue(ours._should_stop_test_suite())


class SparseTest(unittest.TestCase, Cases):
    def same(self, name, *args, **kwargs):
        results = []
        for case in (self.ours, self.theirs):
            torch.manual_seed(0)
            results.append(getattr(case, name)(*args, **kwargs))
        return results

    def assertSameTensor(self, a, b):
        self.assertEqual(a.layout, b.layout)
        self.assertEqual(a.shape, b.shape)
        self.assertEqual(a.dtype, b.dtype)
        if a.layout == torch.sparse_coo:
            self.assertEqual(a.is_coalesced(), b.is_coalesced())
            a_parts, b_parts = _compat.sparse_coo_raw(a), _compat.sparse_coo_raw(b)
        elif a.layout in (torch.sparse_csr, torch.sparse_bsr):
            a_parts, b_parts = (a.crow_indices(), a.col_indices(), a.values()), (
                b.crow_indices(), b.col_indices(), b.values())
        elif a.layout in (torch.sparse_csc, torch.sparse_bsc):
            a_parts, b_parts = (a.ccol_indices(), a.row_indices(), a.values()), (
                b.ccol_indices(), b.row_indices(), b.values())
        else:
            a_parts, b_parts = (a,), (b,)
        for x, y in zip(a_parts, b_parts, strict=True):
            self.assertTrue(torch.equal(x, y), (x, y))

    def test_compressed_generators_match_upstream(self):
        kw = dict(device="cpu", dtype=torch.float64, index_dtype=torch.int32)
        for name, args, extra in [
            ("genSparseCSRTensor", ((5, 6), 10), {}),
            ("genSparseCSRTensor", ((2, 5, 6, 3), 12), {"dense_dims": 1}),
            ("genSparseCSCTensor", ((5, 6), 7), {}),
            ("genSparseBSRTensor", ((4, 6), (2, 3), 8), {}),
            ("genSparseBSCTensor", ((3, 4, 6), (2, 2), 8), {}),
            ("genSparseCompressedTensor", ((6, 6), 0), {"layout": torch.sparse_csr}),
        ]:
            ours, theirs = self.same(name, *args, **kw, **extra)
            self.assertSameTensor(ours, theirs)
        ours, theirs = self.same("genSparseCSRTensor", (5, 6), 10, device="cpu", dtype=torch.uint8,
                                 index_dtype=torch.int64)
        self.assertSameTensor(ours, theirs)

    def test_compressed_generators_refuse_as_upstream(self):
        for args, kwargs in [(((0, 3), 2), {}), (((4, 5), 2), {"blocksize": (3, 1)}), (((4,), 2), {})]:
            texts = [failure(case.genSparseCompressedTensor, *args, layout=torch.sparse_bsr if kwargs else
                             torch.sparse_csr, device="cpu", dtype=torch.float32, index_dtype=torch.int64, **kwargs)
                     for case in (self.ours, self.theirs)]
            self.assertEqual(texts[0], texts[1])
        texts = [failure(case.genSparseBSRTensor, (4, 4), (2,), 4, device="cpu", dtype=torch.float32,
                         index_dtype=torch.int64) for case in (self.ours, self.theirs)]
        self.assertEqual(texts[0], texts[1])

    def test_make_crow_indices_matches_upstream(self):
        for n_rows, n_cols, nnz in [(5, 6, 0), (5, 6, 30), (7, 3, 11), (20, 20, 150), (1, 1, 1)]:
            for random in (True, False):
                ours, theirs = self.same("_make_crow_indices", n_rows, n_cols, nnz, device="cpu",
                                         dtype=torch.int64, random=random)
                self.assertTrue(torch.equal(ours, theirs), (n_rows, n_cols, nnz))
                self.assertEqual(int(ours[-1]), nnz)
        self.assertEqual(*[failure(c._make_crow_indices, 2, 2, 5, device="cpu", dtype=torch.int64)
                           for c in (self.ours, self.theirs)])

    def test_coo_generator_matches_upstream(self):
        for uncoalesced in (False, True):
            ours, theirs = self.same("genSparseTensor", (4, 5, 2), 2, 6, uncoalesced, "cpu", torch.float32)
            for a, b in zip(ours[1:], theirs[1:], strict=True):
                self.assertTrue(torch.equal(a, b))
            self.assertSameTensor(ours[0], theirs[0])
            self.assertEqual(ours[0].is_coalesced(), not uncoalesced)

    def test_generate_simple_inputs_matches_upstream(self):
        layouts = (torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                   torch.sparse_bsc)
        for layout in layouts:
            for options in ({}, {"enable_batch": False, "enable_hybrid": False, "enable_zero_sized": False},
                            {"index_dtype": torch.int32, "dtype": torch.float16}):
                ours, theirs = (list(c.generate_simple_inputs(layout, **options)) for c in (self.ours, self.theirs))
                self.assertEqual(len(ours), len(theirs), (layout, options))
                self.assertGreater(len(ours), 0)
                for a, b in zip(ours, theirs, strict=True):
                    self.assertSameTensor(a, b)
            args_ours, args_theirs = (list(c.generate_simple_inputs(layout, output_tensor=False, dtype=torch.float64))
                                      for c in (self.ours, self.theirs))
            self.assertEqual(len(args_ours), len(args_theirs))
            for (a_args, a_kw), (b_args, b_kw) in zip(args_ours, args_theirs, strict=True):
                self.assertEqual(a_kw, b_kw)
                for x, y in zip(a_args, b_args, strict=True):
                    self.assertTrue(torch.equal(x, y) and x.stride() == y.stride())

    def test_variable_nse_batches_fail_as_upstream(self):
        # Upstream's own note: batches of variable NSE need torch support that is not there.
        texts = []
        for case in (self.ours, self.theirs):
            with self.assertRaises(RuntimeError) as ctx:
                list(case.generate_simple_inputs(torch.sparse_csr, enable_batch_variable_nse=True))
            texts.append(str(ctx.exception))
        self.assertEqual(texts[0], texts[1])

    def test_same_dense_tensor_for_every_layout(self):
        dense = [self.ours.safeToDense(t) for t in self.ours.generate_simple_inputs(
            torch.sparse_csr, enable_batch=False, enable_hybrid=False, enable_zero_sized=False)]
        strided = list(self.ours.generate_simple_inputs(
            torch.strided, enable_batch=False, enable_hybrid=False, enable_zero_sized=False))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(dense, strided, strict=True)))

    def test_safe_to_dense(self):
        x = torch.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (2,))
        self.assertEqual(self.ours.safeToDense(x).tolist(), [3.0, 0.0])
        self.assertEqual(self.ours.safeToDense(x.to_sparse_csr() if x.ndim == 2 else x).tolist(), [3.0, 0.0])


class SubprocessTest(unittest.TestCase, Cases):
    def test_run_process_no_exception(self):
        out, err = disttest.TestCase.run_process_no_exception(
            "import sys; print('out'); print('err', file=sys.stderr); raise SystemExit(3)")
        self.assertEqual((out.strip(), err.strip()), (b"out", b"err"))

    def test_run_with_pytorch_api_usage_stderr(self):
        with mock.patch.dict(os.environ, {"CI": "1"}):
            err = disttest.TestCase.runWithPytorchAPIUsageStderr(
                "import os, sys; print(os.environ.get('PYTORCH_API_USAGE_STDERR'), 'CI' in os.environ, file=sys.stderr)")
        self.assertEqual(err.strip(), "1 False")

    def test_attempt_load_from_subprocess(self):
        with tempfile.TemporaryDirectory() as tmp:
            good, bad = os.path.join(tmp, "good.pt"), os.path.join(tmp, "bad.pt")
            torch.save({"w": torch.ones(2)}, good)
            torch.save({"w": torch.ones(2), "ns": types.SimpleNamespace(a=1)}, bad)
            self.ours._attempt_load_from_subprocess(good, "")
            self.ours._attempt_load_from_subprocess(bad, "", "Unsupported global: GLOBAL types.SimpleNamespace")
            with self.assertRaisesRegex(RuntimeError, "Weights only load failed"):
                self.ours._attempt_load_from_subprocess(bad, "")
            # From an empty folder: no module beside it shadows one the import string names.
            with self.assertRaisesRegex(RuntimeError, "No module named 'modes'"):
                self.ours._attempt_load_from_subprocess(good, "import modes;")


class ToleranceOverrideTest(unittest.TestCase):
    """``precision``/``rel_tol`` (set by upstream's ``@precisionOverride`` and
    ``@toleranceOverride``) raise assertEqual's tolerances as upstream's do."""

    def test_the_same_verdicts_as_upstreams(self):
        import numpy as np
        import torch
        from torch.testing._internal.common_utils import TestCase as Upstream

        import disttest

        def verdicts(cls, attr):
            case = type("Case", (cls,), {"runTest": lambda self: None})()
            out = []
            for value, (a, b) in [
                (0.0, (torch.tensor(1.0), torch.tensor(1.05))), (0.1, (torch.tensor(1.0), torch.tensor(1.05))),
                (0.1, (1.0, 1.05)), (0.1, (np.array([1.0]), np.array([1.05]))),
                (0.1, ([torch.tensor(1.0)], [torch.tensor(1.05)])), (0.1, (torch.tensor(1), torch.tensor(2))),
                (0.01, (torch.tensor(1.0), torch.tensor(1.05))), (0.1, (torch.tensor(100.0), torch.tensor(105.0))),
            ]:
                setattr(case, attr, value)
                try:
                    case.assertEqual(a, b)
                    out.append("pass")
                except AssertionError:
                    out.append("fail")
            return out

        for attr in ("precision", "rel_tol"):
            with self.subTest(attr=attr):
                ours = verdicts(disttest.TestCase, attr)
                self.assertEqual(ours, verdicts(Upstream, attr))
                self.assertIn("pass", ours[1:])  # the override acts
                self.assertEqual(ours[0], "fail")


if __name__ == "__main__":
    unittest.main()
