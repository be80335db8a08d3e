"""Mixture of experts with weight-only FP4 experts (NVFP4 or MXFP4, the layout of
``fp4_reference.py`` per expert): the grouped GEMMs of ``fused_moe.py`` with each weight tile
unpacked and scaled in registers (``fp4_tile.dequant_tile``: eight codes of a 32-bit word at a time
where the experts' rows are word-aligned), the MMA in the activation dtype with fp32
accumulation.

Per stack (``w13`` for gate/up, ``w2`` for down): ``packed`` uint8 [E, N, K/2],
``block_scale`` [E, N, K/g] (e4m3 for NVFP4, g = 16; E8M0 bytes for MXFP4, g = 32) and, for
NVFP4, ``row_scale`` fp32 [E, N] (each shard's per-tensor scale, applied to the accumulator).

``fused_moe_fp4_reference`` dequantizes the experts and runs ``fused_moe_reference``: it runs
anywhere and is what the CPU path computes. No host syncs: capturable in CUDA graphs. Decode steps
take the word GEMV of ``word_gemv.py`` instead (``KVSERVE_FP4_MOE_GEMV=0`` turns that off).
Large prefill steps dequantize the experts to the activation dtype a chunk at a time and run
``fused_moe``'s grouped GEMM on them (``DEQUANT_MIN_SLOTS_PER_EXPERT``), as dense FP4 layers
take cuBLAS past 128 rows.
"""

from __future__ import annotations

import functools

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import jit, launch_options, pdl_release, pdl_wait, tl
from kvserve.kernels.fp4_dequantize import dequantize_fp4_dense
from kvserve.kernels.fp4_reference import dequantize_fp4, group_size_of
from kvserve.kernels.fp4_tile import code_words, dequant_tile, first_scales, step_scales
from kvserve.kernels.fused_moe import (
    ExpertGemm,
    SlotOutput,
    SortedSlots,
    TokenSum,
    _block_config,
    _block_slots,
    _grouped_gemm,
    _program_tile,
    _store_slots,
    block_tables,
    fused_moe_reference,
    fused_moe_with,
    grouped_grid,
    half_weight_tiles,
    one_slot_per_block,
)
from kvserve.kernels.moe_tiles import MoeTiles, expert_tiles
from kvserve.kernels.word_gemv import gated_gemv_enabled, moe_gemv

MOE_GEMV_ENV = "KVSERVE_FP4_MOE_GEMV"
# From this many slots an expert on average, the experts are dequantized and multiplied by the
# half-precision grouped GEMM. On the H200 at 8K-token steps (512 an expert at top-8 of 128) that
# took gate/up + down from 1.53 + 0.77 ms (the in-register decode) to 0.28 + 0.89 and 0.16 +
# 0.51 ms for Qwen3-30B-A3B NVFP4, from 5.40 + 2.60 to 1.07 + 3.35 and 0.55 + 1.74 ms for
# GLM-4.5-Air (moe_gemm_h200_prefill_order_2026-12-02.json); the dequantize is a fixed cost a
# step, so it pays only for large steps. Engine prefill, one machine: 8K-token steps +10.6% (GLM)
# / +14.7% (Qwen3); 4K-token steps (256 an expert) -2.7% / +6.4% (moe_decode_h200_dqmoe_*).
# Between the two measured points: 4K-token steps keep the in-register kernel.
DEQUANT_MIN_SLOTS_PER_EXPERT = 384
# The dequantized experts of one call live in chunks of at most this many bytes (GLM-4.5-Air's
# gate/up stack is 2.95 GB in bf16; one chunk holds 23 of its 128 experts). The engine's
# activation profile, a largest step, counts one chunk before it sizes the KV pool.
DEQUANT_CHUNK_BYTES = 512 << 20

Fp4Stack = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # packed, block, row scales


