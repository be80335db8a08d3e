"""Router logits ``x @ W.T`` in float32, in one Triton launch: x read in its own dtype, W the
router's float32 weight [E, H].

The torch path (``F.linear(x.float(), W)``) is three launches at decode (the cast of x and
cuBLAS's two-kernel float GEMV), which at one token per step cost more than the bytes they
move; at prefill it is a float32 GEMM on the CUDA cores plus a float32 copy of x (7.2 of 158 ms
of a Qwen3-30B-A3B prefill of 8 x 1K prompts on the H200:
decode_profile_h200_qwen_prefill_2026-12-02.json).

- Up to ``MAX_KERNEL_TOKENS`` tokens, ``_router_logits_kernel``: each program owns
  ``BLOCK_E`` experts and ``BLOCK_T`` tokens and sums products over H on the CUDA cores in
  float32.
- From ``MIN_MMA_TOKENS``, with x in bf16 or fp16, ``_router_logits_mma_kernel`` on the tensor
  cores: W splits in registers into a high part (W rounded to x's dtype) and a low part (the
  remainder, rounded again; kept scaled by ``2^LO_SHIFT``), and two MMAs with float32
  accumulation sum ``x @ hi.T + x @ lo.T``. Each product of two 16-bit operands is exact in
  float32, and hi + lo holds W to about 16 mantissa bits, so the logits equal the float32
  GEMM's up to summation order and that last rounding of W (none when the checkpoint's router
  was bf16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)
from kvserve.kernels.moe_routing import Routing, routed_outputs, topk_row
from kvserve.kernels.skinny_gemm import _arrival_counters, arrive

# Up to this many tokens the CUDA-core kernel computes the logits. On the H200
# (Qwen3-30B-A3B shape, moe_decode_h200_qwen_*_2026-12-01.json) the kernel's first version,
# which reduced over H every step, took batch 1 from 251 to 262 tok/s but batch 64 from 3,295
# to 3,023: the launches it saves matter only at the smallest batches.
MAX_KERNEL_TOKENS = 16
# From this many tokens (16-bit x) the split-W tensor-core kernel; between the two, torch. On the
# H200 (Qwen3-30B-A3B bf16, moe_decode_h200_router_{head,base}_2026-12-02.json, one machine) it
# took prefill of 8 x 1K / 2 x 4K prompts from 60,159 / 50,423 to 63,155 / 52,298 tok/s, but
# decode at batch 64 from 3,467 to 3,392: its 64-token programs are too few there. Decode
# batches (at most 256 tokens) stay on torch.
MIN_MMA_TOKENS = 512
# Up to this many tokens the router kernel picks the experts too (``router_topk``): the last of
# a token block's programs to store its logits runs the top-k, one token after another, which
# spares the top-k kernel's launch (0.17 ms of a 4.2 ms Qwen3-30B-A3B batch-1 step on the H200,
# decode_profile_h200_qwen_b1_s35); more tokens would make that serial tail long. Not timed
# alone: with this stop's other decode fusions Qwen3-30B-A3B batch 1 went from 268 to 303 tok/s
# (moe_decode_h200_s35_final_{head,base}, one machine).
FUSED_TOPK_MAX_TOKENS = 4
LO_SHIFT = 12  # the low half of W is kept times 2^12 (|W - hi| <= 2^-11 |W| in fp16)


@jit
def _tile(
    x_ptr, w_ptr, t_block, e_block, T, E, stride_x, stride_w,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """A program's tokens and experts, their row pointers ([BLOCK_T, 1], [BLOCK_E, 1]) and
    masks."""
    tokens = t_block * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = e_block * BLOCK_E + tl.arange(0, BLOCK_E)
    x_rows = x_ptr + tokens.to(tl.int64)[:, None] * stride_x
    w_rows = w_ptr + experts.to(tl.int64)[:, None] * stride_w
    return tokens, experts, x_rows, w_rows, (tokens < T)[:, None], (experts < E)[:, None]


@jit
def _router_logits_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    topk_weights_ptr,  # SCORING: fp32 [T, TOP_K + SHARED] out
    topk_ids_ptr,  # SCORING: int32 [T, TOP_K + SHARED] out
    bias_ptr,  # SCORING and HAS_BIAS: fp32 [E] correction bias
    counter_ptr,  # SCORING: int32 arrival counters, one per token block, zero between launches
    scaling,
    T,
    E,
    H,
    stride_x,
    stride_w,
    stride_out,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
    SCORING: tl.constexpr,  # 0: logits only; else the top-k too (moe_routing.Routing)
    TOP_K: tl.constexpr = 1,
    RENORMALIZE: tl.constexpr = False,
    BLOCK_ALL_E: tl.constexpr = 1,
    GROUPS: tl.constexpr = 1,
    PER_GROUP: tl.constexpr = 1,
    TOPK_GROUPS: tl.constexpr = 1,
    HAS_BIAS: tl.constexpr = False,
    BLOCK_G: tl.constexpr = 1,
    BLOCK_P: tl.constexpr = 1,
    BLOCK_K: tl.constexpr = 1,
    SHARED: tl.constexpr = False,
):
    tokens, experts, x_rows, w_rows, t_ok, e_ok = _tile(
        x_ptr, w_ptr, tl.program_id(1), tl.program_id(0), T, E, stride_x, stride_w, BLOCK_T,
        BLOCK_E,
    )  # fmt: skip
    h = tl.arange(0, BLOCK_H)[None, :]
    # The weights never change, so a dependent launch loads the first step's while the kernel
    # before still runs (at one token that is all of Qwen3-30B-A3B's); x only after the wait.
    w = tl.load(w_rows + h, mask=e_ok & (h < H), other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    x = tl.load(x_rows + h, mask=t_ok & (h < H), other=0.0).to(tl.float32)
    # Products summed per lane of H in the loop, across lanes once at the end: a reduction
    # every step would cost more shuffles than the FMAs
    acc = x[:, None, :] * w[None, :, :]
    for h0 in range(BLOCK_H, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :]
        x = tl.load(x_rows + h, mask=t_ok & (h < H), other=0.0).to(tl.float32)
        w = tl.load(w_rows + h, mask=e_ok & (h < H), other=0.0).to(tl.float32)
        acc += x[:, None, :] * w[None, :, :]
    logits = tl.sum(acc, axis=2)
    out = out_ptr + tokens.to(tl.int64)[:, None] * stride_out + experts[None, :]
    tl.store(out, logits, mask=t_ok & (experts < E)[None, :])
    if SCORING:
        # The program of this token block that stores its logits last picks the experts
        counter = counter_ptr + tl.program_id(1)
        if arrive(counter) == tl.num_programs(0) - 1:
            for t in range(BLOCK_T):
                token = (tl.program_id(1) * BLOCK_T + t).to(tl.int64)
                if token < T:
                    row = token * (TOP_K + SHARED)
                    topk_row(
                        out_ptr + token * stride_out, bias_ptr, topk_weights_ptr + row,
                        topk_ids_ptr + row, E, scaling, SCORING, TOP_K, RENORMALIZE, BLOCK_ALL_E,
                        GROUPS, PER_GROUP, TOPK_GROUPS, HAS_BIAS, BLOCK_G, BLOCK_P, BLOCK_K,
                        SHARED,
                    )  # fmt: skip
            tl.store(counter, 0)


@jit
def _router_logits_mma_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    T,
    E,
    H,
    stride_x,
    stride_w,
    stride_out,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LO_SHIFT: tl.constexpr,
):
    tokens, experts, x_rows, w_rows, t_ok, e_ok = _tile(
        x_ptr, w_ptr, tl.program_id(0), tl.program_id(1), T, E, stride_x, stride_w, BLOCK_T,
        BLOCK_E,
    )  # fmt: skip
    dims = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    acc_lo = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + dims[None, :]
        x = tl.load(x_rows + h, mask=t_ok & (h < H), other=0.0)
        w = tl.load(w_rows + h, mask=e_ok & (h < H), other=0.0)
        hi = w.to(x.dtype)
        # The remainder scaled up by 2^LO_SHIFT (exact) so that in fp16 it stays a normal
        # number: fp16 subnormals lost it on the H200 (logits 2e-4 off at H = 4096)
        lo = ((w - hi.to(tl.float32)) * (1 << LO_SHIFT)).to(x.dtype)
        acc = tl.dot(x, tl.trans(hi), acc=acc)
        acc_lo = tl.dot(x, tl.trans(lo), acc=acc_lo)
    logits = acc + acc_lo * (1.0 / (1 << LO_SHIFT))
    out = out_ptr + tokens.to(tl.int64)[:, None] * stride_out + experts[None, :]
    tl.store(out, logits, mask=t_ok & (experts < E)[None, :])


def router_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    routing: Routing,
    correction_bias: torch.Tensor | None = None,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits and each token's top-k experts (weights fp32 [T, k], ids int32 [T, k];
    k + 1 columns with ``routing.shared``) in one launch, for ``x`` [T, H] with T <=
    ``FUSED_TOPK_MAX_TOKENS``: as ``router_logits`` then ``moe_routing.softmax_topk`` /
    ``grouped_sigmoid_topk``."""
    tokens = x.shape[0]
    assert 0 < tokens <= FUSED_TOPK_MAX_TOKENS
    weights, ids = routed_outputs(tokens, routing.top_k, routing.shared, x.device)
    bias = correction_bias if correction_bias is not None else weights
    routed = (weights, ids, bias, float(routing.scaling))
    _launch_cuda_core(x, weight, routed, routing.constants(correction_bias is not None), pdl)
    return weights, ids


