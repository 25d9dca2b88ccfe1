"""The classifier, on hand-made facts: no rank, process or thread involved."""

from __future__ import annotations

import itertools
import traceback
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist

import disttest
from disttest._runner.board import InFlight
from disttest._runner.outcome import ExitStatus, Kind, Outcome, comm_site, outcome_from_exception
from disttest._runner.report import RankError, raise_for_outcomes
from disttest._runner.verdict import Status, ended, explain, judge, reclassified


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


LOST = "[pair.cc:553] Connection closed by peer [127.0.0.1]:4481"


def comm(rank: int, message: str = LOST, at: float = 0.0) -> Outcome:
    return Outcome(rank, Kind.ERRORED, "RuntimeError", message, comm="DTensor.full_tensor", at=at)


def kinds(outcomes: dict) -> dict:
    return {r: x.kind for r, x in sorted(outcomes.items())}


class ExplainTest(unittest.TestCase):
    """Cause and consequence from facts (issue 24): never from timing."""

    def test_communication_errors_are_consequences_of_an_assertion_whatever_the_order(self):
        failed = o(2, Kind.FAILED, "rank 2 disagrees")
        # Every order of the ranks' report times, the failing rank first or last.
        for times in itertools.permutations([1.0, 2.0, 3.0, 4.0]):
            with self.subTest(times=times):
                facts = {0: comm(0, at=times[0]), 1: comm(1, at=times[1]), 3: comm(3, at=times[3]),
                         2: Outcome(2, Kind.FAILED, "AssertionError", "no", at=times[2])}
                out = explain(facts, 4, {}, {})
                self.assertEqual(kinds(out), {0: Kind.STOPPED, 1: Kind.STOPPED, 2: Kind.FAILED, 3: Kind.STOPPED})
                self.assertEqual(out[3].detail,
                                 "rank 3/4 failed in DTensor.full_tensor after rank 2/4 had failed")
                self.assertEqual(judge(list(out.values())).status, Status.FAILED)
        self.assertIs(failed.kind, Kind.FAILED)

    def test_the_facts_are_not_changed(self):
        facts = {0: comm(0), 1: o(1, Kind.FAILED)}
        explain(facts, 2, {}, {})
        self.assertIs(facts[0].kind, Kind.ERRORED)

    def test_any_own_end_explains_them(self):
        for own in (o(1, Kind.ERRORED, "boom"), Outcome(1, Kind.CRASHED, exit=ExitStatus(signal=9)),
                    o(1, Kind.TIMED_OUT), o(1, Kind.DESYNC, "rank 3/4 finished; {who} {waits} in x")):
            with self.subTest(own=own.kind):
                out = explain({0: comm(0), 1: own}, 2, {}, {})
                self.assertEqual(kinds(out), {0: Kind.STOPPED, 1: own.kind})
                self.assertIn("after rank 1/2 had failed", out[0].detail)

    def test_a_skip_explains_them_and_the_test_skips(self):
        out = explain({0: comm(0), 1: o(1, Kind.SKIPPED, "no GPU")}, 2, {}, {})
        self.assertEqual(out[0].detail, "rank 0/2 failed in DTensor.full_tensor after rank 1/2 had skipped")
        self.assertEqual(judge(list(out.values())).status, Status.SKIPPED)

    def test_a_failure_that_wrapped_a_lost_peer_stays_a_cause(self):
        # Its check may be the test's real one (a survivor's of an injected
        # fault, a rank's while its peer's exit is expected): never judged a
        # consequence, so never hidden by a peer's skip or a forgiven exit.
        wrapped = Outcome(0, Kind.FAILED, "AssertionError", "all_reduce failed: peer went away", wrapped="all_reduce")
        out = explain({0: wrapped, 1: o(1, Kind.ERRORED, "REAL CAUSE")}, 2, {}, {})
        self.assertEqual(kinds(out), {0: Kind.FAILED, 1: Kind.ERRORED})
        out = explain({0: wrapped, 1: o(1, Kind.SKIPPED, "no GPU")}, 2, {}, {})
        self.assertEqual(judge(list(out.values())).status, Status.FAILED)
        crashed = Outcome(1, Kind.CRASHED, exit=ExitStatus(code=7))
        out = explain({0: wrapped, 1: crashed}, 2, {}, {})
        self.assertEqual(judge(list(out.values()), expected_exit_codes=[7]).status, Status.FAILED)

    def test_a_failure_that_wrapped_a_lost_peer_is_listed_after_the_ranks_own_causes(self):
        # (rank 0's wrapped consequence was listed first, and its traceback raised)
        wrapped = Outcome(0, Kind.FAILED, "AssertionError", "all_reduce failed: peer went away",
                          "Traceback...\nAssertionError: all_reduce failed\n", wrapped="all_reduce")
        own = Outcome(1, Kind.ERRORED, "ValueError", "REAL CAUSE", "Traceback...\nValueError: REAL CAUSE\n")
        with self.assertRaises(RankError) as caught:
            raise_for_outcomes("test_x", 2, 30, [wrapped, own])
        text = str(caught.exception)
        self.assertIn("rank 1/2 raised ValueError; rank 0/2 raised AssertionError", text)
        self.assertLess(text.index("REAL CAUSE"), text.index("all_reduce failed"))

    def test_a_peer_lost_error_is_a_consequence_of_another_communication_error(self):
        own = comm(1, "Tensors must be contiguous")
        out = explain({0: comm(0), 1: own, 2: comm(2, "Connection reset by peer")}, 3, {}, {})
        self.assertEqual(kinds(out), {0: Kind.STOPPED, 1: Kind.ERRORED, 2: Kind.STOPPED})
        self.assertIn("after rank 1/3 had failed", out[2].detail)

    def test_peer_lost_errors_alone_after_a_peer_finished_are_a_desync(self):
        # Not "a collective its peer never entered": the board did not say so
        # (gloo completes an all_reduce on the rank whose tensor is smaller).
        out = explain({0: o(0, Kind.PASSED), 1: comm(1)}, 2, {}, {})
        self.assertEqual(out[1].kind, Kind.DESYNC)
        self.assertEqual(out[1].detail, "rank 0/2 finished; {who} {waits} in DTensor.full_tensor, which lost its "
                                        "peer: the peer never entered it, or their calls differ (a size, a dtype, "
                                        "the operation)")
        try:
            raise_for_outcomes("test_x", 2, 30, list(out.values()))
        except RankError as e:
            self.assertIn("\ndesync: rank 0/2 finished; rank 1/2 waits in DTensor.full_tensor, which lost its peer: "
                          "the peer never entered it, or their calls differ (a size, a dtype, the operation)", str(e))
            self.assertNotIn("a collective its peer never entered", str(e))
        else:
            self.fail("no report")

    def test_communication_errors_alone_stay_causes(self):
        out = explain({0: comm(0), 1: comm(1)}, 2, {}, {})
        self.assertEqual(kinds(out), {0: Kind.ERRORED, 1: Kind.ERRORED})

    def test_an_error_the_board_saw_in_a_collective_counts_as_communication(self):
        flight = InFlight(0, "all_reduce", 2, "default", (0, 1))
        plain = Outcome(0, Kind.ERRORED, "RuntimeError", LOST)  # no torch.distributed frame known
        out = explain({0: plain, 1: o(1, Kind.FAILED)}, 2, {}, {0: flight})
        self.assertEqual(out[0].detail, "rank 0/2 failed in all_reduce #2 of the default group "
                                        "after rank 1/2 had failed")
        self.assertEqual(explain({0: plain, 1: o(1, Kind.FAILED)}, 2, {}, {})[0].kind, Kind.ERRORED)

    def test_a_finished_peer_that_never_entered_the_collective_makes_a_desync(self):
        flight = InFlight(1, "all_reduce", 2, "default", (0, 1))
        out = explain({0: o(0, Kind.PASSED), 1: comm(1)}, 2, {1: (0, flight)}, {1: flight})
        self.assertEqual(out[1].detail, "rank 0/2 finished; {who} {waits} in all_reduce #2 of the default group")


