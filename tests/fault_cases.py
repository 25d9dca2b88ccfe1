"""Test bodies with injected faults, one class per runner.

tests/test_faults.py runs each body under the runners it applies to. At
module level (not a test_*.py file) so that the fork server can import the
classes by name and pytest does not collect them.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

# Bound by name before any test (the functional collectives are wrapped later, in the ranks).
from torch.distributed._functional_collectives import all_reduce as funcol_all_reduce
from torch.distributed._functional_collectives import wait_tensor as funcol_wait_tensor

import disttest
from disttest import InjectedFault, inject_fault


def _init_gloo(case) -> None:
    store = dist.FileStore(case.file_name, case.world_size)
    dist.init_process_group("gloo", rank=case.rank, world_size=case.world_size, store=store)
    # NB: gloo's init returns on one rank while a peer may still be connecting;
    # a rank killed at its first collective would break the peer's init. Meet
    # through the store (not a collective: fault counts stay as the tests say).
    store.add("initialized", 1)
    deadline = time.monotonic() + 30
    while int(store.add("initialized", 0)) < case.world_size and time.monotonic() < deadline:
        time.sleep(0.005)


def _funcol():
    import torch.distributed._functional_collectives as funcol

    return funcol


def _plain_decorator(func):
    def wrapper(self):  # NB: no functools.wraps: the runner cannot see the faults below
        return func(self)
    return wrapper


class FaultBodies:
    rank: int
    _testMethodName: str
    world_size = 2

    @property
    def timeout(self) -> float:
        return 2 if "hang" in self._testMethodName else 30

    def init(self) -> None:
        raise NotImplementedError

    @inject_fault(rank=1, action="kill", at="all_reduce", nth=2)
    def test_kill_survived(self):
        self.init()
        t = torch.ones(2)
        dist.all_reduce(t)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            survived = True  # the peer is gone: a fault-tolerant loop goes on
        else:
            survived = False
        self.assertTrue(survived, f"rank {self.rank}: the second all_reduce completed")

    def test_hang_in_fuzzed_calls(self):
        # (run under DISTTEST_CHAOS: its delays add up until the limit ends the test)
        self.init()
        t = torch.ones(1)
        while True:
            dist.all_reduce(t)

    @inject_fault(rank=1, action="kill", at="all_reduce", nth=1)
    def test_kill_survivor_takes_its_time(self):
        self.init()
        try:
            dist.all_reduce(torch.ones(2))
        except RuntimeError:
            time.sleep(1.0)  # longer than the fail-fast grace: an expected death does not stop it
            return
        self.fail("all_reduce completed")

    @inject_fault(rank=1, action="exit", at="all_reduce", nth=1)
    def test_exit_survived(self):
        self.init()
        t = torch.ones(2)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            return
        self.fail(f"rank {self.rank}: all_reduce completed")

    @inject_fault(rank=1, action="kill", at="all_reduce", nth=1)
    def test_kill_not_handled(self):
        self.init()
        dist.all_reduce(torch.ones(2))

    @inject_fault(rank=1, action="raise", at="all_reduce", nth=1)
    def test_raise_retried(self):
        self.init()
        t = torch.full((2,), float(self.rank + 1))
        retries = 0
        while True:
            try:
                dist.all_reduce(t)
                break
            except InjectedFault as e:
                self.assertEqual((e.rank, e.op, e.nth), (1, "all_reduce", 1))
                retries += 1
        self.assertEqual(t, torch.full((2,), 3.0))
        self.assertEqual(retries, 1 if self.rank == 1 else 0)

    @inject_fault(rank=1, action="raise", at="barrier", nth=1)
    def test_raise_not_handled(self):
        self.init()
        dist.barrier()

    @inject_fault(rank=1, action="hang", at="barrier", nth=1)
    def test_hang(self):
        self.init()
        dist.barrier()

    @inject_fault(rank=0, action="delay", at="barrier", nth=2, seconds=0.6)
    def test_delay(self):
        self.init()
        dist.barrier()
        start = time.monotonic()
        dist.barrier()
        waited = time.monotonic() - start
        self.assertGreaterEqual(waited, 0.5, f"rank {self.rank} waited {waited:.2f}s")

    # Functional collectives (DTensor's, tensor parallel's) reach the group
    # from C++, past torch.distributed's functions: faults see them too.
    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_functional_raise(self):
        self.init()
        funcol = _funcol()
        try:
            got = funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        except InjectedFault:  # a fresh call, which rank 0's first one meets
            self.assertEqual(self.rank, 1)
            got = funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        self.assertEqual(got, torch.full((2,), 2.0))

    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_functional_bound_by_name(self):
        # (the names kept the unwrapped functions: "never fired ... made 0 all_reduce calls")
        self.init()
        try:
            got = funcol_wait_tensor(funcol_all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        except InjectedFault:
            self.assertEqual(self.rank, 1)
            got = funcol_wait_tensor(funcol_all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        self.assertEqual(got, torch.full((2,), 2.0))

    @inject_fault(rank=1, action="corrupt", at="all_gather_into_tensor")
    def test_functional_corrupt(self):
        self.init()
        funcol = _funcol()
        gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        got = gather(torch.ones(2), 0, dist.group.WORLD)  # (not waited: the fault waits for it)
        if self.rank == 1:
            self.assertTrue(bool((got != torch.ones(4)).all()), f"not every element changed: {got}")
        else:
            self.assertEqual(got, torch.ones(4))

    @inject_fault(rank=1, action="kill", at="all_gather_into_tensor")
    def test_functional_kill_in_dtensor(self):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        self.init()
        mesh = init_device_mesh("cpu", (2,))
        d = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        d.redistribute(mesh, [Replicate()]).to_local()  # rank 0 fails here: its peer is gone

    @inject_fault(rank=1, action="corrupt", at="all_reduce", nth=1)
    def test_corrupt(self):
        self.init()
        floats = torch.tensor([0.0, -0.0, 1.0, -2.5, 1e30])
        ints = torch.arange(-3, 3)
        dist.all_reduce(floats)  # the first all_reduce: corrupted on rank 1
        dist.all_reduce(ints)
        want_f = torch.tensor([0.0, -0.0, 1.0, -2.5, 1e30]) * 2
        if self.rank == 1:
            self.assertTrue(bool((floats != want_f).all()), f"not every element changed: {floats}")
        else:
            self.assertEqual(floats, want_f)
        self.assertEqual(ints, torch.arange(-3, 3) * 2)

    @inject_fault(rank=1, action="corrupt")  # at="any": the first collective is a barrier
    def test_corrupt_lands_on_a_barrier(self):
        self.init()
        dist.barrier()
        dist.all_reduce(torch.ones(2))

    @inject_fault(rank=[0, 1], action="kill", at="all_reduce")
    def test_every_rank_killed(self):
        self.init()
        dist.all_reduce(torch.ones(2))
        self.fail("never reached: every rank dies first")

    @inject_fault(rank=[0, 1], action="kill", at="all_reduce", ends_test=True)
    def test_every_rank_killed_as_declared(self):
        self.init()
        dist.all_reduce(torch.ones(2))

    @inject_fault(rank=1, action="kill", at="all_reduce")
    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_two_faults_on_one_call(self):
        self.init()
        dist.all_reduce(torch.ones(2))

    @inject_fault(rank=1, action="kill", at="all_reduce", nth=5)
    def test_unfired(self):
        self.init()
        dist.all_reduce(torch.ones(1))

    @inject_fault(rank=1, action="corrupt", at="irecv")
    @inject_fault(rank=1, action="corrupt", at="batch_isend_irecv")
    def test_corrupt_asynchronous_p2p_as_the_test_waits(self):
        self.init()
        peer = 1 - self.rank
        if self.rank == 0:
            time.sleep(0.2)  # rank 1's values arrive after its call returned
        got = torch.zeros(3)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), 7.0), peer),
                                        dist.P2POp(dist.irecv, got, peer)])
        for work in works:
            work.wait()
        # An irecv posted before the send its peer waits for: the values
        # change at the test's wait, never by a wait of disttest's before it.
        late = torch.zeros(2)
        if self.rank == 1:
            work = dist.irecv(late, src=0)
            dist.send(torch.ones(2), dst=0)
            work.wait()
            self.assertTrue(bool((got != 7.0).all()), f"batch_isend_irecv not corrupted: {got}")
            self.assertTrue(bool((late != 3.0).all()), f"irecv not corrupted: {late}")
        else:
            dist.recv(late, src=1)
            dist.send(torch.full((2,), 3.0), dst=1)
            self.assertEqual(got, torch.full((3,), 7.0))

    @inject_fault(rank=0, action="corrupt", at="broadcast")
    def test_corrupt_at_a_broadcasts_source(self):
        self.init()
        dist.broadcast(torch.ones(2), src=0)  # rank 0 sends: it receives nothing

    @inject_fault(rank=1, action="raise", at="any")
    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_two_faults_meet_on_one_call(self):
        self.init()
        dist.all_reduce(torch.ones(1))

    @_plain_decorator
    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_a_fault_a_decorator_hides(self):
        self.init()
        dist.all_reduce(torch.ones(1))

    @inject_fault(rank=2, action="kill", at="all_reduce")
    def test_a_fault_outside_the_world(self):
        self.init()
        dist.all_reduce(torch.ones(1))

    def test_plain(self):
        self.init()
        t = torch.ones(2)
        dist.all_reduce(t)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 4.0))


class ProcessFaults(FaultBodies, disttest.MultiProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init(self) -> None:
        _init_gloo(self)


class ThreadFaults(FaultBodies, disttest.MultiThreadedTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def init(self) -> None:
        pass  # each thread already has its threaded default group

    @inject_fault(rank=1, action="corrupt", at="all_gather")
    @inject_fault(rank=1, action="corrupt", at="broadcast")
    @inject_fault(rank=1, action="corrupt", at="irecv")
    def test_corrupt_outputs_of_other_collectives(self):
        parts = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        dist.all_gather(parts, torch.full((2,), self.rank, dtype=torch.int64))
        flag = torch.tensor([True, False])
        dist.broadcast(flag, src=0)
        if self.rank == 0:
            dist.send(torch.full((3,), 5.0), dst=1)
            self.assertEqual(parts, [torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)])
            self.assertEqual(flag.tolist(), [True, False])
            return
        got = torch.zeros(3)
        work = dist.irecv(got, src=0)
        work.wait()
        self.assertEqual(parts, [torch.full((2,), -1), torch.full((2,), -2)])  # ~0, ~1
        self.assertEqual(flag.tolist(), [False, True])
        self.assertTrue(bool((got != 5.0).all()), got)


class PoolFaults(FaultBodies, disttest.MultiProcContinousTest):
    """The bodies in a pool (each test run alone, by name)."""

    timeout = 4

    @classmethod
    def backend_str(cls):
        return "gloo"

    def init(self) -> None:
        pass  # the class's group


class PoolHeals(disttest.MultiProcContinousTest):
    """A kill in test 1; test 2 runs on a whole group again."""

    timeout = 30

    @classmethod
    def backend_str(cls):
        return "gloo"

    @inject_fault(rank=1, action="kill", at="all_reduce", nth=1)
    def test_1_kill(self):
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError:
            pass

    def test_2_whole_group(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((1,), 2.0))


class SubgroupBodies:
    """Rank 3 of 4 dies; a group without it goes on, as gloo's does."""

    rank: int
    world_size = 4
    timeout = 20

    def init(self) -> None:
        raise NotImplementedError

    @inject_fault(rank=3, action="kill", at="barrier")
    def test_a_group_without_the_dead_rank_goes_on(self):
        self.init()
        pair = dist.new_group([0, 1])
        if self.rank == 3:
            dist.barrier()  # dies here
        if self.rank in (0, 1):
            time.sleep(0.3)  # after the death
            t = torch.ones(1)
            dist.all_reduce(t, group=pair)
            self.assertEqual(t.item(), 2.0)


