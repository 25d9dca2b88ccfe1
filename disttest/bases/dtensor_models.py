"""The reference models of upstream's DTensor tests (``common_dtensor``).

Classes only at import: nothing is built, and the tensor-parallel styles
(torch's and the expert styles of :mod:`disttest.bases.dtensor_experts`) load
only when ``Transformer.parallelize`` runs. With ``ModelArgs.num_experts`` > 0
each block's feed-forward is an :class:`ExpertLayer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__unittest = True

__all__ = [
    "Attention",
    "ExpertLayer",
    "Experts",
    "FeedForward",
    "MLPModule",
    "MLPStacked",
    "ModelArgs",
    "RMSNormPython",
    "Transformer",
    "TransformerBlock",
]

NO_MESH = "Transformer.parallelize(tp_mesh=None, ep_mesh=None): give at least one of the two meshes (disttest)"
SEQ_EXPERTS = (
    "Transformer.parallelize(use_seq_parallel=True) on a model with experts (ModelArgs.num_experts={n}): "
    "the expert layers take no sequence-sharded input (upstream's plan fails in forward); "
    "use use_seq_parallel=False (disttest)"
)


class RMSNormPython(nn.Module):
    """RMSNorm in plain torch ops."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` divided by its root mean square over the last dimension (upstream's name: tests call it)."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x) * self.weight


class MLPModule(nn.Module):
    """10 -> 16 -> ReLU -> 10, seeded with 5 (the same weights on every rank)."""

    def __init__(self, device: Any, bias: bool = True) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.net1 = nn.Linear(10, 16, bias=bias, device=device)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10, bias=bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.net2(self.relu(self.net1(x))))

    def reset_parameters(self) -> None:
        self.net1.reset_parameters()
        self.net2.reset_parameters()