class RefusedTest(unittest.TestCase):
    """Which errors of a call of torch.distributed are torch refusing the
    call before it communicated (the rank's own error, uncounted)."""

    @staticmethod
    def raised_in_torch(exc: BaseException) -> BaseException:
        import os

        from disttest._runner import refusals

        # (a frame whose file is torch's, as c10d's Python raising a backend's error)
        code = compile("raise exc", os.path.join(refusals._torch_dir(), "distributed", "distributed_c10d.py"), "exec")
        try:
            exec(code, {"exc": exc})
        except BaseException as e:  # noqa: BLE001
            return e
        raise AssertionError("did not raise")

    def test_which_errors_are_refusals(self):
        from disttest._runner.refusals import refused

        enqueue = self.raised_in_torch(RuntimeError("ProcessGroupGloo::broadcast: invalid root rank: 5"))
        self.assertTrue(refused(enqueue, "broadcast", reached_wait=False))
        self.assertFalse(refused(enqueue, "broadcast", reached_wait=True))  # (raised by its wait: communication)
        self.assertFalse(refused(enqueue, "monitored_barrier", reached_wait=False))  # (it communicates in the call)
        self.assertTrue(refused(self.raised_in_torch(ValueError("bad src")), "scatter", reached_wait=True))
        for said in ("Connection closed by peer [127.0.0.1]:1", "Timed out waiting 3000ms for recv",
                     "NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", "remote process exited",
                     "ncclRemoteError: A call failed possibly due to a network error",
                     "socketPollConnect: Connect to 10.0.0.2 returned 113(No route to host)"):
            with self.subTest(said=said):
                self.assertFalse(refused(self.raised_in_torch(RuntimeError(said)), "all_reduce", reached_wait=False))
        backend_error = type("DistBackendError", (RuntimeError,), {})  # (c10d's class, by name)
        self.assertFalse(refused(self.raised_in_torch(backend_error("invalid root")), "broadcast", reached_wait=False))
        # Raised outside torch (a backend written in Python, the test): never.
        self.assertFalse(refused(RuntimeError("invalid root rank: 5"), "broadcast", reached_wait=False))
        # Another Python error of torch's before the wait (pickling an object
        # for all_gather_object): refused; it was a communication error, and a
        # peer's skip hid it.
        unpicklable = self.raised_in_torch(AttributeError("Can't pickle local object '<lambda>'"))
        self.assertTrue(refused(unpicklable, "all_gather_object", reached_wait=False))
        self.assertFalse(refused(unpicklable, "all_gather_object", reached_wait=True))
        self.assertFalse(refused(self.raised_in_torch(ConnectionResetError("reset")), "all_reduce",
                                 reached_wait=False))


