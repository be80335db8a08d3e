"""A sparse mixture-of-experts feed-forward block: a router picks each token's top-k experts,
their SwiGLU MLPs run (``kvserve.kernels.fused_moe``), and an optional shared expert (a dense
MLP every token goes through, GLM-4.5) is added.

Parameter names follow the HF checkpoints: ``gate.weight`` (router, [E, H]),
``gate.e_score_correction_bias`` ([E], grouped-sigmoid routers), ``shared_experts.*``;
the per-expert ``experts.{e}.{gate,up,down}_proj.weight`` tensors are stacked into ``w13``
[E, 2I, H] and ``w2`` [E, H, I] by ``load_expert``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.config import MoEConfig
from kvserve.kernels.fused_moe import fused_moe_reference
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.layers.moe_router import select_experts

_EXPERT_SHARDS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}


class Router(nn.Module):
    """Router weights in float32: the top-k choice is sensitive to rounding of the logits."""

    def __init__(self, hidden_size: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden_size), False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(cfg.num_experts), False)
            if cfg.scoring == "grouped_sigmoid"
            else None
        )


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        cfg: MoEConfig,
        dtype: torch.dtype,
        shared_experts: nn.Module | None = None,
        kernels: KernelOptions = TORCH_REFERENCE,
    ) -> None:
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        experts, inter = cfg.num_experts, cfg.expert_intermediate_size
        self.gate = Router(hidden_size, cfg)
        self.w13 = nn.Parameter(torch.empty(experts, 2 * inter, hidden_size, dtype=dtype), False)
        self.w2 = nn.Parameter(torch.empty(experts, hidden_size, inter, dtype=dtype), False)
        self.shared_experts = shared_experts
        self._loaded: set[tuple[int, str]] = set()

    def missing(self) -> list[str]:
        """Checkpoint names (relative to this layer) of expert tensors not loaded yet."""
        return [
            f"experts.{e}.{proj}.weight"
            for e in range(self.cfg.num_experts)
            for proj in _EXPERT_SHARDS
            if (e, proj) not in self._loaded
        ]

    def load_expert(self, expert: int, proj: str, loaded: torch.Tensor) -> str:
        """Copy one checkpoint tensor ``experts.{expert}.{proj}.weight`` into its stack; the
        name of the parameter it filled."""
        if proj not in _EXPERT_SHARDS or not 0 <= expert < self.cfg.num_experts:
            raise ValueError(f"no expert tensor experts.{expert}.{proj} in this layer")
        name, shard = _EXPERT_SHARDS[proj]
        stack: torch.Tensor = getattr(self, name).data[expert]
        rows = stack.shape[0] // 2 if name == "w13" else stack.shape[0]
        target = stack[shard * rows : (shard + 1) * rows]
        if target.shape != loaded.shape:
            raise ValueError(
                f"experts.{expert}.{proj}.weight has shape {tuple(loaded.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        target.copy_(loaded)
        self._loaded.add((expert, proj))
        return name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.gate.weight)
        bias = self.gate.e_score_correction_bias
        weights, ids = select_experts(logits, self.cfg, bias, self.kernels)
        if self.kernels.triton:
            from kvserve.kernels.fused_moe import fused_moe

            out = fused_moe(x, self.w13, self.w2, weights, ids)
        else:
            out = fused_moe_reference(x, self.w13, self.w2, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