class SubgroupProcesses(SubgroupBodies, disttest.MultiProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init(self) -> None:
        _init_gloo(self)


class SubgroupThreads(SubgroupBodies, disttest.MultiThreadedTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def init(self) -> None:
        pass


class PoolForgets(disttest.MultiProcContinousTest):
    """Test 2's rank 1 fails in setUp, so it is never armed: what test 1's
    rank 1 recorded is not test 2's."""

    timeout = 10

    @classmethod
    def backend_str(cls):
        return "gloo"

    def setUp(self):
        super().setUp()
        if self._testMethodName == "test_2_setup_fails" and self.rank == 1:
            raise RuntimeError("setUp fails on rank 1")

    @inject_fault(rank=1, action="raise", at="all_reduce")
    def test_1_raise_retried(self):
        t = torch.ones(1)
        try:
            dist.all_reduce(t)
        except InjectedFault:
            dist.all_reduce(t)

    @inject_fault(rank=1, action="delay", at="all_reduce", seconds=0.01)
    def test_2_setup_fails(self):
        dist.all_reduce(torch.ones(1))


class ChaosThreads(disttest.MultiThreadedTestCase):
    """An ordering bug that schedule fuzzing finds: reading a tensor an
    irecv fills before waiting on it. On an idle machine rank 0's send comes
    first (rank 1 is busy for 20 ms), so the value happens to be there."""

    world_size = 2
    timeout = 30

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_read_before_wait(self):
        if self.rank == 0:
            dist.send(torch.full((4,), 7.0), dst=1)
        else:
            time.sleep(0.02)  # some local work first
            t = torch.zeros(4)
            work = dist.irecv(t, src=0)
            seen = t.clone()  # BUG: read before work.wait()
            work.wait()
            self.assertEqual(seen, torch.full((4,), 7.0))

    def test_functional_calls_are_fuzzed(self):
        # (DTensor's collectives: they reach the group from C++)
        from disttest.faults import rank as faults_rank

        funcol = _funcol()
        for _ in range(3):
            funcol.wait_tensor(funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD))
        self.assertEqual(faults_rank._local.state.counts.get("all_reduce"), 3)

    def test_read_after_wait(self):
        if self.rank == 0:
            dist.send(torch.full((4,), 7.0), dst=1)
        else:
            time.sleep(0.02)
            t = torch.zeros(4)
            dist.irecv(t, src=0).wait()
            self.assertEqual(t.clone(), torch.full((4,), 7.0))


class ThreadDelayPastTheLimit(disttest.MultiThreadedTestCase):
    """An injected delay longer than the test's limit: the rank thread is
    stopped in it at the limit, as in a hang."""

    world_size = 2
    timeout = 1

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    @inject_fault(rank=1, action="delay", at="all_reduce", seconds=30)
    def test_delay(self):
        dist.all_reduce(torch.ones(1))


class ThreadBroadcastSubgroup(disttest.MultiThreadedTestCase):
    """A functional broadcast's ``src`` is a rank of its group: in the
    subgroup [1, 2, 3], src 1 is global rank 2, and rank 1 receives."""

    world_size = 4
    timeout = 30

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    @inject_fault(rank=[0, 1], action="corrupt", at="broadcast")
    def test_corrupt_a_receiver(self):
        funcol = _funcol()
        sub = dist.new_group([1, 2, 3])
        if self.rank in (1, 2, 3):  # rank 1's broadcast #1: it receives from global rank 2
            got = funcol.wait_tensor(funcol.broadcast(torch.full((2,), float(self.rank)), 1, sub))
            self.assert_corrupted_on(1, got, 2.0)
        # Rank 0's broadcast #1, from rank 1 (the default root would be rank 0).
        got = funcol.wait_tensor(funcol.broadcast(torch.full((2,), float(self.rank)), 1, dist.group.WORLD))
        self.assert_corrupted_on(0, got, 1.0)

    def assert_corrupted_on(self, rank, got, value):
        if self.rank == rank:
            self.assertTrue(bool((got != torch.full((2,), value)).all()), f"not every element changed: {got}")
        else:
            self.assertEqual(got, torch.full((2,), value))
