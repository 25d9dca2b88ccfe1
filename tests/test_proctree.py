"""disttest._runner.proctree: a process's descendants, and the watch that
lists them again only when one may be new."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from unittest import mock

import runner_cases as cases
import torch.distributed as dist

import disttest
from disttest._runner import proctree
from disttest.runners import multithread


def _counting_listings():
    """A patch of proctree.descendants that counts its calls."""
    calls = []
    real = proctree.descendants

    def listing():
        calls.append(1)
        return real()

    return mock.patch.object(proctree, "descendants", side_effect=listing), calls


@unittest.skipUnless(sys.platform.startswith("linux") and proctree._last_pid() is not None,
                     "needs Linux's /proc/sys/kernel/ns_last_pid")
class DescendantWatchTest(unittest.TestCase):
    def test_a_new_process_is_seen(self):
        watch = proctree.DescendantWatch()
        before = watch.descendants()
        child = subprocess.Popen(["sleep", "30"])
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.assertFalse(watch.unchanged())
        self.assertNotIn(child.pid, before)
        self.assertIn(child.pid, watch.descendants())

    def test_no_listing_while_the_last_pid_stays(self):
        # (The last PID held still: other processes of the machine make some.)
        patch, calls = _counting_listings()
        with patch, mock.patch.object(proctree, "_last_pid", return_value=1234):
            watch = proctree.DescendantWatch()
            first = watch.descendants()
            self.assertTrue(watch.unchanged())
            self.assertIs(watch.descendants(), first)
        self.assertEqual(len(calls), 1)

    def test_lists_again_when_the_last_pid_moved(self):
        patch, calls = _counting_listings()
        last = iter([10, 10, 11, 11])
        with patch, mock.patch.object(proctree, "_last_pid", side_effect=lambda: next(last)):
            watch = proctree.DescendantWatch()
            watch.descendants()  # 10: listed
            watch.descendants()  # 10: kept
            self.assertFalse(watch.unchanged())  # 11
            watch.descendants()  # 11: listed
        self.assertEqual(len(calls), 2)

    def test_a_forked_copy_lists_its_own(self):
        patch, calls = _counting_listings()
        with patch, mock.patch.object(proctree, "_last_pid", return_value=1234):
            watch = proctree.DescendantWatch()
            watch.descendants()
            with mock.patch("os.getpid", return_value=os.getpid() + 1):
                self.assertFalse(watch.unchanged())
                watch.descendants()
        self.assertEqual(len(calls), 2)

    def test_every_call_lists_where_the_last_pid_is_unknown(self):
        patch, calls = _counting_listings()
        with patch, mock.patch.object(proctree, "LAST_PID", "/nonexistent/ns_last_pid"):
            watch = proctree.DescendantWatch()
            watch.descendants()
            self.assertFalse(watch.unchanged())
            watch.descendants()
        self.assertEqual(len(calls), 2)


class ThreadTestsListOnlyWhenNeededTest(unittest.TestCase):
    def test_a_thread_test_that_starts_no_process_reads_no_listing(self):
        # A listing reads /proc for every thread of the test process, twice a
        # test: a tenth of a 4-rank thread test's time.
        @disttest.spawn_threads_and_init_comms(world_size=2)
        def body(self):
            pass

        body(self)  # the watch's first listing
        patch, calls = _counting_listings()
        with patch, mock.patch.object(proctree, "_last_pid", return_value=1234), \
                mock.patch.object(proctree, "kill_descendants", side_effect=AssertionError("listed")):
            multithread._DESCENDANTS.descendants()
            for _ in range(3):
                body(self)
        self.assertEqual(len(calls), 1)

    def test_a_process_a_rank_thread_leaves_is_still_killed(self):
        @disttest.spawn_threads_and_init_comms(world_size=2)
        def quiet(self):
            pass

        @disttest.spawn_threads_and_init_comms(world_size=2)
        def leaves_one(self):
            if dist.get_rank() == 1:
                cases.started(subprocess.Popen(["sleep", cases.LEFT_SLEEP]))

        quiet(self)  # the watch has listed: the next test's start keeps that listing
        with self.assertWarnsRegex(UserWarning, f"left processes running.*sleep {cases.LEFT_SLEEP}"):
            leaves_one(self)
        self.assertEqual(cases.sleeps_left(), [])

if __name__ == "__main__":
    unittest.main()
