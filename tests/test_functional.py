"""disttest._runner.functional: torch's functional collectives seen by a
rank's tracking (DTensor's redistribute goes through them)."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from disttest._runner import board as boards
from disttest._runner import functional, record, tracking


class TrackedFunctionalCallsTest(unittest.TestCase):
    def setUp(self):
        names = [*functional.FUNCTIONAL, "wait_tensor"]
        saved = {n: vars(funcol)[n] for n in names if n in vars(funcol)}
        self.addCleanup(vars(funcol).update, saved)  # (the test process's own funcol stays unwrapped)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        self.board = boards.MemoryBoard(1)
        tracker = record.Tracker(self.board, 0)
        patch = mock.patch.object(tracking, "_process_tracker", [tracker])
        patch.start()
        self.addCleanup(patch.stop)
        functional.track_functional()

    def test_a_call_its_own_checks_refused_is_not_counted(self):
        # funcol checks its arguments with AssertionError and RuntimeError:
        # counted, the rank's later calls were one ahead of its peers'.
        with self.assertRaises(Exception):  # noqa: B017 (torch's own error, whatever its type)
            funcol.all_reduce(torch.ones(2), "bogus", dist.group.WORLD)
        self.assertEqual(self.board.counts(0), {"default": 0})
        out = funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        self.assertEqual(out.tolist(), [1.0, 1.0])
        self.assertEqual(self.board.counts(0), {"default": 1})
        self.assertEqual(self.board.read(0)["op"], "all_reduce")

    def test_a_wait_is_a_wait_in_the_call(self):
        waits = []
        real = record.Tracker.wait_in

        def wait_in(tracker, call, limit):
            waits.append(call["op"])
            return real(tracker, call, limit)

        with mock.patch.object(record.Tracker, "wait_in", wait_in):
            # (a gather on dim 1 waits inside the call itself)
            funcol.all_gather_tensor(torch.ones(4, 2), 1, dist.group.WORLD).sum()
            funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).sum()
        self.assertEqual(waits, ["all_gather_into_tensor", "all_reduce"])


if __name__ == "__main__":
    unittest.main()
