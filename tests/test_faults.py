"""Fault injection and schedule fuzzing (disttest.faults), under every runner."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import fault_cases as cases
import torch
from runner_cases import live_ranks

from disttest import ConfigError, InjectedFault, _compat, inject_fault
from disttest._runner import tracking
from disttest._runner.functional import FUNCTIONAL
from disttest._runner.outcome import ExitStatus, Kind, Outcome
from disttest._runner.report import NEVER_MARK
from disttest.faults import (
    CANNOT_CORRUPT,
    CHAOS_ENV,
    FAULT_ENV,
    HIDDEN,
    NO_FAULT,
    NOT_IN_A_RANK,
    Fault,
    chaos_seed,
    declared_faults,
    env_faults,
    judge,
    parse_fault_spec,
    test_faults,
)
from disttest.faults import rank as _faults_rank
from disttest.faults.judge import (
    ALL_DIED,
    INJECTED,
    NOT_IN_WORLD,
    SUITE_NEVER_FIRED,
    SUITE_NO_CALL,
    SUITE_NO_RANK,
    check_world,
    injected_lines,
    judge_injected,
)
from disttest.faults.rank import (
    CHAOS_LONG,
    _local,
    _process,
    before_collective,
    chaos_delay,
    chaos_delays,
    corrupt_,
)

PROCESS_AND_POOL_AND_THREADS = (cases.ProcessFaults, cases.PoolFaults, cases.ThreadFaults)


def run(cls: type[unittest.TestCase], name: str) -> tuple[unittest.TestResult, float]:
    result = unittest.TestResult()
    start = time.monotonic()
    cls(name).run(result)
    return result, time.monotonic() - start


class DeclarationTest(unittest.TestCase):
    def test_decorator_stacks_in_source_order_and_changes_nothing_else(self):
        def body(self):
            return 42

        decorated = inject_fault(rank=[1, 0], action="delay", at="barrier", seconds=0.5)(
            inject_fault(rank=1, action="kill", at="all_reduce", nth=3)(body))
        self.assertIs(decorated.__wrapped__, body)  # one check wraps it, however many faults
        self.assertEqual(declared_faults(decorated), (
            Fault((0, 1), "delay", "barrier", 1, 0.5), Fault((1,), "kill", "all_reduce", 3)))
        self.assertEqual(decorated.__name__, "body")

    def test_a_fault_on_a_test_no_runner_runs_is_refused_when_it_runs(self):
        class Plain(unittest.TestCase):
            @inject_fault(rank=1, action="kill", at="all_reduce")
            def test_x(self):
                pass

        result, _ = run(Plain, "test_x")
        self.assertEqual(len(result.errors), 1, result.errors)
        self.assertIn("Invalid fault 'rank 1 kill at all_reduce #1' from @inject_fault (disttest): "
                      + NOT_IN_A_RANK, result.errors[0][1])

    def test_on_a_class_it_is_refused_not_dropped(self):
        with self.assertRaises(ConfigError) as ctx:
            @inject_fault(rank=1, action="kill", at="all_reduce")
            class Suite(unittest.TestCase):
                def test_x(self):
                    pass
        self.assertIn("Invalid fault target", str(ctx.exception))
        self.assertIn("from @inject_fault", str(ctx.exception))
        self.assertIn("Suite", str(ctx.exception))

    def test_a_field_given_twice_is_refused_not_last_wins(self):
        with self.assertRaises(ConfigError) as ctx:
            parse_fault_spec("rank=1,action=raise,at=all_reduce,action=delay,seconds=1", "DISTTEST_FAULT")
        self.assertIn("action= is given twice", str(ctx.exception))
        self.assertIn("from DISTTEST_FAULT", str(ctx.exception))
        # Two faults, each with its fields once, are fine.
        self.assertEqual(len(parse_fault_spec("rank=1,action=raise;rank=0,action=raise", "x")), 2)

    def test_a_spec_without_a_fault_is_refused_and_an_empty_variable_is_unset(self):
        for text in ("", ";", " ; ;"):
            with self.subTest(text=text), self.assertRaises(ConfigError) as ctx:
                parse_fault_spec(text, "DISTTEST_FAULT")
            self.assertIn(NO_FAULT, str(ctx.exception))
            self.assertIn("from DISTTEST_FAULT", str(ctx.exception))
        self.assertEqual(env_faults({FAULT_ENV: " "}), ())
        with self.assertRaisesRegex(ConfigError, "declares no fault"):
            env_faults({FAULT_ENV: ";"})

    def test_bad_values_name_themselves_and_their_source(self):
        cases_ = [
            (dict(rank="x", action="kill"), "Invalid fault rank 'x' from @inject_fault"),
            (dict(rank=-1, action="kill"), "Invalid fault rank -1"),
            (dict(rank=True, action="kill"), "Invalid fault rank True"),
            (dict(rank=1, action="explode"), "Invalid fault action 'explode' from @inject_fault"),
            (dict(rank=1, action="kill", at="allreduce"), "Invalid fault collective 'allreduce'"),
            (dict(rank=1, action="kill", nth=0), "Invalid fault nth 0"),
            (dict(rank=1, action="delay"), "Invalid fault seconds None"),
            (dict(rank=1, action="delay", seconds=-1), "Invalid fault seconds -1"),
            (dict(rank=1, action="kill", seconds=1), "only action 'delay' takes seconds"),
            (dict(rank=1, action="corrupt", at="barrier"), "barrier receives no tensor values"),
            (dict(rank=1, action="corrupt", at="all_gather_object"), "all_gather_object receives no tensor"),
            (dict(rank=1, action="raise", ends_test=True), "only a death (kill or exit) can end the test"),
            (dict(rank=1, action="kill", ends_test="maybe"), "Invalid fault ends_test 'maybe'"),
            # (a string in code: "no" was read as False, "yes" as True; only a spec is text)
            (dict(rank=1, action="kill", ends_test="no"), "Invalid fault ends_test 'no' from @inject_fault"),
            (dict(rank=1.0, action="kill"), "Invalid fault rank 1.0"),
            (dict(rank=1, action="kill", nth=1.0), "Invalid fault nth 1.0"),
            (dict(rank=1, action="delay", seconds=10**400), "Invalid fault seconds 1000"),
            # (the rank died in time.sleep's OverflowError; a string is not a number in code)
            (dict(rank=1, action="delay", seconds=1e300), "Invalid fault seconds 1e+300 from @inject_fault"),
            (dict(rank=1, action="delay", seconds="0.5"), "Invalid fault seconds '0.5' from @inject_fault"),
        ]
        for kwargs, message in cases_:
            with self.subTest(**{k: repr(v) for k, v in kwargs.items()}):
                with self.assertRaises(ConfigError) as cm:
                    inject_fault(**kwargs)
                self.assertIn(message, str(cm.exception))

    def test_env_spec(self):
        with self.assertRaisesRegex(ConfigError, "Invalid fault seconds '1e300' from DISTTEST_FAULT"):
            parse_fault_spec("rank=1,action=delay,seconds=1e300")
        faults = parse_fault_spec("rank=1,action=kill,at=all_reduce,nth=3; rank=0|2,action=delay,seconds=0.5")
        self.assertEqual(faults, (
            Fault((1,), "kill", "all_reduce", 3, None, FAULT_ENV),
            Fault((0, 2), "delay", "any", 1, 0.5, FAULT_ENV)))
        self.assertEqual(env_faults({}), ())
        for text, message in [
            ("rank=x,action=kill", "Invalid fault rank 'x' from DISTTEST_FAULT"),
            ("rank=1,action=explode", "Invalid fault action 'explode' from DISTTEST_FAULT"),
            ("rank=1", "missing action="),
            ("rank=1,action=kill,when=3", "Invalid fault field 'when=3' from DISTTEST_FAULT"),
            ("rank=1,action=kill,nth=three", "Invalid fault nth 'three'"),
            ("rank=1,action=kill,nth=1_0", "Invalid fault nth '1_0'"),
            ("rank=-0,action=kill", "Invalid fault rank '-0'"),
        ]:
            with self.subTest(text=text), self.assertRaises(ConfigError) as cm:
                env_faults({FAULT_ENV: text})
            self.assertIn(message, str(cm.exception))

    def test_faults_are_found_under_other_decorators(self):
        import functools

        def other_decorator(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                return func(*args, **kwargs)
            return wrapper

        def body():
            pass

        inner = other_decorator(other_decorator(inject_fault(rank=0, action="raise")(body)))
        self.assertEqual(declared_faults(inner), (Fault((0,), "raise"),))
        def fresh():
            pass

        outer = inject_fault(rank=1, action="raise")(other_decorator(fresh))
        self.assertEqual(declared_faults(outer), (Fault((1,), "raise"),))

    def test_ends_test_in_a_spec(self):
        self.assertTrue(parse_fault_spec("rank=1,action=kill,ends_test=1")[0].ends_test)
        self.assertFalse(parse_fault_spec("rank=1,action=kill,ends_test=no")[0].ends_test)
        self.assertIn(", ends the test (from", parse_fault_spec("rank=1,action=exit,ends_test=true")[0].describe())

    def test_two_faults_on_one_call_of_one_rank_are_refused(self):
        # Issue 24: kill then raise on rank 1's first all_reduce reported the
        # raise as "never fired" after the test had run.
        def body():
            pass

        body = inject_fault(rank=1, action="kill", at="all_reduce")(inject_fault(rank=[0, 1], action="raise",
                                                                                 at="all_reduce")(body))
        with self.assertRaises(ConfigError) as cm:
            test_faults(body, {})
        self.assertIn("Invalid fault 'rank 1 raise at all_reduce #1' from @inject_fault (disttest): "
                      "rank 1 kill at all_reduce #1 (from @inject_fault) acts on the same call", str(cm.exception))
        # Across sources: the decorator's and DISTTEST_FAULT's.
        def other():
            pass

        other = inject_fault(rank=1, action="corrupt", at="all_reduce", nth=2)(other)
        with self.assertRaises(ConfigError) as cm:
            test_faults(other, {FAULT_ENV: "rank=1,action=hang,at=all_reduce,nth=2"})
        self.assertIn("from DISTTEST_FAULT", str(cm.exception))
        # Delays share a call with anything; other calls or ranks do not collide.
        inject_fault(rank=1, action="delay", at="all_reduce", nth=2, seconds=0.1)(other)
        inject_fault(rank=0, action="kill", at="all_reduce", nth=2)(other)
        inject_fault(rank=1, action="kill", at="all_reduce", nth=3)(other)
        self.assertEqual(len(test_faults(other, {})), 4)

    def test_chaos_seed(self):
        self.assertIsNone(chaos_seed({}))
        self.assertEqual(chaos_seed({CHAOS_ENV: "7"}), 7)
        with self.assertRaises(ConfigError) as cm:
            chaos_seed({CHAOS_ENV: "seven"})
        self.assertIn("Invalid chaos seed 'seven' from DISTTEST_CHAOS", str(cm.exception))

    def test_same_seed_same_delays(self):
        def delays(seed, rank):
            rng = chaos_delays(seed, "test_x", rank)
            return [chaos_delay(rng) for _ in range(50)]

        self.assertEqual(delays(3, 1), delays(3, 1))
        self.assertNotEqual(delays(3, 1), delays(4, 1))
        self.assertNotEqual(delays(3, 0), delays(3, 1))
        self.assertTrue(all(0 <= d <= CHAOS_LONG for d in delays(3, 1)))

    def test_injected_fault_is_a_runtime_error(self):
        self.assertTrue(issubclass(InjectedFault, RuntimeError))
        import pickle

        e = pickle.loads(pickle.dumps(InjectedFault("m", 1, "all_reduce", 3)))
        self.assertEqual((str(e), e.rank, e.op, e.nth), ("m", 1, "all_reduce", 3))


class CorruptTest(unittest.TestCase):
    def test_every_element_changes_for_every_dtype(self):
        values = [0.0, -0.0, 1.0, -0.5, -1.0, float("inf"), float("nan"), 3e38, 1e-45]
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            with self.subTest(dtype=dtype):
                t = torch.tensor(values, dtype=torch.float64).to(dtype)
                before = t.clone()
                corrupt_(t)
                same = (t == before) | (t.isnan() & before.isnan())
                self.assertFalse(bool(same.any()), f"{before} -> {t}")
        for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
            with self.subTest(dtype=dtype):
                t = torch.arange(0, 100).to(dtype)
                before = t.clone()
                corrupt_([t])
                self.assertFalse(bool((t == before).any()))
        flags = torch.tensor([True, False])
        corrupt_(flags)
        self.assertEqual(flags.tolist(), [False, True])
        c = torch.tensor([1 + 2j, 0j])
        before = c.clone()
        corrupt_(c)
        self.assertFalse(bool((torch.view_as_real(c) == torch.view_as_real(before)).any()))


class JudgeTest(unittest.TestCase):
    """The pure judge, without ranks."""

    kill = Fault((1,), "kill", "all_reduce", 3)

    def test_injected_death_is_expected(self):
        outcomes = [Outcome(0, Kind.PASSED), Outcome(1, Kind.CRASHED, exit=ExitStatus(signal=9))]
        fired = {1: [{"fault": 0, "action": "kill", "what": "rank 1 killed at all_reduce #3"}]}
        judged = judge_injected(outcomes, [self.kill], fired)
        self.assertEqual([o.kind for o in judged], [Kind.PASSED, Kind.PASSED])
        self.assertEqual(judged[1].faults_fired, ["rank 1 killed at all_reduce #3"])
        self.assertEqual(outcomes[1].kind, Kind.CRASHED)  # inputs untouched

    def test_schedule_fuzzing_delays_are_named_from_a_tenth_of_a_second(self):
        def line(*delayed):
            outcomes = [Outcome(r, Kind.TIMED_OUT) for r in range(len(delayed))]
            fired = {r: [{"chaos": 5, "where": CHAOS_ENV}, {"delayed": d / 2}, {"delayed": d}]
                     for r, d in enumerate(delayed)}
            [text] = injected_lines(judge_injected(outcomes, [], fired))
            return text

        seed = "schedule fuzzing: DISTTEST_CHAOS=5 (the same seed gives the same delays)"
        self.assertEqual(line(0.05, 0.02), seed)
        self.assertEqual(line(0.3, 1.26, 0.7), seed + "; its delays took 1.3s of rank 1/3's time, the most of any rank")

    def test_death_not_injected_stays_a_cause(self):
        outcomes = [Outcome(0, Kind.PASSED), Outcome(1, Kind.CRASHED, exit=ExitStatus(signal=9))]
        judged = judge_injected(outcomes, [self.kill], {1: [{"counts": {"all_reduce": 2}}]})
        self.assertEqual(judged[1].kind, Kind.CRASHED)
        self.assertEqual(judged[1].faults_fired,
                         ["never fired: rank 1 kill at all_reduce #3 (from @inject_fault)"])

    def test_stopped_peer_did_not_survive(self):
        outcomes = [Outcome(0, Kind.STOPPED, detail="stopped"), Outcome(1, Kind.CRASHED)]
        fired = {1: [{"fault": 0, "action": "kill", "what": "rank 1 killed at all_reduce #3"}]}
        judged = judge_injected(outcomes, [self.kill], fired)
        self.assertEqual(judged[0].kind, Kind.ERRORED)
        self.assertIn("did not survive the injected fault (rank 1 killed at all_reduce #3)",
                      judged[0].message)

    def test_a_stopped_peer_s_detail_reads_whole_in_the_message(self):
        # A detail the report fills ("{who} {waits} in ...") showed its
        # placeholders once the judge made it part of the message; and the
        # detail was shown a second time under it.
        from disttest._runner.verdict import WAITED_FOR

        detail = WAITED_FOR.format(what="all_reduce #1 of group 1", peer=2, world=3)
        outcomes = [Outcome(0, Kind.STOPPED, "RankStopped", detail=detail), Outcome(1, Kind.CRASHED)]
        fired = {1: [{"fault": 0, "action": "kill", "what": "rank 1 killed at all_reduce #3"}]}
        judged = judge_injected(outcomes, [self.kill], fired)
        self.assertEqual(judged[0].message, "did not survive the injected fault (rank 1 killed at all_reduce #3): "
                                            "it waited in all_reduce #1 of group 1 for rank 2/3, which never "
                                            "entered it: that rank hung")
        self.assertEqual(judged[0].detail, "")

    def test_error_after_the_death_did_not_survive_it(self):
        fired = {1: [{"fault": 0, "action": "kill", "what": "rank 1 killed at all_reduce #3", "t": 10.0}]}
        outcomes = [Outcome(0, Kind.ERRORED, "RuntimeError", "Connection closed by peer", at=11.0),
                    Outcome(1, Kind.CRASHED), Outcome(2, Kind.ERRORED, "ValueError", "earlier", at=9.0),
                    Outcome(3, Kind.FAILED, "AssertionError", "wrong", at=12.0)]
        judged = judge_injected(outcomes, [Fault((1,), "kill", "all_reduce", 3)], fired)
        self.assertEqual([o.kind for o in judged], [Kind.ERRORED, Kind.PASSED, Kind.ERRORED, Kind.FAILED])
        self.assertEqual(judged[0].message, "did not survive the injected fault (rank 1 killed at "
                                            "all_reduce #3): Connection closed by peer")
        self.assertEqual([o.message for o in judged[2:]], ["earlier", "wrong"])

    def test_every_rank_dead_is_an_error_unless_each_death_ends_the_test(self):
        outcomes = [Outcome(0, Kind.CRASHED, exit=ExitStatus(signal=9)),
                    Outcome(1, Kind.CRASHED, exit=ExitStatus(signal=9))]
        fired = {r: [{"fault": 0, "action": "kill", "what": f"rank {r} killed at all_reduce #1", "t": 1.0}]
                 for r in (0, 1)}
        judged = judge_injected(outcomes, [Fault((0, 1), "kill", "all_reduce")], fired)
        self.assertEqual([o.kind for o in judged], [Kind.ERRORED, Kind.PASSED])
        self.assertEqual(judged[0].message, ALL_DIED.format(
            faults="rank 0 killed at all_reduce #1; rank 1 killed at all_reduce #1"))
        ending = Fault((0, 1), "kill", "all_reduce", ends_test=True)
        self.assertEqual([o.kind for o in judge_injected(outcomes, [ending], fired)], [Kind.PASSED] * 2)
        # One rank left alive, or dead on its own: not every rank died by a fault.
        one = {1: fired[1]}
        self.assertEqual(judge_injected(outcomes, [Fault((1,), "kill", "all_reduce")], one)[0].kind, Kind.CRASHED)

    def test_unfired_fault_is_an_error_naming_it(self):
        outcomes = [Outcome(0, Kind.PASSED), Outcome(1, Kind.PASSED)]
        judged = judge_injected(outcomes, [self.kill], {1: [{"counts": {"all_reduce": 2}}]})
        self.assertEqual(judged[1].kind, Kind.ERRORED)
        self.assertEqual(judged[1].message, "injected fault never fired: rank 1 kill at all_reduce #3 "
                                            "(from @inject_fault): rank 1 made 2 all_reduce calls in the test")
        with self.assertRaises(ConfigError) as cm:
            check_world([Fault((5,), "raise")], 2)  # the runners ask before any rank starts
        self.assertIn(NOT_IN_WORLD.format(rank=5, world_size=2), str(cm.exception))

    def test_a_suite_wide_fault_that_did_not_fire_is_noted_not_an_error(self):
        outcomes = [Outcome(0, Kind.PASSED), Outcome(1, Kind.PASSED)]
        suite = Fault((1, 5), "kill", "all_reduce", 3, where=FAULT_ENV)
        check_world([suite], 2)  # rank 5: it acts in the tests that have one
        judged = judge_injected(outcomes, [suite], {1: [{"counts": {"all_reduce": 2}}]})
        self.assertEqual([o.kind for o in judged], [Kind.PASSED] * 2)
        self.assertEqual(judged[1].faults_fired, [NEVER_MARK + suite.describe(1)])


class HookTest(unittest.TestCase):
    def test_the_core_asks_fault_injection_only_while_a_rank_is_armed(self):
        class Case:
            @inject_fault(rank=0, action="raise", at="barrier")
            def test_x(self):
                pass

        self.assertEqual(tracking._hook, [])
        run_dir = tempfile.mkdtemp(prefix="disttest-hook-test-")
        self.addCleanup(shutil.rmtree, run_dir, True)
        with _faults_rank.armed(Case, "test_x", 0, run_dir):
            self.assertEqual(tracking._hook, [_faults_rank.before_collective])
            with _faults_rank.armed(Case, "test_x", 0, run_dir):  # a second rank thread
                pass
            self.assertEqual(tracking._hook, [_faults_rank.before_collective])
        self.assertEqual(tracking._hook, [])
        with _faults_rank.armed(unittest.TestCase, "run", 0):  # nothing declared
            self.assertEqual(tracking._hook, [])

    def test_a_fault_where_no_parent_reads_the_records_is_refused(self):
        class Case:
            @inject_fault(rank=0, action="raise", at="barrier")
            def test_x(self):
                pass

        with self.assertRaises(ConfigError) as cm, _faults_rank.armed(Case, "test_x", 0):
            pass
        self.assertIn("this rank was started by an external launcher (run_rank)", str(cm.exception))
        self.assertEqual(tracking._hook, [])


class RunnerFaultsTest(unittest.TestCase):
    """Each action under each runner it applies to."""

    def setUp(self):
        # A count of suite-wide faults of its own: a fault of these tests that
        # never fired would fail the pytest run that runs them.
        self.addCleanup(judge.suite_summary_by("tests"))

    def tearDown(self):
        deadline = time.monotonic() + 5
        while live_ranks() and time.monotonic() < deadline:
            time.sleep(0.05)
        cases.PoolFaults.tearDownClass()
        self.assertEqual(live_ranks(), [], "a rank outlived its test")
        self.assertEqual(_process, [], "interception left armed")
        self.assertIsNone(getattr(_local, "state", None))
        self.assertEqual(_faults_rank._armed_count, 0)
        self.assertEqual(tracking._hook, [], "the core's collective hook left set")

    def each(self, name, runners=PROCESS_AND_POOL_AND_THREADS):
        """(runner, result, seconds) of ``name`` under each runner."""
        return [(runner, *run(runner, name)) for runner in runners]

    def assert_passed(self, result):
        self.assertEqual(result.testsRun, 1)
        self.assertEqual(result.errors + result.failures + result.skipped, [])

    def only_error(self, result):
        self.assertEqual(result.failures, [])
        self.assertEqual(len(result.errors), 1, result.errors)
        return result.errors[0][1]

    def test_kill_is_expected_and_survivors_see_it_promptly(self):
        for runner, result, elapsed in self.each("test_kill_survived"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)
                self.assertLess(elapsed, 20)  # not the 30 s limit: the peer's collective failed

    def test_an_injected_death_does_not_stop_the_survivors(self):
        for runner, result, _ in self.each("test_kill_survivor_takes_its_time"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_a_timeout_says_what_schedule_fuzzing_delays_took(self):
        with mock.patch.dict(os.environ, {CHAOS_ENV: "5"}):
            for runner, result, _ in self.each("test_hang_in_fuzzed_calls"):
                with self.subTest(runner=runner.__name__):
                    text = self.only_error(result)
                    self.assertIn("timed out after", text)
                    found = re.search(r"schedule fuzzing: DISTTEST_CHAOS=5 \(the same seed gives the same delays\); "
                                      r"its delays took (\d+\.\d)s of rank [01]/2's time, the most of any rank", text)
                    self.assertIsNotNone(found, text)
                    self.assertGreaterEqual(float(found.group(1)), 0.1)

    def test_exit_is_expected(self):
        for runner, result, _ in self.each("test_exit_survived"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_unhandled_kill_names_the_injected_fault_apart_from_the_cause(self):
        for runner, result, _ in self.each("test_kill_not_handled"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn(INJECTED.format(faults="rank 1 killed at all_reduce #1"), text)
                self.assertIn("errored (disttest): rank 0/2 raised", text)
                self.assertIn("did not survive the injected fault (rank 1 killed at all_reduce #1)", text)
                self.assertNotIn("rank 1/2", text.split("\n")[0])  # the header names causes only
                # The survivor's call that failed, once (threads said only "released by
                # disttest", twice; a thread rank's, as a thousand end at once, without
                # a traceback, processes' with theirs).
                if runner is cases.ThreadFaults:
                    self.assertEqual(text.count("all_reduce on group 0 was released by disttest: rank 1 was "
                                                "killed by an injected fault at all_reduce #1"), 1, text)
                else:
                    self.assertIn("dist.all_reduce(torch.ones(2))", text)
                    self.assertEqual(text.count("rank 0/2 failed in all_reduce #1"), 1, text)

    def test_raise_can_be_retried(self):
        for runner, result, _ in self.each("test_raise_retried"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_unhandled_raise(self):
        for runner, result, _ in self.each("test_raise_not_handled"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("rank 1/2 raised InjectedFault", text)
                self.assertIn("injected by disttest (not causes): rank 1 raised InjectedFault at barrier #1", text)

    def test_hang_is_reported_by_the_timeout(self):
        for runner, result, _ in self.each("test_hang"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("timed out after", text)
                self.assertIn("injected by disttest (not causes): rank 1 hung at barrier #1", text)
                self.assertIn("fault_cases.py", text)  # the hung rank's stack

    def test_delay(self):
        for runner, result, _ in self.each("test_delay"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_a_delay_past_the_limit_is_stopped_at_the_limit(self):
        # (the rank thread slept on: the report came when the delay ended,
        # and said the test's thread could not be stopped)
        result, elapsed = run(cases.ThreadDelayPastTheLimit, "test_delay")
        text = self.only_error(result)
        self.assertIn("rank 1/2 did not finish 'test_delay' within 1s", text)
        self.assertIn("injected by disttest (not causes): rank 1 delayed 30", text)
        self.assertNotIn("could not be stopped", text)
        self.assertLess(elapsed, 10)

    def test_corrupt(self):
        for runner, result, _ in self.each("test_corrupt"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_corrupt_changes_what_each_collective_received(self):
        for runner, result, _ in self.each("test_corrupt_outputs_of_other_collectives", (cases.ThreadFaults,)):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_a_corrupt_that_lands_where_nothing_is_received_is_an_error(self):
        for runner, result, _ in self.each("test_corrupt_lands_on_a_barrier"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("rank 1/2 raised ConfigError", text)
                self.assertIn("Invalid fault 'corrupt at collective #1' from @inject_fault (disttest): it landed on "
                              "barrier #1, which gave rank 1 no tensor values to corrupt", text)
                self.assertIn("rank 1 could not corrupt barrier #1", text)
                self.assertNotIn("corrupted its received values", text)

    def test_faults_act_on_functional_collectives(self):
        # They reach the group from C++: a fault at all_reduce said "rank 1
        # made 0 all_reduce calls", and one at="any" never fired in a DTensor test.
        module = vars(_compat.functional_collectives())
        for runner, result, _ in self.each("test_functional_raise"):
            with self.subTest(runner=runner.__name__, fault="raise"):
                self.assert_passed(result)
        for runner, result, _ in self.each("test_functional_bound_by_name"):
            with self.subTest(runner=runner.__name__, fault="raise", bound_by_name=True):
                self.assert_passed(result)
        self.assertIs(cases.funcol_all_reduce, module["all_reduce"])  # (put back after the test)
        for runner, result, _ in self.each("test_functional_corrupt"):
            with self.subTest(runner=runner.__name__, fault="corrupt"):
                self.assert_passed(result)
        for runner, result, _ in self.each("test_functional_kill_in_dtensor"):
            with self.subTest(runner=runner.__name__, fault="kill"):
                text = self.only_error(result)
                self.assertIn(INJECTED.format(faults="rank 1 killed at all_gather_into_tensor #1"), text)
                self.assertIn("did not survive the injected fault", text)
        # A functional broadcast's root is a rank of its group (a subgroup here).
        result, _ = run(cases.ThreadBroadcastSubgroup, "test_corrupt_a_receiver")
        self.assert_passed(result)
        self.assertEqual([n for n in FUNCTIONAL if getattr(module.get(n), "__disttest_tracked__", False)], [],
                         "functional collectives left wrapped")

    def test_every_rank_killed_is_not_a_pass(self):
        for runner, result, _ in self.each("test_every_rank_killed"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn(ALL_DIED.format(faults="rank 0 killed at all_reduce #1; rank 1 killed at "
                                                     "all_reduce #1"), text)
        for runner, result, _ in self.each("test_every_rank_killed_as_declared"):
            with self.subTest(runner=runner.__name__, declared=True):
                self.assert_passed(result)

    def test_two_faults_on_one_call_are_refused_before_any_rank_starts(self):
        for runner, result, _ in self.each("test_two_faults_on_one_call"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("acts on the same call", text)
                self.assertNotIn("rank 1/2", text)  # no rank ran it

    def test_spawn_threads_and_init_comms_applies_faults_declared_on_either_side(self):
        import disttest

        for order in ("outer", "inner"):
            with self.subTest(order=order):
                def body():
                    torch.distributed.barrier()

                fault = inject_fault(rank=1, action="raise", at="barrier")
                spawn = disttest.spawn_threads_and_init_comms(world_size=2)
                test = fault(spawn(body)) if order == "outer" else spawn(fault(body))
                with self.assertRaises(disttest.RankFailure) as cm:
                    test()
                self.assertIn("rank 1/2 raised InjectedFault", str(cm.exception))

    def test_unfired_fault_is_an_error(self):
        for runner, result, _ in self.each("test_unfired"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("rank 1/2 raised UnfiredFault", text)
                self.assertIn("injected fault never fired: rank 1 kill at all_reduce #5 (from @inject_fault): "
                          "rank 1 made 1 all_reduce call in the test", text)

    def test_corrupt_acts_on_asynchronous_p2p_when_the_test_waits(self):
        for runner, result, _ in self.each("test_corrupt_asynchronous_p2p_as_the_test_waits"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_a_corrupt_on_a_broadcasts_source_is_an_error(self):
        for runner, result, _ in self.each("test_corrupt_at_a_broadcasts_source"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn(CANNOT_CORRUPT.format(op="broadcast", nth=1, rank=0), text)
                self.assertNotIn("corrupted its received values", text)

    def test_two_faults_that_meet_on_one_call_at_run_time(self):
        # at="any" and a named collective: only the run shows they meet.
        for runner, result, _ in self.each("test_two_faults_meet_on_one_call"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("rank 1/2 raised ConfigError", text)
                self.assertIn("acts on the same call", text)
                self.assertIn("(both landed on all_reduce #1)", text)
                self.assertNotIn("never fired", text)
                self.assertNotIn("raised InjectedFault", text)

    def test_a_fault_for_a_rank_outside_the_world_is_refused_before_any_rank_starts(self):
        for runner, result, _ in self.each("test_a_fault_outside_the_world"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("Invalid fault 'rank 2 kill at all_reduce #1' from @inject_fault (disttest): "
                              + NOT_IN_WORLD.format(rank=2, world_size=2), text)
                self.assertNotIn("rank 0/2", text)  # no rank ran it

    def test_a_pool_test_does_not_read_the_records_of_the_one_before(self):
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(cases.PoolForgets).run(result)
        self.assertEqual((result.testsRun, result.failures), (2, []))
        self.assertEqual(len(result.errors), 1, result.errors)
        text = result.errors[0][1]
        self.assertIn("'test_2_setup_fails' errored (disttest): rank 1/2 raised RuntimeError in setUp", text)
        self.assertNotIn("InjectedFault at all_reduce", text)  # test 1's
        self.assertIn("never fired: rank 1 delay 0.01s at all_reduce #1 (from @inject_fault)", text)

    def test_a_group_without_the_dead_rank_goes_on(self):
        for runner, result, _ in self.each("test_a_group_without_the_dead_rank_goes_on",
                                           (cases.SubgroupProcesses, cases.SubgroupThreads)):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_a_killed_rank_thread_that_catches_its_death_makes_no_more_calls(self):
        import disttest

        calls = []

        class Caught(disttest.MultiThreadedTestCase):
            world_size = 2

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            @inject_fault(rank=1, action="kill", at="all_reduce")
            def test_x(self):
                try:
                    torch.distributed.all_reduce(torch.ones(1))
                except BaseException:  # noqa: BLE001 - what the fault must survive
                    pass
                try:
                    torch.distributed.barrier()
                except BaseException as e:  # noqa: BLE001
                    calls.append((self.rank, type(e).__name__))
                    if self.rank == 1:
                        raise

        result, _ = run(Caught, "test_x")
        self.assert_passed(result)  # rank 1's death was injected; rank 0 survived it
        self.assertEqual(sorted(calls), [(0, "CollectiveAborted"), (1, "RankKilled")])

    def test_a_fault_a_decorator_hides_from_the_runner_is_refused(self):
        for runner, result, _ in self.each("test_a_fault_a_decorator_hides"):
            with self.subTest(runner=runner.__name__):
                text = self.only_error(result)
                self.assertIn("Invalid fault 'rank 1 raise at all_reduce #1' from @inject_fault (disttest): "
                              + HIDDEN, text)

    def test_whole_suite_fault_acts_where_it_can(self):
        # A rank the test's world lacks, a call it never reaches: the test runs as without it.
        for spec in ("rank=0|2,action=delay,at=any,seconds=0.01", "rank=1,action=kill,at=all_reduce,nth=5"):
            with mock.patch.dict(os.environ, {FAULT_ENV: spec}):
                for runner, result, _ in self.each("test_plain"):
                    with self.subTest(runner=runner.__name__, spec=spec):
                        self.assert_passed(result)
            cases.PoolFaults.tearDownClass()  # (its ranks read DISTTEST_FAULT as the pool starts)
        # ... and the run's end says which fired in no test (the delay fired on rank 0).
        self.assertEqual(judge.unfired_suite_faults(), [SUITE_NEVER_FIRED.format(
            fault="rank 1 kill at all_reduce #5 (from DISTTEST_FAULT)", tests=3, s="s", why=SUITE_NO_CALL)])
        self.assertEqual(judge.suite_tally(), {
            "rank 0|2 delay 0.01s at collective #1 (from DISTTEST_FAULT)": [3, 3, 3],
            "rank 1 kill at all_reduce #5 (from DISTTEST_FAULT)": [3, 3, 0]})

    def test_whole_suite_fault_from_the_environment(self):
        with mock.patch.dict(os.environ, {FAULT_ENV: "rank=1,action=raise,at=all_reduce,nth=2"}):
            for runner, result, _ in self.each("test_plain"):
                with self.subTest(runner=runner.__name__):
                    text = self.only_error(result)
                    self.assertIn("declared rank 1 raise at all_reduce #2 (from DISTTEST_FAULT)", text)
                    self.assertIn("rank 1 raised InjectedFault at all_reduce #2", text)
        for runner, result, _ in self.each("test_plain"):
            with self.subTest(runner=runner.__name__):
                self.assert_passed(result)

    def test_pool_heals_after_an_injected_kill(self):
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(cases.PoolHeals).run(result)
        self.assertEqual(result.testsRun, 2)
        self.assertEqual(result.errors + result.failures, [])

    def test_unarmed_interceptor_does_nothing(self):
        self.assertIsNone(before_collective("all_reduce", 0))
        self.assertIsNone(before_collective("barrier", 3))


class ChaosTest(unittest.TestCase):
    """Schedule fuzzing finds a read before wait() that passes without it."""

    test = "test_read_before_wait"

    def seed_where(self, send_delay, irecv_delay):
        for seed in range(1, 1000):
            d0 = chaos_delay(chaos_delays(seed, self.test, 0))
            d1 = chaos_delay(chaos_delays(seed, self.test, 1))
            if send_delay(d0) and irecv_delay(d1):
                return seed
        raise AssertionError("no such seed")

    def run_with(self, name, seed):
        env = {CHAOS_ENV: str(seed)} if seed is not None else {}
        with mock.patch.dict(os.environ, env):
            if seed is None:
                os.environ.pop(CHAOS_ENV, None)
            return run(cases.ChaosThreads, name)[0]

    def test_chaos_finds_the_read_before_wait(self):
        result = self.run_with(self.test, None)
        self.assertEqual(result.failures + result.errors, [])
        # Rank 0's send waits 40+ ms, rank 1's irecv < 2 ms after its 20 ms of work.
        bad = self.seed_where(lambda d: d > 0.04, lambda d: d < 0.002)
        result = self.run_with(self.test, bad)
        self.assertEqual(len(result.failures), 1, result.errors)
        text = result.failures[0][1]
        self.assertIn("rank 1/2 raised AssertionError", text)
        self.assertIn(f"schedule fuzzing: DISTTEST_CHAOS={bad} (the same seed gives the same delays)", text)
        # The same seed again: the same failure; the correct code passes under it.
        self.assertEqual(len(self.run_with(self.test, bad).failures), 1)
        result = self.run_with("test_read_after_wait", bad)
        self.assertEqual(result.failures + result.errors, [])

    def test_functional_collectives_are_fuzzed(self):
        result = self.run_with("test_functional_calls_are_fuzzed", 7)
        self.assertEqual(result.failures + result.errors, [])


SUITE = textwrap.dedent("""
    import time
    import torch
    import torch.distributed as dist
    import disttest

    class Threads(disttest.MultiThreadedTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_read_before_wait(self):
            if self.rank == 0:
                dist.send(torch.full((4,), 7.0), dst=1)
            else:
                time.sleep(0.005)
                t = torch.zeros(4)
                work = dist.irecv(t, src=0)
                seen = t.clone()
                work.wait()
                assert seen.tolist() == [7.0] * 4, seen

        def test_all_reduce(self):
            t = torch.ones(2)
            dist.all_reduce(t)
            dist.all_reduce(t)

        def test_slow(self):
            time.sleep(0.7)

    class Pool(disttest.MultiProcContinousTest):
        world_size = 2
        timeout = 30

        @classmethod
        def backend_str(cls):
            return "gloo"

        def test_pool_sees_each_seed(self):
            import os
            t = torch.tensor([float(os.environ["DISTTEST_CHAOS"])])
            dist.all_reduce(t)  # both ranks run with the seed
            assert t.item() != 4.0, "seed 2 fails"

    import pytest

    @pytest.mark.world_size(2)
    def test_function_threads(rank):
        t = torch.ones(2)
        dist.all_reduce(t)
        dist.all_reduce(t)

    @pytest.mark.world_size(2, mode="processes")
    def test_function_processes(rank):
        t = torch.ones(2)
        dist.all_reduce(t)
        dist.all_reduce(t)

    @pytest.mark.world_size(2)
    @disttest.inject_fault(rank=0, action="raise", at="barrier")
    def test_function_declares_a_fault(rank):
        dist.barrier()

""")


def pytest_run(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_fault_suite.py"), "w") as f:
            f.write(SUITE)
        env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
        env.update(environ or {})
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "test_fault_suite.py", *args],
                              cwd=tmp, capture_output=True, text=True, timeout=300, env=env)


def usage_error(args: tuple[str, ...], environ: dict[str, str] | None = None) -> str:
    """The message of the usage error that the plugin's option check raises
    for pytest's command-line ``args`` (``--opt value`` pairs) with
    ``environ`` set; fails if it raises none."""
    import pytest

    from disttest.faults.pytest_options import configure

    given = {args[i].removeprefix("--").replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
    config = mock.Mock(spec=["getoption"])
    config.getoption.side_effect = lambda name: given.get(name)
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
    with mock.patch.dict(os.environ, {**env, **(environ or {})}, clear=True):
        try:
            configure(config)
        except pytest.UsageError as e:
            return str(e)
    raise AssertionError(f"{args} {environ}: no usage error")


class DocsExampleTest(unittest.TestCase):
    def test_the_guides_example_runs_and_passes(self):
        guide = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "docs", "howto", "faults.rst")
        with open(guide) as f:
            text = f.read()
        block = text.split("Declare a fault on a test\n---", 1)[1]
        block = block.split(".. code-block:: python\n", 1)[1].split("``disttest.inject_fault(*", 1)[0]
        namespace: dict = {"__name__": "docs_faults"}
        exec(compile(textwrap.dedent(block), guide, "exec"), namespace)
        result, _ = run(namespace["Survivors"], "test_survivors_see_the_peer_die")
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual(result.testsRun, 1)


class PytestOptionsTest(unittest.TestCase):
    def test_repeat_reports_the_failing_seeds(self):
        # Seed 39 delays rank 0's send by 25 ms, rank 1's irecv by 0.2 ms (after 5 ms of work).
        proc = pytest_run("--disttest-repeat", "40", "-k", "read_before_wait")
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 1, out)
        self.assertRegex(out, r"failing seeds: [0-9, ]*\b39 of 1\.\.40 \(reproduce one with DISTTEST_CHAOS=")
        self.assertIn("schedule fuzzing: DISTTEST_CHAOS=", out)
        self.assertIn("1 failed", out)
        proc = pytest_run("--disttest-chaos", "39", "-k", "read_before_wait")
        self.assertIn("schedule fuzzing: DISTTEST_CHAOS=39", proc.stdout)
        self.assertEqual(proc.returncode, 1, proc.stdout)

    def test_a_pytest_timeout_over_all_repeats_blames_no_seed(self):
        # Issue 24: it reported the seed that was running (one that passes alone) as failing.
        # (each run's share of 2.5 s is 0.875 s, against a 0.7 s body: room for a busy machine)
        proc = pytest_run("--disttest-repeat", "5", "--timeout", "2.5", "-k", "test_slow")
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 1, out)
        self.assertRegex(out, "pytest-timeout's limit of 2.5s covers all 5 runs of --disttest-repeat together and "
                              "expired during seed [2-5] after ")
        self.assertNotIn("failing seeds", out)
        # Timed per run (timeout_func_only), no run reaches the limit: every seed passes.
        proc = pytest_run("--disttest-repeat", "2", "--timeout", "2.5", "-o", "timeout_func_only=true",
                          "-k", "test_slow")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_repeat_sets_the_seed_up_again_in_a_pool(self):
        proc = pytest_run("--disttest-repeat", "3", "-k", "pool_sees_each_seed")
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("failing seeds: 2 of 1..3 (reproduce one with DISTTEST_CHAOS=2)", out)
        self.assertIn("schedule fuzzing: DISTTEST_CHAOS=2", out)

    def test_a_skip_on_some_seeds_is_no_pass(self):
        # (every seed's skip was dropped: "all 3 seeds passed", and no <skipped> in the XML)
        source = textwrap.dedent("""
            import os
            import pytest

            def test_skips_on_seed_1():
                if os.environ["DISTTEST_CHAOS"] == "1":
                    pytest.skip("resource gone on seed 1")

            def test_skips_on_every_seed():
                pytest.skip("never here")
        """)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_skipping.py"), "w") as f:
                f.write(source)
            env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                   "--disttest-repeat", "3", "--junitxml", "out.xml", "test_skipping.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300, env=env)
            out = proc.stdout + proc.stderr
            with open(os.path.join(tmp, "out.xml")) as f:
                xml = f.read()
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("2 skipped", out)
        self.assertIn("resource gone on seed 1", out)
        self.assertEqual(xml.count("<skipped"), 2, xml)
        from disttest.faults.pytest_options import SKIPPED_SEEDS

        self.assertIn(SKIPPED_SEEDS.format(seeds="1", n=3, env=CHAOS_ENV, first=1, others="passed on 2, 3"), xml)
        self.assertIn(SKIPPED_SEEDS.format(seeds="1, 2, 3", n=3, env=CHAOS_ENV, first=1, others="no seed passed"),
                      xml)

    def test_repeat_makes_session_and_module_fixtures_once(self):
        source = textwrap.dedent("""
            import os
            import pytest

            def made(what):
                with open(os.environ["MADE_FILE"], "a") as f:
                    f.write(what + "\\n")

            @pytest.fixture(scope="session")
            def session_thing():
                made("session")

            @pytest.fixture(scope="module")
            def module_thing():
                made("module")

            @pytest.fixture(scope="class")
            def class_thing():
                made("class")

            def test_a(session_thing, module_thing):
                pass

            def test_b(session_thing, module_thing):
                pass

            class TestC:
                def test_c(self, session_thing, module_thing, class_thing):
                    pass
        """)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_fixtures.py"), "w") as f:
                f.write(source)
            made = os.path.join(tmp, "made.txt")
            env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "--disttest-repeat", "3", "test_fixtures.py"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300,
                                  env=dict(env, MADE_FILE=made))
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            with open(made) as f:
                lines = f.read().split()
        # The class is set up again for each seed (a pool takes its seed at start).
        self.assertEqual(sorted(lines), ["class"] * 3 + ["module", "session"])

    def test_fault_option_applies_to_every_test(self):
        proc = pytest_run("--disttest-fault", "rank=1,action=raise,at=all_reduce,nth=2", "-k", "all_reduce")
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("rank 1 raised InjectedFault at all_reduce #2", out)
        # (it said "from DISTTEST_FAULT", the variable the option sets for the ranks)
        self.assertIn("declared rank 1 raise at all_reduce #2 (from --disttest-fault)", out)
        self.assertNotIn("from DISTTEST_FAULT", out)

    def test_faults_the_option_set_are_said_to_come_from_it(self):
        from disttest.faults import FAULT_OPTION, FAULT_OPTION_ENV

        spec = "rank=1,action=kill"
        (fault,) = env_faults({FAULT_ENV: spec, FAULT_OPTION_ENV: spec})
        self.assertEqual((fault.where, fault.suite_wide), (FAULT_OPTION, True))
        # the variable changed since the option set it: its own
        (fault,) = env_faults({FAULT_ENV: spec, FAULT_OPTION_ENV: "rank=0,action=kill"})
        self.assertEqual((fault.where, fault.suite_wide), (FAULT_ENV, True))

    def test_fault_option_and_decorator_act_on_plain_functions_in_either_mode(self):
        # Issue 24: a threads-mode function passed with the fault dropped, and a
        # processes-mode one was reported as 'test_function'.
        proc = pytest_run("--disttest-fault", "rank=1,action=raise,at=all_reduce,nth=2", "-k", "function_",
                          "-rf")
        out = proc.stdout + proc.stderr
        self.assertIn("3 failed", out)
        for name in ("test_function_threads", "test_function_processes"):
            self.assertRegex(out, f"'{name}' (failed|errored) \\(disttest\\): rank 1/2 raised InjectedFault")
        # Count in the failure sections only: how much of each message the
        # short summary repeats depends on the terminal's width.
        sections = out.split("short test summary info")[0]
        self.assertEqual(
            sections.count("injected by disttest (not causes): rank 1 raised InjectedFault at all_reduce #2"), 2, out)
        self.assertNotIn("test_function'", out)
        # (an error, as in processes: InjectedFault is not an assertion)
        self.assertIn("'test_function_declares_a_fault' errored (disttest): rank 0/2 raised InjectedFault", out)
        self.assertIn("rank 0 raised InjectedFault at barrier #1", out)

    def test_a_suite_wide_fault_that_fires_in_no_test_fails_the_run(self):
        # It passed, and the run said nothing of the fault (also under pytest-xdist).
        for extra in ((), ("-n", "2")):
            with self.subTest(extra=extra):
                proc = pytest_run("--disttest-fault", "rank=7,action=raise", "-k", "test_all_reduce", *extra)
                out = proc.stdout + proc.stderr
                self.assertEqual(proc.returncode, 1, out)
                self.assertIn("1 passed", out)
                self.assertIn("disttest: suite-wide faults", out)
                self.assertIn(SUITE_NEVER_FIRED.format(fault="rank 7 raise at collective #1 (from --disttest-fault)",
                                                       tests=1, s="", why=SUITE_NO_RANK), out)
        # One that fired somewhere is not named.
        proc = pytest_run("--disttest-fault", "rank=1,action=delay,seconds=0.01", "-k", "test_all_reduce")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("suite-wide", proc.stdout + proc.stderr)

    def test_a_suite_wide_fault_that_fires_in_no_test_under_unittest(self):
        source = textwrap.dedent("""
            import torch, torch.distributed as dist
            import disttest

            class T(disttest.MultiThreadedTestCase):
                world_size = 2

                def setUp(self):
                    super().setUp()
                    self._spawn_threads()

                def test_a(self):
                    dist.all_reduce(torch.ones(2))

            if __name__ == "__main__":
                disttest.run_tests()
        """)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "test_t.py"), "w") as f:
                f.write(source)
            env = dict(os.environ, **{FAULT_ENV: "rank=0,action=raise,at=broadcast"})
            expected = "disttest: " + SUITE_NEVER_FIRED.format(
                fault="rank 0 raise at broadcast #1 (from DISTTEST_FAULT)", tests=1, s="", why=SUITE_NO_CALL)
            for command, status in (([sys.executable, "-m", "unittest", "test_t"], 0),  # said as it exits
                                    ([sys.executable, "test_t.py"], 1)):  # run_tests: the run fails
                with self.subTest(command=command[1:]):
                    proc = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
                    self.assertEqual(proc.returncode, status, proc.stdout + proc.stderr)
                    self.assertEqual(proc.stderr.count(expected), 1, proc.stderr)

    def test_the_fault_option_given_twice_declares_both(self):
        # The second replaced the first without a word.
        from disttest.faults.pytest_options import configure

        config = mock.Mock(spec=["getoption"])
        given = {"disttest_fault": ["rank=1,action=raise", "rank=0,action=kill,at=barrier"]}
        config.getoption.side_effect = given.get
        env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
        with mock.patch.dict(os.environ, env, clear=True):
            configure(config)
            self.addCleanup(config._disttest_suite_undo)
            self.assertEqual([f.what() for f in env_faults()],
                             ["rank 1 raise at collective #1", "rank 0 kill at barrier #1"])

    def test_an_option_agrees_with_its_variable_as_read_not_as_written(self):
        from disttest.faults.pytest_options import configure

        for name, value, environ in (("disttest_chaos", "7", {CHAOS_ENV: "07"}),
                                     ("disttest_fault", ["rank=1, action=raise"], {FAULT_ENV: "rank=1,action=raise "})):
            with self.subTest(name=name):
                config = mock.Mock(spec=["getoption"])
                config.getoption.side_effect = {name: value}.get
                env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, CHAOS_ENV)}
                with mock.patch.dict(os.environ, {**env, **environ}, clear=True):
                    configure(config)  # (was a usage error: "also set, to '07'")
                    config._disttest_suite_undo()

    def test_bad_values_are_usage_errors(self):
        for args, message in [
            (("--disttest-fault", "rank=1,action=explode"), "Invalid fault action 'explode' from --disttest-fault"),
            (("--disttest-chaos", "x"), "Invalid chaos seed 'x' from --disttest-chaos"),
            # An empty spec (a shell variable that was empty) ran the suite
            # without the fault, as the empty seed is refused.
            (("--disttest-fault", ""), "Invalid fault '' from --disttest-fault (disttest): declares no fault"),
            (("--disttest-fault", " ; "), "Invalid fault ' ; ' from --disttest-fault (disttest): declares no fault"),
            (("--disttest-chaos", ""), "Invalid chaos seed '' from --disttest-chaos"),
            (("--disttest-repeat", "0"), "Invalid repeat count '0' from --disttest-repeat"),
            (("--disttest-repeat", "x"), "Invalid repeat count 'x' from --disttest-repeat"),
            (("--disttest-repeat", "2.5"), "Invalid repeat count '2.5' from --disttest-repeat"),
        ]:
            with self.subTest(args=args):
                self.assertIn(message, usage_error(args))
        # pytest itself ends in a usage error, exit status 4, for the error
        # the option check raises (the cases above call it here: a pytest
        # with torch per case cost 5 s each)
        proc = pytest_run("--disttest-repeat", "x")
        self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)
        self.assertIn("Invalid repeat count 'x' from --disttest-repeat", proc.stderr)

    def test_conflicting_declarations_are_usage_errors_not_last_wins(self):
        for args, environ, message in [
            (("--disttest-repeat", "5", "--disttest-chaos", "7"), {},
             "Invalid repeat count '5' from --disttest-repeat (disttest): it runs seeds 1..N itself, so the "
             "seed of --disttest-chaos would be dropped"),
            (("--disttest-repeat", "5"), {CHAOS_ENV: "7"},
             "so the seed of DISTTEST_CHAOS would be dropped"),
            (("--disttest-chaos", "3"), {CHAOS_ENV: "7"},
             "Invalid chaos seed '3' from --disttest-chaos (disttest): DISTTEST_CHAOS is also set, to '7'"),
            (("--disttest-fault", "rank=1,action=raise"), {FAULT_ENV: "rank=0,action=raise"},
             "Invalid fault 'rank=1,action=raise' from --disttest-fault (disttest): DISTTEST_FAULT is also set, to 'rank=0,action=raise'"),
        ]:
            with self.subTest(args=args, environ=environ):
                self.assertIn(message, usage_error(args, environ))
        proc = pytest_run("--disttest-chaos", "3", "-k", "nothing_matches_this", environ={CHAOS_ENV: "7"})
        self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)
        self.assertIn("Invalid chaos seed '3' from --disttest-chaos (disttest): DISTTEST_CHAOS is also set",
                      proc.stderr)


if __name__ == "__main__":
    unittest.main()
