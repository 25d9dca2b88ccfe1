"""MultiProcessTestCase classes that tests/test_multiprocess.py runs into a
recording result. At module level (not in test_*.py, so pytest does not
collect them) so that the fork server can import them by name."""

from __future__ import annotations

import datetime
import os
import resource
import signal
import sys
import time

import torch
import torch.distributed as dist

import disttest
from disttest import MultiProcessTestCase


def init_pg(case: MultiProcessTestCase) -> None:
    store = dist.FileStore(case.file_name, case.world_size)
    dist.init_process_group("gloo", store=store, rank=case.rank, world_size=case.world_size)


class Base(MultiProcessTestCase):
    timeout = 30

    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class Outcomes(Base):
    """Endings only processes have."""

    def test_os_exit_in_rank_1(self):
        if self.rank == 1:
            os._exit(3)

    def test_signal_in_rank_1(self):
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)

    def test_sys_exit_nonzero(self):
        if self.rank == 0:
            sys.exit(5)

    def test_os_exit_zero_in_rank_1(self):
        if self.rank == 1:
            os._exit(0)

    def test_sys_exit_zero_in_rank_1(self):
        if self.rank == 1:
            sys.exit(0)


def stuck_in_a_helper():
    time.sleep(60)


class Hangs(Base):
    timeout = 2

    def test_hang(self):
        if self.rank == 1:
            stuck_in_a_helper()

    def test_blocked_in_collective(self):
        init_pg(self)
        if self.rank == 0:
            dist.all_reduce(torch.ones(2))  # rank 1 never joins and never ends

        else:
            stuck_in_a_helper()

    def test_hang_in_a_cleanup(self):
        if self.rank == 1:
            self.addCleanup(time.sleep, 60)  # (no Python frame of the test's)

    def test_peer_fails_while_blocked(self):
        init_pg(self)
        if self.rank == 1:
            raise RuntimeError("rank 1 gives up")
        dist.all_reduce(torch.ones(2))


class GroupTimeout(Base):
    timeout = 20

    def hang_on(self, hung: set[int]) -> None:
        """A group whose calls time out after 2 s; the ``hung`` ranks hang
        outside it while the others all_reduce."""
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=2))
        if self.rank in hung:
            stuck_in_a_helper()
        dist.all_reduce(torch.ones(2))

    def test_group_times_out_for_a_hung_peer(self):
        self.hang_on({1})


class GroupTimeoutTwoHung(GroupTimeout):
    @property
    def world_size(self) -> int:
        return 3

    def test_group_times_out_for_two_hung_peers(self):
        self.hang_on({1, 2})


class DifferentCalls(Base):
    timeout = 3

    def test_all_reduce_against_broadcast(self):
        init_pg(self)
        if self.rank == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), src=1)


class UpstreamHooks(Base):
    """Subclasses that override _run as upstream's TestDistBackend does."""

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        init_pg(self)
        self.run_test(test_name, pipe)
        dist.barrier()
        dist.destroy_process_group()
        sys.exit(0)

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False

    def test_collective_after_custom_init(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.tensor([2.0]))

    def test_failure_in_custom_run(self):
        if self.rank == 0:
            self.assertEqual(1, 2)


class ReturnCodes(Base):
    def setUp(self) -> None:
        super().setUp()
        # As upstream suites do: the current test's unwrapped method.
        current = getattr(self, self._testMethodName).__wrapped__
        if self._testMethodName in ("test_exits_7", "test_rank_1_exits_7_rank_0_fails_later"):
            self.special_return_code_checks = {current: 7}
        else:
            self.skip_return_code_checks = [current]

    def test_exits_7(self):
        os._exit(7)

    def test_rank_1_exits_7_rank_0_fails_later(self):
        if self.rank == 1:
            os._exit(7)
        time.sleep(1.5)
        self.fail("rank 0's own check, after its peer's expected exit")

    def test_any_code(self):
        os._exit(self.rank + 40)


class NoSpawn(MultiProcessTestCase):
    def test_forgot_to_spawn(self):
        pass


class StartMethods(Base):
    def test_pass(self):
        init_pg(self)
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0))
        # The parallel op the fork trap is about.
        torch.ones(256, 256) @ torch.ones(256, 256)


class BadWorldSize(Base):
    @property
    def world_size(self) -> int:
        return -2  # (0 skips: tests/test_runners.py)

    def test_any(self):
        pass


class BadTimeout(Base):
    timeout = -3

    def test_any(self):
        pass


