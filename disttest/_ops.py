"""The names of torch.distributed's communication operations, as torch spells
them: what disttest tracks in ranks and where faults can be declared. No
imports: every part of disttest can use it."""

from __future__ import annotations

__unittest = True

__all__ = ["COLLECTIVES", "P2P_OPS", "RENDEZVOUS_OPS"]

#: Collectives that wait for peers, as ``torch.distributed`` spells them.
COLLECTIVES = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "scatter", "gather", "barrier", "monitored_barrier", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list",
    "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base",
    "_reduce_scatter_base", "all_gather_single", "reduce_scatter_single",
)
#: Point-to-point operations.
P2P_OPS = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
#: Collective set-up: every rank must take part, so a peer that leaves breaks
#: it; counted apart, so collective numbers read as the user counts them.
RENDEZVOUS_OPS = ("init_process_group", "new_group")
