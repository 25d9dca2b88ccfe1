"""Test classes that tests/test_checkpoint.py and tests/test_state_dict.py run
on disttest's runners. At module level so that the fork server can import
them by name. The assertions run in the ranks."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from disttest._runner.rank import run_dir as rank_run_dir
from disttest.bases.checkpoint import with_temp_dir
from disttest.bases.dtensor import (
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    with_comms,
)
from disttest.bases.state_dict import VerifyStateDictMixin
from disttest.runners.multiprocess import DistributedTestBase

#: The file into which rank 0 of ``Crashing`` writes its temp dir's path.
PROBE_ENV = "DISTTEST_TEST_CKPT_PROBE"


def check_shared(case):
    """Every rank holds the same existing ``temp_dir``; what rank 0 writes
    there, rank 1 reads."""
    paths = [None] * case.world_size
    dist.all_gather_object(paths, case.temp_dir)
    assert len(set(paths)) == 1, paths
    assert os.path.isdir(case.temp_dir), case.temp_dir
    if case.rank == 0:
        with open(os.path.join(case.temp_dir, "note"), "w") as f:
            f.write("from rank 0")
    dist.barrier()
    with open(os.path.join(case.temp_dir, "note")) as f:
        assert f.read() == "from rank 0"
    dist.barrier()  # rank 0's remove waits for every reader anyway; keep it explicit


def check_removed(case):
    """with_temp_dir removes the directory when the body passes and when it
    raises, in every rank, before it returns."""
    seen = []

    def body(self):
        seen.append(self.temp_dir)
        check_shared(self)

    with_temp_dir(body)(case)
    assert not os.path.exists(seen[-1]), seen

    def failing(self):
        seen.append(self.temp_dir)
        raise ValueError("body")

    try:
        with_temp_dir(failing)(case)
    except ValueError:
        pass
    else:
        raise AssertionError("with_temp_dir swallowed the body's error")
    # A rank process leaves it to its run's directory (a peer may still
    # write there), which the test process removes at the test's end.
    in_a_run = rank_run_dir()
    assert os.path.exists(seen[-1]) == (in_a_run is not None), (seen, in_a_run)
    assert in_a_run is None or seen[-1].startswith(in_a_run), (seen, in_a_run)
    assert seen[0] != seen[1]


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class Checkpoints(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @with_temp_dir
    def test_dcp_roundtrip(self):
        check_shared(self)
        mesh = self.build_device_mesh()
        full = torch.arange(32.0).reshape(8, 4)
        state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "step": torch.tensor(7), "extra": [1, 2]}
        dcp.save(state, checkpoint_id=self.temp_dir)
        assert os.path.isfile(os.path.join(self.temp_dir, ".metadata"))
        loaded = {"w": distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)]), "step": torch.tensor(0),
                  "extra": None}
        dcp.load(loaded, checkpoint_id=self.temp_dir)
        assert isinstance(loaded["w"], DTensor)
        self.assertEqual(loaded["w"].full_tensor(), full)
        self.assertEqual(loaded["w"].to_local(), full[self.rank * 4:(self.rank + 1) * 4])
        self.assertEqual(loaded["step"], torch.tensor(7))
        self.assertEqual(loaded["extra"], [1, 2])

    @with_comms
    def test_removed(self):
        check_removed(self)


class FailsOnRankZero(DTensorTestBase):
    """Rank 0 fails in the body while rank 1 still writes to the directory."""

    @property
    def world_size(self):
        return 2

    @with_comms
    @with_temp_dir
    def test_rank_zero_fails(self):
        if self.rank == 0:
            raise AssertionError("rank 0's own failure")
        import time

        time.sleep(0.3)  # (rank 0 has failed by now)
        with open(os.path.join(self.temp_dir, "late"), "w") as f:
            f.write("rank 1")
        dist.barrier()


class Crashing(DTensorTestBase):
    """Both ranks die inside the body: no cleanup of with_temp_dir runs."""

    @property
    def world_size(self):
        return 2

    @with_comms
    @with_temp_dir
    def test_crash(self):
        if self.rank == 0:
            with open(os.environ[PROBE_ENV], "w") as f:
                f.write(self.temp_dir)
        dist.barrier()
        os._exit(3)


class FakeRanks(DTensorTestBase):
    """Ranks over the fake group: a broadcast reaches no peer."""

    @property
    def world_size(self):
        return 2

    @with_comms(backend="fake")
    @with_temp_dir
    def test_own_dir(self):
        assert dist.get_backend() == "fake"
        assert os.path.isdir(self.temp_dir), repr(self.temp_dir)
        assert self.temp_dir.startswith(rank_run_dir()), (self.temp_dir, rank_run_dir())


class PlainProcesses(DistributedTestBase):
    @property
    def world_size(self):
        return 2

    def test_shared_and_removed(self):
        self.create_pg("cpu")
        check_removed(self)


class Threads(DTensorOpTestBase):
    @property
    def world_size(self):
        return 2

    @with_temp_dir
    def test_shared(self):
        check_shared(self)

    def test_removed(self):
        check_removed(self)


class Pool(DTensorContinuousTestBase):
    world_size = 2

    @with_temp_dir
    def test_shared(self):
        check_shared(self)

    def test_removed(self):
        check_removed(self)


class StateDicts(VerifyStateDictMixin, DTensorTestBase):
    """FSDP2 over 2 gloo ranks against the same model in one process."""

    @property
    def world_size(self):
        return 2

    def _trained(self):
        model = mlp()
        dist_model = fully_shard(copy.deepcopy(model))
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        dist_optim = torch.optim.Adam(dist_model.parameters(), lr=0.1)
        torch.manual_seed(1)  # the same batch in every rank
        batch = torch.randn(4, 8)
        for _ in range(2):
            for m, o in ((model, optim), (dist_model, dist_optim)):
                m(batch).sum().backward()
                o.step()
                o.zero_grad()
        return model, optim, dist_model, dist_optim

    @with_comms
    def test_verify(self):
        model, optim, dist_model, dist_optim = self._trained()
        dist_msd = get_model_state_dict(dist_model)
        assert isinstance(dist_msd["0.weight"], DTensor)
        self._verify_msd(model.state_dict(), dist_msd)
        dist_osd = get_optimizer_state_dict(dist_model, dist_optim)
        self._verify_osd(model, optim, optim.state_dict(), dist_osd)
        self._verify_osd_by_load(model, optim, torch.optim.Adam(model.parameters(), lr=0.1), dist_osd)

    @with_comms
    def test_sharded_tensor(self):
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec

        spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"])
        st = sharded_tensor.full(spec, (4, 2), fill_value=3.0)
        self._compare_tensor(torch.full((4, 2), 3.0), st)
        with self.assertRaisesRegex(AssertionError, "ShardedTensor, gathered: shape \\(4, 2\\)"):
            self._compare_tensor(torch.zeros(4, 2), st)

    @with_comms
    def test_mismatch(self):
        model, optim, dist_model, dist_optim = self._trained()
        dist_msd = get_model_state_dict(dist_model)
        if self.rank == 1:  # one shard of one rank differs: every rank sees it in the gathered tensor
            dist_msd["2.bias"].to_local().add_(1.0)
        with self.assertRaisesRegex(AssertionError, "2.bias has mismatched value"):
            self._verify_msd(model.state_dict(), dist_msd)
        dist_osd = get_optimizer_state_dict(dist_model, dist_optim)
        dist_osd["state"]["0.weight"]["exp_avg"].to_local().mul_(2.0)
        with self.assertRaisesRegex(AssertionError, "not close"):
            self._verify_osd(model, optim, optim.state_dict(), dist_osd)

    @with_comms
    @with_temp_dir
    def test_dcp_roundtrip_verified(self):
        model, _, dist_model, _ = self._trained()
        dcp.save(get_model_state_dict(dist_model), checkpoint_id=self.temp_dir)
        fresh = fully_shard(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
        restored = get_model_state_dict(fresh)
        with self.assertRaises(AssertionError):  # not yet loaded
            self._verify_msd(model.state_dict(), restored)
        dcp.load(restored, checkpoint_id=self.temp_dir)
        set_model_state_dict(fresh, restored)
        self._verify_msd(model.state_dict(), get_model_state_dict(fresh))
