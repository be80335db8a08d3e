"""Mixture of experts with FP8 (e4m3) expert weights: the grouped GEMMs of ``fused_moe.py`` on
FP8 tensor cores, activations quantized dynamically before each GEMM.

Weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` in float8_e4m3fn with fp32 scales, either
- block-wise (``block = (bn, bk)``, Qwen3-FP8 / GLM-4.5-FP8): ``w13_scale [E, 2I/bn, H/bk]``,
  activations per token and group of ``bk`` columns; each K step's fp32 partial product is
  multiplied by the rows' and the weight block's scales;
- per output channel (``block = None``): ``w13_scale [E, 2I]``, activations per token (one
  scale per row); both scales are applied once, to the accumulator.

``fused_moe_fp8_reference`` is the plain-torch reference (dequantize the experts, quantize and
dequantize the activations the same way, then ``fused_moe_reference``); it runs anywhere and
is what the CPU path computes. No host syncs: capturable in CUDA graphs.

Decode steps (one slot per expert block) run weight-only on the word GEMV of ``word_gemv.py``
(bf16 activations, half sums, the SiLU-mul in the gate/up GEMV's epilogue), as FP4 experts do:
two launches fewer a layer (the activations' quantizations). ``KVSERVE_FP8_MOE_GEMV=0`` keeps
them on the grouped kernel (``fp8_moe_gemv_enabled``).
"""

from __future__ import annotations

import functools
from functools import partial

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import jit, launch_options, pdl_release, pdl_wait, tl
from kvserve.kernels.fp8_quant import dequantize_fp8_activation, quantize_fp8
from kvserve.kernels.fused_moe import (
    ExpertGemm,
    SlotOutput,
    SortedSlots,
    TokenSum,
    _block_config,
    _block_slots,
    _program_tile,
    _store_slots,
    block_tables,
    fused_moe_reference,
    fused_moe_with,
    grouped_grid,
    one_slot_per_block,
)
from kvserve.kernels.moe_tiles import MoeTiles, expert_tiles
from kvserve.kernels.word_gemv import (
    gated_fits,
    gated_gemv_enabled,
    gemv_takes_fp8_blocks,
    moe_gemv,
)

FP8_MOE_GEMV_ENV = "KVSERVE_FP8_MOE_GEMV"


def dequantize_fp8_experts(
    w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
) -> torch.Tensor:
    """fp32 ``[E, N, K]`` from FP8 experts and their block ``[E, N/bn, K/bk]`` or per-channel
    ``[E, N]`` scales."""
    if block is None:
        return w.float() * scale.float()[:, :, None]
    bn, bk = block
    full = scale.float().repeat_interleave(bn, 1).repeat_interleave(bk, 2)
    return w.float() * full[:, : w.shape[1], : w.shape[2]]


def fake_quant_fp8(t: torch.Tensor, group: int | None) -> torch.Tensor:
    """Activations quantized per token (``group`` None) or token group, then dequantized."""
    return dequantize_fp8_activation(*quantize_fp8(t, group)).to(t.dtype)


def fused_moe_fp8_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block: tuple[int, int] | None,
) -> torch.Tensor:
    w13_f = dequantize_fp8_experts(w13, w13_scale, block)
    w2_f = dequantize_fp8_experts(w2, w2_scale, block)
    quant = partial(fake_quant_fp8, group=block[1] if block else None)
    out = fused_moe_reference(x.float(), w13_f, w2_f, topk_weights, topk_ids, quant, x.dtype)
    return out.to(x.dtype)


