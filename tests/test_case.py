"""disttest.TestCase: tensor-aware assertEqual, seeding, exit-code skips."""

from __future__ import annotations

import enum
import math
import os
import random
import subprocess
import sys
import unittest
import warnings
from unittest import mock

import numpy as np
import torch
from torch.testing._internal import common_utils as upstream

import disttest
from disttest import TEST_SKIPS
from disttest.runners import case as case_module
from disttest.runners import case_equal

HERE = os.path.dirname(os.path.abspath(__file__))


def run_case(case_cls: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case_cls(name).run(result)
    return result


class _Color(enum.IntEnum):
    RED = 1


#: (actual, expected, options): inputs on which disttest's assertEqual must
#: decide as upstream's does, with the same exception type and message.
PARITY_CASES = [
    (torch.arange(4.0), torch.arange(4.0), {}),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), {}),
    (torch.zeros(2, 3), torch.zeros(3, 2), {}),
    (torch.zeros(2), torch.zeros(2, dtype=torch.float64), {}),
    (torch.zeros(2), torch.zeros(2, dtype=torch.float64), {"exact_dtype": False}),
    (torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]), {}),
    (torch.tensor([math.nan]), torch.tensor([math.nan]), {"equal_nan": False}),
    (math.nan, math.nan, {}),
    (torch.tensor([1.0]), torch.tensor([1.1]), {}),
    (torch.tensor([1.0]), torch.tensor([1.1]), {"atol": 0.2, "rtol": 0}),
    (torch.tensor([1.0]), torch.tensor([1.1]), {"atol": 0.2}),  # one tolerance alone: a ValueError
    (torch.ones(2), torch.ones(2), {"rtol": 0.2}),  # also for equal inputs
    (torch.ones(2), torch.ones(2).t(), {"exact_stride": True}),
    (torch.ones(2, 2), torch.ones(2, 2).t(), {"exact_stride": True}),
    (torch.ones(2, 2), torch.ones(2, 2).t(), {}),
    (torch.ones(2, 0), torch.ones(2, 0), {}),
    (torch.ones(2, device="meta"), torch.ones(3, device="meta"), {}),
    (torch.nn.Parameter(torch.ones(2)), torch.ones(2), {}),
    ([torch.ones(2), (1, "x", None, 2.5, b"b")], [torch.ones(2), (1, "x", None, 2.5, b"b")], {}),
    ([1, 2], (1, 2), {}),
    ({"a": torch.ones(1)}, {"a": torch.ones(1)}, {}),
    (1, True, {}),
    (np.array([1, 2]), [1, 2], {}),  # an ambiguous ==: a RuntimeError
    (10**400, 10**400 + 1, {}),
    (torch.tensor([97, 98]), bytearray(b"ab"), {}),
    (float("nan"), float("nan"), {"equal_nan": False}),
    (torch.tensor([1 + 2j]), torch.tensor([1 + 2j]).conj().conj(), {}),
    (0.1 + 0.2, 0.3, {}),
    (1.0, 1.0 + 1e-6, {}),  # float32's tolerance for Python floats
    (1.0, 1.5, {}),
    (3, 3.0, {}),
    (True, 1, {}),
    (False, torch.tensor([0]), {}),
    (True, torch.tensor([1, 1]), {}),
    (True, False, {}),
    (np.bool_(True), True, {}),
    (_Color.RED, 1, {}),
    (_Color.RED, 2, {}),
    (np.float32(1.5), 1.5, {}),
    (torch.tensor([5.0]), 5.0, {}),
    (torch.tensor([5.0, 5.0]), 5.0, {}),
    (torch.tensor(3), 3, {}),
    (torch.tensor([1, 2, 3]), [1, 2, 3], {}),
    ([1.0, 2.0], torch.tensor([1.0, 2.0]), {}),
    (torch.tensor([1, 2, 3]), [1, 2, 4], {}),
    (np.arange(3), np.arange(3), {}),
    (torch.arange(3), np.arange(3), {}),
    (np.arange(3), np.array([0, 1, 5]), {}),
    (np.array(["a", "b"]), np.array(["a", "c"]), {}),
    (torch.eye(2), torch.eye(2).to_sparse(), {}),
    (torch.eye(2), torch.eye(2).to_sparse(), {"exact_layout": True}),
    (torch.zeros(2, 2), torch.zeros(2, 2).t(), {"exact_stride": True}),
    (torch.zeros(2, 2), torch.zeros(2, 2).t().contiguous(), {"exact_stride": True}),
    (torch.eye(2).to_sparse(), torch.eye(2).to_sparse(), {"exact_is_coalesced": True}),
    ({"w": [torch.zeros(2), (1, "x")], "b": torch.ones(1)},
     {"w": [torch.ones(2), (1, "x")], "b": torch.ones(1)}, {}),
    ({"w": [torch.zeros(2), (1, "x")]}, {"w": [torch.zeros(2), (1, "y")]}, {}),
    ({"a": 1}, {"b": 1}, {}),
    ([1, 2], [1, 2, 3], {}),
    ("abc", "abc", {}),
    ("abc\ndef", "abc\nxyz", {}),
    (b"ab", b"ac", {}),
    ("1", 1, {}),
    (None, None, {}),
    (None, 0, {}),
    ({1, 2}, {1, 3}, {}),
    (int, float, {}),
    (torch.nn.ModuleList([torch.nn.Identity()]), [torch.nn.Identity(), torch.nn.Identity()], {}),
    (torch.ones(2).untyped_storage(), torch.zeros(2).untyped_storage(), {}),
]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # nested tensors are a prototype, quantized ones deprecated, complex32 experimental
    PARITY_CASES += [(torch.ones(2, dtype=torch.complex32), torch.ones(2, dtype=torch.complex32), {}),
                     (torch.ones(2, dtype=torch.complex32), torch.zeros(2, dtype=torch.complex32), {}),
                     ([torch.ones(2, dtype=torch.complex32)], [torch.ones(2, dtype=torch.complex32)], {})]
    PARITY_CASES.append((torch.ones(2, 2), torch.nested.nested_tensor([torch.ones(2), torch.ones(2)]), {}))
    PARITY_CASES.append(([torch.ones(2, 2)], [torch.nested.nested_tensor([torch.ones(2), torch.ones(2)])], {}))
    PARITY_CASES.append((torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
                         torch.quantize_per_tensor(torch.ones(2), 0.2, 0, torch.qint8), {}))
    PARITY_CASES.append((torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]),
                         torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)]), {}))


