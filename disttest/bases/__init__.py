"""Test bases for torch subsystems, under the names of upstream's modules:
the backend suite's ``TestDistBackend`` (``backend``, from
``distributed_test.py``), DTensor (``dtensor``, ``common_dtensor``), FSDP
(``fsdp``, ``common_fsdp``), RPC (``rpc``, ``dist_utils`` and the RPC
fixtures) and dynamo (``dynamo``), with their reference models.

Upstream's checkpoint, state-dict, sharded-tensor and composable bases join
this package as ``checkpoint``, ``state_dict``, ``sharded_tensor`` and
``composable``; a simulated-scale base as ``simulated``.

Layer: above the runners; only the tools, the plugin and ``disttest`` itself
import from here."""

__unittest = True