@jit
def _fp8_grouped_gemm_kernel(
    a_ptr,  # fp8 [rows of A, K]: tokens (A_PER_TOKEN) or slots
    as_ptr,  # fp32 [rows of A, K / SCALE_K] (BLOCKWISE) or [rows of A, 1]
    w_ptr,  # fp8 [E, N, K]
    ws_ptr,  # fp32 [E, N / GROUP_N, K / SCALE_K] (BLOCKWISE) or [E, N]
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
    stride_as,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_out,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    ONE_SLOT_PER_BLOCK: tl.constexpr,
    SUM_TOKENS: tl.constexpr,
    BLOCKWISE: tl.constexpr,
    GROUP_N: tl.constexpr,
    SCALE_K: tl.constexpr,  # K columns per scale (BLOCKWISE; a multiple of BLOCK_K)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
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
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_a + offs_k[None, :]
    w_ptrs = (
        w_ptr
        + expert.to(tl.int64) * stride_we
        + offs_n.to(tl.int64)[None, :] * stride_wn
        + offs_k[:, None]
    )
    as_rows = as_ptr + a_rows.to(tl.int64) * stride_as
    ws_cols = ws_ptr + expert.to(tl.int64) * stride_wse + (offs_n // GROUP_N) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if BLOCKWISE:  # scales in their own step: a step ahead was no faster (s59)
            a_s = tl.load(as_rows + k0 // SCALE_K, mask=row_ok, other=0.0)
            w_s = tl.load(ws_cols + k0 // SCALE_K, mask=n_ok, other=0.0)
            acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
        else:
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not BLOCKWISE:
        acc = acc * tl.load(as_rows, mask=row_ok, other=0.0)[:, None]
        acc = acc * tl.load(ws_cols, mask=n_ok, other=0.0)[None, :]
    _store_slots(
        out_ptr, acc, slots, row_ok, offs_n, N, weights_ptr, stride_out, sums_ptr, counter_ptr,
        SCALE_ROWS, SUM_TOKENS, TOP_K, BLOCK_M, BLOCK_N,
    )  # fmt: skip


def _fp8_grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    block: tuple[int, int] | None,
    blocks: SortedSlots | torch.Tensor,
    num_slots: int,
    top_k: int,
    config: dict[str, int],
    row_weights: torch.Tensor | None,
    token_sum: TokenSum | None = None,
    pdl: bool = False,
    gated: bool = False,
) -> torch.Tensor:
    """``a`` in the activation dtype: quantized here (per token group or per token), then
    ``a @ w[e].T`` per slot as ``fused_moe._grouped_gemm`` does (``token_sum`` too). ``gated``:
    ``a`` is the gate/up output [slots, 2K], SiLU-multiplied in the same launch as its
    quantization (``fp8_quant``)."""
    n, k = w.shape[1], w.shape[2]
    aq, a_scale = quantize_fp8(a, block[1] if block else None, pdl=pdl, gated=gated)
    config = launch_tile(config, block)
    block_n, block_k = config["BLOCK_N"], config["BLOCK_K"]
    dest = SlotOutput.plan(a, num_slots, n, top_k, block_n, token_sum)
    block_expert, slots, one_slot = block_tables(blocks)
    grid = grouped_grid(block_expert, n, block_n)
    _fp8_grouped_gemm_kernel[grid](
        aq, a_scale, w, ws, dest.out, slots, block_expert,
        row_weights if row_weights is not None else a_scale, dest.sums, dest.counters,
        num_slots, n, k, aq.stride(0), a_scale.stride(0), w.stride(0), w.stride(1),
        ws.stride(0), ws.stride(1), dest.out.stride(0), TOP_K=top_k,
        A_PER_TOKEN=row_weights is None, SCALE_ROWS=row_weights is not None,
        ONE_SLOT_PER_BLOCK=one_slot, SUM_TOKENS=dest.sum_mode, BLOCKWISE=block is not None,
        GROUP_N=block[0] if block else 1, SCALE_K=block[1] if block else block_k,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **launch_options(pdl),
    )  # fmt: skip
    return dest.out


def launch_tile(config: dict[str, int], block: tuple[int, int] | None) -> dict[str, int]:
    """``config`` as the kernel runs it: with 128 x 128 weight blocks a K step is one scale
    block and a program's columns stay within one."""
    if block is None:
        return config
    return config | {"BLOCK_N": min(config["BLOCK_N"], block[0]), "BLOCK_K": block[1]}


def fp8_kind(block: tuple[int, int] | None) -> str:
    """The experts' format in the tile tables (``moe_tiles``)."""
    return f"fp8_block{block[0]}x{block[1]}" if block else "fp8_channel"


def fused_moe_fp8(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block: tuple[int, int] | None,
    pdl: bool = False,
    addend: torch.Tensor | None = None,
    shared: bool = False,
) -> torch.Tensor:
    """The GPU path of ``fused_moe_fp8_reference`` (same arguments; ``shared`` as
    ``fused_moe``'s)."""
    experts = w13.shape[0]
    gemv = fp8_moe_gemv_here(topk_ids.numel(), w13, block)
    tiles = fp8_tiles(w13.shape, block, topk_ids, x.device, gemv, shared)
    gated = gemv and gated_gemv_enabled() and gated_fits(w13.shape[1], block[0] if block else 0)
    gemm = fp8_expert_gemm(w13, w13_scale, w2, w2_scale, block, pdl, gemv, gated)
    return fused_moe_with(
        x, topk_weights, topk_ids, experts, w2.shape[1], gemm, tiles, pdl, addend,
        gated_down=not gemv, gated_gate_up=gated,
    )  # fmt: skip


@functools.cache
def fp8_moe_gemv_enabled() -> bool:
    """``KVSERVE_FP8_MOE_GEMV``: 1 (the default) runs FP8 experts' decode steps on the word
    GEMV, 0 on the grouped tensor-core kernel. On the H200, alternating runs on one machine:
    with the tuned ``fp8_block128x128_gemv`` tiles (moe_tune_h200_s43_gemv, env_ab_s43_*),
    GLM-4.5-Air FP8 blocks batch 1 / 2 / 4 from 200.4 / 271.5 / 369.6 to 204.0 / 283.2 / 370.4
    tok/s, Qwen3-30B-A3B FP8 blocks 386.5 / 579.5 / 814.4 to 383.6 / 583.2 / 833.9; per-channel
    experts with the heuristic tiles (env_ab_s44_q3_fp8ch_moegemv), Qwen3-30B-A3B batch 1 / 2
    384.6 / 568.7 -> 396.8 / 571.6."""
    return env_switch(FP8_MOE_GEMV_ENV, default=True)


def fp8_moe_gemv_here(num_slots: int, w13: torch.Tensor, block: tuple[int, int] | None) -> bool:
    """A decode step (one slot per expert block) with the GEMV on (``fp8_moe_gemv_enabled``)
    and scales it takes: per channel, or blocks of 128 columns and a multiple of 64 rows."""
    fits = block is None or gemv_takes_fp8_blocks(block)
    return fits and one_slot_per_block(num_slots, w13.shape[0]) and fp8_moe_gemv_enabled()


def fp8_tiles(
    shape: torch.Size, block: tuple[int, int] | None, topk_ids: torch.Tensor,
    device: torch.device, gemv: bool, shared: bool = False,
) -> MoeTiles:  # fmt: skip
    """The grouped kernel's tiles, or on the GEMV its ``*_gemv`` entries (else its default)."""
    if gemv:
        return expert_tiles(f"{fp8_kind(block)}_gemv", shape, topk_ids, device, {}, shared)
    fallback = _block_config(topk_ids.numel(), shape[0])
    return expert_tiles(fp8_kind(block), shape, topk_ids, device, fallback, shared)


def fp8_expert_gemm(
    w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
    block: tuple[int, int] | None, pdl: bool = False, gemv: bool = False, gated: bool = False,
) -> ExpertGemm:  # fmt: skip
    """``fused_moe_fp8``'s grouped GEMM over these stacks, or with ``gemv`` the word GEMV. The
    grouped down GEMM takes the SiLU-mul output [slots, I], or the gate/up output [slots, 2I]
    (``fused_moe_with``'s ``gated_down``), which its quantization SiLU-multiplies; with
    ``gated`` the gate/up GEMV applies the SiLU-mul (``gated_gate_up``)."""
    stacks = ((w13, w13_scale), (w2, w2_scale))

    def gemm(a, which, blocks, num_slots, top_k, config, row_weights, token_sum):  # noqa: ANN001, ANN202
        w, ws = stacks[which]
        if gemv:  # weight-only, half sums; blocks: each slot's expert
            scales = (None, ws) if block is None else (ws, None)
            route = (blocks, top_k, row_weights)
            return moe_gemv(a, w.view(torch.uint8), scales, config, 8, route, token_sum, pdl,
                            block[0] if block else 0, gated=gated and which == 0)  # fmt: skip
        down_gated = which == 1 and a.shape[1] == 2 * w.shape[2]
        return _fp8_grouped_gemm(a, w, ws, block, blocks, num_slots, top_k, config, row_weights,
                                 token_sum, pdl, down_gated)  # fmt: skip

    return gemm
