"""Expert selection: router logits -> (weights, expert ids) per token, in float32.

Two scorings, as the configs name them (``MoEConfig.scoring``):
- softmax: softmax over all experts, keep the top k (renormalised when ``norm_topk_prob``);
- grouped_sigmoid: sigmoid scores; the *choice* adds a per-expert correction bias, first keeps
  the ``topk_groups`` groups whose two best biased scores sum highest, then the top k experts
  inside them; the *weights* are the unbiased scores of the chosen experts, renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``.
"""

from __future__ import annotations

import torch

from kvserve.config import MoEConfig
from kvserve.kernels.moe_routing import softmax_topk, softmax_topk_reference
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions


def select_experts(
    router_logits: torch.Tensor,  # [T, E] float32
    cfg: MoEConfig,
    correction_bias: torch.Tensor | None = None,  # [E] float32, grouped_sigmoid only
    kernels: KernelOptions = TORCH_REFERENCE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weights [T, k] float32, expert ids [T, k] int32)."""
    if cfg.scoring == "softmax":
        if kernels.triton:
            return softmax_topk(router_logits, cfg.top_k, cfg.norm_topk_prob)
        return softmax_topk_reference(router_logits, cfg.top_k, cfg.norm_topk_prob)
    weights, ids = _grouped_sigmoid_topk(router_logits, cfg, correction_bias)
    return weights, ids.to(torch.int32)


def _grouped_sigmoid_topk(
    logits: torch.Tensor, cfg: MoEConfig, correction_bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    tokens, experts = choice.shape
    per_group = experts // cfg.num_groups
    grouped = choice.view(tokens, cfg.num_groups, per_group)
    group_score = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # [T, G]
    kept_groups = group_score.topk(cfg.topk_groups, dim=-1).indices
    group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept_groups, True)
    expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(tokens, experts)
    ids = choice.masked_fill(~expert_mask, float("-inf")).topk(cfg.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, ids
