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
from kvserve.kernels.moe_routing import (
    grouped_sigmoid_topk,
    grouped_sigmoid_topk_reference,
    softmax_topk,
    softmax_topk_reference,
)
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
    grouped = (cfg.top_k, cfg.num_groups, cfg.topk_groups, cfg.norm_topk_prob,
               cfg.routed_scaling_factor, correction_bias)  # fmt: skip
    if kernels.triton:
        return grouped_sigmoid_topk(router_logits, *grouped)
    return grouped_sigmoid_topk_reference(router_logits, *grouped)
