"""Where the names of torch's private testing modules live in disttest (no
dependency: the command reads it before it knows libcst is there)."""

from __future__ import annotations

__unittest = True

__all__ = ["FALLBACK", "HOMES", "ONLY", "PREFIX", "RPC_FIXTURES", "RPC_SUITES"]

PREFIX = "torch.testing._internal"
#: The disttest module to look in first for the names of each upstream module
#: (after it, ``disttest``); modules not listed look in ``disttest`` only.
HOMES = {
    "common_distributed": "disttest",
    "dist_utils": "disttest",
    "distributed.distributed_utils": "disttest",
    "distributed.fake_pg": "disttest",
    "distributed.multi_threaded_pg": "disttest",
    "distributed.distributed_test": "disttest",
    "distributed._tensor.common_dtensor": "disttest.bases.dtensor",
    "common_fsdp": "disttest.bases.fsdp",
    "common_dist_composable": "disttest.bases.composable",
    "distributed.checkpoint_utils": "disttest.bases.checkpoint",
    "distributed.common_state_dict": "disttest.bases.state_dict",
    "distributed._shard.sharded_tensor": "disttest.bases.sharded_tensor",
    "distributed._shard.sharded_tensor._test_st_common": "disttest.bases.sharded_tensor",
    "distributed._shard.sharded_tensor._test_ops_common": "disttest.bases.sharded_tensor",
    "distributed._shard.test_common": "disttest.bases.sharded_tensor",
}
#: Where a name is looked for after its module's home, in this order.
FALLBACK = ("disttest", "disttest.bases.dtensor", "disttest.bases.fsdp")
#: Upstream modules of which only some names move (the rest of common_utils
#: is upstream's general test framework, which disttest does not replace).
ONLY = {
    "common_utils": {"find_free_port", "retry_on_connect_failures", "skip_but_pass_in_sandcastle",
                     "skip_but_pass_in_sandcastle_if", "run_tests"},
}

#: Upstream's RPC agent fixtures. disttest has its own, but upstream's RPC
#: suites derive from upstream's fixture: a file that keeps a suite keeps its
#: fixtures too (mixed, the test classes stay abstract and nothing runs).
RPC_FIXTURES = {
    "distributed.rpc.rpc_agent_test_fixture",
    "distributed.rpc.faulty_rpc_agent_test_fixture",
    "distributed.rpc.tensorpipe_rpc_agent_test_fixture",
}
#: Where upstream's RPC suites live (module names, or their packages with a dot).
RPC_SUITES = ("distributed.rpc.", "distributed.rpc_utils", "distributed.ddp_under_dist_autograd_test",
              "distributed.nn.api.")
