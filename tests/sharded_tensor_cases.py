"""Sharded-tensor test classes that tests/test_sharded_tensor.py runs. At
module level so that the fork server can import them by name. The
assertions run in the ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import rpc
from torch.distributed._shard import shard_parameter, sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

from disttest.bases.sharded_tensor import (
    TEST_GPU_NUM,
    MyShardedModel1,
    ShardedTensorTestBase,
    SimpleMegatronLM,
    _chunk_sharding_specs_list_for_test,
    generate_chunk_sharding_specs_for_test,
    generate_enumerable_sharding_specs_for_test,
    generate_local_weight_sharding_params_for_test,
    with_comms,
)

CPU_ROWS = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"])


def check_local_chunk(case, st, spec, dim, size):
    """This rank's shard sits where the reference helper says."""
    (shard,) = st.local_shards()
    start, length = generate_local_weight_sharding_params_for_test(
        torch.empty(size), dim, case.world_size, spec, case.rank)
    case.assertEqual(shard.metadata.shard_offsets[dim], start)
    case.assertEqual(shard.tensor.size(dim), length)


class TwoRanks(ShardedTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms(backend="gloo")
    def test_rpc_and_gloo(self):
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 2
        assert rpc.get_worker_info().name == f"worker{self.rank}"
        torch.manual_seed(0)
        st = sharded_tensor.rand(CPU_ROWS, 10, 20, init_rrefs=True)
        self.assertEqual(st.local_shards()[0].tensor.size(), (5, 20))
        self.assertEqual(len(st.remote_shards()), 1)  # the other rank's, through RPC
        check_local_chunk(self, st, CPU_ROWS, 0, (10, 20))
        self.assert_sharded_tensor_equal(st, st)

    @with_comms(init_rpc=False, backend=None)
    def test_host_backend_without_rpc(self):
        assert dist.get_backend() == "gloo"
        with self.assertRaises(RuntimeError):
            rpc.get_worker_info()
        st = sharded_tensor.zeros(CPU_ROWS, 4, 3, init_rrefs=False)
        full = torch.zeros(4, 3) if self.rank == 0 else None
        st.gather(0, full)
        if self.rank == 0:
            self.assertEqual(full, torch.zeros(4, 3))

    @with_comms(backend="gloo")
    def test_unequal_sharded_tensors_fail(self):
        a = sharded_tensor.ones(CPU_ROWS, 4, 4, init_rrefs=True)
        b = sharded_tensor.ones(CPU_ROWS, 4, 4, init_rrefs=True)
        if self.rank == 1:
            b.local_shards()[0].tensor[0, 0] = 2.0
        self.assert_sharded_tensor_equal(a, b)

    @with_comms(init_rpc=False, backend="gloo")
    def test_models(self):
        model = MyShardedModel1(CPU_ROWS, init_rrefs=False)
        self.assertEqual(model.sharded_tensor1.size(), (10, 20))
        self.assertEqual(model.submodule.sharded_tensor2.local_shards()[0].tensor.size(), (5, 20))
        self.assertIsNone(MyShardedModel1().sharded_tensor1)

    @with_comms(init_rpc=False, backend="gloo")
    def test_model_on_missing_gpus_skips(self):
        MyShardedModel1(_chunk_sharding_specs_list_for_test([0])[0], init_rrefs=False)
        raise AssertionError("a sharded model was built on GPUs this host lacks")

    @with_comms(init_rpc=False, backend="gloo")
    def test_megatron_column_sharded(self):
        torch.manual_seed(0)
        model = SimpleMegatronLM([[6, 4], [4, 3]])
        full = model.fc1.weight.detach().clone()
        shard_parameter(model.fc1, "weight", CPU_ROWS)
        local, _ = model.get_weights()
        self.assertEqual(local, full[self.rank * 2:(self.rank + 1) * 2])

    @with_comms
    def test_nccl_default(self):
        raise AssertionError("a rank started on a host without enough GPUs")


class FourRanks(ShardedTensorTestBase):
    """upstream's world size (TEST_GPU_NUM) and specs, on CPU."""

    @with_comms(backend="gloo")
    def test_upstream_specs_on_cpu(self):
        assert dist.get_world_size() == TEST_GPU_NUM
        for spec in generate_chunk_sharding_specs_for_test(1, device="cpu"):
            st = sharded_tensor.rand(spec, 8, 10, init_rrefs=True)
            check_local_chunk(self, st, spec, 1, (8, 10))
            self.assertEqual(len(st.remote_shards()), 3)
        (spec,) = generate_enumerable_sharding_specs_for_test(device="cpu")
        st = sharded_tensor.ones(spec, 10, 10)
        (shard,) = st.local_shards()
        self.assertEqual(shard.metadata.shard_offsets, [[0, 0], [5, 0], [0, 5], [5, 5]][self.rank])
        for spec in _chunk_sharding_specs_list_for_test([0, 1], seed=3, device="cpu"):
            check_local_chunk(self, sharded_tensor.rand(spec, 12, 12), spec, spec.dim, (12, 12))
