"""MultiProcContinousTest classes that tests/test_continuous.py runs.
At module level so that every start method can import them by name."""

from __future__ import annotations

import os
import signal
import sys
import time
import unittest

import torch
import torch.distributed as dist

import disttest


def stuck_in_pool_helper():
    time.sleep(60)


class Mixed(disttest.MultiProcContinousTest):
    """Bad tests of every kind among passing ones (run in name order)."""

    timeout = 3

    @classmethod
    def backend_str(cls):
        return "gloo"

    def setUp(self):
        super().setUp()
        # Runs in the ranks, not in the parent (rank -1 would fail here).
        assert self.rank in (0, 1), self.rank
        self.t = torch.ones(2) * (self.rank + 1)

    def tearDown(self):
        with open(os.environ["POOL_LOG"], "a") as f:
            f.write(f"teardown {self._testMethodName} {self.rank} {os.getpid()}\n")
        super().tearDown()

    def test_01_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))

    def test_02_assertion(self):
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_03_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))

    def test_04_os_exit(self):
        if self.rank == 1:
            os._exit(3)
        dist.barrier()

    def test_05_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(type(self).pg.size(), 2)

    def test_06_signal(self):
        if self.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    def test_07_pass(self):
        dist.all_reduce(self.t)

    def test_08_hang(self):
        if self.rank == 1:
            stuck_in_pool_helper()
        dist.barrier()

    def test_09_pass(self):
        dist.all_reduce(self.t)

    def test_10_early_return(self):
        dist.all_reduce(self.t)
        if self.rank == 1:
            return
        dist.all_reduce(self.t)

    def test_11_pass(self):
        dist.all_reduce(self.t)

    def test_12_skip(self):
        raise unittest.SkipTest("not in this rank's mood")

    def test_13_exit_code_skip(self):
        if self.rank == 0:
            sys.exit(disttest.TEST_SKIPS["nccl"].exit_code)

    def test_14_pass(self):
        dist.all_reduce(self.t)
        self.assertEqual(self.t, torch.full((2,), 3.0))


class NoBackend(disttest.MultiProcContinuousTest):
    @classmethod
    def backend_str(cls):
        return "nccl"

    def test_never_runs(self):
        raise AssertionError("the class must skip")


class InitFails(disttest.MultiProcContinousTest):
    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        if rank == 1:
            raise RuntimeError("no group for rank 1")
        super()._init_pg(rank, world_size, rdvz_file)

    def test_any(self):
        pass


class Wide(disttest.MultiProcContinousTest):
    @property
    def world_size(self):
        return 3

    def test_three_ranks(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3.0)
        self.assertIn("gloo", dist.get_backend_config())  # chosen by device


class Launched(disttest.MultiProcContinousTest):
    """Run by an external launcher (run_rank)."""

    def test_sum(self):
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        n = self.world_size
        self.assertEqual(t.item(), n * (n + 1) / 2)

    def test_rank_in_range(self):
        self.assertTrue(0 <= self.rank < self.world_size)

    def test_no_join_loop_watches(self):
        # The group's timeout is then the class's limit, with no margin for
        # a join loop's report (GroupLimitTest).
        self.assertTrue(type(self)._run_by_launcher)
        self.assertEqual(disttest._compat.group_timeout(type(self).pg), type(self)._group_limit())


