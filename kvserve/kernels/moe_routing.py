"""Softmax top-k routing (Qwen3-MoE, Mixtral): router logits -> each token's k experts and
their weights. One Triton program per token replaces the softmax, top-k, renormalisation and
index-cast kernels, which at decode cost more than the routing itself."""

from __future__ import annotations

import torch

from kvserve.kernels._triton import jit, next_pow2, require_triton, tl


def softmax_topk_reference(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int32), best first."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


@jit
def _softmax_topk_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    valid = cols < num_experts
    x = tl.load(logits_ptr + token * stride_logits + cols, mask=valid, other=-float("inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(valid, p, -1.0)
    total = 0.0
    for i in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        idx = tl.min(tl.where(p == best, cols, BLOCK_E), axis=0)  # lowest index among ties
        tl.store(weights_ptr + token * TOP_K + i, best)
        tl.store(ids_ptr + token * TOP_K + i, idx.to(tl.int32))
        total += best
        p = tl.where(cols == idx, -1.0, p)
    if RENORMALIZE:
        for i in tl.static_range(TOP_K):
            w = tl.load(weights_ptr + token * TOP_K + i)
            tl.store(weights_ptr + token * TOP_K + i, w / total)


def softmax_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    require_triton()
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    if tokens:
        _softmax_topk_kernel[(tokens,)](
            logits, weights, ids, experts, logits.stride(0), TOP_K=top_k,
            RENORMALIZE=renormalize, BLOCK_E=next_pow2(experts), num_warps=4,
        )  # fmt: skip
    return weights, ids
