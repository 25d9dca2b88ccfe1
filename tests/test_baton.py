"""The turns of rank threads (disttest.pg._baton), on plain threads and futures."""

from __future__ import annotations

import os
import threading
import time
import unittest
import unittest.mock

from torch.futures import Future

from disttest.pg import _baton
from disttest.pg._baton import HOLD_LIMIT, Baton


class _Threads:
    """Threads started through a baton: each runs ``jobs[i]`` when started."""

    def __init__(self, baton: Baton, jobs: list) -> None:
        self.baton = baton
        self.inboxes = [threading.Semaphore(0) for _ in jobs]
        self.threads = [threading.Thread(target=self._run, args=(i, job), daemon=True)
                        for i, job in enumerate(jobs)]
        for t in self.threads:
            t.start()
        baton.begin([(t, self.inboxes[i].release) for i, t in enumerate(self.threads)])

    def _run(self, i: int, job) -> None:
        self.inboxes[i].acquire()
        self.baton.resume()
        job()

    def join(self, timeout: float = 5.0) -> None:
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a thread did not end"


class BatonTest(unittest.TestCase):
    def test_threads_start_one_at_a_time_each_after_the_previous_one_leaves(self):
        baton, log = Baton(), []

        def job(i):
            def run():
                log.append(("start", i, baton.holds()))
                time.sleep(0.02)  # the next must not start meanwhile
                log.append(("end", i))
                baton.leave()
            return run

        _Threads(baton, [job(i) for i in range(3)]).join()
        self.assertEqual(log, [("start", 0, True), ("end", 0), ("start", 1, True), ("end", 1),
                               ("start", 2, True), ("end", 2)])
        self.assertFalse(baton.free)

    def test_a_wait_hands_the_turn_on_and_resumes_in_order_once_done(self):
        baton, log = Baton(), []
        futures = [Future() for _ in range(3)]

        def job(i):
            def run():
                log.append(("before", i))
                if i == 2:  # the last completes everyone's future and keeps its turn
                    for f in futures:
                        f.set_result(None)
                    log.append(("completed", i))
                else:
                    self.assertTrue(baton.wait_for(futures[i], limit=5.0))
                    log.append(("after", i, baton.holds()))
                baton.leave()
            return run

        _Threads(baton, [job(i) for i in range(3)]).join()
        self.assertEqual(log, [("before", 0), ("before", 1), ("before", 2), ("completed", 2),
                               ("after", 0, True), ("after", 1, True)])

    def test_a_thread_that_holds_the_turn_too_long_loses_it(self):
        baton, log = Baton(), []
        release = threading.Event()
        third = threading.Event()

        def blocked():  # blocks where the baton cannot see, holding the turn
            log.append("blocked")
            self.assertTrue(release.wait(5))
            log.append(("blocked resumes, holding the turn", baton.holds()))
            baton.leave()

        def other():
            log.append(("other", baton.holds()))
            release.set()
            time.sleep(0.05)  # the loser runs on meanwhile, without a turn
            log.append("other leaves")
            baton.leave()

        def last():
            log.append("last")
            third.set()
            baton.leave()

        threads = _Threads(baton, [blocked, other, last])
        time.sleep(HOLD_LIMIT * 4)
        self.assertEqual(log, ["blocked"])  # not started while the turn is held...
        self.assertFalse(baton.watch())  # (the first watch of a long turn looks at the holder's CPU time)
        time.sleep(HOLD_LIMIT * 2)
        self.assertTrue(baton.watch())  # ...until a watch finds it held too long, not running
        threads.join()
        # The next thread got the turn, and the one after it waited for it:
        # the world did not go free (a thousand threads would then contend).
        self.assertEqual(log, ["blocked", ("other", True), ("blocked resumes, holding the turn", False),
                               "other leaves", "last"])
        self.assertFalse(baton.free)

    def test_a_thread_that_lost_its_turn_waits_for_one_at_its_next_wait(self):
        baton, log = Baton(), []
        release = threading.Event()
        done = Future()

        def blocked():
            self.assertTrue(release.wait(5))  # loses the turn here
            self.assertTrue(baton.wait_for(done, limit=5.0))
            log.append(("blocked after its wait", baton.holds()))
            baton.leave()

        def other():
            release.set()
            time.sleep(0.02)  # the loser enters its wait meanwhile: it must not take the turn from us
            log.append(("other", baton.holds()))
            done.set_result(None)  # it queues for the turn...
            time.sleep(0.02)
            log.append("other leaves")  # ...which it gets once we leave
            baton.leave()

        threads = _Threads(baton, [blocked, other])
        time.sleep(HOLD_LIMIT * 2)
        baton.watch()
        time.sleep(HOLD_LIMIT * 2)
        self.assertTrue(baton.watch())
        threads.join()
        self.assertEqual(log, [("other", True), "other leaves", ("blocked after its wait", True)])
        self.assertFalse(baton.free)

    def test_after_enough_holders_lost_their_turns_the_world_goes_free(self):
        # Ranks that meet outside disttest (a threading.Barrier): each would
        # lose its turn in turn; past MAX_DEMOTIONS they all run at once.
        n = _baton.MAX_DEMOTIONS + 2
        meet = threading.Barrier(n, timeout=20)
        baton = Baton()
        threads = _Threads(baton, [lambda: (meet.wait(), baton.leave()) for _ in range(n)])
        deadline = time.monotonic() + 20
        while any(t.is_alive() for t in threads.threads) and time.monotonic() < deadline:
            time.sleep(HOLD_LIMIT * 2)
            baton.watch()
        threads.join()
        self.assertTrue(baton.free)

    @unittest.skipUnless(_baton._cpu_seconds(threading.get_native_id()) is not None,
                         "needs per-thread CPU times (Linux schedstat)")
    def test_a_holder_that_computes_keeps_the_turn_up_to_the_busy_limit(self):
        # Issue 26: the last of 1024 ranks into a collective hands out the
        # results for longer than HOLD_LIMIT; the world went free and every
        # later hand-off woke all the threads.
        baton, log = Baton(), []
        stop = threading.Event()

        def busy():  # runs Python, holding the turn, until told
            log.append("busy")
            while not stop.is_set():
                sum(range(1000))
            baton.leave()

        threads = _Threads(baton, [busy, lambda: log.append("other")])
        watched = []
        for _ in range(4):
            time.sleep(HOLD_LIMIT * 3)
            watched.append(baton.watch())
        self.assertEqual((watched, log), ([False] * 4, ["busy"]))  # busy: it keeps the turn
        with unittest.mock.patch.object(_baton, "BUSY_HOLD_LIMIT", 0.0):
            self.assertTrue(baton.watch())  # past the limit: a spin must not hold the others for ever
        stop.set()
        threads.join()
        self.assertEqual(log, ["busy", "other"])

    def test_a_short_turn_is_not_taken_for_a_stuck_one(self):
        baton = Baton()
        started = threading.Event()
        handed = time.monotonic()  # at the latest
        threads = _Threads(baton, [lambda: (started.wait(5), baton.leave()), lambda: None])
        with unittest.mock.patch.object(_baton, "_cpu_seconds", side_effect=AssertionError("looked")) as looked:
            self.assertFalse(baton.watch(now=handed + HOLD_LIMIT / 2))  # held for less than the limit
        looked.assert_not_called()  # (a look opens a file: a short test would pay it at each poll)
        started.set()
        threads.join()
        self.assertFalse(baton.watch())  # nobody waits: nothing to free

    def test_free_wakes_the_waiting_and_later_waits_are_plain(self):
        baton = Baton()
        done = Future()
        resumed = []

        def waiter():
            self.assertTrue(baton.wait_for(done, limit=5.0))
            resumed.append(baton.holds())

        def holder():
            done.set_result(None)  # the waiter is ready now, but it is this thread's turn
            time.sleep(0.05)
            self.assertEqual(resumed, [])
            baton.go_free()  # an abort: everyone runs
            deadline = time.monotonic() + 5
            while not resumed and time.monotonic() < deadline:
                time.sleep(0.001)
            self.assertEqual(resumed, [False])  # it ran without a turn, and before this one left

        _Threads(baton, [waiter, holder]).join()
        self.assertTrue(baton.free)
        self.assertFalse(baton.holds())
        baton.leave()  # nothing to pass on: a no-op

    def test_a_free_baton_starts_every_thread_at_once(self):
        baton = Baton()
        baton.go_free()
        barrier = threading.Barrier(3, timeout=5)  # passes only if all three run at once
        _Threads(baton, [barrier.wait] * 3).join()

    def test_a_wait_with_a_limit_gives_up_and_leaves_the_queue(self):
        baton, log = Baton(), []
        never = Future()

        def waiter():
            start = time.monotonic()
            log.append(("waited", baton.wait_for(never, limit=0.1), time.monotonic() - start >= 0.1))
            never.set_result(None)  # its done-callback must not hand the turn to the wait that left
            log.append(("late", baton.holds()))
            baton.leave()

        def other():
            log.append("other")
            baton.leave()

        _Threads(baton, [waiter, other]).join()
        self.assertEqual(log, ["other", ("waited", False, True), ("late", False)])
        self.assertFalse(baton.watch())

    def test_a_future_done_within_the_limit_is_no_timeout_while_another_keeps_the_turn(self):
        # As without turns: the limit is the collective's, not the turn's.
        baton, log = Baton(), []
        done = Future()

        def waiter():
            log.append(("waited", baton.wait_for(done, limit=0.1), baton.holds()))
            baton.leave()

        def holder():
            done.set_result(None)  # within the waiter's limit...
            time.sleep(0.3)  # ...but this thread keeps the turn past it (nobody watches here)
            # The waiter runs on without a turn, out of the queue: nobody waits for this one.
            log.append(("holder", baton.holds(), baton.watch(now=time.monotonic() + 60)))
            baton.leave()

        _Threads(baton, [waiter, holder]).join()
        self.assertEqual(log, [("waited", True, False), ("holder", True, False)])

    @unittest.skipUnless(hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1,
                         "needs CPU affinity (Linux) and two CPUs")
    def test_a_thread_moved_to_its_wakers_cpu_gets_its_cpus_back(self):
        cpus = os.sched_getaffinity(0)
        go, seen = threading.Event(), []

        def sleeper():
            go.wait(5)
            seen.append(os.sched_getaffinity(0))  # where it was woken
            _baton.give_back_cpus(had)
            seen.append(os.sched_getaffinity(0))

        t = threading.Thread(target=sleeper)
        t.start()
        had = _baton.move_here(t.native_id)
        self.assertEqual(had, cpus)
        self.assertEqual(len(os.sched_getaffinity(t.native_id)), 1)
        go.set()
        t.join(5)
        self.assertEqual(len(seen[0]), 1)
        self.assertEqual(seen[1], cpus)
        self.assertEqual(os.sched_getaffinity(0), cpus)  # the mover's own CPUs untouched
        self.assertIsNone(_baton.move_here(None))

    @unittest.skipUnless(hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1,
                         "needs CPU affinity (Linux) and two CPUs")
    def test_a_thread_handed_the_turn_wakes_on_its_wakers_cpu_and_takes_its_cpus_back(self):
        cpus = os.sched_getaffinity(0)
        baton, seen = Baton(), []
        inboxes = [threading.Semaphore(0) for _ in range(3)]

        def run(i):
            inboxes[i].acquire()
            woken = os.sched_getaffinity(0)  # as handed the turn (by the test's thread, or the previous one)
            baton.resume()
            seen.append((i, len(woken), os.sched_getaffinity(0) == cpus))
            baton.leave()

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        baton.begin([(t, inboxes[i].release) for i, t in enumerate(threads)])
        for t in threads:
            t.join(5)
        self.assertEqual(seen, [(0, 1, True), (1, 1, True), (2, 1, True)])

    def test_the_hold_limit_is_a_few_milliseconds(self):
        # Long enough for a turn between two collectives, short enough that a
        # thread blocked outside disttest costs a test little.
        self.assertLessEqual(_baton.HOLD_LIMIT, 0.02)
        self.assertGreaterEqual(_baton.HOLD_LIMIT, 0.001)


if __name__ == "__main__":
    unittest.main()
