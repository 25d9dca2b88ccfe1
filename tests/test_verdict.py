"""The classifier, on hand-made facts: no rank, process or thread involved."""

from __future__ import annotations

import unittest

from disttest._runner.outcome import ExitStatus, Kind, Outcome
from disttest._runner.verdict import Status, ended, judge, reclassified


def o(rank: int, kind: Kind, message: str = "", **fields) -> Outcome:
    return Outcome(rank, kind, "X" if kind in (Kind.FAILED, Kind.ERRORED) else "", message, **fields)


class EndedTest(unittest.TestCase):
    def test_a_rank_that_reported_nothing_crashed(self):
        out = ended(1, None, ExitStatus(code=3), "last words")
        self.assertEqual((out.kind, out.exit.code, out.output_tail), (Kind.CRASHED, 3, "last words"))

    def test_a_signal_after_a_report_is_a_crash_that_says_so(self):
        reported = o(0, Kind.PASSED)
        out = ended(0, reported, ExitStatus(signal=9))
        self.assertEqual((out.kind, out.detail), (Kind.CRASHED, "after reporting passed"))
        self.assertIs(reported.kind, Kind.PASSED)  # the fact is not changed

    def test_a_clean_exit_keeps_the_report(self):
        out = ended(0, o(0, Kind.FAILED, "boom"), ExitStatus(code=10))
        self.assertEqual((out.kind, out.message, out.exit.code), (Kind.FAILED, "boom", 10))

    def test_reclassified_is_a_new_outcome(self):
        first = o(2, Kind.ERRORED, "connection closed")
        second = reclassified(first, Kind.DESYNC, "rank 1/4 finished")
        self.assertEqual((first.kind, second.kind, second.detail), (Kind.ERRORED, Kind.DESYNC, "rank 1/4 finished"))


class JudgeTest(unittest.TestCase):
    def test_all_passed(self):
        verdict = judge([o(0, Kind.PASSED), o(1, Kind.PASSED)])
        self.assertEqual((verdict.status, verdict.causes), (Status.PASSED, []))

    def test_assertions_only_fail(self):
        verdict = judge([o(0, Kind.PASSED), o(1, Kind.FAILED)])
        self.assertEqual((verdict.status, verdict.causes), (Status.FAILED, [1]))

    def test_any_other_cause_errors(self):
        for kind in (Kind.ERRORED, Kind.CRASHED, Kind.TIMED_OUT, Kind.DESYNC):
            with self.subTest(kind=kind):
                self.assertEqual(judge([o(0, Kind.FAILED), o(1, kind)]).status, Status.ERRORED)

    def test_always_failure_makes_every_cause_a_failure(self):
        self.assertEqual(judge([o(0, Kind.ERRORED)], always_failure=True).status, Status.FAILED)

    def test_a_skip_wins_over_the_desync_and_stops_it_caused(self):
        verdict = judge([o(0, Kind.SKIPPED, "no GPU"), o(1, Kind.DESYNC), o(2, Kind.STOPPED)])
        self.assertEqual((verdict.status, verdict.reason), (Status.SKIPPED, "no GPU"))

    def test_a_hard_failure_wins_over_a_skip(self):
        self.assertEqual(judge([o(0, Kind.SKIPPED, "no"), o(1, Kind.FAILED)]).status, Status.FAILED)

    def test_skip_reasons_are_merged(self):
        verdict = judge([o(0, Kind.SKIPPED, "b"), o(1, Kind.SKIPPED, "a"), o(2, Kind.SKIPPED, "a")])
        self.assertEqual(verdict.reason, "a; b")

    def test_upstream_exit_code_maps(self):
        crashed = Outcome(1, Kind.CRASHED, exit=ExitStatus(code=7))
        self.assertEqual(judge([crashed]).status, Status.ERRORED)
        self.assertEqual(judge([crashed], expected_exit_codes=(7,)).status, Status.PASSED)
        self.assertEqual(judge([crashed], expected_exit_codes=(8,)).status, Status.ERRORED)
        self.assertEqual(judge([crashed], lenient_exits=True).status, Status.PASSED)
        self.assertIs(crashed.kind, Kind.CRASHED)  # facts stay as they were

    def test_the_verdict_is_immutable(self):
        verdict = judge([o(0, Kind.PASSED)])
        with self.assertRaises(AttributeError):
            verdict.status = Status.FAILED  # type: ignore[misc]
        self.assertIsInstance(verdict.outcomes, tuple)


if __name__ == "__main__":
    unittest.main()
