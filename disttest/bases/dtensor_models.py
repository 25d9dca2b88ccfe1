"""The reference models of upstream's DTensor tests (``common_dtensor``).

Classes only at import: nothing is built and the tensor-parallel styles load
only when ``Transformer.parallelize`` runs. The expert layers of upstream's
toy transformer are not carried over (``ModelArgs.num_experts`` must be 0).
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
    "FeedForward",
    "MLPModule",
    "MLPStacked",
    "ModelArgs",
    "RMSNormPython",
    "Transformer",
    "TransformerBlock",
]

NO_EXPERTS = "ModelArgs.num_experts={n}: disttest's Transformer has no expert layers; use 0 (disttest)"
NO_EP_MESH = "Transformer.parallelize(ep_mesh=...): expert parallelism is not carried over (disttest)"


class RMSNormPython(nn.Module):
    """RMSNorm in plain torch ops."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


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


class TransformerBlock(nn.Module):
    """LayerNorm, attention, LayerNorm, feed-forward, with residuals."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.num_experts:
            raise ValueError(NO_EXPERTS.format(n=args.num_experts))
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.has_experts = False
        self.feed_forward = FeedForward(args.dim, hidden_dim=4 * args.dim, dropout_p=args.dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + cast(torch.Tensor, self.attention(self.attention_norm(x)))
        return h + cast(torch.Tensor, self.feed_forward(self.ffn_norm(h)))


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
        """Tensor-parallel over ``tp_mesh`` (with sequence parallelism when
        ``use_seq_parallel``), as upstream's plan."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        if not isinstance(module, Transformer):
            raise TypeError(f"Transformer.parallelize needs a Transformer, got {type(module).__name__} (disttest)")
        if ep_mesh is not None:
            raise ValueError(NO_EP_MESH)
        if tp_mesh is None:
            raise ValueError("Transformer.parallelize(tp_mesh=None): a tensor-parallel mesh is needed (disttest)")
        seq = use_seq_parallel
        root: dict[str, Any] = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if seq else Replicate()),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0) if seq else Replicate()),
        }
        if seq:
            root["norm"] = SequenceParallel()
        parallelize_module(module, tp_mesh, root)
        for layer in module.layers:
            plan: dict[str, Any] = {}
            if seq:
                plan["attention"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
                plan["attention_norm"] = SequenceParallel()
                plan["ffn_norm"] = SequenceParallel()
            for name in ("wq", "wk", "wv"):
                plan[f"attention.{name}"] = ColwiseParallel(use_local_output=local_output_for_attn)
            plan["attention.wo"] = RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel()
            plan["feed_forward.w1"] = ColwiseParallel(input_layouts=Shard(1)) if seq else ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel()
            parallelize_module(layer, tp_mesh, plan)
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
