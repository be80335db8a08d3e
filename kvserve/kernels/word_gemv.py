"""Weight-only GEMV for 1-4 rows of x on CUDA cores, W read as 32-bit words: FP4 (E2M1, eight
codes a word, NVFP4 or MXFP4 block scales), FP8 e4m3 (four values a word) or x's own 16-bit
dtype (bf16 or fp16, two values a word: ``half_gemv``).

References: ``fp4_linear_reference`` (``fp4_reference.py``) and ``F.linear`` on the dequantized
FP8 weight. Entry points: ``fp4_linear`` (``fp4_gemm.py``) with a ``GemvConfig``, and
``fp8_gemv`` here.

Why not the tensor cores: with one to four rows of x there is no math for them to do, and
handing a dequantized tile to them in their operand layout costs more than the math (the FP4
MMA kernel took 27 us on Llama-3-8B's qkv at M = 1 against 10 us here, and the CUDA-core GEMV
this replaced, byte loads and cross-thread sums, 14.5 instructions a weight). Here every thread
owns whole 16-byte runs of W's rows and decodes them in registers (instructions a weight in
the loop, from the sm_90 SASS of the defaults: NVFP4 3.1, MXFP4 3.0, FP8 2.7 with half sums and
3.8 without; ``benchmarks/lowbit_sass.py``):

- FP4 -> e4m3 bytes, four codes per 32-bit operation: a code ``s e1 e0 m`` with its magnitude
  moved under an e4m3 byte's exponent/mantissa boundary is an e4m3 number worth exactly
  ``value * 2**-6`` (the zero-exponent codes land on e4m3's subnormals, which are exact); the
  2**6 is multiplied back once, at the end. Even codes (low nibbles) make one word of four
  bytes, odd codes another.
- e4m3 -> f16: ``cvt.rn.f16x2.e4m3x2`` widens two bytes at once (exact).
- FP4 with bf16/fp16 x ("packed"): x read 32 bytes at a time per pair of W words, times 2**-4
  in f16 and paired as the weights are; a word pair's sixteen products summed in one f16x2 chain
  (eight HFMA2), then its two lanes in fp32. The weights are exact in f16 and bf16 x loses
  nothing in f16 (11 against 8 significant bits); the products and the eight-term lane sums
  round at f16's 11 bits, finer than the bf16 output's 8; the 2**-4 keeps activations up to
  2**20 inside f16's range. (One word per chain and x read 2 bytes at a time took 3.9 and 3.4
  instructions a weight.)
- FP8 with bf16/fp16 x and ``GemvConfig.half_sums`` (the default at one or two rows): a word
  pair's eight products in one f16x2 chain (four HFMA2), then its two lanes in fp32. e4m3 values
  reach 448, so a fixed factor on x cannot both keep the chains inside f16 and keep small
  activations out of its subnormals; each program first reads its K range of x and takes it at
  the power of two that puts its largest |x| in [8, 16) (``word_decode._x_factor``): a lane's
  four products stay under 2**15, x keeps f16's 11 bits down to 2**-19 of its largest value, and
  the sums are divided by the factor once, at the end.
- Otherwise (FP8 without half sums; fp32 x; Triton's interpreter) f16 -> f32 and one fp32 FMA
  per weight.
- 16-bit weights: bf16 widened to fp32 by moving its bits into the top half (fp16 converted),
  one fp32 FMA per weight.
- Per scale group the partial sum is multiplied by its block scale once.

A program owns BLOCK_N rows of W and walks K in steps of BLOCK_W words (the in-register pieces
are in ``word_decode.py``). Split K and the epilogue (row scale, bias, transposed store) are the
MMA kernels' (``skinny_gemm._finish_tile``), with its deterministic last-arrival reduction, so
launches can be captured in CUDA graphs. With ``MoeSlots`` a program row serves one slot of a
mixture-of-experts step: its expert's weights and scales, its token's x row; with a token sum
(the down GEMM of a decode step) the last of a token's k slots to finish a column tile sums their
rows, as the grouped MMA kernels do (``fused_moe._sum_token_rows``). Launched with
programmatic dependent launch (``pdl``), a program issues its first step's weight and scale
loads before it waits for the kernel before (they never change while serving); x after.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import (
    interpreting,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    sm_count,
    tl,
)
from kvserve.kernels.activation import silu_mul
from kvserve.kernels.fp4_reference import MXFP4_GROUP
from kvserve.kernels.fused_moe import SlotOutput, TokenSum, _sum_token_rows
from kvserve.kernels.skinny_gemm import (
    _arrival_counters,
    _finish_tile,
    _jit,
    _store_out_tile,
    split_total,
)
from kvserve.kernels.word_decode import (
    E4M3_CODE_LOG2,
    X_PAIR_LOG2,
    _block_scale,
    _groups_in,
    _row_step,
    _scale_bytes,
    _times_unit,
    _x_factor,
)

GEMV_ROWS = 4  # the most rows the GEMV takes
GATED_GEMV_ENV = "KVSERVE_GATED_GEMV"
FP8_PER_WORD = 4
FP4_PER_WORD = 8


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 128  # rows of W per program
    block_w: int = 32  # 32-bit words of each row per K step (a multiple of a scale group's)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    # FP4 block scales read by inline-asm loads, which Triton cannot re-layout: a plain load
    # takes the coalescer's layout and the scaled sums are moved to it through shared memory,
    # with barriers, every K step (sm_90 SASS: 8 per step for NVFP4, 4 for MXFP4). Off in the
    # defaults since x is read 16 bytes at a time (gemv_config); the candidates try it.
    asm_scale_loads: bool = False
    maxnreg: int = 0  # registers a thread may use (0: ptxas decides)
    # FP8 with 16-bit x on the GPU: a word pair's products summed in one f16x2 chain, x taken
    # at a power-of-two factor per program (``word_decode._x_factor``); else fp32 FMAs
    half_sums: bool = False

    def __post_init__(self) -> None:
        for b in (self.block_n, self.block_w):
            if b < 1 or b & (b - 1):
                raise ValueError(f"block_n and block_w must be powers of two: {self}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1: {self}")


@_jit
def _word_gemv_kernel(
    x_ptr,
    w_ptr,  # int32 [N, words]: the packed weight's bytes, four to a word
    s_ptr,  # uint8 [N, K/GROUP] (FP4: E8M0 exponents or e4m3 bytes); FP8_BLOCK: fp32 scales
    rs_ptr,  # fp32 [N] or [1] (SCALAR_ROW_SCALE); unused without HAS_ROW_SCALE
    bias_ptr,
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, ROWS]; unused when DIRECT
    counter_ptr,
    M,
    N,
    words,  # per row of W
    stride_xm,
    stride_wn,  # in words
    stride_sn,
    stride_om,
    words_per_split,  # a multiple of BLOCK_W
    num_splits,
    slot_expert_ptr,  # MOE: int32 [slots], the expert of each slot (one per program row z)
    router_w_ptr,  # MOE and SCALE_ROWS: fp32 [slots]
    sums_ptr,  # SUM_TOKENS: fp32 [slots, N] workspace (fused_moe.SlotOutput)
    sum_counter_ptr,  # SUM_TOKENS: int32 arrival counters [tokens, N tiles], zero between launches
    stride_we,  # MOE: per expert, in words; likewise the next two
    stride_se,
    stride_rse,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    FP4: tl.constexpr,
    GROUP: tl.constexpr,  # FP4 scale group (16 or 32 values); 8 for FP8 (unused)
    ROWS: tl.constexpr,  # 1, 2 or 4 accumulators, >= M
    SCALE_E8M0: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    SCALAR_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DIRECT: tl.constexpr,
    USE_ASM: tl.constexpr,
    PACKED: tl.constexpr,  # 16-bit x on the GPU: products summed in f16x2 (FP4; FP8 half_sums)
    X_BF16: tl.constexpr,  # PACKED: x is bf16 (else fp16)
    ASM_SCALE_LOADS: tl.constexpr,
    MOE: tl.constexpr,  # grid z = slots: W, scales and the x row chosen per slot
    A_PER_TOKEN: tl.constexpr,  # MOE: slot s reads x row s // top_k (else row s)
    SCALE_ROWS: tl.constexpr,  # MOE: outputs times the slot's router weight
    TOP_K: tl.constexpr,  # MOE: slots per token
    # MOE: out is [tokens, N], each token's TOP_K rows summed in choice order (1), and added to
    # out's row (2), by the last of them to finish a column tile (fused_moe._sum_token_rows)
    SUM_TOKENS: tl.constexpr,
    USE_PDL: tl.constexpr,
    # FP8 with a scale per block of FP8_BLOCK rows and 128 columns ([N / FP8_BLOCK, K / 128]
    # at s_ptr; a multiple of BLOCK_N, so all of a program's rows share a block row); 0: none
    FP8_BLOCK: tl.constexpr = 0,
    X_CHUNK: tl.constexpr = 0,  # FP8 PACKED: x values a program reads at once for its factor
    W16: tl.constexpr = False,  # W holds x's 16-bit dtype, two values a word (not FP4 or FP8)
    # W is a gate/up stack [2I, K] (N = 2I): a program's first BLOCK_N / 2 rows are gate rows,
    # the rest the up rows of the same outputs; out [M, I] = silu(gate) * up (``_gated_rows``)
    GATED: tl.constexpr = False,
):
    WORDS_PER_GROUP: tl.constexpr = GROUP // 8
    # FP8 PACKED: one partial sum per word pair
    BLOCK_G: tl.constexpr = BLOCK_W // WORDS_PER_GROUP if FP4 else BLOCK_W // (1 + PACKED)
    unit_log2 = E4M3_CODE_LOG2 + X_PAIR_LOG2 if PACKED else E4M3_CODE_LOG2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_s = tl.program_id(2)
    if MOE:
        x_ptr, w_ptr, s_ptr, rs_ptr, out_ptr = _slot_operands(
            x_ptr, w_ptr, s_ptr, rs_ptr, out_ptr, slot_expert_ptr, pid_s, stride_xm, stride_we,
            stride_se, stride_rse, stride_om, USE_PDL, A_PER_TOKEN, TOP_K, SUM_TOKENS,
        )  # fmt: skip
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, BLOCK_W)
    w_start = pid_k * words_per_split
    w_end = tl.minimum(w_start + words_per_split, words)
    rows = (rn % N).to(tl.int64)[:, None]
    if GATED:
        rows = _gated_rows(pid_n, N // 2, BLOCK_N)
    w_ptrs = w_ptr + rows * stride_wn + (w_start + rw)[None, :]
    rg = tl.arange(0, BLOCK_G)
    s_ptrs = s_ptr + rows * stride_sn + (w_start // WORDS_PER_GROUP + rg)[None, :]
    words_per_sum: tl.constexpr = BLOCK_W // BLOCK_G  # FP8: the words of an accumulator column
    acc0 = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    # Software pipelining by one step: the loads of step i + 1 are issued before step i's
    # math, so a warp has them in flight while it computes (Triton pipelines only loads that
    # feed a dot).
    in_k = w_start + rw < w_end
    q = tl.load(w_ptrs, mask=in_k[None, :], other=0)
    if FP4:
        in_g = _groups_in(w_start, rg, w_end, WORDS_PER_GROUP)
        s = _scale_bytes(s_ptrs, in_g, s_ptr, ASM_SCALE_LOADS)
    if FP8_BLOCK:
        # 32 words (128 values) of a row per block scale; gated, the gate half's block row
        first_row = pid_n * (BLOCK_N // 2) if GATED else pid_n * BLOCK_N
        fp8_block_scales = s_ptr + (first_row // FP8_BLOCK) * stride_sn
    if not MOE:
        # Weights and scales never change, so a dependent launch issues their first step's
        # loads while the kernel before still runs; x (and the split-K workspace) only after.
        pdl_wait(USE_PDL)
        pdl_release(USE_PDL)
    xf0, xf1, xf2, xf3 = _x_factors(
        x_ptr, stride_xm, M, w_start, w_end, PACKED and not FP4, ROWS, X_CHUNK
    )
    for w0 in range(w_start, w_end, BLOCK_W):
        in_k_next = w0 + BLOCK_W + rw < w_end
        q_next = tl.load(w_ptrs + BLOCK_W, mask=in_k_next[None, :], other=0)
        scale = 1.0
        if FP8_BLOCK:
            scale = _fp8_step_scales(fp8_block_scales, w0 + rg * words_per_sum, w_end, N,
                                     stride_sn, FP8_BLOCK, BLOCK_N, GATED)  # fmt: skip
        if FP4:
            in_g_next = _groups_in(w0 + BLOCK_W, rg, w_end, WORDS_PER_GROUP)
            s_next = _scale_bytes(s_ptrs + BLOCK_G, in_g_next, s_ptr, ASM_SCALE_LOADS)
            scale = _block_scale(s, SCALE_E8M0)
        # fmt: off
        acc0 = _row_step(acc0, x_ptr, 0, stride_xm, M, w0, words, in_k, q, scale, xf0, FP4,
                         PACKED, X_BF16, USE_ASM, BLOCK_N, BLOCK_W, WORDS_PER_GROUP, W16)
        if ROWS > 1:
            acc1 = _row_step(acc1, x_ptr, 1, stride_xm, M, w0, words, in_k, q, scale, xf1, FP4,
                             PACKED, X_BF16, USE_ASM, BLOCK_N, BLOCK_W, WORDS_PER_GROUP, W16)
        if ROWS > 2:
            acc2 = _row_step(acc2, x_ptr, 2, stride_xm, M, w0, words, in_k, q, scale, xf2, FP4,
                             PACKED, X_BF16, USE_ASM, BLOCK_N, BLOCK_W, WORDS_PER_GROUP, W16)
            acc3 = _row_step(acc3, x_ptr, 3, stride_xm, M, w0, words, in_k, q, scale, xf3, FP4,
                             PACKED, X_BF16, USE_ASM, BLOCK_N, BLOCK_W, WORDS_PER_GROUP, W16)
        # fmt: on
        q = q_next
        in_k = in_k_next
        if FP4:
            s = s_next
        w_ptrs += BLOCK_W
        s_ptrs += BLOCK_G

    tile = _times_unit(_row_tile(acc0, acc1, acc2, acc3, xf0, xf1, xf2, xf3, ROWS), FP4, unit_log2)
    if SCALAR_ROW_SCALE:
        tile = tile * tl.load(rs_ptr)
    if SCALE_ROWS:
        tile = tile * tl.load(router_w_ptr + pid_s)
    tile_index = pid_s * tl.num_programs(0) + pid_n
    per_row_scale: tl.constexpr = HAS_ROW_SCALE and not SCALAR_ROW_SCALE
    if GATED:
        if per_row_scale:  # per W row, so before the halves meet
            tile = tile * tl.load(rs_ptr + rows)
        _finish_gated_tile(
            tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, out_ptr, pid_n, M, N // 2,
            stride_om, BLOCK_N, ROWS, DIRECT,
        )  # fmt: skip
    elif SUM_TOKENS:
        _finish_token_row(
            tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, rs_ptr, out_ptr, rn, N,
            stride_om, pid_s, sums_ptr, sum_counter_ptr, BLOCK_N, per_row_scale, DIRECT, TOP_K,
            SUM_TOKENS == 2,
        )  # fmt: skip
    else:
        _finish_tile(
            tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, rs_ptr, bias_ptr, out_ptr,
            rn, tl.arange(0, ROWS), M, N, stride_om, BLOCK_N, ROWS, per_row_scale, HAS_BIAS,
            DIRECT,
        )  # fmt: skip


@jit
def _slot_operands(
    x_ptr, w_ptr, s_ptr, rs_ptr, out_ptr, slot_expert_ptr, pid_s, stride_xm, stride_we,
    stride_se, stride_rse, stride_om, USE_PDL: tl.constexpr, A_PER_TOKEN: tl.constexpr,
    TOP_K: tl.constexpr, SUM_TOKENS: tl.constexpr,
):  # fmt: skip
    """A MoE program row's operands: its slot's x row, its expert's weights and scales, its
    output row (one per token when summing)."""
    pdl_wait(USE_PDL)  # the slots' experts come from the kernel before
    pdl_release(USE_PDL)
    expert = tl.load(slot_expert_ptr + pid_s).to(tl.int64)
    x_ptr += (pid_s // TOP_K if A_PER_TOKEN else pid_s).to(tl.int64) * stride_xm
    w_ptr += expert * stride_we
    s_ptr += expert * stride_se
    rs_ptr += expert * stride_rse
    if not SUM_TOKENS:
        out_ptr += pid_s.to(tl.int64) * stride_om
    return x_ptr, w_ptr, s_ptr, rs_ptr, out_ptr


@jit
def _fp8_step_scales(
    block_scales, sum_words, w_end, N, stride_sn, FP8_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    """The FP8 block scale of each accumulator column of a K step ([1, BLOCK_G]; gated,
    [BLOCK_N, BLOCK_G]: the up half's from its own block row)."""
    scale = tl.load(block_scales + sum_words // 32, mask=sum_words < w_end, other=0.0)[None, :]
    if GATED:
        up_scales = block_scales + _up_block_offset(N, FP8_BLOCK, stride_sn)
        up = tl.load(up_scales + sum_words // 32, mask=sum_words < w_end, other=0.0)
        scale = tl.where(tl.arange(0, BLOCK_N)[:, None] >= BLOCK_N // 2, up[None, :], scale)
    return scale


@jit
def _x_factors(
    x_ptr, stride_xm, M, w_start, w_end, HALF_SUMS: tl.constexpr, ROWS: tl.constexpr,
    X_CHUNK: tl.constexpr,
):  # fmt: skip
    """Each row's power-of-two factor on x for FP8's half sums (``word_decode._x_factor``);
    1.0 where the sums are not in f16 or the row is not there."""
    xf0 = 1.0
    xf1 = 1.0
    xf2 = 1.0
    xf3 = 1.0
    if HALF_SUMS:
        xf0 = _x_factor(x_ptr, 0, stride_xm, M, w_start, w_end, X_CHUNK)
        if ROWS > 1:
            xf1 = _x_factor(x_ptr, 1, stride_xm, M, w_start, w_end, X_CHUNK)
        if ROWS > 2:
            xf2 = _x_factor(x_ptr, 2, stride_xm, M, w_start, w_end, X_CHUNK)
            xf3 = _x_factor(x_ptr, 3, stride_xm, M, w_start, w_end, X_CHUNK)
    return xf0, xf1, xf2, xf3


@jit
def _row_tile(acc0, acc1, acc2, acc3, xf0, xf1, xf2, xf3, ROWS: tl.constexpr):
    """One [BLOCK_N, ROWS] tile from the accumulators, column m = row m of x (each divided by
    its x factor), as the MMA kernels' epilogue takes it."""
    cols = tl.arange(0, ROWS)[None, :]
    tile = tl.where(cols == 0, (tl.sum(acc0, axis=1) / xf0)[:, None], 0.0)
    if ROWS > 1:
        tile += tl.where(cols == 1, (tl.sum(acc1, axis=1) / xf1)[:, None], 0.0)
    if ROWS > 2:
        tile += tl.where(cols == 2, (tl.sum(acc2, axis=1) / xf2)[:, None], 0.0)
        tile += tl.where(cols == 3, (tl.sum(acc3, axis=1) / xf3)[:, None], 0.0)
    return tile


@jit
def _gated_rows(pid_n, half_n, BLOCK_N: tl.constexpr):
    """W rows [BLOCK_N, 1] of a gated program: gate rows pid_n * BLOCK_N / 2 + i, then the up
    rows half_n below them (past half_n they wrap onto valid rows; the store masks them)."""
    i = tl.arange(0, BLOCK_N)
    out_rows = (pid_n * (BLOCK_N // 2) + i % (BLOCK_N // 2)) % half_n
    return (out_rows + (i >= BLOCK_N // 2) * half_n).to(tl.int64)[:, None]


@jit
def _up_block_offset(N, FP8_BLOCK: tl.constexpr, stride_sn):
    """From a gate row's FP8 scale block row to its up row's (N / 2 a multiple of
    FP8_BLOCK)."""
    return (N // 2 // FP8_BLOCK) * stride_sn


@jit
def _finish_gated_tile(
    tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, out_ptr, pid_n, M, half_n,
    stride_om, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, DIRECT: tl.constexpr,
):  # fmt: skip
    """The end of a gated program's tile [BLOCK_N, ROWS] (gate rows, then up rows): after the
    K splits' sum, silu(gate) * up of the two halves, each rounded to out's dtype first as the
    two-kernel path (GEMV, then ``silu_and_mul``) rounds them, stored as [BLOCK_N / 2] outputs."""
    last = True
    total = tile
    if not DIRECT:
        last, total = split_total(tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr,
                                  BLOCK_N, ROWS)  # fmt: skip
    if last:
        halves = tl.permute(tl.reshape(total, [2, BLOCK_N // 2, ROWS]), (1, 2, 0))
        gate, up = tl.split(halves)
        dtype = out_ptr.dtype.element_ty
        gated = silu_mul(gate.to(dtype), up.to(dtype))
        rn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        _store_out_tile(out_ptr, gated, rn, tl.arange(0, ROWS), M, half_n, stride_om)


@jit
def _finish_token_row(
    tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, rs_ptr, out_ptr, rn, N,
    stride_om, slot, sums_ptr, sum_counter_ptr, BLOCK_N: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr, DIRECT: tl.constexpr, TOP_K: tl.constexpr,
    ACCUMULATE: tl.constexpr,
):  # fmt: skip
    """The end of a MoE slot's tile [BLOCK_N, 1] when tokens are summed: the last K split to
    arrive (``_finish_tile``'s reduction) scales the slot's row and hands it to the token sum."""
    if DIRECT:
        _token_row(tile, rs_ptr, out_ptr, rn, N, stride_om, slot, sums_ptr, sum_counter_ptr,
                   BLOCK_N, HAS_ROW_SCALE, TOP_K, ACCUMULATE)  # fmt: skip
    else:
        last, total = split_total(
            tile, tile_index, pid_k, num_splits, ws_ptr, counter_ptr, BLOCK_N, 1
        )
        if last:
            _token_row(total, rs_ptr, out_ptr, rn, N, stride_om, slot, sums_ptr,
                       sum_counter_ptr, BLOCK_N, HAS_ROW_SCALE, TOP_K, ACCUMULATE)  # fmt: skip


@jit
def _token_row(
    tile, rs_ptr, out_ptr, rn, N, stride_om, slot, sums_ptr, sum_counter_ptr,
    BLOCK_N: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, TOP_K: tl.constexpr,
    ACCUMULATE: tl.constexpr,
):  # fmt: skip
    row = tl.sum(tile, axis=1)
    if HAS_ROW_SCALE:
        row = row * tl.load(rs_ptr + rn, mask=rn < N, other=0.0)
    _sum_token_rows(out_ptr, row, slot, rn, N, stride_om, sums_ptr, sum_counter_ptr, TOP_K,
                    BLOCK_N, ACCUMULATE)  # fmt: skip


@dataclass(frozen=True)
class MoeSlots:
    """A mixture-of-experts step for the GEMV: slot s multiplies x row ``s // top_k``
    (``a_per_token``, the gate/up GEMM) or row s (the down GEMM) by expert ``experts[s]``."""

    experts: torch.Tensor  # int32 [slots]
    top_k: int
    a_per_token: bool
    router_weights: torch.Tensor | None = None  # fp32 [slots]: scales each slot's output
    # each token's k rows summed by the kernel (``SlotOutput.plan`` with a ``TokenSum``, at the
    # launch's block_n); ``out`` is then its ``out``
    token_sum: SlotOutput | None = None


def launch_word_gemv(
    x: torch.Tensor,
    weight_bytes: torch.Tensor,
    block_scale: torch.Tensor | None,
    row_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: GemvConfig,
    group: int,
    moe: MoeSlots | None = None,
    pdl: bool = False,
    fp8_block_rows: int = 0,
    half_weights: bool = False,
    gated: bool = False,
) -> None:
    """``weight_bytes`` uint8 [N, K/2] (FP4 codes; ``block_scale`` [N, K/group]) or float8
    e4m3 [N, K] (FP8; ``row_scale`` [N] or [1], or with ``fp8_block_rows`` ``block_scale`` fp32
    [N / fp8_block_rows, K / 128]), or with ``half_weights`` the bytes of a weight in x's 16-bit
    dtype, uint8 [N, 2K]. With ``moe``, each of them has a leading expert dimension and ``out``
    is [slots, N]. ``gated``: W stacks gate over up rows ([2I, K]) and ``out`` takes
    silu(gate) * up, [M or slots, I]. ``pdl``: programmatic dependent launch
    (``kvserve.kernels._triton``)."""
    m, k = x.shape
    n, row_bytes = weight_bytes.shape[-2:]
    fp4 = block_scale is not None and not fp8_block_rows
    if fp8_block_rows and fp8_block_rows % cfg.block_n:
        raise ValueError(f"FP8 scale blocks of {fp8_block_rows} rows do not fit {cfg}")
    if gated:
        _check_gated(n, cfg, fp8_block_rows, bias, moe)
    slots = 1 if moe is None else moe.experts.numel()
    if m > GEMV_ROWS and moe is None:
        raise ValueError(f"the GEMV takes at most {GEMV_ROWS} rows, got {m}")
    if row_bytes % 4 or weight_bytes.stride(-2) % 4 or weight_bytes.data_ptr() % 4:
        raise ValueError("the GEMV reads W as 32-bit words: its rows must be 4-byte multiples")
    words = row_bytes // 4
    wpg = group // 8 if fp4 else 1
    if cfg.block_w % wpg:
        raise ValueError(f"block_w {cfg.block_w} words is not a multiple of a group ({wpg})")
    n_tiles, k_steps = -(-n // cfg.block_n), -(-words // cfg.block_w)
    if gated:
        n_tiles = -(-(n // 2) // (cfg.block_n // 2))
    steps_per_split = -(-k_steps // max(1, min(cfg.split_k, k_steps)))
    splits = -(-k_steps // steps_per_split)
    direct = splits == 1
    rows = 1 if moe is not None else min(GEMV_ROWS, 1 << (m - 1).bit_length())
    summing = moe is not None and moe.token_sum is not None
    if summing and (bias is not None or out is not moe.token_sum.out):
        raise ValueError("a token-summing GEMV writes its SlotOutput's out and takes no bias")
    ws, counters = out, out  # placeholders, unused unsplit
    if not direct:
        ws, counters = _split_workspace(x.device, slots * n_tiles, splits * cfg.block_n * rows, moe)
    scales = block_scale.view(torch.uint8) if fp4 else weight_bytes
    if fp8_block_rows:
        scales = block_scale
    half = fp4 or (cfg.half_sums and not half_weights and words % 2 == 0)
    packed = half and x.dtype != torch.float32 and not interpreting()
    # FP8 packed: a program reads its K range of x at most 4096 values at a time for its factor
    x_chunk = min(4096, 4 * next_pow2(steps_per_split * cfg.block_w))
    if packed and (x.data_ptr() % 16 or x.stride(0) * x.element_size() % 16):
        x = x.clone(memory_format=torch.contiguous_format)  # x is read 16 bytes at a time
    w_words = weight_bytes.view(torch.int32)
    _word_gemv_kernel[(n_tiles, splits, slots)](
        x, w_words, scales,
        row_scale if row_scale is not None else out, bias if bias is not None else out,
        out, ws, counters, 1 if moe is not None else m, n, words, x.stride(0),
        w_words.stride(-2), scales.stride(-2), out.stride(0), steps_per_split * cfg.block_w,
        splits, *_moe_args(moe, out, w_words, scales, row_scale),
        BLOCK_N=cfg.block_n, BLOCK_W=cfg.block_w, FP4=fp4, GROUP=group if fp4 else 8,
        ROWS=rows,
        SCALE_E8M0=fp4 and block_scale.dtype == torch.uint8,
        HAS_ROW_SCALE=row_scale is not None,
        SCALAR_ROW_SCALE=row_scale is not None and row_scale.shape[-1] == 1 and n > 1,
        HAS_BIAS=bias is not None, DIRECT=direct, USE_ASM=not interpreting(),
        PACKED=packed, X_BF16=x.dtype == torch.bfloat16,
        ASM_SCALE_LOADS=cfg.asm_scale_loads and not interpreting(),
        MOE=moe is not None, A_PER_TOKEN=moe is not None and moe.a_per_token,
        SCALE_ROWS=moe is not None and moe.router_weights is not None,
        TOP_K=1 if moe is None else moe.top_k,
        SUM_TOKENS=moe.token_sum.sum_mode if summing else 0,
        FP8_BLOCK=fp8_block_rows, X_CHUNK=x_chunk if packed and not fp4 else 0, W16=half_weights,
        GATED=gated,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(pdl), **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )  # fmt: skip


def _split_workspace(
    device: torch.device, tiles: int, tile_values: int, moe: MoeSlots | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K partials (fp32, ``tile_values`` a tile) and an arrival counter a tile;
    with a token sum, the counters come after the token sums' ([tokens, N tiles]), which share
    the buffer."""
    ws = torch.empty(tiles * tile_values, dtype=torch.float32, device=device)
    taken = tiles // moe.top_k if moe is not None and moe.token_sum is not None else 0
    return ws, _arrival_counters(device, taken + tiles)[taken:]


def gated_fits(n: int, fp8_block_rows: int = 0) -> bool:
    """A gate/up stack of ``n`` rows the gated GEMV takes: n = 2I, and with FP8 block scales I a
    whole number of blocks (a program's up half reads its own block row)."""
    return n % 2 == 0 and (not fp8_block_rows or (n // 2) % fp8_block_rows == 0)


def _check_gated(
    n: int, cfg: GemvConfig, fp8_block_rows: int, bias: torch.Tensor | None, moe: MoeSlots | None
) -> None:
    """A gated launch's W is [2I, K], a program's halves lie inside one FP8 scale block row
    each, and the output takes no bias or token sum."""
    if not gated_fits(n, fp8_block_rows) or cfg.block_n < 2:
        raise ValueError(f"a gated GEMV needs gate/up rows [2I, K] (I a multiple of the FP8 "
                         f"scale block's {fp8_block_rows} rows), got N = {n} at {cfg}")  # fmt: skip
    if bias is not None or (moe is not None and moe.token_sum is not None):
        raise ValueError("a gated GEMV takes no bias and sums no token rows")


@functools.cache
def gated_gemv_enabled() -> bool:
    """``KVSERVE_GATED_GEMV``: 1 (the default) has a gate/up projection that runs on the GEMV
    (MoE decode steps' experts, dense MLPs' few-token steps) apply the SiLU-mul in its epilogue
    (``launch_word_gemv``'s ``gated``), sparing the SiLU-mul kernel; 0 keeps that kernel. On
    the H200, batch 1, two alternating runs a side on one machine (moe_decode_h200_s42_*,
    lowbit_decode_h200_s42_*): GLM-4.5-Air NVFP4 232 / 232 -> 236 / 236 tok/s, Llama-3-8B FP8
    weight-only 328 / 333 -> 340 / 340, GLM-4.5-Air FP8 blocks with its experts on the GEMV
    (``KVSERVE_FP8_MOE_GEMV=1``) 195 / 195 -> 197 / 197."""
    return env_switch(GATED_GEMV_ENV, default=True)


def moe_gemv(
    a: torch.Tensor,
    weight_bytes: torch.Tensor,
    scales: tuple[torch.Tensor | None, torch.Tensor | None],
    config: dict[str, int],
    group: int,
    route: tuple[torch.Tensor, int, torch.Tensor | None],
    token_sum: TokenSum | None = None,
    pdl: bool = False,
    fp8_block_rows: int = 0,
    half_weights: bool = False,
    gated: bool = False,
) -> torch.Tensor:
    """One GEMV per slot of a decode step's experts (``launch_word_gemv`` with ``MoeSlots``):
    ``route`` is (expert of each slot, top_k, router weights or None: the gate/up GEMM, x row
    per token); ``scales`` (block scales, row scales); ``weight_bytes`` and ``half_weights`` as
    ``launch_word_gemv``'s; ``config``: a tuned ``*_gemv`` entry's ``GemvConfig`` fields, else
    ``gemv_config``'s default for the step, with FP8's half sums (table entries do not name
    them) and its rows inside one scale block. Returns [slots, N], or with a ``token_sum``
    [tokens, N], each token's k rows summed in the epilogue, or ``gated`` (the gate/up stack)
    [slots, N / 2], the SiLU-mul applied."""
    experts, top_k, row_weights = route
    n, words = weight_bytes.shape[1], weight_bytes.shape[2] // 4
    if config:
        cfg = GemvConfig(**config)
    else:
        cfg = gemv_config(n, words, num_sms=sm_count(a.device), slots=experts.numel())
    cfg = replace(cfg, half_sums=True)  # FP8's; FP4 and 16-bit weights have their own sums
    if fp8_block_rows:
        cfg = replace(cfg, block_n=min(cfg.block_n, fp8_block_rows))
    a = a if a.stride(1) == 1 else a.contiguous()
    n_out = n // 2 if gated else n
    dest = SlotOutput.plan(a, experts.numel(), n_out, top_k, cfg.block_n, token_sum)
    summing = dest if token_sum is not None else None
    slots = MoeSlots(experts, top_k, row_weights is None, row_weights, summing)
    launch_word_gemv(a, weight_bytes, *scales, None, dest.out, cfg, group, slots, pdl,
                     fp8_block_rows, half_weights, gated)  # fmt: skip
    return dest.out


def _moe_args(
    moe: MoeSlots | None,
    placeholder: torch.Tensor,
    w_words: torch.Tensor,
    scales: torch.Tensor,
    row_scale: torch.Tensor | None,
) -> tuple:
    """The kernel's slot_expert_ptr, router_w_ptr, sums_ptr, sum_counter_ptr and per-expert
    strides (words, scale bytes, row scales); placeholders without ``moe``."""
    if moe is None:
        return placeholder, placeholder, placeholder, placeholder, 0, 0, 0
    router = moe.router_weights if moe.router_weights is not None else placeholder
    sums = (moe.token_sum.sums, moe.token_sum.counters) if moe.token_sum else (placeholder,) * 2
    rs_stride = row_scale.stride(0) if row_scale is not None else 0
    return moe.experts, router, *sums, w_words.stride(0), scales.stride(0), rs_stride


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    *,
    block: tuple[int, int] | None = None,
    pdl: bool = False,
    gated: bool = False,
) -> torch.Tensor:
    """Weight-only FP8 for 1-4 rows: ``x`` [M, K] (bf16/fp16/fp32) @ (``weight`` [N, K] e4m3
    * ``scale``).T (+ bias) -> [M, N] in x's dtype; ``scale`` fp32 [N] or [1], or with
    ``block`` (rows, 128) one per block of W: [ceil(N / rows), ceil(K / 128)]. ``gated``: W is
    a gate/up stack and the result silu(gate) * up, [M, N / 2] (``launch_word_gemv``)."""
    n, k = weight.shape
    scale_ok = scale.numel() in (1, n) if block is None else _fits_fp8_blocks(scale, block, n, k)
    ok = (
        x.dim() == 2 and x.shape[1] == k and 0 < x.shape[0] <= GEMV_ROWS
        and weight.dtype == torch.float8_e4m3fn and weight.stride(1) == 1
        and scale_ok and x.device == weight.device == scale.device
    )  # fmt: skip
    if not ok:
        got = f"x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}"
        raise ValueError(f"fp8_gemv: {got}, scale {tuple(scale.shape)}, block {block}")
    require_triton()
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], n // 2 if gated else n, dtype=x.dtype, device=x.device)
    cfg = config or fp8_gemv_config(n, k // FP8_PER_WORD, x.shape[0], sm_count(x.device))
    if block is None:
        block_scale, row_scale, block_rows = None, scale.reshape(-1).float(), 0
    else:  # a program's rows inside one block row
        block_scale, row_scale, block_rows = scale.float(), None, block[0]
        cfg = replace(cfg, block_n=min(cfg.block_n, block_rows))
    launch_word_gemv(x, weight.view(torch.uint8), block_scale, row_scale, bias, out, cfg, 8,
                     pdl=pdl, fp8_block_rows=block_rows, gated=gated)  # fmt: skip
    return out


def half_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    *,
    pdl: bool = False,
    gated: bool = False,
) -> torch.Tensor:
    """``x`` [M <= 4, K] @ ``weight``.T (+ bias), the weight in x's dtype (bf16 or fp16), on the
    word GEMV: two weights a 32-bit word, widened exactly to fp32, one fp32 FMA each. K even.
    ``gated``: as ``fp8_gemv``'s."""
    n, k = weight.shape
    ok = (
        x.dim() == 2 and x.shape[1] == k and 0 < x.shape[0] <= GEMV_ROWS and k % 2 == 0
        and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
        and weight.stride(1) == 1 and x.device == weight.device
    )  # fmt: skip
    if not ok:
        got = f"x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}"
        raise ValueError(f"half_gemv: {got}")
    require_triton()
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty(x.shape[0], n // 2 if gated else n, dtype=x.dtype, device=x.device)
    cfg = config or half_gemv_config(n, k // 2, x.shape[0], sm_count(x.device))
    launch_word_gemv(x, weight.view(torch.uint8), None, None, bias, out, cfg, 8, pdl=pdl,
                     half_weights=True, gated=gated)  # fmt: skip
    return out


def gemv_takes_fp8_blocks(block: tuple[int, int]) -> bool:
    """FP8 scale blocks the GEMV reads: 128 columns (one scale per 32 words) and a multiple of
    64 rows, so that a program's rows share one block row."""
    return block[1] == 128 and block[0] % 64 == 0


def _fits_fp8_blocks(scale: torch.Tensor, block: tuple[int, int], n: int, k: int) -> bool:
    """Scales [ceil(N / rows), ceil(K / 128)] of blocks the GEMV takes, contiguous in K."""
    rows, cols = block
    shape_ok = tuple(scale.shape) == (-(-n // rows), -(-k // cols))
    return gemv_takes_fp8_blocks(block) and shape_ok and scale.stride(-1) == 1


SPLIT_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)  # K splits the GEMV and the FP4 MMA kernel try
# (block_n, block_w, num_warps) tried by the benchmarks (benchmarks/fp4_gemm.py,
# benchmarks/fp8_gemv.py); the last five are narrow and wide in K, for shapes of few rows
# (N = 4096), which the others split eight ways
GEMV_TILES = (
    (128, 32, 4), (128, 32, 8), (64, 32, 4), (256, 32, 8), (64, 64, 4), (128, 16, 4),
    (32, 128, 4), (16, 256, 4), (32, 256, 8), (16, 128, 4), (64, 128, 8),
)  # fmt: skip


def gemv_config(
    n: int,
    words: int,
    *,
    rows: int = 1,
    num_sms: int = 132,
    block_n: int | None = None,
    block_w: int = 32,
    num_warps: int = 4,
    programs_per_sm: int = 4,
    slots: int = 1,
    scale_group: int = 0,
    max_split: int = SPLIT_COUNTS[-1],
) -> GemvConfig:
    """128 rows of W per program (64 for 3-4 rows of x, whose accumulators would spill), K
    split until there are about ``programs_per_sm`` programs per SM, with >= 2 K steps each
    (a program keeps one step's loads in flight while it computes the one before), in at most
    ``max_split`` parts. ``slots``: the row tiles repeat once per slot of a MoE step
    (``MoeSlots``).

    ``scale_group``: values per block scale (16 NVFP4, 32 MXFP4, 0 none). Since x is read in
    16-byte runs and word pairs sum in one chain, both formats read their scales with plain
    loads, and MXFP4 at one row runs with at most 128 registers a thread. On the H200 (Llama-3-8B's
    projections at one row, fp4_gemm_h200_wordpair_{1head,3head}_2026-12-01.json, one machine),
    ``asm_scale_loads`` made NVFP4's gate_up / down 30.4 / 18.8 us against 25.4 / 16.2 (qkv / o
    8.8 / 7.9 against 9.1 / 8.0), and the cap took MXFP4's qkv / o from 8.8 / 7.7 to 8.1 / 7.0 us
    (gate_up / down within 1%)."""
    block_n = block_n or (128 if rows <= 2 else 64)
    tiles = slots * -(-n // block_n)
    k_steps = -(-words // block_w)
    split = 1
    for s in SPLIT_COUNTS:
        if s > 1 and (tiles * s > programs_per_sm * num_sms or k_steps // s < 2 or s > max_split):
            break
        split = s
    # the cap was measured at one row; more rows' accumulators spill under it (MXFP4 at 2 rows:
    # 616 bytes a thread, tests/sm90_builds)
    maxnreg = 128 if scale_group == MXFP4_GROUP and rows == 1 else 0
    return GemvConfig(block_n, block_w, split, num_warps, 3, maxnreg=maxnreg)


def fp8_gemv_config(n: int, words: int, rows: int, num_sms: int) -> GemvConfig:
    """One or two rows of x: half sums, and 64 rows by 64 words per program with K split at
    most four ways, or where N has at most half an SM count of such row tiles (N = 4096),
    128 rows by 32 words with K split up to sixteen ways. On the H200, one row, one machine
    (fp8_gemv_h200_s41_halfsums_{llama,glm}), half sums took GLM-4.5-Air's block-scaled qkv from
    24.6 to 18.1 us and Llama-3-8B's gate_up from 32.6 to 30.9; the wide tile took o / down /
    GLM o (K 12288) from 9.2 / 22.0 / 19.2 us (64 x 64, fp32 sums) to 8.8 / 19.3 / 18.0 (with
    fp32 sums it was slower: 10.8 / 24.1 / 21.3). In the engine, batch 1: GLM-4.5-Air FP8
    blocks 191 -> 201 tok/s, Llama-3-8B FP8 on the GEMV within noise (326-331 either way).
    Three or four rows: ``gemv_config``, fp32 sums (not timed with half sums)."""
    if rows > 2:
        return gemv_config(n, words, rows=rows, num_sms=num_sms)
    if -(-n // 64) <= num_sms // 2:
        cfg = gemv_config(n, words, rows=rows, num_sms=num_sms, block_n=128, block_w=32)
    else:
        cfg = gemv_config(n, words, rows=rows, num_sms=num_sms, block_n=64, block_w=64, max_split=4)
    return replace(cfg, half_sums=True)


def half_gemv_config(n: int, words: int, rows: int, num_sms: int) -> GemvConfig:
    """16-bit weights, one row of x: 16 rows of W by 128 words (256 values) per program where
    those row tiles fit four an SM (N <= 8448 on the H200), K split as ``gemv_config`` splits;
    otherwise ``gemv_config``. On the H200 (skinny_gemm_h200_s42_qwen_llama_attn, one row, bf16)
    it beat the 128-row default on every shape timed: Qwen3-30B-A3B's q/k/v / o 9.8 / 9.7 ->
    9.4 / 7.9 us (cuBLAS 8.9 / 8.9), Llama-3-8B's 18.6 / 13.4 -> 17.8 / 12.5 (cuBLAS 16.9 /
    13.1). Not timed in the engine."""
    if rows > 1 or -(-n // 16) > 4 * num_sms:
        return gemv_config(n, words, rows=rows, num_sms=num_sms)
    return gemv_config(n, words, num_sms=num_sms, block_n=16, block_w=128)


def fp4_gemv_config(n: int, words: int, rows: int, num_sms: int, group: int) -> GemvConfig:
    """One row of x: 16 rows of W by 256 words (2048 values) per program where those row tiles
    fit four an SM, so that N = 4096 needs no K split; 64 by 64 past that. On the H200
    (Llama-3-8B's projections, NVFP4, fp4_gemm_h200_s36_tiles_2026-12-02.json) they took
    qkv / o / down from 9.4 / 7.9 / 16.6 to 8.6 / 7.0 / 14.7 us and gate_up from 25.3 to 24.2
    (16 by 256 there: 25.3). Otherwise ``gemv_config``."""
    if rows > 1:
        return gemv_config(n, words, rows=rows, num_sms=num_sms, scale_group=group)
    block_n, block_w = (16, 256) if -(-n // 16) <= 4 * num_sms else (64, 64)
    return gemv_config(
        n, words, num_sms=num_sms, block_n=block_n, block_w=block_w, scale_group=group
    )


def gemv_candidates(
    n: int, words: int, *, rows: int = 1, num_sms: int = 132, scale_group: int = 0
) -> list[GemvConfig]:
    """The default config, then (FP4) it with ``asm_scale_loads``, the 128-register cap or both
    flipped, then every tile of GEMV_TILES at 4, 8 and 2 programs per SM."""
    default = gemv_config(n, words, rows=rows, num_sms=num_sms, scale_group=scale_group)
    configs = [default]
    if scale_group:
        other_cap = 0 if default.maxnreg else 128
        for asm, cap in ((True, default.maxnreg), (False, other_cap), (True, other_cap)):
            configs.append(replace(default, asm_scale_loads=asm, maxnreg=cap))
    for per_sm in (4, 8, 2):
        for block_n, block_w, warps in GEMV_TILES:
            cfg = gemv_config(n, words, rows=rows, num_sms=num_sms, block_n=block_n,
                              block_w=block_w, num_warps=warps, programs_per_sm=per_sm,
                              scale_group=scale_group)  # fmt: skip
            if cfg not in configs:
                configs.append(cfg)
    return configs