def outcome(fn, *args, **kwargs):
    """What ``fn`` did: ("pass", None) or (exception type, message)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        return type(e).__name__, str(e)
    return "pass", None


class AssertEqualParityTest(unittest.TestCase):
    """disttest's assertEqual decides as upstream's: same outcome, type and message."""

    ours = disttest.TestCase()
    theirs = upstream.TestCase()

    def assertSameOutcome(self, *args, **kwargs):
        ours = outcome(self.ours.assertEqual, *args, **kwargs)
        theirs = outcome(self.theirs.assertEqual, *args, **kwargs)
        if theirs[0] == "RuntimeError":  # upstream's goes on with advice to file an issue with PyTorch
            self.assertEqual(ours[0], theirs[0], ours)
            self.assertTrue(ours[1].startswith("Comparing\n\n") and theirs[1].startswith(ours[1]), (ours, theirs))
            return ours
        self.assertEqual(ours, theirs)
        return ours

    def test_every_case_decides_as_upstream(self):
        kinds = set()
        for i, (actual, expected, options) in enumerate(PARITY_CASES):
            with self.subTest(i=i, actual=actual, expected=expected, options=options):
                kinds.add(self.assertSameOutcome(actual, expected, **options)[0])
        # the table has passes, failures and the errors upstream raises
        self.assertEqual(kinds, {"pass", "AssertionError", "ValueError", "RuntimeError"})

    def test_equal_plain_values_skip_the_pairs(self):
        # the common passing case is decided without torch's pairs (a fraction of their time)
        with mock.patch.object(case_equal._cmp, "originate_pairs", side_effect=AssertionError("pairs")):
            self.ours.assertEqual([torch.ones(3), {"k": (1, "s", None, 2.5)}], [torch.ones(3), {"k": (1, "s", None, 2.5)}])
            with self.assertRaisesRegex(AssertionError, "pairs"):
                self.ours.assertEqual(torch.ones(3), torch.zeros(3))

    def test_module_function_and_method_agree(self):
        for actual, expected, options in PARITY_CASES:
            self.assertEqual(outcome(disttest.assert_equal, actual, expected, **options),
                             outcome(self.ours.assertEqual, actual, expected, **options))

    def test_user_message(self):
        args = (torch.zeros(1), torch.ones(1))
        ours = self.assertSameOutcome(*args, msg="on rank 3")
        self.assertTrue(ours[1].endswith("\non rank 3"), ours)
        self.assertIn("Tensor-likes are not close!", ours[1])
        self.assertEqual(self.assertSameOutcome(*args, msg=lambda text: f"<{text.splitlines()[0]}>")[1],
                         "<Tensor-likes are not close!>")
        quiet = disttest.TestCase()
        quiet.longMessage = False
        self.assertEqual(outcome(quiet.assertEqual, *args, msg="only this"), ("AssertionError", "only this"))

    def test_message_kept_where_upstream_drops_it(self):
        # upstream loses msg when lengths or keys differ; disttest keeps it
        for args in (([1, 2], [1, 2, 3]), ({"a": 1}, {"b": 1})):
            kind, text = outcome(self.ours.assertEqual, *args, msg="on rank 3")
            self.assertEqual(kind, "AssertionError")
            self.assertEqual(text, outcome(self.theirs.assertEqual, *args)[1] + "\non rank 3")

    def test_text_against_a_tensor_is_torch_s_error_as_upstream_s(self):
        # (It was a failure here, "Object comparison failed", so that
        # assertNotEqual(tensor, "abc") passed where upstream's errs.)
        kind, text = self.assertSameOutcome(torch.zeros(1), "abc")
        self.assertEqual(kind, "TypeError")

    def test_tolerance_overrides(self):
        case = disttest.TestCase()
        case.precision, case.rel_tol = 0.2, 0.0
        case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]))
        case.assertEqual(1.0, 1.1)
        case.precision = 0.0
        with self.assertRaises(AssertionError):
            case.assertEqual(1.0, 1.1)

    def test_dtensor_placements_checked(self):
        from torch.distributed.tensor import DTensor  # noqa: F401  (the check runs once it is loaded)

        kind, text = outcome(self.ours.assertEqual, torch.zeros(1), mock.MagicMock(spec=DTensor))
        self.assertEqual(kind, "TypeError")
        self.assertIn("Comparing a DTensor to a non-DTensor is ambiguous", text)

    def test_upstream_s_argument_names(self):
        self.ours.assertEqual(x=torch.ones(1), y=torch.ones(1))
        self.ours.assertNotEqual(x=1, y=2)
        with self.assertRaises(TypeError):
            self.ours.assertEqual(first=1, second=1)

    def test_assert_not_equal_fails_even_where_repr_raises(self):
        class NoRepr:
            def __eq__(self, other):
                return True

            def __repr__(self):
                raise RuntimeError("no repr")

        for case in (self.ours, self.theirs):
            with self.subTest(case=type(case).__module__), \
                    self.assertRaisesRegex(AssertionError, "^AssertionError not raised : why$"):
                case.assertNotEqual(NoRepr(), NoRepr(), msg="why")

    def test_assert_not_equal_decides_as_upstream_s(self):
        # A tensor against a str is torch's TypeError on both (it was a
        # failure of assertEqual here, so assertNotEqual passed).
        for args in ((torch.ones(1), "1"), ("1", torch.ones(1)), (torch.ones(1), b"1"), (1, 1),
                     (torch.ones(2), torch.ones(2) + 0.01)):
            with self.subTest(args=args):
                self.assertEqual(outcome(self.ours.assertNotEqual, *args),
                                 outcome(self.theirs.assertNotEqual, *args))
        self.assertEqual(outcome(self.ours.assertEqual, torch.ones(1), "1")[0], "TypeError")

    def test_any_enum_compares_as_its_int(self):
        import enum

        class Half(float, enum.Enum):
            A = 1.5

        self.assertEqual(self.assertSameOutcome(Half.A, 1), ("pass", None))
        self.assertEqual(self.assertSameOutcome(Half.A, 1.5)[0], "AssertionError")

    def test_numpy_types_without_a_torch_dtype_of_their_own_compare_by_item(self):
        # np.longlong has int64's width but is another type: upstream compares its arrays item by item.
        longlong = np.array([1, 2], dtype=np.longlong)
        self.assertEqual(self.assertSameOutcome(longlong, torch.tensor([1.0, 2.0])), ("pass", None))
        self.assertEqual(self.assertSameOutcome(longlong, np.array([1, 2], dtype=np.int32)), ("pass", None))
        self.assertEqual(self.assertSameOutcome(longlong, np.array([1, 3]))[0], "AssertionError")
        self.assertEqual(self.assertSameOutcome(np.array([1.0], dtype=">f4"), np.array([1.0], dtype=">f4")),
                         ("pass", None))

    def test_a_later_item_that_cannot_compare_is_an_error(self):
        class Raises:
            def __eq__(self, other):
                raise ValueError("cannot compare")

        for case in (self.ours, self.theirs):
            with self.subTest(case=type(case).__module__), self.assertRaises(RuntimeError) as ctx:
                case.assertEqual([1, Raises()], [2, Raises()])
            self.assertIsInstance(ctx.exception.__cause__, ValueError)

    def test_assert_not_equal(self):
        self.ours.assertNotEqual(torch.zeros(2), torch.ones(2))
        self.ours.assertNotEqual(True, 0)
        with self.assertRaises(AssertionError):
            self.ours.assertNotEqual(torch.zeros(2), torch.zeros(2))

    def test_assert_not_equal_keeps_its_message_with_msg(self):
        # A msg replaced the message ("m" alone); upstream's follows its own.
        for case in (self.ours, self.theirs):
            with self.subTest(case=type(case).__module__), self.assertRaises(AssertionError) as ctx:
                case.assertNotEqual(1, 1, msg="m")
            self.assertEqual(str(ctx.exception), "AssertionError not raised : m")


class AssertEqualTest(disttest.TestCase):
    def test_assert_greater_almost_equal(self):
        self.assertGreaterAlmostEqual(2.0, 1.0)
        self.assertGreaterAlmostEqual(1.0, 1.0 + 1e-9)
        self.assertGreaterAlmostEqual(0.9, 1.0, delta=0.2)
        # upstream's words
        for args, kwargs in (((0.5, 1.0), {"delta": 0.2}), ((0.5, 1.0), {}), ((1, 2), {"places": 1, "delta": 1})):
            self.assertEqual(outcome(self.assertGreaterAlmostEqual, *args, **kwargs),
                             outcome(upstream.TestCase().assertGreaterAlmostEqual, *args, **kwargs))
        self.assertEqual(outcome(self.assertGreaterAlmostEqual, 0.5, 1.0, delta=0.2),
                         ("AssertionError", "0.5 not greater than or equal to 1.0 within 0.2 delta"))

    def test_assert_expected_inline_available(self):
        self.assertExpectedInline(str(1 + 1), """2""")


class SeedingTest(unittest.TestCase):
    def test_setup_seeds_every_rng(self):
        draws = []

        class Case(disttest.TestCase):
            def test_draw(self):
                draws.append((torch.rand(1).item(), np.random.rand(), random.random()))

        for _ in range(2):
            torch.rand(5), np.random.rand(), random.random()  # disturb the state
            self.assertTrue(run_case(Case, "test_draw").wasSuccessful())
        self.assertEqual(draws[0], draws[1])

    def test_seed_is_a_class_attribute(self):
        draws = []

        class Case(disttest.TestCase):
            def test_draw(self):
                draws.append(torch.rand(1).item())

        class Other(Case):
            seed = 7

        run_case(Case, "test_draw")
        run_case(Other, "test_draw")
        self.assertNotEqual(draws[0], draws[1])

    def test_a_seed_method_or_none_is_the_class_s_own(self):
        # upstream's TestCase has no seed setting: a method of that name is the suite's
        draws = []

        class Method(disttest.TestCase):
            def seed(self):
                return "the suite's own"

            def test_draw(self):
                draws.append(torch.rand(1).item())

        class Nothing(Method):
            seed = None

        for case in (Method, Nothing):
            self.assertTrue(run_case(case, "test_draw").wasSuccessful())
        torch.manual_seed(case_module.DEFAULT_SEED)
        self.assertEqual(draws, [torch.rand(1).item()] * 2)

    def test_a_bad_seed_is_refused_before_anything_changes(self):
        class Bad(disttest.TestCase):
            seed = "x"

            def test_x(self):
                pass

        before = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        result = run_case(Bad, "test_x")
        self.assertEqual(len(result.errors), 1)
        self.assertIn("Invalid seed 'x' from Bad.seed", result.errors[0][1])
        self.assertEqual(torch.sparse.check_sparse_tensor_invariants.is_enabled(), before)


class ChainBreakerTest(unittest.TestCase):
    """A base whose setUp and tearDown call no super()'s (upstream's
    common_utils.TestCase) placed before disttest's: disttest's part of the
    chain still runs, once."""

    @staticmethod
    def breaker(calls: list[str]) -> type:
        def set_up(self):
            calls.append("breaker setUp")

        def tear_down(self):
            calls.append("breaker tearDown")

        cls = type("TestCase", (unittest.TestCase,), {"setUp": set_up, "tearDown": tear_down})
        cls.__module__ = "torch.testing._internal.common_utils"
        return cls

    def test_disttest_setup_and_teardown_run_after_the_breaker(self):
        calls: list[str] = []

        class Mine(disttest.TestCase):
            def setUp(self):
                super().setUp()
                calls.append("disttest setUp")

            def tearDown(self):
                calls.append("disttest tearDown")
                super().tearDown()

            def test_it(self):
                calls.append("test")

        class Device(self.breaker(calls), Mine):  # the order instantiate_device_type_tests makes
            pass

        torch.set_grad_enabled(True)
        result = unittest.TestResult()
        Device("test_it").run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        # From where the breaker stopped, as if it had called super()'s.
        self.assertEqual(calls, ["breaker setUp", "disttest setUp", "test", "breaker tearDown",
                                 "disttest tearDown"])

    def test_no_double_run_when_the_chain_is_whole(self):
        calls: list[str] = []

        class Mine(disttest.TestCase):
            def setUp(self):
                calls.append("setUp")
                super().setUp()

            def test_it(self):
                pass

        class AfterBreaker(Mine, self.breaker(calls)):  # disttest's part first: nothing cut
            pass

        with mock.patch("disttest.runners.case.set_rng_seed") as seed:
            AfterBreaker("test_it").run(unittest.TestResult())
        self.assertEqual(calls, ["setUp", "breaker setUp", "breaker tearDown"])
        self.assertEqual(seed.call_count, 1)

    def test_upstream_device_type_classes_start_their_ranks(self):
        # The real case: instantiate_device_type_tests on a DistributedTestBase
        # (PyTorch's test_c10d_object_collectives: "no ranks were started").
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "device_type_cases"], cwd=HERE,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("test_sum_cpu (device_type_cases.CollectCPU.test_sum_cpu) ... ok", proc.stderr)


class ExitCodeSkipTest(unittest.TestCase):
    def test_sys_exit_with_skip_code_is_a_skip(self):
        class Case(disttest.TestCase):
            def test_exit(self):
                sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

        result = run_case(Case, "test_exit")
        self.assertEqual([reason for _, reason in result.skipped], ["Need at least 2 CUDA devices"])

    def test_sys_exit_with_skip_code_in_set_up_is_a_skip(self):
        # (as in a rank's setUp: it was an error here and under run_rank)
        class Case(disttest.TestCase):
            def setUp(self):
                super().setUp()
                sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

            def test_exit(self):
                raise AssertionError("not run")

        result = run_case(Case, "test_exit")
        self.assertEqual([reason for _, reason in result.skipped], ["Need at least 2 CUDA devices"])
        self.assertEqual(result.errors + result.failures, [])

    def test_sys_exit_with_other_code_is_an_error(self):
        class Case(disttest.TestCase):
            def test_exit(self):
                sys.exit(3)

        result = run_case(Case, "test_exit")
        self.assertEqual(len(result.errors), 1)
        self.assertIn("SystemExit: 3", result.errors[0][1])


class FakeBackendTest(unittest.TestCase):
    """Issue 25: upstream's test process has c10d's ``fake`` backend (its
    ``fake_pg`` registers it when imported); a suite that imports
    ``FakeStore`` from disttest instead must still find it, and disttest
    must take it away again after the class and the test."""

    SCRIPT = (
        "import sys, unittest, torch.distributed as dist\n"
        "import fake_backend_cases as cases\n"
        "assert 'FAKE' not in dist.Backend._plugins, 'registered at import'\n"
        "result = unittest.TestResult()\n"
        "unittest.defaultTestLoader.loadTestsFromModule(cases).run(result)\n"
        "print('run', result.testsRun, 'problems', [t for _, t in result.errors + result.failures])\n"
        "print('left', 'FAKE' in dist.Backend._plugins)\n"
        "result = unittest.TestResult()\n"
        "cases.TestWorld('test_world').run(result)  # on its own: no class set-up\n"
        "print('alone', result.wasSuccessful(), 'left', 'FAKE' in dist.Backend._plugins)\n"
        "class Asks(cases.disttest.TestCase):\n"
        "    def test_it(self):\n"
        "        cases.disttest.register_fake_backend()  # for the rest of the process, as documented\n"
        "result = unittest.TestResult()\n"
        "unittest.TestSuite([Asks('test_it')]).run(result)\n"
        "print('asked', result.wasSuccessful(), 'left', 'FAKE' in dist.Backend._plugins)\n"
    )

    def test_fake_backend_for_the_class_and_the_test_and_gone_after(self):
        proc = subprocess.run([sys.executable, "-c", self.SCRIPT], cwd=HERE,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertEqual(proc.stdout.splitlines(), [
            "run 2 problems []", "left False", "alone True left False", "asked True left True"], proc.stdout)