class Phases(disttest.MultiProcContinousTest):
    """Failures in each phase, run by unittest's machinery in the ranks."""

    def setUp(self):
        super().setUp()
        if self._testMethodName in ("test_setup_fails", "test_expected_failure_setup_fails") and self.rank == 1:
            raise RuntimeError("setUp broke in rank 1")

    def tearDown(self):
        if self._testMethodName in ("test_teardown_fails", "test_both_fail", "test_expected_failure_teardown_fails",
                                    "test_expected_error_teardown_fails") and self.rank == 0:
            raise ValueError("tearDown broke in rank 0")
        super().tearDown()

    def test_setup_fails(self):
        pass

    def test_teardown_fails(self):
        pass

    def test_both_fail(self):
        self.assertEqual(self.rank, 99)

    def test_cleanup_fails(self):
        def broken():
            raise KeyError("cleanup broke")

        self.addCleanup(broken)

    def test_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 2)

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_expected_failure_setup_fails(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_expected_failure_teardown_fails(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_expected_error_teardown_fails(self):
        raise NotImplementedError("any exception of the body is expected")

    @unittest.expectedFailure
    def test_expected_failure_cleanup_fails(self):
        def broken():
            raise KeyError("cleanup broke")

        self.addCleanup(broken)
        self.assertEqual(1, 2)

    def test_keyboard_interrupt(self):
        if self.rank == 1:
            raise KeyboardInterrupt("raised by the test in rank 1")

    def test_z_pass(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


class InitSkips(disttest.MultiProcContinousTest):
    """A rank skips the class while the pool starts; its peer waits in the rendezvous."""

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        if rank == 1:
            raise unittest.SkipTest("rank 1 has no such device")
        super()._init_pg(rank, world_size, rdvz_file)

    def test_a(self):
        pass


class InitHangs(disttest.MultiProcContinousTest):
    """A rank hangs while the pool starts: its peer waits in the rendezvous."""

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        if rank == 1:
            time.sleep(600)
        super()._init_pg(rank, world_size, rdvz_file)

    def test_a(self):
        pass

    def test_b(self):
        pass


class StartDies(disttest.MultiProcContinousTest):
    """A rank dies while the pool starts: every test fails, only the first waits."""

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        if rank == 1:
            os._exit(3)
        super()._init_pg(rank, world_size, rdvz_file)

    def test_a(self):
        pass

    def test_b(self):
        pass

    def test_c(self):
        pass


class Crashes(disttest.MultiProcContinousTest):
    """Every test crashes a rank; the pool may be rebuilt once."""

    max_pool_rebuilds = 1

    def test_1(self):
        if self.rank == 1:
            os._exit(5)

    def test_2(self):
        if self.rank == 1:
            os._exit(5)

    def test_3(self):
        pass


class Marked(disttest.MultiProcContinousTest):
    """A test that asks for 3 ranks in a class of 2 (as @pytest.mark.world_size does)."""

    def test_default(self):
        self.assertEqual((self.world_size, dist.get_world_size()), (2, 2))

    def test_three(self):
        self.assertEqual((self.world_size, dist.get_world_size()), (3, 3))

    test_three._required_world_size = 3


if __name__ == "__main__":
    # python pool_cases.py RANK WORLD_SIZE [RDVZ_FILE]; without arguments,
    # the launcher's environment (torchrun, Slurm, Open MPI) and env://.
    if len(sys.argv) > 1:
        rank, world = int(sys.argv[1]), int(sys.argv[2])
        rdvz = sys.argv[3] if len(sys.argv) > 3 else None
    else:
        rank, world, rdvz = None, None, None
    result = Launched.run_rank(rank, world, rdvz)
    sys.exit(0 if result.wasSuccessful() else 1)



class Scheduled(disttest.MultiProcContinousTest):
    """``rank_scheduling`` in a pool: the workers run as batch processes."""

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    def test_batch(self):
        assert os.sched_getscheduler(0) == os.SCHED_BATCH, os.sched_getscheduler(0)


class ChangesTheWorld(disttest.MultiProcContinousTest):
    """Tests that destroy the class's group, and the tests after them."""

    timeout = 20

    def all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    def test_1_destroys_the_group(self):
        self.all_reduce()
        dist.destroy_process_group()

    def test_2_has_a_group(self):
        self.all_reduce()

    def test_3_destroys_it_again(self):
        dist.destroy_process_group()

    def test_4_has_a_group(self):
        self.all_reduce()


class Interrupted(disttest.MultiProcContinousTest):
    """The parent's join is interrupted (as pytest-timeout does) while the
    ranks are still in the test."""

    timeout = 6

    def test_1_still_running_when_interrupted(self):
        if self.rank == 0:
            time.sleep(60)

    def test_2_quick(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


class ForgetsSuper(disttest.MultiProcContinousTest):
    """A tearDownClass that does not call super()'s."""

    @classmethod
    def tearDownClass(cls):
        pass

    def test_it(self):
        pass


class TakesTheStackSignal(disttest.MultiProcContinousTest):
    """A test sets its own handler for the signal disttest reads stacks with."""

    timeout = 3

    def test_1_ignores_sigusr1(self):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def test_2_hangs(self):
        if self.rank == 0:
            time.sleep(30)


class Mismatched(disttest.MultiProcContinousTest):
    """A collective whose calls differ: gloo's all_reduce of 2 elements on
    rank 0 and 3 on rank 1 returns on rank 0 and leaves rank 1 waiting."""

    timeout = 3

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_sizes_differ(self):
        dist.all_reduce(torch.ones(2 if self.rank == 0 else 3))


class PointToPoint(disttest.MultiProcContinousTest):
    """Tests that leave sends and receives unmatched, each followed by one
    whose calls would match the leftovers (run in name order)."""

    timeout = 20

    @classmethod
    def backend_str(cls):
        return "gloo"

    def _pid(self):
        with open(os.environ["POOL_LOG"], "a") as f:
            f.write(f"{self._testMethodName} {self.rank} {os.getpid()}\n")

    def _send_recv(self):
        self._pid()
        if self.rank == 0:
            dist.send(torch.ones(1) * 3, 1)
        else:
            t = torch.zeros(1)
            dist.recv(t, 0)
            self.assertEqual(t.item(), 3)  # not the message an earlier test left

    def test_1_matched(self):
        self._send_recv()

    def test_2_matched(self):
        self._send_recv()

    def test_3_leaves_a_send(self):
        self._pid()
        if self.rank == 0:
            dist.isend(torch.ones(1) * 7, 1)  # never received, never waited

    def test_4_send_recv(self):
        self._send_recv()

    def test_5_leaves_a_receive(self):
        self._pid()
        if self.rank == 1:
            dist.irecv(torch.zeros(1), 0)  # nothing is sent

    def test_6_send_recv(self):
        self._send_recv()

class _UnpicklesToValueError:
    def __reduce__(self):
        return int, ("not a number",)


class Collectives(disttest.MultiProcContinousTest):
    """Tests that leave collectives unmatched (one a rank started and never
    waited for, on the class's group and on a subgroup), each followed by
    one whose collective would match the leftover (run in name order)."""

    world_size = 3
    timeout = 20

    @classmethod
    def backend_str(cls):
        return "gloo"

    def _all_reduce(self, group=None):
        with open(os.environ["POOL_LOG"], "a") as f:
            f.write(f"{self._testMethodName} {self.rank} {os.getpid()}\n")
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        self.assertEqual(t.item(), 3 if group is None else 2)  # not with an earlier test's value

    def test_0_checks_an_argument_error_on_one_rank(self):
        # The scatter raises before it reaches the group: nothing is left.
        if self.rank == 0:
            with self.assertRaises(ValueError):
                dist.scatter(torch.zeros(1), scatter_list=None, src=0)
        self._all_reduce()

    def test_1_matched(self):
        # The broadcast completed; only unpickling failed on the receivers,
        # in torch's own frame (the reconstructor is a C builtin): it counts.
        objects = [_UnpicklesToValueError() if self.rank == 0 else None]
        if self.rank == 0:
            dist.broadcast_object_list(objects, src=0)
        else:
            with self.assertRaisesRegex(ValueError, "invalid literal"):
                dist.broadcast_object_list(objects, src=0)
        self._all_reduce()

    def test_2_leaves_one(self):
        self._all_reduce()
        if self.rank == 0:
            dist.all_reduce(torch.full((1,), 100.0), async_op=True)  # no peer enters it

    def test_3_all_reduce(self):
        self._all_reduce()

    def test_4_leaves_one_in_a_subgroup(self):
        group = dist.new_group([0, 1])
        if self.rank in (0, 1):
            self._all_reduce(group)
        if self.rank == 0:
            dist.all_reduce(torch.full((1,), 100.0), group=group, async_op=True)

    def test_5_all_reduce(self):
        self._all_reduce()



class OutputPerTest(disttest.MultiProcContinousTest):
    """A rank that crashes silently after a test that printed."""

    world_size = 2
    timeout = 20

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_1_prints(self):
        print(f"printed by test_1 on rank {self.rank}", flush=True)

    def test_2_crashes(self):
        if self.rank == 1:
            os._exit(5)


class ProcessState(disttest.MultiProcContinousTest):
    """A test that changes its rank process for good, then one that looks."""

    world_size = 2
    timeout = 20

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_1_changes(self):
        os.environ["DISTTEST_POOL_LEAK"] = "1"
        os.chdir("/")
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        import warnings

        warnings.simplefilter("error")

    def test_2_sees_none_of_it(self):
        import warnings

        self.assertEqual((os.environ.get("DISTTEST_POOL_LEAK"), os.getcwd() == "/", torch.get_default_dtype(),
                          torch.get_float32_matmul_precision(), warnings.filters[0][0] == "error"),
                         (None, False, torch.float32, "highest", False))
