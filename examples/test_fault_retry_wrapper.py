"""Example: a collective wrapper with a deadline and retries, tested with
injected faults (a failing call, a slow peer, a hung peer).

Ranks are threads over disttest's threaded group. ``@disttest.inject_fault``
makes rank 1 raise at, be late to, or hang in its first all_reduce.
Run: python -m unittest -v examples/test_fault_retry_wrapper.py
"""

import time
import unittest

import torch
import torch.distributed as dist
import torch.distributed.tensor  # noqa: F401  NB: imported once here, not by two rank threads' first assertEqual at once

import disttest


class CollectiveTimeout(RuntimeError):
    pass


def all_reduce_with_retry(tensor, *, deadline_s, retries):
    """Sum ``tensor`` over the ranks. A call that fails before it
    communicates is retried up to ``retries`` times; a peer that does not
    join within ``deadline_s`` raises CollectiveTimeout. Returns the attempts."""
    for attempt in range(1, retries + 2):
        try:
            work = dist.all_reduce(tensor, async_op=True)
        except RuntimeError:
            if attempt > retries:
                raise
            continue
        give_up = time.monotonic() + deadline_s
        while not work.is_completed():
            if time.monotonic() > give_up:
                raise CollectiveTimeout(f"all_reduce: no peer answer within {deadline_s}s")
            time.sleep(0.005)
        work.wait()
        return attempt
    raise AssertionError("unreachable")


class RetryWrapper(disttest.MultiThreadedTestCase):
    world_size = 2
    timeout = 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    @disttest.inject_fault(rank=1, action="raise", at="all_reduce", nth=1)
    def test_a_failed_call_is_retried(self):
        t = torch.full((2,), float(self.rank + 1))
        attempts = all_reduce_with_retry(t, deadline_s=1.0, retries=2)
        self.assertEqual(t, torch.full((2,), 3.0))
        self.assertEqual(attempts, 2 if self.rank == 1 else 1)

    @disttest.inject_fault(rank=1, action="delay", at="all_reduce", nth=1, seconds=0.3)
    def test_a_slow_peer_within_the_deadline(self):
        t = torch.ones(2)
        start = time.monotonic()
        self.assertEqual(all_reduce_with_retry(t, deadline_s=1.0, retries=0), 1)
        self.assertEqual(t, torch.full((2,), 2.0))
        if self.rank == 0:
            self.assertGreaterEqual(time.monotonic() - start, 0.25)

    @disttest.inject_fault(rank=1, action="delay", at="all_reduce", nth=1, seconds=0.5)
    def test_a_peer_past_the_deadline_times_out(self):
        if self.rank == 0:
            with self.assertRaises(CollectiveTimeout):
                all_reduce_with_retry(torch.ones(2), deadline_s=0.1, retries=0)
        else:
            all_reduce_with_retry(torch.ones(2), deadline_s=0.1, retries=0)


class HungPeer(unittest.TestCase):
    """A hung peer: the wrapper gives up in rank 0 (which passes); the hung
    rank 1 is what the harness reports, with the injected hang named."""

    def test_the_wrapper_gives_up_and_the_report_names_the_hang(self):
        class Hang(disttest.MultiThreadedTestCase):
            world_size = 2
            timeout = 1.5

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            @disttest.inject_fault(rank=1, action="hang", at="all_reduce", nth=1)
            def test_hang(self):
                with self.assertRaises(CollectiveTimeout):
                    all_reduce_with_retry(torch.ones(2), deadline_s=0.2, retries=0)

        result = unittest.TestResult()
        Hang("test_hang").run(result)
        self.assertEqual(len(result.errors), 1, result.failures)
        report = result.errors[0][1]
        self.assertIn("'test_hang' errored (disttest): rank 1/2 timed out after 1.5s", report)
        self.assertIn("injected by disttest (not causes): rank 1 hung at all_reduce #1", report)


if __name__ == "__main__":
    unittest.main()
