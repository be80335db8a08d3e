"""Expert selection: router logits -> (weights, expert ids) per token, in float32.

Two scorings, as the configs name them (``MoEConfig.scoring``):
- softmax: softmax over all experts, keep the top k (renormalised when ``norm_topk_prob``);
- grouped_sigmoid: sigmoid scores; the *choice* adds a per-expert correction bias, first keeps
  the ``topk_groups`` groups whose two best biased scores sum highest, then the top k experts
  inside them; the *weights* are the unbiased scores of the chosen experts, renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``.

With ``shared`` (a shared expert run as one more expert of the stacks) each row gets a last
column for it: id E, weight 1.0 (``moe_routing.with_shared_slot``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kvserve.config import MoEConfig, env_switch
from kvserve.kernels.moe_routing import (
    Routing,
    grouped_sigmoid_topk,
    grouped_sigmoid_topk_reference,
    softmax_topk,
    softmax_topk_reference,
)
from kvserve.kernels.normed_router import normed_router_topk
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.kernels.router_logits import FUSED_TOPK_MAX_TOKENS, router_logits, router_topk

NORM_ROUTER_ENV = "KVSERVE_NORM_ROUTER"


@functools.cache
def norm_router_enabled() -> bool:
    """``KVSERVE_NORM_ROUTER``: 1 (the default) has a decode step's post-attention norm run in
    the router's kernel (``kernels.normed_router``); 0 launches them apart (for A/B runs)."""
    return env_switch(NORM_ROUTER_ENV, default=True)


def select_experts(
    router_logits: torch.Tensor,  # [T, E] float32
    cfg: MoEConfig,
    correction_bias: torch.Tensor | None = None,  # [E] float32, grouped_sigmoid only
    kernels: KernelOptions = TORCH_REFERENCE,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weights [T, k] float32, expert ids [T, k] int32); k + 1 columns with
    ``shared``."""
    if cfg.scoring == "softmax":
        softmax = (router_logits, cfg.top_k, cfg.norm_topk_prob, shared)
        if kernels.triton:
            return softmax_topk(*softmax, pdl=kernels.pdl)
        return softmax_topk_reference(*softmax)
    grouped = (cfg.top_k, cfg.num_groups, cfg.topk_groups, cfg.norm_topk_prob,
               cfg.routed_scaling_factor, correction_bias, shared)  # fmt: skip
    if kernels.triton:
        return grouped_sigmoid_topk(router_logits, *grouped, pdl=kernels.pdl)
    return grouped_sigmoid_topk_reference(router_logits, *grouped)


def route(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E, H] float32
    cfg: MoEConfig,
    correction_bias: torch.Tensor | None = None,
    kernels: KernelOptions = TORCH_REFERENCE,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits, then ``select_experts``: (weights [T, k] float32, ids [T, k] int32; k + 1
    columns with ``shared``). On the Triton path decode steps of up to
    ``FUSED_TOPK_MAX_TOKENS`` tokens take one kernel for both (``router_topk``)."""
    if _routed_in_one_launch(x, kernels):
        how = routing(cfg, shared)
        return router_topk(x, router_weight, how, correction_bias, pdl=kernels.pdl)
    if kernels.triton:
        logits = router_logits(x, router_weight, pdl=kernels.pdl)
    else:
        logits = F.linear(x.float(), router_weight)
    return select_experts(logits, cfg, correction_bias, kernels, shared)


def _routed_in_one_launch(x: torch.Tensor, kernels: KernelOptions) -> bool:
    """A decode step on the Triton path (1 to ``FUSED_TOPK_MAX_TOKENS`` tokens, read at call
    time): its logits and top-k come from one kernel."""
    return kernels.triton and 0 < x.shape[0] <= FUSED_TOPK_MAX_TOKENS


def normed_route(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor,  # [T, H]
    norm_weight: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,  # [E, H] float32
    cfg: MoEConfig,
    correction_bias: torch.Tensor | None,
    kernels: KernelOptions,
    shared: bool = False,
    l2_warm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(norm(x + residual), x + residual, weights, ids)`` in one launch, what
    ``fused_add_rms_norm`` then ``route`` give, for a step ``route`` takes in one kernel; None
    for the others, and with ``KVSERVE_NORM_ROUTER=0``. ``l2_warm``: flat bytes the kernel asks L2
    for (``kernels.l2_warm``)."""
    if not (_routed_in_one_launch(x, kernels) and norm_router_enabled()):
        return None
    how = routing(cfg, shared)
    return normed_router_topk(
        x, residual, norm_weight, eps, router_weight, how, correction_bias, pdl=kernels.pdl,
        l2_warm=l2_warm,
    )  # fmt: skip


@functools.cache
def routing(cfg: MoEConfig, shared: bool = False) -> Routing:
    """The fused router kernel's view of ``cfg`` (built once per config)."""
    return Routing(
        cfg.num_experts, cfg.top_k, cfg.norm_topk_prob, cfg.scoring == "grouped_sigmoid",
        cfg.num_groups, cfg.topk_groups, cfg.routed_scaling_factor, shared,
    )  # fmt: skip
