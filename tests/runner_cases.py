"""Test bodies every runner must handle alike, and one class per runner.

tests/test_runners.py runs each body under each runner into a recording
result. At module level (not a test_*.py file) so that the fork server can
import the process class by name and pytest does not collect them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
import warnings
from multiprocessing import resource_tracker

import psutil
import torch
import torch.distributed as dist

import disttest
from disttest import TEST_SKIPS
from disttest._runner import proctree, zygote
from disttest.support import janitor


def live_ranks() -> list[object]:
    """Ranks still alive: rank threads, and processes started for ranks
    (children of this process and of its fork server, less the helpers)."""
    me = psutil.Process()
    helpers = {*zygote.server_pids(), *janitor.reaper_pids()}
    # multiprocessing's resource tracker (started by the spawn start method)
    # lives as long as this process by design.
    helpers.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    # A rank's own tracker ends by itself a moment after the rank (it cleans up first).
    procs = [p for p in me.children(recursive=True)
             if p.pid not in helpers and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
             and not proctree.is_resource_tracker(p.pid)]
    threads = [t for t in threading.enumerate() if " rank " in t.name and t.is_alive()]
    return [*procs, *threads]


def stuck_in_a_helper() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Python-level, so a thread can be stopped
        time.sleep(0.01)


#: A suite's own TEST_SKIPS entry (upstream reads the table when it judges an exit).
SUITE_SKIP_KEY = "disttest-tests-suite-own"
SUITE_SKIP = disttest.TestSkip(91, "the suite's own skip reason")


class Behaviours:
    """``self.init()`` makes the default group where the runner does not."""

    rank: int
    _testMethodName: str

    @property
    def world_size(self) -> int:
        return 4 if "wide" in self._testMethodName else 2

    @property
    def timeout(self) -> float:
        return 2 if "hang" in self._testMethodName else 30

    def init(self) -> None:
        raise NotImplementedError

    def test_pass(self):
        self.init()
        t = torch.full((3,), float(self.rank))
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 1.0))

    def test_assertion_in_rank_1(self):
        self.init()
        if self.rank == 1:
            self.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 5.0]))

    def test_exception_in_rank_1(self):
        self.init()
        if self.rank == 1:
            raise ValueError(f"boom in rank {self.rank}")

    def test_skiptest(self):
        raise unittest.SkipTest("not today")

    def test_skip_exit_code_in_one_rank(self):
        if self.rank == 1:
            sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

    def test_own_error_in_torch_beside_a_skip(self):
        self.init()
        if self.rank == 0:
            self.skipTest("rank 0 skips")
        # rank 1's own error, before anything is sent: a lambda cannot be pickled
        dist.all_gather_object([None] * self.world_size, lambda: 0)

    @disttest.requires_world_size(8, allow_cpu=True)
    @disttest.skip_if_small_worldsize
    def test_size_checks_see_the_ranks_size(self):
        assert self.world_size == 8, self.world_size

    def test_ddp_after_a_peer_skips(self):
        self.init()
        if self.rank == 0:
            self.skipTest("rank 0 skips")
        # (its wait on rank 0 fails from torch.distributed.utils, not c10d)
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))

    def test_suite_own_skip_exit_code(self):
        # A suite's own entry, registered where the rank runs (as a suite's
        # import does; the test's cleanup removes it from a thread world's).
        TEST_SKIPS.setdefault(SUITE_SKIP_KEY, SUITE_SKIP)
        sys.exit(SUITE_SKIP.exit_code)

    @disttest.skip_if_lt_x_gpu(2)
    def test_skip_decorator(self):
        raise AssertionError("must not run: the parent decides the skip")

    def test_wide_identical_failures(self):
        self.init()
        if self.rank != 0:
            raise KeyError("same everywhere")

    def test_wide_mixed(self):
        self.init()
        if self.rank == 1:
            self.assertTrue(False, "rank 1 asserts")
        if self.rank == 2:
            raise OSError("rank 2 raises")

    def test_wide_last_rank_fails(self):
        self.init()
        if self.rank == 3:
            self.fail("only the last rank")

    def test_fail_fast_while_peer_waits(self):
        self.init()
        if self.rank == 1:
            raise RuntimeError("early failure")
        dist.barrier()  # never completes: rank 1 is gone

    def test_wide_assert_while_peers_gather(self):
        # The peers wait in a collective issued from C++ (functional
        # collectives: disttest's tracking does not see the call), broken
        # when rank 2 leaves: their errors are its consequences, whatever
        # the timing.
        from torch.distributed import _functional_collectives as funcol

        self.init()
        if self.rank == 2:
            self.assertEqual(self.rank, 0, "rank 2 disagrees")
        with warnings.catch_warnings():  # deprecated in newer torch, the only spelling in older
            warnings.simplefilter("ignore", FutureWarning)
            funcol.all_gather_tensor(torch.ones(2), 0, dist.group.WORLD).wait()

    def test_wide_assert_while_peers_reduce(self):
        self.init()
        if self.rank == 2:
            self.assertEqual(self.rank, 0, "rank 2 disagrees")
        dist.all_reduce(torch.ones(2))

    def test_fake_backend(self):
        # Issue 25: as in upstream's ranks, c10d's fake backend is usable.
        if dist.is_initialized():  # the runner's own group (threads, pool)
            group = dist.new_group(backend="fake")
            assert dist.get_backend(group) == "fake", dist.get_backend(group)
            return
        dist.init_process_group("fake", store=disttest.FakeStore(), rank=self.rank, world_size=self.world_size)
        try:
            t = torch.ones(2)
            dist.all_reduce(t)  # no communication: a fake group
            assert dist.get_backend() == "fake"
        finally:
            dist.destroy_process_group()

    def test_hang(self):
        self.init()
        if self.rank == 1:
            stuck_in_a_helper()
        dist.barrier()

    def test_recv_from_a_peer_that_returned(self):
        self.init()
        if self.rank == 0:
            dist.recv(torch.zeros(2), src=1)

    def test_early_return(self):
        self.init()
        dist.all_reduce(torch.ones(2))
        if self.rank == 1:
            return
        dist.all_reduce(torch.ones(2))

    def test_ddp_rank_skips_a_step(self):
        self.init()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        model(torch.ones(2, 4)).sum().backward()
        if self.rank == 1:
            return  # rank 0's next step waits in collectives DDP issues from C++
        model(torch.ones(2, 4)).sum().backward()

    def test_str_raises(self):
        self.init()
        if self.rank == 1:
            raise HostileAssertion("unprintable")

    def test_output_of_a_failing_rank(self):
        self.init()
        print(f"a note from rank {self.rank}", flush=True)
        if self.rank == 1:
            self.fail("rank 1 fails after printing")

    # -- hostile tests (issue 12); process runners only where a thread would
    # take the test process with it --

    def test_segfault_in_rank_1(self):
        self.init()
        if self.rank == 1:
            import ctypes

            ctypes.string_at(0)  # the crash site
        dist.barrier()

    def test_kill_the_fork_server(self):
        if self.rank == 1:
            os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)

    def test_leave_a_process_running(self):
        self.init()
        if self.rank == 1:
            started(subprocess.Popen(["sleep", LEFT_SLEEP], start_new_session=True))

    def test_leave_a_daemon_running(self):
        self.init()
        if self.rank == 1:  # a double fork: the daemon's parent exits at once, and init would adopt it
            code = f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', {LEFT_SLEEP!r}])"
            subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
            deadline = time.monotonic() + 5
            while not sleeps_left() and time.monotonic() < deadline:
                time.sleep(0.02)

    def test_leave_a_process_running_and_fail(self):
        self.init()
        if self.rank == 1:
            started(subprocess.Popen(["sleep", LEFT_SLEEP], start_new_session=True))
            raise ValueError("fails after starting a process")

    def test_use_a_multiprocessing_queue(self):
        # A rank process's start method is spawn (as upstream's): the queue's
        # lock starts multiprocessing's resource tracker, which serves the
        # rank for the rest of its life, not this test only.
        import multiprocessing

        q = multiprocessing.Queue()
        q.put(self.rank)
        assert q.get(timeout=10) == self.rank
        q.close()
        q.join_thread()

    def test_crash_after_starting_a_process(self):
        self.init()
        if self.rank == 1:
            import ctypes

            subprocess.Popen(["sleep", LEFT_SLEEP], start_new_session=True)
            ctypes.string_at(0)
        dist.barrier()

    def test_subtest_fails_in_rank_1(self):
        # Each subTest's all_reduce has its own size: a rank that went on to
        # the next subTest after its failure would meet its peer's earlier
        # all_reduce (gloo hangs on the mismatch).
        self.init()
        for i in range(3):
            with self.subTest(i=i):
                if self.rank == 1 and i == 1:
                    self.fail("rank 1 fails i=1")
                dist.all_reduce(torch.ones(2 + i))

    def test_subtests_fail_alike(self):
        self.init()
        for i in range(3):
            with self.subTest(i=i, kind="same"):
                with self.subTest(step=i * 10):
                    dist.all_reduce(torch.ones(1))
                    self.assertNotEqual(i, 1)

    def test_subtest_failure_caught_by_the_test(self):
        self.init()
        with contextlib.suppress(Exception), self.subTest(i=0):
            self.assertEqual(self.rank, 0)

    def test_subtest_skipped_then_fails(self):
        self.init()
        for i in range(3):
            with self.subTest(i=i):
                if i == 0:
                    raise unittest.SkipTest("case 0 not supported")
                dist.all_reduce(torch.ones(1))
                self.assertNotEqual(i, 1)

    def test_subtest_skipped_on_one_rank_then_desync(self):
        # Rank 1 skips subTest 0's all_reduce and goes on: its peer waits in
        # all_reduce #2, which rank 1 never enters (gloo would hang).
        self.init()
        for i in range(2):
            with self.subTest(i=i):
                if self.rank == 1 and i == 0:
                    self.skipTest("case 0 not on rank 1")
                dist.all_reduce(torch.ones(1))

    def test_nested_subtest_fails_in_rank_1(self):
        self.init()
        for i in range(3):
            with self.subTest(i=i), self.subTest(step=i):
                if self.rank == 1 and i == 1:
                    self.fail("rank 1 fails i=1")
                dist.all_reduce(torch.ones(2 + i))  # a size per step: ranks out of step would hang

    def test_caught_subtest_failure_then_exit_0(self):
        self.init()
        with contextlib.suppress(Exception), self.subTest(i=0):
            self.assertEqual(self.rank, 0)
        sys.exit(0)  # upstream's ranks end a passing test so

    def test_do_cleanups_in_the_test(self):
        self.init()
        done = []
        self.addCleanup(done.append, 1)
        self.doCleanups()
        self.assertEqual(done, [1])

    def test_os_exit_with_a_skip_code_in_rank_1(self):
        self.init()
        if self.rank == 1:
            os._exit(disttest.TEST_SKIPS["multi-gpu-2"].exit_code)  # as upstream's ranks may end
        dist.all_reduce(torch.ones(2))  # (waits for rank 1, which is gone)

    def test_cleanup_in_rank_1_fails(self):
        self.init()
        ran = []
        self.addCleanup(lambda: ran == ["second"] or self.fail(f"the cleanups ran in the wrong order: {ran}"))
        self.addCleanup(ran.append, "second")
        if self.rank == 1:
            def fails() -> None:
                self.fail("rank 1's cleanup fails")

            self.addCleanup(fails)
        dist.all_reduce(torch.ones(2))

    def test_fails_then_cleanup_fails(self):
        self.init()
        self.addCleanup(self.fail, "the cleanup fails too")
        self.fail(f"rank {self.rank}'s test fails")

    def test_p2p_tags_differ(self):
        self.init()
        t = torch.ones(2)
        if self.rank == 0:
            dist.send(t, 1, tag=1)
        else:
            dist.recv(t, 0, tag=2)

    def test_both_receive(self):
        self.init()
        dist.recv(torch.ones(2), 1 - self.rank)

    def test_both_receive_from_any_rank(self):
        self.init()
        dist.recv(torch.ones(2))

    def test_both_wait_on_irecv(self):
        # The wait on a request, not the call, is where each rank blocks.
        self.init()
        dist.irecv(torch.ones(2), 1 - self.rank).wait()

    def test_collectives_differ(self):
        # Call #1 of the default group: an all_reduce on rank 0, a broadcast
        # from rank 0 on rank 1 (it waits for its root, which waits for it).
        self.init()
        t = torch.ones(2)
        if self.rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)

    def test_collectives_differ_under_futures(self):
        # The same, each rank waiting on its call's future, not its Work.
        self.init()
        t = torch.ones(2)
        if self.rank == 0:
            dist.all_reduce(t, async_op=True).get_future().wait()
        else:
            dist.broadcast(t, src=0, async_op=True).get_future().wait()

    def test_async_roots_differ(self):
        # Broadcast #1 from each rank itself, each waited on through its Work.
        self.init()
        dist.broadcast(torch.ones(2), src=self.rank, async_op=True).wait()

    def test_wide_cycle_of_waits(self):
        # 0 waits for 1's send, 1 for 2's, 2 in a barrier that 0 and 1 never
        # reach; 3 waits in the barrier too (a consequence, not in the cycle).
        self.init()
        if self.rank < 2:
            dist.recv(torch.ones(2), self.rank + 1)
        else:
            dist.barrier()

    def test_kill_own_process_group(self):
        if self.rank == 1:
            os.killpg(0, signal.SIGKILL)  # the rank's group, not the test process's
        stuck_in_a_helper()  # until stopped: the test fails fast


#: A sleep no other test starts: found by its command line.
LEFT_SLEEP = "297.125"


def started(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` runs its command (its report names it by it)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(proc.pid).cmdline() == ["sleep", LEFT_SLEEP]:
                return
        except psutil.Error:
            return
        time.sleep(0.01)


def sleeps_left() -> list[int]:
    """Processes running ``sleep LEFT_SLEEP``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["cmdline"] == ["sleep", LEFT_SLEEP] and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


class HostileAssertion(AssertionError):
    """An assertion whose text cannot be made."""

    def __str__(self):
        raise RuntimeError("__str__ is broken")


def _init_gloo(case: disttest.MultiProcessTestCase) -> None:
    store = dist.FileStore(case.file_name, case.world_size)
    dist.init_process_group("gloo", store=store, rank=case.rank, world_size=case.world_size)


class ProcessRunner(Behaviours, disttest.MultiProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init(self) -> None:
        _init_gloo(self)


class ThreadRunner(Behaviours, disttest.MultiThreadedTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def init(self) -> None:
        pass  # each thread already has its threaded default group


class PoolRunner(Behaviours, disttest.MultiProcContinousTest):
    @classmethod
    def backend_str(cls):
        return "gloo"

    def init(self) -> None:
        pass  # the pool made the class's group


RUNNERS = (ProcessRunner, ThreadRunner, PoolRunner)
PROCESS_RUNNERS = (ProcessRunner, PoolRunner)