def dequantize_fp4_experts(stack: Fp4Stack, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense [E, N, K] experts of one stack."""
    packed, block_scale, row_scale = stack
    return torch.stack(
        [
            dequantize_fp4(packed[e], block_scale[e], None if row_scale is None else row_scale[e])
            for e in range(packed.shape[0])
        ]
    ).to(dtype)


def fused_moe_fp4_reference(
    x: torch.Tensor,
    w13: Fp4Stack,
    w2: Fp4Stack,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    w13_f, w2_f = dequantize_fp4_experts(w13), dequantize_fp4_experts(w2)
    return fused_moe_reference(x.float(), w13_f, w2_f, topk_weights, topk_ids).to(x.dtype)


@jit
def _fp4_grouped_gemm_kernel(
    a_ptr,  # [rows of A, K]: tokens (A_PER_TOKEN) or slots
    w_ptr,  # uint8 [E, N, K/2], or int32 [E, N, K/8] (WORD_DEQUANT)
    s_ptr,  # uint8 [E, N, K/GROUP]: E8M0 exponents or the bytes of e4m3 scales
    rs_ptr,  # fp32 [E, N] (HAS_ROW_SCALE)
    out_ptr,  # [num_slots, N]
    slots_ptr,
    block_expert_ptr,
    weights_ptr,  # [num_slots] float32 router weights (SCALE_ROWS)
    sums_ptr,  # SUM_TOKENS: fp32 [num_slots, N] (fused_moe.SlotOutput)
    counter_ptr,
    num_slots,
    N,
    K,
    stride_a,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_rse,
    stride_out,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    ONE_SLOT_PER_BLOCK: tl.constexpr,
    SUM_TOKENS: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WORD_DEQUANT: tl.constexpr,
    USE_PDL: tl.constexpr,
    # K % BLOCK_K == 0, no K mask: the pipeliner copies codes (16 bytes a copy) and scales ahead
    EVEN_K: tl.constexpr = False,
):
    PER_ELEMENT: tl.constexpr = 8 if WORD_DEQUANT else 2  # codes per element of w_ptr
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    pid_m, pid_n, expert = _program_tile(block_expert_ptr, N, BLOCK_N)
    if expert < 0:
        return
    slots, row_ok, a_rows = _block_slots(
        slots_ptr, pid_m, num_slots, TOP_K, A_PER_TOKEN, ONE_SLOT_PER_BLOCK, BLOCK_M
    )
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows_w = (offs_n % N).to(tl.int64)[:, None]  # rows past N wrap; the store masks them
    rk = tl.arange(0, BLOCK_K)
    rb = tl.arange(0, BLOCK_K // PER_ELEMENT)
    rg = tl.arange(0, BLOCK_K // GROUP)
    e64 = expert.to(tl.int64)
    w_ptrs = w_ptr + e64 * stride_we + rows_w * stride_wn + rb[None, :]
    s_ptrs = s_ptr + e64 * stride_se + rows_w * stride_sn + rg[None, :]
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_a + rk[None, :]
    dtype = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    SCALES_AHEAD: tl.constexpr = BLOCK_K // GROUP < 8  # fp4_tile.step_scales
    s_ahead = first_scales(s_ptrs, 0, K, rg, GROUP, EVEN_K, SCALES_AHEAD)
    for k0 in range(0, K, BLOCK_K):
        # codes, scales, x: the copies issued in the measured kernel's order
        if EVEN_K:
            p = tl.load(w_ptrs)
        else:
            p = tl.load(w_ptrs, mask=(k0 // PER_ELEMENT + rb < K // PER_ELEMENT)[None, :], other=0)
        s, s_ahead = step_scales(
            s_ahead, s_ptrs, k0, K, K, rg, GROUP, BLOCK_K, EVEN_K, SCALES_AHEAD
        )
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & (k0 + rk < K)[None, :], other=0.0)
        w = dequant_tile(p, s, BLOCK_N, BLOCK_K, GROUP, SCALE_E8M0, dtype, WORD_DEQUANT)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K // PER_ELEMENT
        s_ptrs += BLOCK_K // GROUP
        a_ptrs += BLOCK_K
    if HAS_ROW_SCALE:
        acc = acc * tl.load(rs_ptr + e64 * stride_rse + offs_n, mask=n_ok, other=0.0)[None, :]
    _store_slots(
        out_ptr, acc, slots, row_ok, offs_n, N, weights_ptr, stride_out, sums_ptr, counter_ptr,
        SCALE_ROWS, SUM_TOKENS, TOP_K, BLOCK_M, BLOCK_N,
    )  # fmt: skip


def _fp4_grouped_gemm(
    a: torch.Tensor,
    stack: Fp4Stack,
    blocks: SortedSlots | torch.Tensor,
    num_slots: int,
    top_k: int,
    config: dict[str, int],
    row_weights: torch.Tensor | None,
    token_sum: TokenSum | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    packed, block_scale, row_scale = stack
    n, k = packed.shape[1], 2 * packed.shape[2]
    group = group_size_of(block_scale)
    dest = SlotOutput.plan(a, num_slots, n, top_k, config["BLOCK_N"], token_sum)
    block_expert, slots, one_slot = block_tables(blocks)
    scales = block_scale.view(torch.uint8)
    w = code_words(packed)
    grid = grouped_grid(block_expert, n, config["BLOCK_N"])
    _fp4_grouped_gemm_kernel[grid](
        a, w, scales, row_scale if row_scale is not None else a, dest.out, slots, block_expert,
        row_weights if row_weights is not None else a, dest.sums, dest.counters, num_slots, n,
        k, a.stride(0), w.stride(0), w.stride(1), scales.stride(0), scales.stride(1),
        row_scale.stride(0) if row_scale is not None else 0, dest.out.stride(0),
        TOP_K=top_k, A_PER_TOKEN=row_weights is None, SCALE_ROWS=row_weights is not None,
        ONE_SLOT_PER_BLOCK=one_slot, SUM_TOKENS=dest.sum_mode, GROUP=group,
        SCALE_E8M0=block_scale.dtype == torch.uint8, HAS_ROW_SCALE=row_scale is not None,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        WORD_DEQUANT=w.dtype == torch.int32, EVEN_K=k % config["BLOCK_K"] == 0,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **launch_options(pdl),
    )  # fmt: skip
    return dest.out


def _dequantized_grouped_gemm(
    a: torch.Tensor,
    stack: Fp4Stack,
    blocks: SortedSlots,
    num_slots: int,
    top_k: int,
    config: dict[str, int],
    row_weights: torch.Tensor | None,
    pdl: bool = False,
) -> torch.Tensor:
    """``_fp4_grouped_gemm`` with the experts dequantized to a's dtype, a chunk of experts at a
    time, and multiplied by ``fused_moe``'s grouped GEMM at ``config`` (``half_weight_tiles``)."""
    packed, block_scale, row_scale = stack
    experts, n, k = packed.shape[0], packed.shape[1], 2 * packed.shape[2]
    per_chunk = max(1, DEQUANT_CHUNK_BYTES // (n * k * a.element_size()))
    out = torch.empty(num_slots, n, dtype=a.dtype, device=a.device)
    for lo in range(0, experts, per_chunk):
        hi = min(experts, lo + per_chunk)
        rows = None if row_scale is None else row_scale[lo:hi].flatten()
        chunk = packed[lo:hi].flatten(0, 1), block_scale[lo:hi].flatten(0, 1), rows
        w = dequantize_fp4_dense(*chunk, a.dtype).view(hi - lo, n, k)
        _grouped_gemm(a, w, blocks, num_slots, top_k, config, row_weights, out, (lo, hi), pdl=pdl)
        del w  # before the next chunk is allocated: one chunk at a time
    return out


@functools.cache
def moe_gemv_enabled() -> bool:
    """Decode steps (one slot per expert block) on the word GEMV of ``word_gemv.py`` instead
    of the grouped MMA kernel, unless ``KVSERVE_FP4_MOE_GEMV=0``. On the H200 it took
    GLM-4.5-Air NVFP4 batch-1 decode from 85 to 107 tok/s (moe_decode_h200_moe_gemv and
    _moe_mma, 2026-12-01, one machine); batch 8 is not a one-slot-per-block step there."""
    return env_switch(MOE_GEMV_ENV, default=True)


def _fp4_moe_gemv(
    a: torch.Tensor,
    stack: Fp4Stack,
    experts: torch.Tensor,
    top_k: int,
    row_weights: torch.Tensor | None,
    token_sum: TokenSum | None = None,
    pdl: bool = False,
    config: dict[str, int] | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """One GEMV per slot: [slots, N] (see ``MoeSlots``); with a ``token_sum``, [tokens, N], each
    token's k rows summed in the GEMV's epilogue; ``gated`` (the gate/up stack) [slots, N / 2],
    the SiLU-mul applied. ``config``: ``GemvConfig`` fields (a tuned ``*_gemv`` tile), else
    ``gemv_config``'s."""
    packed, block_scale, row_scale = stack
    # Plain scale loads for both formats: the MoE A/B on the H200 ran them; the asm loads that
    # the dense NVFP4 GEMV takes are not yet timed here.
    route = (experts, top_k, row_weights)
    group = group_size_of(block_scale)
    return moe_gemv(a, packed, (block_scale, row_scale), config, group, route, token_sum, pdl,
                    gated=gated)  # fmt: skip


def fused_moe_fp4(
    x: torch.Tensor,
    w13: Fp4Stack,
    w2: Fp4Stack,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    pdl: bool = False,
    addend: torch.Tensor | None = None,
    shared: bool = False,
) -> torch.Tensor:
    """The GPU path of ``fused_moe_fp4_reference`` (same arguments; ``shared`` as
    ``fused_moe``'s)."""
    experts = w13[0].shape[0]
    path = fp4_path(topk_ids.numel(), experts)
    tiles = fp4_tiles(w13, topk_ids, x, path, shared)
    gated = path == "gemv" and gated_gemv_enabled()
    gemm = fp4_expert_gemm(w13, w2, path, pdl, gated)
    return fused_moe_with(x, topk_weights, topk_ids, experts, w2[0].shape[1], gemm, tiles, pdl,
                          addend, gated_gate_up=gated)  # fmt: skip


def fp4_path(num_slots: int, experts: int) -> str:
    """Which kernel a step's FP4 experts run: ``gemv`` (decode steps, one slot a block, unless
    ``KVSERVE_FP4_MOE_GEMV=0``), ``dequantized`` (``DEQUANT_MIN_SLOTS_PER_EXPERT`` slots an expert
    and more) or ``grouped`` (the in-register grouped GEMM)."""
    if one_slot_per_block(num_slots, experts):
        return "gemv" if moe_gemv_enabled() else "grouped"
    return "dequantized" if num_slots >= DEQUANT_MIN_SLOTS_PER_EXPERT * experts else "grouped"


def fp4_expert_gemm(
    w13: Fp4Stack, w2: Fp4Stack, path: str, pdl: bool = False, gated: bool = False
) -> ExpertGemm:
    """``fused_moe_fp4``'s GEMM over these stacks on ``path`` (``fp4_path``); ``gated``: the
    gate/up GEMV applies the SiLU-mul (``fused_moe_with``'s ``gated_gate_up``)."""
    stacks = (w13, w2)

    def gemm(a, which, blocks, num_slots, top_k, config, row_weights, token_sum):  # noqa: ANN001, ANN202
        if path == "gemv":
            return _fp4_moe_gemv(a, stacks[which], blocks, top_k, row_weights, token_sum, pdl,
                                 config, gated and which == 0)  # fmt: skip
        args = (a, stacks[which], blocks, num_slots, top_k, config, row_weights)
        if path == "dequantized":
            return _dequantized_grouped_gemm(*args, pdl=pdl)
        return _fp4_grouped_gemm(*args, token_sum, pdl)

    return gemm


def fp4_tiles(
    w13: Fp4Stack, topk_ids: torch.Tensor, x: torch.Tensor, path: str, shared: bool = False
) -> MoeTiles:
    """Dequantized experts run the half-precision grouped GEMM, and take its tiles; decode
    steps on the word GEMV take ``*_gemv`` entries, else the GEMV's own default."""
    packed, block_scale = w13[0], w13[1]
    shape = (packed.shape[0], packed.shape[1], 2 * packed.shape[2])
    if path == "dequantized":
        return half_weight_tiles(torch.Size(shape), x.dtype, topk_ids, x.device, shared)
    kind = "nvfp4" if group_size_of(block_scale) == 16 else "mxfp4"
    if path == "gemv":
        return expert_tiles(f"{kind}_gemv", shape, topk_ids, x.device, {}, shared)
    fallback = _block_config(topk_ids.numel(), shape[0])
    return expert_tiles(kind, shape, topk_ids, x.device, fallback, shared)