class MLPStacked(nn.Module):
    """``n_layers`` :class:`MLPModule` in a row."""

    def __init__(self, device: Any, n_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MLPModule(device) for _ in range(n_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass
class ModelArgs:
    """The toy transformer's sizes and switches."""

    n_layers: int = 2
    vocab_size: int = 8
    max_seq_len: int = 16
    dim: int = 16
    n_heads: int = 4
    dropout_p: float = 0.1
    use_attn_mask: bool = True
    weight_tying: bool = True
    checkpoint_activations: bool = False
    num_experts: int = 0


class Attention(nn.Module):
    """Multi-head causal self-attention (``scaled_dot_product_attention``)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.dim % args.n_heads != 0:
            raise ValueError(f"ModelArgs.dim={args.dim} is not a multiple of n_heads={args.n_heads} (disttest)")
        self.head_dim = args.dim // args.n_heads
        self.n_heads = args.n_heads
        self.dropout_p = args.dropout_p
        self.resid_dropout = nn.Dropout(args.dropout_p)
        self.use_attn_mask = args.use_attn_mask
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.size()

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x)), None,
            self.dropout_p if self.training else 0, self.use_attn_mask,
        )
        return cast(torch.Tensor, self.resid_dropout(self.wo(out.transpose(1, 2).reshape(bsz, seq_len, -1))))


class FeedForward(nn.Module):
    """dim -> hidden_dim -> GELU -> dim, with dropout."""

    def __init__(self, dim: int, hidden_dim: int, dropout_p: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(hidden_dim, dim)
        self.resid_dropout = nn.Dropout(dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.resid_dropout(self.w2(self.gelu(self.w1(x)))))


class Experts(nn.Module):
    """``num_experts`` GELU MLPs (dim -> hidden_dim -> dim) in two stacked
    weights, ``w1`` (experts, hidden_dim, dim) and ``w2`` (experts, dim,
    hidden_dim), initialised N(0, 0.02); every token goes through every
    expert and the outputs are summed.

    Input: (tokens, dim). Weights sharded into DTensors (by the expert
    styles) are used through their local shards, so each rank computes its
    own experts' (or hidden slice's) share.
    """

    def __init__(self, dim: int, hidden_dim: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.reset_parameters()
        self.gelu = nn.GELU()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w1, std=0.02)
        nn.init.normal_(self.w2, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        w1: torch.Tensor = self.w1
        w2: torch.Tensor = self.w2
        if isinstance(w1, DTensor):  # sharded by a style; x was dispatched by its hooks
            w1, w2 = w1.to_local(), cast(DTensor, w2).to_local()
        x_exp = x.unsqueeze(0).expand(w1.shape[0], -1, -1)
        h = self.gelu(torch.bmm(x_exp, w1.transpose(-2, -1)))
        return torch.bmm(h, w2.transpose(-2, -1)).sum(dim=0)


class ExpertLayer(nn.Module):
    """:class:`Experts` over (batch, seq, dim) input, their summed output
    divided by ``num_experts``."""

    def __init__(self, num_experts: int, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.experts = Experts(dim=dim, hidden_dim=hidden_dim, num_experts=num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, slen, dim = x.shape
        out = cast(torch.Tensor, self.experts(x.view(-1, dim))) / self.num_experts
        return out.view(bs, slen, dim)


class TransformerBlock(nn.Module):
    """LayerNorm, attention, LayerNorm, feed-forward (an :class:`ExpertLayer`
    when ``args.num_experts`` > 0), with residuals."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.has_experts = args.num_experts > 0
        if self.has_experts:
            self.expert_layer = ExpertLayer(args.num_experts, dim=args.dim, hidden_dim=4 * args.dim)
        else:
            self.feed_forward = FeedForward(args.dim, hidden_dim=4 * args.dim, dropout_p=args.dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + cast(torch.Tensor, self.attention(self.attention_norm(x)))
        ffn = self.expert_layer if self.has_experts else self.feed_forward
        return h + cast(torch.Tensor, ffn(self.ffn_norm(h)))


class Transformer(nn.Module):
    """A toy decoder-only transformer (token and position embeddings, blocks,
    LayerNorm, output projection tied to the embedding by default)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.model_args = args
        self.max_seq_len = args.max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.dropout = nn.Dropout(args.dropout_p)
        self.layers = nn.ModuleList([TransformerBlock(args) for _ in range(args.n_layers)])
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.weight_tying:
            self.output.weight = self.tok_embeddings.weight
        self.checkpoint_activations = args.checkpoint_activations

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, seq_len = tokens.size()
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} > max_seq_len {self.max_seq_len} (disttest)")
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(0, seq_len, device=tokens.device))
        h = self.dropout(h)
        for layer in self.layers:
            if self.checkpoint_activations:
                h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        return cast(torch.Tensor, self.output(self.norm(h))).float()

    @staticmethod
    def parallelize(module: Transformer, tp_mesh: Any, use_seq_parallel: bool,
                    local_output_for_attn: bool = False, ep_mesh: Any = None) -> nn.Module:
        """Parallelize ``module`` in place, as upstream's plan, and return it.

        Over ``tp_mesh``: tensor parallelism (with sequence parallelism when
        ``use_seq_parallel``), experts included
        (:class:`~disttest.bases.dtensor_experts.TensorParallelForExpert`)
        unless ``ep_mesh`` is given. Over ``ep_mesh``: expert parallelism
        (:class:`~disttest.bases.dtensor_experts.ExpertParallel`, or
        :class:`~disttest.bases.dtensor_experts.ExpertParallelWithTP` with
        ``tp_mesh`` too). Every rank of the meshes calls it.
        """
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        from disttest.bases import dtensor_experts as ep

        if not isinstance(module, Transformer):
            raise TypeError(f"Transformer.parallelize needs a Transformer, got {type(module).__name__} (disttest)")
        if tp_mesh is None and ep_mesh is None:
            raise ValueError(NO_MESH)
        seq = use_seq_parallel
        if seq and tp_mesh is not None and module.model_args.num_experts > 0:
            raise ValueError(SEQ_EXPERTS.format(n=module.model_args.num_experts))
        if tp_mesh is not None:
            root: dict[str, Any] = {
                "tok_embeddings": RowwiseParallel(input_layouts=Replicate(),
                                                  output_layouts=Shard(1) if seq else Replicate()),
                "pos_embeddings": RowwiseParallel(input_layouts=Replicate(),
                                                  output_layouts=Shard(0) if seq else Replicate()),
            }
            if seq:
                root["norm"] = SequenceParallel()
            parallelize_module(module, tp_mesh, root)
        for block in module.layers:
            layer: Any = block
            if tp_mesh is not None:
                plan: dict[str, Any] = {}
                if seq:
                    plan["attention"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
                    plan["attention_norm"] = SequenceParallel()
                    plan["ffn_norm"] = SequenceParallel()
                for name in ("wq", "wk", "wv"):
                    plan[f"attention.{name}"] = ColwiseParallel(use_local_output=local_output_for_attn)
                plan["attention.wo"] = RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel()
                if not layer.has_experts:
                    plan["feed_forward.w1"] = ColwiseParallel(input_layouts=Shard(1)) if seq else ColwiseParallel()
                    plan["feed_forward.w2"] = RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel()
                elif ep_mesh is None:
                    plan["expert_layer.experts"] = (
                        ep.TensorParallelForExpert(input_layouts=Shard(0), output_layouts=Shard(0)) if seq
                        else ep.TensorParallelForExpert())
                parallelize_module(layer, tp_mesh, plan)
            if ep_mesh is not None and layer.has_experts:
                if tp_mesh is not None:
                    parallelize_module(layer.expert_layer, ep_mesh, ep.ExpertParallelWithTP(ep_mesh, tp_mesh))
                else:
                    parallelize_module(layer.expert_layer.experts, ep_mesh, ep.ExpertParallel())
        if tp_mesh is not None:
            output_plan = (ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()) if seq
                           else ColwiseParallel(output_layouts=Replicate()))
            parallelize_module(module.output, tp_mesh, output_plan)
            if local_output_for_attn:
                for layer in module.layers:
                    attention: Any = layer.attention
                    attention.n_heads = module.model_args.n_heads // tp_mesh.size()
            if module.model_args.weight_tying:
                module.output.weight = module.tok_embeddings.weight
        return module