class CommSiteTest(unittest.TestCase):
    """Whether an error came out of torch.distributed: a fact of its traceback."""

    @staticmethod
    def caught(func) -> BaseException:
        try:
            func()
        except BaseException as e:  # noqa: BLE001
            return e
        raise AssertionError("did not raise")

    def test_an_error_out_of_a_collective(self):
        exc = self.caught(lambda: dist.all_reduce(torch.ones(1)))  # no group: raised by torch.distributed
        self.assertEqual(comm_site(exc), "all_reduce")
        self.assertEqual(outcome_from_exception(0, exc).comm, "all_reduce")

    def test_a_call_torch_refused_is_the_tests_own(self):
        # (marked by the rank's tracking: raised before the call communicated)
        from disttest._runner import refusals

        exc = self.caught(lambda: dist.all_reduce(torch.ones(1)))
        refusals.mark_refused(exc)
        self.assertEqual(comm_site(exc), "")
        self.assertEqual(outcome_from_exception(0, exc).comm, "")

    def test_the_tests_own_error(self):
        def own():
            raise RuntimeError("Connection closed by peer")  # the words do not make it one

        self.assertEqual(comm_site(self.caught(own)), "")
        self.assertEqual(outcome_from_exception(0, self.caught(own)).comm, "")

    def test_an_error_of_a_callback_torch_distributed_called_is_the_tests_own(self):
        from torch.distributed.distributed_c10d import _object_to_tensor

        class Hostile:
            def __reduce__(self):
                raise ValueError("cannot pickle me")

        exc = self.caught(lambda: _object_to_tensor(Hostile(), torch.device("cpu"), None))
        self.assertEqual(comm_site(exc), "")

    def test_an_error_of_torch_distributed_code_that_does_not_communicate_is_the_tests_own(self):
        # DTensor's placement check on rank 1 was called communication, and
        # rank 0's skip hid it (the test was reported skipped).
        from torch.distributed.tensor import DTensor, Shard

        with disttest.with_dist(rank=0, world_size=2):
            mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2,))
            exc = self.caught(lambda: DTensor.from_local(torch.ones(2, 2), mesh, [Shard(7)]))
        self.assertIn("torch.distributed.tensor", "".join(
            f.f_globals.get("__name__", "") for f, _ in traceback.walk_tb(exc.__traceback__)))
        self.assertEqual(comm_site(exc), "")

    def test_a_dist_error_anywhere(self):
        def raise_it():
            raise dist.DistBackendError("gloo says no")

        self.assertEqual(comm_site(self.caught(raise_it)), "DistBackendError")

    def test_a_store_timeout_called_by_the_test_is_its_own(self):
        # (a desync would read "waits in DistStoreError, a collective its peer never entered")
        store = dist.HashStore()
        store.set_timeout(timedelta(milliseconds=50))
        exc = self.caught(lambda: store.wait(["never set"]))
        self.assertIsInstance(exc, dist.DistStoreError)
        self.assertEqual(comm_site(exc), "")

    @staticmethod
    def in_c10d(message: str):
        """A function of torch.distributed's c10d module (by its globals) that raises ``message``."""
        namespace: dict = {"__name__": "torch.distributed.distributed_c10d"}
        exec("def all_reduce(message):\n    raise RuntimeError(message)\n", namespace)
        return namespace["all_reduce"]

    def wrapped(self, message: str) -> BaseException:
        def test_body():
            try:
                self.in_c10d(message)(message)
            except RuntimeError as e:
                raise AssertionError(f"all_reduce failed: {e}")  # noqa: B904 (as a test's self.fail)

        return self.caught(test_body)

    def test_a_failure_that_wraps_a_lost_peer_names_the_call(self):
        # (rank 0's wrapped consequence was listed first, as a cause)
        exc = self.wrapped(LOST)
        self.assertEqual(comm_site(exc), "")  # raised by the test
        o = outcome_from_exception(0, exc)
        self.assertEqual((o.kind, o.comm, o.wrapped), (Kind.FAILED, "", "all_reduce"))
        # An error of the call that is no lost peer is not one.
        self.assertEqual(outcome_from_exception(0, self.wrapped("Tensors must be contiguous")).wrapped, "")
        # A cycle of contexts ends.
        a, b, top = RuntimeError("a"), RuntimeError("b"), AssertionError("x")
        a.__context__, b.__context__, top.__context__ = b, a, a
        self.assertEqual(outcome_from_exception(0, top).wrapped, "")

    def test_an_assertion_is_never_communication(self):
        exc = self.caught(lambda: dist.all_reduce(torch.ones(1)))
        self.assertEqual(outcome_from_exception(0, AssertionError("x")).comm, "")
        self.assertEqual(outcome_from_exception(0, exc).kind, Kind.ERRORED)


if __name__ == "__main__":
    unittest.main()
