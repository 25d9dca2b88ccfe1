"""A class run by an external launcher (``run_rank``), each rank a plain
process: ``python launched_cases.py RANK WORLD_SIZE RDVZ_FILE``, with
``LAUNCHED_MODE`` choosing what goes wrong on rank 1. Each rank prints its
result's failures and errors as JSON on its last line."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import disttest

MODE = os.environ.get("LAUNCHED_MODE", "")


class BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no str")


class Launched(disttest.MultiProcContinousTest):
    timeout = 4  # (the group's timeout too: a collective a peer never joins raises after it)

    @classmethod
    def backend_str(cls) -> str:
        return os.environ.get("LAUNCHED_BACKEND", "gloo")

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if MODE == "set_up_class" and cls.rank == 1:
            raise RuntimeError("setUpClass broke on rank 1")

    def test_a_sum(self) -> None:
        if MODE == "fail" and self.rank == 1:
            self.fail("rank 1 fails before the all_reduce")
        if MODE in ("skip_exit", "skip_async") and self.rank == 1:  # (upstream's way to skip: its peer waits in vain)
            sys.exit(disttest.TEST_SKIPS["multi-gpu-2"].exit_code)
        if MODE == "hang" and self.rank == 1:
            time.sleep(3600)  # (nobody else stops it: no disttest parent is there)
        if MODE == "unstoppable" and self.rank == 1:
            while True:  # (it catches the stop: the rank exits)
                try:
                    time.sleep(3600)
                except BaseException:  # noqa: BLE001,S110
                    pass
        if MODE == "exit" and self.rank == 1:
            os._exit(3)
        t = torch.ones(1) * (self.rank + 1)
        if MODE == "skip_async":  # (the wait raises from this frame: no torch.distributed frame to read)
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)
        if MODE == "interrupt" and self.rank == 1:
            raise KeyboardInterrupt
        if MODE == "bad_str" and self.rank == 1:
            raise BadStr
        self.assertEqual(t.item(), 3.0)

    def tearDown(self) -> None:
        if MODE == "hang" and self.rank == 1:
            time.sleep(0.2)  # (after a stopped test: it had no time left)
            print("TORN DOWN", flush=True)
        super().tearDown()

    def test_b_second(self) -> None:
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    def test_c_temp_file(self) -> None:
        with disttest.rank_temp_file() as path:
            print(f"TEMP {path}", flush=True)
            if MODE == "exit_with_temp" and self.rank == 0:
                os._exit(3)

    def test_d_no_collective(self) -> None:
        if MODE in ("skip_exit", "skip_async") and self.rank == 1:
            self.skipTest("rank 1 skips alone")


if __name__ == "__main__":
    patterns = os.environ.get(f"LAUNCHED_K{sys.argv[1]}")  # (this rank's own -k)
    if patterns:
        import unittest

        unittest.defaultTestLoader.testNamePatterns = patterns.split(",")
    result = Launched.run_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    entries = {kind: {str(test).split(" ")[0]: text for test, text in getattr(result, kind)}
               for kind in ("failures", "errors")}
    entries["skipped"] = {str(test).split(" ")[0]: reason for test, reason in result.skipped}
    entries["ran"] = result.testsRun
    print(json.dumps(entries), flush=True)
    sys.exit(0 if result.wasSuccessful() else 1)
