"""DTensor and FSDP test classes that tests/test_dtensor.py and
tests/test_fsdp.py run. At module level so that the fork server can import
them by name. The assertions run in the ranks."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from disttest.bases.dtensor import (
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    with_comms,
)
from disttest.bases.fsdp import (
    MLP,
    FSDPTest,
    FSDPTestContinuous,
    FSDPTestMultiThread,
    check_sharded_parity,
    patch_all_reduce,
)


def shard_roundtrip(case, mesh):
    t = torch.arange(16.0).reshape(8, 2)
    dt = distribute_tensor(t, mesh, [Shard(0)])
    n = 8 // case.world_size
    case.assertEqual(dt.to_local(), t[case.rank * n:(case.rank + 1) * n])
    case.assertEqual(dt.redistribute(mesh, [Replicate()]).to_local(), t)


def backend_of(case):
    # The local-tensor copy of a class runs over the fake group.
    return "fake" if case.is_local_tensor_enabled else "gloo"


class Processes(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_bare(self):
        assert dist.get_backend() == backend_of(self) and dist.get_world_size() == 2
        shard_roundtrip(self, self.build_device_mesh())

    @with_comms(eager_init=True, backend="gloo")
    def test_with_arguments(self):
        assert dist.get_backend() == backend_of(self)
        shard_roundtrip(self, self.build_device_mesh())

    @with_comms()
    def test_op(self):
        self._test_op(self.build_device_mesh(), torch.add, torch.randn(4, 6), torch.randn(4, 6))

    @with_comms
    def test_op_mismatch(self):
        def wrong(x):
            return x * 2 if isinstance(x, DTensor) else x

        self._test_op(self.build_device_mesh(), wrong, torch.ones(4, 2))

    @with_comms
    def test_fails_on_rank_1(self):
        dt = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(), [Shard(0)])
        self.assertEqual(dt.full_tensor().sum().item(), 16.0 if self.rank == 0 else 15.0)

    @with_comms(backend="nccl")
    def test_nccl(self):
        raise AssertionError("a rank started on a host without enough GPUs")

    @with_comms(backend="mpi")
    def test_mpi(self):
        raise AssertionError("a rank started on a host without MPI")

    @with_comms(backend="ucc")
    def test_ucc(self):
        raise AssertionError("a rank ran a test whose backend with_comms does not take")

    @with_comms(backend=" GLOO ")
    def test_gloo_as_torch_reads_it(self):
        self.assertEqual(dist.get_backend(), "gloo")

    @with_comms
    def test_transformer_parallel_matches(self):
        from disttest.bases.dtensor import ModelArgs, Transformer

        for seq in (False, True):
            torch.manual_seed(0)
            model = Transformer(ModelArgs(dropout_p=0.0))
            reference = copy.deepcopy(model)
            # NB: torch 2.13 has no DTensor rule for CPU attention: local heads.
            Transformer.parallelize(model, self.build_device_mesh(), use_seq_parallel=seq,
                                    local_output_for_attn=True)
            tokens = torch.randint(0, 8, (2, 8))
            self.assertEqual(model(tokens), reference(tokens), atol=1e-5, rtol=1e-5)

    def test_dynamo_preloaded(self):
        import sys

        assert "torch._dynamo" in sys.modules, "the fork server did not preload torch._dynamo"

    def test_seed_for_rank(self):
        self.init_manual_seed_for_rank()
        self.assertEqual(torch.initial_seed(), self.rank)


class _FailsInFullTensor:
    """Issue 24: rank 2 fails while its peers are in ``full_tensor()``; with_comms
    destroys rank 2's group as it leaves, which breaks their all_gather
    before rank 2 has reported. One cause (rank 2), whatever the timing."""

    @with_comms
    def test_rank_2_fails_in_full_tensor(self):
        mesh = self.build_device_mesh()
        d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
        if self.rank == 2:
            self.assertEqual(self.rank, 0, "rank 2 disagrees")
        d.full_tensor()


class FourRanks(_FailsInFullTensor, DTensorTestBase):
    """The default world size (NUM_DEVICES: 4 on a CPU host)."""

    @with_comms
    def test_default_world(self):
        assert dist.get_world_size() == 4 == self.world_size
        shard_roundtrip(self, self.build_device_mesh())


class Pool(DTensorContinuousTestBase):
    world_size = 2

    @with_comms
    def test_a_with_comms(self):
        assert dist.is_initialized()
        shard_roundtrip(self, self.build_device_mesh())

    def test_b_fails(self):
        self.assertEqual(self.rank, 1, "rank 0 disagrees")

    def test_c_still_runs(self):
        self.assertEqual(self.device_type, "cpu")
        shard_roundtrip(self, self.build_device_mesh())


class FourRanksPool(_FailsInFullTensor, DTensorContinuousTestBase):
    world_size = 4


class FourThreads(_FailsInFullTensor, DTensorOpTestBase):
    @property
    def world_size(self):
        return 4


class Threads(DTensorOpTestBase):
    @property
    def world_size(self):
        return 2

    def test_roundtrip(self):
        shard_roundtrip(self, self.build_device_mesh())

    @with_comms
    def test_with_comms_keeps_the_group(self):
        assert dist.is_initialized() and dist.get_backend() == "threaded"
        shard_roundtrip(self, self.build_device_mesh())

    def test_fails_on_rank_0(self):
        self.assertEqual(self.rank, 1, "rank 0 disagrees")


# --- FSDP -------------------------------------------------------------------------


def _subtests_in_order(case, seen):
    case.run_subtests({"a": [1, 2], "b": ["x"]}, lambda a, b: seen.append((a, b)))
    case.assertEqual(seen, [(1, "x"), (2, "x")])


def _parity(case):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = MLP(8)
    ref = copy.deepcopy(model)
    fully_shard(model)
    torch.manual_seed(case.rank + 1)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    ref(x).sum().backward()
    for p in ref.parameters():
        dist.all_reduce(p.grad)
        p.grad /= case.world_size
    check_sharded_parity(case, ref, model)
    with torch.no_grad():
        ref.in_proj.weight.add_(1)
    with case.assertRaisesRegex(AssertionError, "parameter 'in_proj.weight' differs"):
        check_sharded_parity(case, ref, model)


class FsdpProcesses(FSDPTest):
    def test_group_and_subtests(self):
        assert dist.is_initialized() and self.process_group.size() == self.world_size == 2
        import sys

        assert "torch._dynamo" in sys.modules, "the fork server did not preload torch._dynamo"
        _subtests_in_order(self, [])

    def test_parity(self):
        _parity(self)

    def test_failing_subtest(self):
        def check(a):
            self.assertNotEqual((a, self.rank), (2, 1), "subtest a=2 fails on rank 1")

        self.run_subtests({"a": [1, 2]}, check)


class FsdpThreads(FSDPTestMultiThread):
    def test_subtests(self):
        _subtests_in_order(self, [])

    def test_patch_all_reduce(self):
        orig = dist.all_reduce
        PATCH_CALLS[self.rank] = 0
        with patch_all_reduce(_counting_all_reduce):
            assert dist.all_reduce is _counting_all_reduce
            dist.all_reduce(torch.ones(3))
        assert dist.all_reduce is orig
        self.assertEqual(PATCH_CALLS[self.rank], 1)
        try:
            with patch_all_reduce(_counting_all_reduce):
                raise KeyError("body")
        except KeyError:
            pass
        assert dist.all_reduce is orig, "not restored after the body raised"


PATCH_CALLS: dict[int, int] = {}
_ORIG_ALL_REDUCE = dist.all_reduce


def _counting_all_reduce(tensor, *args, **kwargs):
    # Shared by the rank threads: the patch is process-wide.
    PATCH_CALLS[dist.get_rank()] += 1
    return _ORIG_ALL_REDUCE(tensor, *args, **kwargs)


class FsdpPool(FSDPTestContinuous):
    def test_subtests(self):
        assert self.process_group is type(self).pg and self.process_group.size() == 2
        _subtests_in_order(self, [])

    def test_parity(self):
        _parity(self)


class FsdpFake(FSDPTest):
    fake_pg = True

    def test_fake_group(self):
        assert dist.get_backend() == "fake" and dist.get_world_size() == 2


class Hangs(DTensorTestBase):
    timeout = 2

    @property
    def world_size(self):
        return 2

    @with_comms
    def test_rank_1_skips_the_gather(self):
        dt = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(), [Shard(0)])
        if self.rank == 0:
            dt.full_tensor()  # an all-gather that rank 1 never joins
        else:
            import time

            time.sleep(30)


class HangsInADimOneGather(DTensorTestBase):
    timeout = 2

    @property
    def world_size(self):
        return 2

    @with_comms
    def test_rank_1_sleeps(self):
        # Shard(1) -> Replicate: the all-gather waits inside the functional call itself.
        dt = distribute_tensor(torch.ones(4, 4), self.build_device_mesh(), [Shard(1)])
        if self.rank == 0:
            dt.redistribute(dt.device_mesh, [Replicate()]).to_local().sum()
        else:
            import time

            for _ in range(300):
                time.sleep(0.1)


class Skips(DTensorTestBase):
    timeout = 60

    @property
    def world_size(self):
        return 2

    @with_comms
    def test_rank_1_skips_the_redistribute(self):
        dt = distribute_tensor(torch.arange(8.0), self.build_device_mesh(), [Shard(0)])
        if self.rank == 0:  # DTensor's all-gather, a functional collective (past torch.distributed's functions)
            dt.redistribute(dt.device_mesh, [Replicate()]).to_local().sum()
