"""The report: classification and message, from synthetic outcomes."""

from __future__ import annotations

import os
import sys
import unittest

from disttest import RankError, RankFailure
from disttest._runner.outcome import ExitStatus, Kind, Outcome, outcome_from_exception
from disttest._runner.report import raise_for_outcomes, user_traceback


def raised(outcomes, timeout=30):
    try:
        raise_for_outcomes("test_x", len(outcomes), timeout, outcomes)
    except BaseException as e:  # noqa: BLE001
        return e
    return None


class ClassifyTest(unittest.TestCase):
    def test_all_passed_returns(self):
        self.assertIsNone(raised([Outcome(0, Kind.PASSED), Outcome(1, Kind.PASSED)]))

    def test_assertions_only_is_a_failure(self):
        e = raised([Outcome(0, Kind.PASSED), Outcome(1, Kind.FAILED, "AssertionError", "no")])
        self.assertIsInstance(e, RankFailure)
        self.assertEqual(e.ranks, [1])
        self.assertIn("'test_x' failed (disttest): rank 1/2 raised AssertionError", str(e))

    def test_any_error_makes_it_an_error(self):
        e = raised([Outcome(0, Kind.FAILED, "AssertionError", "a"),
                    Outcome(1, Kind.CRASHED, exit=ExitStatus(signal=9))])
        self.assertIsInstance(e, RankError)
        self.assertIn("rank 1/2 was killed by SIGKILL", str(e))
        self.assertIn("rank 0/2 raised AssertionError", str(e))

    def test_ranks_that_ended_differently_are_not_one_group(self):
        # Both read "was killed by SIGKILL" when the exit was not in the key.
        e = raised([Outcome(0, Kind.CRASHED, exit=ExitStatus(signal=9)),
                    Outcome(1, Kind.CRASHED, exit=ExitStatus(code=7)),
                    Outcome(2, Kind.CRASHED, exit=ExitStatus(signal=9))])
        self.assertIn("errored (disttest): ranks 0, 2/3 was killed by SIGKILL; rank 1/3 exited with code 7\n",
                      str(e))
        self.assertIn("\nrank 1/3 exited with code 7 before finishing 'test_x'", str(e))

    def test_skip_wins_over_desync_it_caused(self):
        e = raised([Outcome(0, Kind.SKIPPED, message="no gpu"),
                    Outcome(1, Kind.DESYNC, detail="rank 0/2 finished; {who} {waits} in x")])
        self.assertIsInstance(e, unittest.SkipTest)
        self.assertEqual(str(e), "no gpu")

    def test_a_deadlock_is_not_hidden_by_a_skip(self):
        # Two live ranks that wait for each other are no consequence of a third's skip.
        d = "ranks 1, 2/3 wait for each other in calls that cannot match: rank 1/3 in recv #1 from rank 2, ..."
        e = raised([Outcome(0, Kind.SKIPPED, message="no gpu"), Outcome(1, Kind.DEADLOCK, detail=d),
                    Outcome(2, Kind.DEADLOCK, detail=d)])
        self.assertIsInstance(e, RankError)
        self.assertIn("deadlock: " + d, str(e))
        self.assertEqual(str(e).count("deadlock: "), 2)  # the header and one section for the pair

    def test_a_deadlock_shows_each_call_s_stack_once(self):
        d = "ranks 0, 1, 2/3 wait for each other in calls that cannot match: ..."

        def stack(line, watcher=""):
            other = f'Thread 0x2 (most recent call first):\n  File "json.py", line {watcher} in loads\n\n' if watcher else ""
            return f'{other}Current thread 0x1 (most recent call first):\n  File "t.py", line {line} in test_x\n'

        # Ranks 0 and 1 wait in one call (rank 0's watcher thread was caught
        # mid-step: no difference), rank 2 in another.
        e = raised([Outcome(0, Kind.DEADLOCK, detail=d, stacks=stack(5, watcher="346")),
                    Outcome(1, Kind.DEADLOCK, detail=d, stacks=stack(5)),
                    Outcome(2, Kind.DEADLOCK, detail=d, stacks=stack(7))])
        self.assertIn("the stack of ranks 0, 1/3:", str(e))
        self.assertIn("the stack of rank 2/3:", str(e))
        self.assertEqual(str(e).count('"t.py", line 5'), 1)

    def test_failure_wins_over_skip(self):
        e = raised([Outcome(0, Kind.SKIPPED, message="s"), Outcome(1, Kind.ERRORED, "ValueError", "v")])
        self.assertIsInstance(e, RankError)

    def test_a_long_message_is_shown_whole_once(self):
        # (the section's line and its traceback each held the whole message)
        message = "Tensor-likes are not close!\n\nMismatched elements: 2 / 2 (100.0%)"
        tb = f"Traceback (most recent call last):\n  File \"t.py\", line 3, in test_x\nAssertionError: {message}\n"
        text = str(raised([Outcome(0, Kind.PASSED), Outcome(1, Kind.FAILED, "AssertionError", message, tb)]))
        self.assertEqual(text.count("Mismatched elements"), 1, text)
        self.assertIn("rank 1/2: AssertionError: Tensor-likes are not close!\nTraceback", text)
        # A message the traceback does not end with is shown whole on its line.
        text = str(raised([Outcome(0, Kind.PASSED), Outcome(1, Kind.FAILED, "AssertionError", message, "")]))
        self.assertIn(f"rank 1/2: AssertionError: {message}", text)

    def test_header_merges_ranks_and_body_groups_identical(self):
        tb = "Traceback...\nKeyError: 'k'\n"
        e = raised([Outcome(r, Kind.ERRORED, "KeyError", "'k'", tb) for r in (0, 1, 2)]
                   + [Outcome(3, Kind.TIMED_OUT, stacks="Thread 1\n  File \"a.py\", line 3 in f\n")])
        text = str(e)
        self.assertIn("ranks 0, 1, 2/4 raised KeyError; rank 3/4 timed out after 30s", text)
        self.assertEqual(text.count("Traceback..."), 1)  # grouped: shown once
        self.assertIn("rank 3/4 did not finish 'test_x' within 30s", text)
        self.assertIn('line 3 in f', text)

    def test_ranks_that_differ_only_in_their_messages_are_one_section_past_a_few(self):
        # A thousand ranks, each naming its own value, made a 100 KB report.
        def ranks(n):
            return [Outcome(r, Kind.FAILED, "AssertionError", f"got {r * 3}\nmore of it",
                            f"Traceback...\n  File \"t.py\", line 9\nAssertionError: got {r * 3}\nmore of it\n")
                    for r in range(n)] + [Outcome(n, Kind.ERRORED, "KeyError", "'k'", "Traceback...\nKeyError: 'k'\n")]

        e = raised(ranks(20))
        text = str(e)
        self.assertIn("'test_x' errored (disttest): ranks 0-19/21 raised AssertionError; rank 20/21 raised KeyError\n",
                      text)
        self.assertIn("\n\nranks 0-19/21: AssertionError, 20 different messages (the first 8):\n"
                      "  rank 0/21: got 0\n  rank 1/21: got 3\n", text)
        self.assertIn("  rank 7/21: got 21\n  ... and 12 more\nthe traceback of rank 0/21:\nTraceback...\n", text)
        self.assertEqual(text.count("Traceback..."), 2)  # the merged ranks' first, and the KeyError's
        self.assertEqual([title for title, _ in e.sections],
                         ["disttest ranks 0-19/21 (failed)", "disttest rank 20/21 (errored)"])
        # A few are each shown whole.
        e = raised(ranks(8))
        self.assertEqual(str(e).count("Traceback..."), 9)
        self.assertNotIn("different messages", str(e))

    def test_desync_groups_waiting_ranks(self):
        d = "rank 1/3 finished; {who} {waits} in all_reduce #2 of the default group"
        e = raised([Outcome(0, Kind.DESYNC, "RuntimeError", "port 1", detail=d),
                    Outcome(1, Kind.PASSED),
                    Outcome(2, Kind.DESYNC, "RuntimeError", "port 2", detail=d)])
        self.assertIn("rank 1/3 finished; ranks 0, 2/3 wait in all_reduce #2", str(e))

    def test_consequences_are_not_causes(self):
        e = raised([Outcome(0, Kind.FAILED, "AssertionError", "x"),
                    Outcome(1, Kind.STOPPED, detail="rank 1/2 failed in barrier #1 of the default group, which rank 0/2 never entered")])
        self.assertIsInstance(e, RankFailure)
        self.assertEqual(e.ranks, [0])
        self.assertIn("(a consequence)", str(e))