def router_logits(x: torch.Tensor, weight: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """``F.linear(x.float(), weight)`` for x [T, H] (any float dtype), weight [E, H] float32."""
    tokens, hidden = x.shape
    experts = weight.shape[0]
    split_mma = x.dtype in (torch.bfloat16, torch.float16) and tokens >= MIN_MMA_TOKENS
    if tokens == 0 or (tokens > MAX_KERNEL_TOKENS and not split_mma):
        return F.linear(x.float(), weight)
    if not split_mma:
        return _launch_cuda_core(x, weight, None, {"SCORING": 0}, pdl)
    x, out = _operands(x, weight)
    # 64 experts a program (32 below 2K tokens: twice the programs over W's bytes)
    block_e = min(64 if tokens >= 2048 else 32, max(16, next_pow2(experts)))
    grid = (-(-tokens // 64), -(-experts // block_e))
    _router_logits_mma_kernel[grid](
        x, weight, out, tokens, experts, hidden, x.stride(0), weight.stride(0),
        out.stride(0), BLOCK_T=64, BLOCK_E=block_e, BLOCK_H=64, LO_SHIFT=LO_SHIFT,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


def _operands(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x with unit column stride, and the float32 logits [T, E] the kernels write."""
    require_triton()
    assert weight.shape[1] == x.shape[1] and weight.stride(1) == 1
    x = x if x.stride(1) == 1 else x.contiguous()
    return x, torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)


def _launch_cuda_core(
    x: torch.Tensor,
    weight: torch.Tensor,
    routed: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None,
    constants: dict[str, int | bool],
    pdl: bool,
) -> torch.Tensor:
    """``_router_logits_kernel`` for few tokens; ``routed``: (top-k weights, ids, correction
    bias, scaling) when it picks the experts too. Returns the logits."""
    x, out = _operands(x, weight)
    tokens, hidden = x.shape
    experts = weight.shape[0]
    # Few tokens, few experts a program: a decode step's weight reads spread over E / 2 SMs at
    # one token (Qwen3-30B-A3B's H = 2048 in one step of the loop), E / 4 at 2-4
    block_t = next_pow2(tokens)
    block_e = 2 if tokens == 1 else 4 if tokens <= 4 else 8
    block_h = 4096 // (block_t * block_e)  # the accumulator: 32 fp32 registers a thread
    grid = (-(-experts // block_e), -(-tokens // block_t))
    topk_weights, topk_ids, bias, scaling = routed or (out, out, out, 1.0)
    counters = _arrival_counters(x.device, grid[1]) if routed else out
    _router_logits_kernel[grid](
        x, weight, out, topk_weights, topk_ids, bias, counters, scaling, tokens, experts,
        hidden, x.stride(0), weight.stride(0), out.stride(0), BLOCK_T=block_t, BLOCK_E=block_e,
        BLOCK_H=block_h, num_warps=4, **constants, **launch_options(pdl),
    )  # fmt: skip
    return out
