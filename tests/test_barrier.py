"""The file barrier across real processes, its timeout and its lock."""

from __future__ import annotations

import multiprocessing
import os
import time
import unittest
from unittest import mock

import disttest
from disttest import Barrier, BarrierTimeout, cleanup_temp_dir, initialize_temp_directories
from disttest.support.barrier import NO_TEMP_DIR


def _arrive(delay: float, wait_for: int, timeout: float, out) -> None:
    # NB: forked children do no tensor work (see the fork trap).
    time.sleep(delay)
    try:
        Barrier.sync(wait_for=wait_for, timeout=timeout)
        out.put(("ok", time.monotonic()))
    except BarrierTimeout as e:
        out.put(("timeout", e.arrived, e.expected, str(e)))


class BarrierTest(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        initialize_temp_directories()
        self.addCleanup(cleanup_temp_dir)
        Barrier.init()
        self.ctx = multiprocessing.get_context("fork")

    def run_ranks(self, delays, wait_for, timeout):
        out = self.ctx.Queue()
        procs = [self.ctx.Process(target=_arrive, args=(d, wait_for, timeout, out)) for d in delays]
        for p in procs:
            p.start()
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(30)
            self.assertEqual(p.exitcode, 0)
        return results

    def test_all_processes_leave_after_the_last_arrives(self):
        start = time.monotonic()
        results = self.run_ranks([0, 0, 0.5], wait_for=3, timeout=10)
        self.assertTrue(all(r[0] == "ok" for r in results), results)
        self.assertGreaterEqual(min(r[1] for r in results) - start, 0.45)

    def test_timeout_says_how_many_arrived(self):
        results = self.run_ranks([0, 0], wait_for=3, timeout=0.5)
        for kind, arrived, expected, message in results:
            self.assertEqual((kind, arrived, expected), ("timeout", 2, 3))
            self.assertIn("2 of 3 ranks arrived", message)
            self.assertIn("timed out after 0.5s", message)

    def test_timeout_is_a_runtime_error_for_upstream_suites(self):
        with self.assertRaises(RuntimeError):
            Barrier.sync(wait_for=2, timeout=0.1)

    def test_bad_timeout_is_named(self):
        with self.assertRaisesRegex(disttest.ConfigError, "Barrier.sync"):
            Barrier.sync(wait_for=1, timeout=-1)

    def test_bad_wait_for_is_named_before_arriving(self):
        for bad in ("1", 0, -1, 1.5, True):
            with self.subTest(wait_for=bad), \
                    self.assertRaisesRegex(disttest.ConfigError, rf"{bad!r} .*Barrier.sync\(wait_for=...\)"):
                Barrier.sync(wait_for=bad, timeout=1)
        self.assertEqual(os.listdir(os.path.join(os.environ["TEMP_DIR"], "barrier")), [])

    def test_a_stray_file_in_the_barrier_folder_is_not_an_arrival(self):
        folder = os.path.join(os.environ["TEMP_DIR"], "barrier")
        for name, text in (("notes.txt", "hello"), ("12345", "x"), ("12346", "")):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        Barrier.sync(wait_for=1, timeout=1)
        with self.assertRaises(BarrierTimeout) as caught:
            Barrier.sync(wait_for=2, timeout=0.2)
        self.assertEqual(caught.exception.pids, [os.getpid()])

    def test_init_clears_previous_arrivals(self):
        Barrier.sync(wait_for=1, timeout=1)
        self.assertEqual(len(os.listdir(os.path.join(os.environ["TEMP_DIR"], "barrier"))), 1)
        Barrier.init()
        self.assertEqual(os.listdir(os.path.join(os.environ["TEMP_DIR"], "barrier")), [])
        self.assertEqual(Barrier.barrier_id, 0)

    def test_lock_is_exclusive_across_processes(self):
        out = self.ctx.Queue()

        def hold():
            with disttest.lock():
                out.put("locked")
                time.sleep(0.5)

        p = self.ctx.Process(target=hold)
        p.start()
        self.assertEqual(out.get(timeout=30), "locked")
        start = time.monotonic()
        with disttest._lock():
            waited = time.monotonic() - start
        p.join(30)
        self.assertGreater(waited, 0.2)

    def test_missing_temp_dir_says_what_to_do(self):
        del os.environ["TEMP_DIR"]
        with self.assertRaises(RuntimeError) as ctx:
            Barrier.sync(wait_for=1)
        self.assertEqual(str(ctx.exception), NO_TEMP_DIR)