class OutcomeTest(unittest.TestCase):
    def test_classification(self):
        self.assertIs(outcome_from_exception(0, None).kind, Kind.PASSED)
        self.assertIs(outcome_from_exception(0, AssertionError("a")).kind, Kind.FAILED)
        self.assertIs(outcome_from_exception(0, ValueError("v")).kind, Kind.ERRORED)
        self.assertIs(outcome_from_exception(0, unittest.SkipTest("s")).kind, Kind.SKIPPED)
        self.assertIs(outcome_from_exception(0, SystemExit(0)).kind, Kind.PASSED)
        skip = outcome_from_exception(0, SystemExit(75))
        self.assertEqual((skip.kind, skip.message), (Kind.SKIPPED, "Need at least 1 CUDA device"))
        self.assertIs(outcome_from_exception(0, SystemExit(3)).kind, Kind.ERRORED)

    def test_traceback_keeps_user_frames_only(self):
        def user_code():
            raise ValueError("from user code")

        try:
            user_code()
        except ValueError as e:
            o = outcome_from_exception(1, e)
        self.assertIn("in user_code", o.traceback)
        self.assertIsNotNone(o.tb_data)


    @unittest.skipIf(sys.version_info < (3, 11), "exception groups: Python 3.11 on")
    def test_a_group_s_members_are_shown(self):
        # (they were dropped: "several (2 sub-exceptions)" and nothing of them)
        def raises_group():
            try:
                raise KeyError("k2")
            except KeyError as e:
                inner = e
            raise ExceptionGroup("several", [ValueError("v1"), inner])  # noqa: F821 (3.11 on)

        try:
            raises_group()
        except BaseException as e:  # noqa: BLE001
            text = outcome_from_exception(0, e).traceback
        self.assertIn("ExceptionGroup: several (2 sub-exceptions)", text)
        self.assertIn("+---------------- 1 of 2 ----------------\n| ValueError: v1\n", text)
        self.assertIn("+---------------- 2 of 2 ----------------\n| Traceback (most recent call last):\n", text)
        self.assertIn("| KeyError: 'k2'", text)

    def test_a_cycle_of_causes_is_shown_once(self):
        # (the text was lost to a RecursionError: the rank's section held the message alone)
        a, b = KeyError("a"), KeyError("b")
        a.__cause__, b.__cause__ = b, a
        try:
            raise b
        except KeyError as e:
            text = outcome_from_exception(0, e).traceback
        self.assertEqual(text.count("KeyError: 'a'"), 1, text)
        self.assertEqual(text.count("KeyError: 'b'"), 1, text)
        self.assertIn("direct cause", text)


    def test_an_over_long_traceback_is_written_whole_only_for_kept_logs(self):
        # (a megabyte a rank reached pytest's captured output, whatever the setting)
        import io
        from unittest import mock

        huge = ValueError("x" * 100_000)
        for keep, written in (("", False), ("0", False), ("1", True)):
            with self.subTest(keep=keep), mock.patch.dict(os.environ, {"DISTTEST_KEEP_LOGS": keep}), \
                    mock.patch.object(sys, "__stderr__", io.StringIO()) as err:
                o = outcome_from_exception(0, huge)
                self.assertEqual("x" * 100_000 in err.getvalue(), written)
                self.assertIn("characters cut by disttest", o.message)


