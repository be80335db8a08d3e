"""A mixture-of-experts layer's post-attention RMSNorm (with its residual add) and its router
(logits and top-k) in one launch, for decode steps of up to ``FUSED_TOPK_MAX_TOKENS`` tokens.

Apart, the norm is one program a row and the router kernel (``router_logits.router_topk``)
starts only once the norm has finished: at one token two dependent launches, each a wait for
the kernel before and a round trip for its x. Here each of the router's programs norms the
step's rows itself (a row is 4-8 KB of x and residual, read from L2), then takes its experts'
logits from the normed values, and the last of them to finish picks each token's experts, as
the router kernel does. Program 0 also stores the normed rows and the new residual for the
experts; the residual goes to a new tensor, since the other programs still read the old one.

The normed values are ``normed_row``'s, launched with the plain norm's warps, so they are the
plain norm's bits; the logits are a float32 dot of those values (rounded to the norm's output
dtype first, as the router would read them) with the router's float32 weight, equal to the
router kernel's up to summation order.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)
from kvserve.kernels.l2_warm import warm_l2_share
from kvserve.kernels.moe_routing import Routing, routed_outputs, topk_row
from kvserve.kernels.rmsnorm import normed_row, row_warps
from kvserve.kernels.router_logits import FUSED_TOPK_MAX_TOKENS
from kvserve.kernels.skinny_gemm import _arrival_counters, arrive


@jit
def _normed_router_kernel(
    x_ptr,  # [T, H]: the attention block's output
    residual_ptr,  # [T, H]: read only
    norm_weight_ptr,  # [H]
    router_weight_ptr,  # fp32 [E, H]
    normed_ptr,  # [T, H] out: norm(x + residual)
    sum_ptr,  # [T, H] out: x + residual
    logits_ptr,  # fp32 [T, E] out
    topk_weights_ptr,  # fp32 [T, TOP_K + SHARED] out
    topk_ids_ptr,  # int32 [T, TOP_K + SHARED] out
    bias_ptr,  # HAS_BIAS: fp32 [E] correction bias
    counter_ptr,  # int32 arrival counter, zero between launches
    warm_ptr,  # WARM: bytes the programs ask L2 for once the kernel before is done
    warm_bytes,
    scaling,
    eps,
    T,
    E,
    H,
    stride_x,
    stride_r,
    stride_h,  # the normed and sum rows'
    stride_w,
    stride_l,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
    SCORING: tl.constexpr,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_ALL_E: tl.constexpr,
    GROUPS: tl.constexpr,
    PER_GROUP: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SHARED: tl.constexpr,
    WARM: tl.constexpr,
):
    experts = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    cols = tl.arange(0, BLOCK_H)
    in_row = cols < H
    # The router's weights never change: a dependent launch loads them while the kernel before
    # still runs; x and the residual only after the wait
    w_rows = router_weight_ptr + experts.to(tl.int64)[:, None] * stride_w
    w = tl.load(w_rows + cols[None, :], mask=(experts < E)[:, None] & in_row[None, :], other=0.0)
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    if WARM:  # DRAM is idle from here to the experts' GEMV (the kernel before has finished)
        pid, programs = tl.program_id(0), tl.num_programs(0)
        warm_l2_share(warm_ptr, warm_bytes, pid, programs)
    writer = tl.program_id(0) == 0
    for t in tl.static_range(BLOCK_T):
        if t < T:
            y = normed_row(
                x_ptr, residual_ptr, sum_ptr, norm_weight_ptr, t, H, eps, stride_x, stride_r,
                stride_h, writer, True, BLOCK_H,
            ).to(normed_ptr.dtype.element_ty)  # fmt: skip
            tl.store(normed_ptr + t * stride_h + cols, y, mask=in_row & writer)
            logits = tl.sum(w * y.to(tl.float32)[None, :], axis=1)
            tl.store(logits_ptr + t * stride_l + experts, logits, mask=experts < E)
    if arrive(counter_ptr) == tl.num_programs(0) - 1:
        for token in range(T):
            row = token * (TOP_K + SHARED)
            topk_row(
                logits_ptr + token * stride_l, bias_ptr, topk_weights_ptr + row, topk_ids_ptr + row,
                E, scaling, SCORING, TOP_K, RENORMALIZE, BLOCK_ALL_E, GROUPS, PER_GROUP,
                TOPK_GROUPS, HAS_BIAS, BLOCK_G, BLOCK_P, BLOCK_K, SHARED,
            )  # fmt: skip
        tl.store(counter_ptr, 0)


def normed_router_topk(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor,  # [T, H]
    norm_weight: torch.Tensor,  # [H]
    eps: float,
    router_weight: torch.Tensor,  # fp32 [E, H]
    routing: Routing,
    correction_bias: torch.Tensor | None = None,
    *,
    pdl: bool = False,
    l2_warm: torch.Tensor | None = None,  # flat bytes asked of L2 once the kernel before is done
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual, top-k weights fp32 [T, k], ids int32 [T, k])`` (k + 1
    columns with ``routing.shared``), as ``fused_add_rms_norm`` then ``router_topk`` give them,
    for 1 to ``FUSED_TOPK_MAX_TOKENS`` tokens; ``residual`` is left as it was."""
    require_triton()
    tokens, hidden = x.shape
    experts = router_weight.shape[0]
    assert 0 < tokens <= FUSED_TOPK_MAX_TOKENS and residual.shape == x.shape
    assert residual.dtype == x.dtype and router_weight.shape[1] == hidden
    unit_strides = (x.stride(1), residual.stride(1), router_weight.stride(1), norm_weight.stride(0))
    assert unit_strides == (1, 1, 1, 1)
    out_dtype = torch.promote_types(x.dtype, norm_weight.dtype)
    normed = torch.empty(tokens, hidden, dtype=out_dtype, device=x.device)
    summed = torch.empty_like(x)
    assert normed.stride(0) == summed.stride(0)
    logits = torch.empty(tokens, experts, dtype=torch.float32, device=x.device)
    weights, ids = routed_outputs(tokens, routing.top_k, routing.shared, x.device)
    block_h = next_pow2(hidden)
    # as the router kernel spreads a step's weight reads: E / 2 programs at one token, E / 4
    # at 2-4
    block_e = 2 if tokens == 1 else 4
    bias = correction_bias if correction_bias is not None else weights
    _normed_router_kernel[(-(-experts // block_e),)](
        x, residual, norm_weight, router_weight, normed, summed, logits, weights, ids, bias,
        _arrival_counters(x.device, 1), *_warm_args(l2_warm, x), float(routing.scaling), eps,
        tokens, experts, hidden,
        x.stride(0), residual.stride(0), normed.stride(0), router_weight.stride(0),
        logits.stride(0), BLOCK_T=next_pow2(tokens), BLOCK_E=block_e, BLOCK_H=block_h,
        # the plain norm's warps: its layout of the row, so its sum order and bits
        num_warps=row_warps(block_h), **routing.constants(correction_bias is not None),
        WARM=l2_warm is not None, **launch_options(pdl),
    )  # fmt: skip
    return normed, summed, weights, ids


def _warm_args(warm: torch.Tensor | None, stand_in: torch.Tensor) -> tuple[torch.Tensor, int]:
    return (stand_in, 0) if warm is None else (warm, warm.numel())