class Files(Base):
    def test_rendezvous_file_is_fresh(self):
        init_pg(self)
        sizes = [None]
        if self.rank == 0:
            sizes = [os.path.dirname(self.file_name)]
        dist.broadcast_object_list(sizes)
        self.assertTrue(os.path.isdir(sizes[0]))

    def test_rank_0_dies_holding_a_rank_temp_file(self):
        init_pg(self)
        with disttest.rank_temp_file() as name:
            if self.rank == 0:
                with open(os.environ["TELL_NAME_IN"], "w") as f:
                    f.write(name)
                os._exit(1)
            time.sleep(30)  # (rank 1: until the test ends)


class Devices(disttest.DistributedTestBase):
    timeout = 30

    @property
    def world_size(self) -> int:
        return 2

    def test_create_pg(self):
        pg = self.create_pg("cpu")
        self.assertEqual(pg.size(), 2)
        self.assertEqual(self.backend("cpu"), "gloo")
        self.assertEqual(self.backend("cuda:0"), "nccl")
        self.assertEqual(self.rank_to_device("cpu"), {0: [0], 1: [0]})
        self.assertEqual(os.environ["WORLD_SIZE"], "2")
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.tensor([3.0]))


class DynamoMulti(disttest.DynamoDistributedMultiProcTestCase):
    timeout = 120

    def test_compiled_allreduce(self):
        with disttest._dynamo_dist_per_rank_init(self.rank, self.world_size):
            @torch.compile(backend="eager")
            def step(x):
                x = x * 2
                dist.all_reduce(x)
                return x + 1

            out = step(torch.ones(3))
            self.assertEqual(out, torch.full((3,), 2.0 * self.world_size + 1))
            self.assertEqual(self.world_size, 2)



class Scheduled(Base):
    """``rank_scheduling``: the rank processes' scheduling policy."""

    def test_batch(self):
        assert os.sched_getscheduler(0) == os.SCHED_BATCH, os.sched_getscheduler(0)

    def test_normal(self):
        assert os.sched_getscheduler(0) == os.SCHED_OTHER, os.sched_getscheduler(0)

    def test_passes(self):
        pass


class Unbatched(Scheduled):
    rank_scheduling = "normal"


class OneRankGroups(Base):
    """A group of one rank of each backend torch lists, made in a rank with
    its own store (as PyTorch's test_c10d_common does in a world of one)."""

    @property
    def world_size(self) -> int:
        return 1

    def test_threaded(self):
        store = dist.FileStore(self.file_name + ".one-rank", 1)
        dist.init_process_group("threaded", rank=0, world_size=1, store=store)
        try:
            pg = dist.distributed_c10d._get_default_group()
            self.assertEqual((pg.rank(), pg.size(), pg.name()), (0, 1, "threaded"))
            t = torch.ones(2)
            dist.all_reduce(t)
            self.assertEqual(t, torch.ones(2))
        finally:
            dist.destroy_process_group()


class ClosedChannel(Base):
    """A rank whose test closes every descriptor above 2: its channel to the
    parent with them (its output, descriptors 1 and 2, stays)."""

    timeout = 20

    def test_closes_its_descriptors_then_fails(self):
        if self.rank == 1:
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            raise ValueError("rank 1's error, after closing its descriptors")


class Refusals(Base):
    """A call torch refuses on one rank (the rank's own argument error,
    raised before the call communicates), and what its peer does meanwhile."""

    timeout = 20

    def test_refused_then_peer_skips(self):
        init_pg(self)
        if self.rank == 0:
            dist.scatter(torch.ones(1), scatter_list=[torch.ones(1)], src=0)  # a list of 1 in a world of 2
        time.sleep(0.2)
        sys.exit(disttest.TEST_SKIPS["no_cuda"].exit_code)

    def test_refused_peer_passes(self):
        init_pg(self)
        if self.rank == 0:
            dist.broadcast(torch.ones(1), src=5)  # gloo: "invalid root rank: 5"

    def test_refused_by_c10d_then_peer_fails(self):
        init_pg(self)
        if self.rank == 0:
            dist.scatter(torch.zeros(1), scatter_list=None, src=0)  # c10d's own check: ValueError
        time.sleep(0.3)
        raise KeyError("rank 1's own error")


class ExpectedSignal(Base):
    """Upstream's watchdog tests: every rank aborts, as the test expects."""

    def setUp(self) -> None:
        super().setUp()
        self.special_return_code_checks = {self.test_aborts.__wrapped__: -signal.SIGABRT}

    def test_aborts(self):
        with open(os.environ["ABORT_LOG"], "a") as f:
            f.write(f"{self.rank}\n")
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (no core file, wherever the machine puts them)
        os.abort()