class OutputTailTest(unittest.TestCase):
    def test_a_cut_tail_starts_at_a_line(self):
        from disttest._runner.report import TAIL_CHARS, _tail

        lines = "".join(f"noisy output {i}\n" for i in range(10_000))
        tail = _tail(lines)
        self.assertTrue(tail.startswith("noisy output "), tail[:40])
        self.assertTrue(tail.endswith("noisy output 9999"))
        self.assertLessEqual(len(tail), TAIL_CHARS)
        # One long line is cut where it must be; a short output is whole.
        self.assertEqual(_tail("x" * (TAIL_CHARS + 10)), "x" * TAIL_CHARS)
        self.assertEqual(_tail("a\nb\n"), "a\nb")


class UserTracebackTest(unittest.TestCase):
    """The traceback a report is raised with: the user's frames, from the
    rank's traceback, else its stack, else the test method."""

    STACKS = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        '  File "/work/helper.py", line 7 in watcher\n'
        "\n"
        "Current thread 0x00007f02 (most recent call first):\n"
        '  File "/site/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'
        '  File "/work/test_a.py", line 12 in helper\n'
        '  File "/work/test_a.py", line 30 in test_hang\n'
    )

    @staticmethod
    def frames(tb):
        out = []
        while tb is not None:
            out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
            tb = tb.tb_next
        return out

    def test_a_hung_rank_s_stack_outermost_first_current_thread(self):
        tb = user_traceback([Outcome(0, Kind.PASSED), Outcome(1, Kind.TIMED_OUT, stacks=self.STACKS)])
        self.assertEqual(self.frames(tb), [
            ("/work/test_a.py", 30, "test_hang"),
            ("/work/test_a.py", 12, "helper"),
            ("/site/torch/distributed/distributed_c10d.py", 5356, "barrier"),
        ])

    def test_the_rank_s_own_traceback_comes_first(self):
        def body():
            raise ValueError("boom")

        try:
            body()
        except ValueError as e:
            failed = outcome_from_exception(0, e)
        hung = Outcome(1, Kind.TIMED_OUT, stacks=self.STACKS)
        names = [name for _, _, name in self.frames(user_traceback([failed, hung]))]
        self.assertEqual(names[-1], "body")

    def test_no_frame_of_a_rank_gives_the_test_method_or_nothing(self):
        def test_crash():
            pass

        crashed = [Outcome(0, Kind.CRASHED, exit=ExitStatus(code=3))]
        self.assertEqual(self.frames(user_traceback(crashed, test_crash)),
                         [(__file__, test_crash.__code__.co_firstlineno, "test_crash")])
        self.assertIsNone(user_traceback(crashed))
        # disttest's own code is never the test's frame.
        self.assertIsNone(user_traceback(crashed, raise_for_outcomes))


class PickleTest(unittest.TestCase):
    def test_a_report_pickles_whole(self):
        import pickle

        e = raised([Outcome(0, Kind.PASSED), Outcome(1, Kind.FAILED, "AssertionError", "no")])
        back = pickle.loads(pickle.dumps(e))
        self.assertIs(type(back), RankFailure)
        self.assertEqual(str(back), str(e))
        self.assertEqual((back.test, back.world_size, back.timeout, back.ranks), ("test_x", 2, 30, [1]))
        self.assertEqual(back.sections, e.sections)
        self.assertEqual([o.kind for o in back.outcomes], [Kind.PASSED, Kind.FAILED])

