"""FP8 (e4m3) weights against few rows of x on the FP8 tensor cores, for decode steps:
``y = x @ (w * ws).T`` with ``x [M, K]`` bf16/fp16 (M <= 64 by default, tiles of at most 64
rows up to ``MOST_ROWS``), ``w [N, K]`` float8_e4m3fn and
``ws`` fp32: one scale per output channel ``[N]``, per tensor ``[1]``, or per block of
``bn x 128`` ``[N / bn, K / 128]`` (the DeepSeek-V3 / Qwen3-FP8 layout, bn a multiple of
BLOCK_N).

Reference: ``fp8_skinny_reference`` below (x quantized as the kernel does, then fp32 math).

The layout is ``skinny_gemm.py``'s "swap AB": a program owns BLOCK_N rows of W (the wgmma's M
side) and all rows of x padded to BLOCK_M (its N side), walks its share of K and, with split K,
hands its fp32 partial to that file's deterministic last-arrival reduction.

x gets one scale per row and K step of BLOCK_K columns (``amax / 448``, the 1 x 128
token-group scaling of DeepSeek-V3's FP8 recipe). Up to QUANTIZE_FIRST_ABOVE rows each program
quantizes its x tiles inside the loop: no separate kernel and no pass over the whole row before
the first MMA. Past it, one quantization kernel runs first (``Fp8SkinnyConfig.quantize_first``).
Each step's product is multiplied by its scales into the fp32 accumulator. The weight streams
through shared memory untouched, so unlike the weight-only GEMV (``word_gemv.py``, 3.8
instructions a weight on the CUDA cores) the loop spends no instructions on W's values.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from kvserve.errors import ConfigError
from kvserve.kernels._triton import (
    constexpr,
    interpreting,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    prefetch_l2,
    require_triton,
    sm_count,
    tl,
)
from kvserve.kernels.activation import silu_and_mul
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight
from kvserve.kernels.fp8_quant import (
    FP8,
    FP8_MAX,
    dequantize_fp8_activation,
    quantize_fp8,
    quantize_fp8_reference,
)
from kvserve.kernels.skinny_gemm import SplitLaunch, _finish_tile, _jit, tile_index, tile_start

MAX_ROWS = 64  # the wgmma's N side: x rows a program
# Rows a launch takes, in tiles of MAX_ROWS that each stream W (adjacent programs share a W tile
# through L2): past the default's 64 only by setting (``KVSERVE_FP8_SKINNY_ROWS``), to time it
# against cuBLAS and the block GEMM at batch 65-512.
MOST_ROWS = 512
# Steps of up to this many rows take the kernel by default (``fp8_method.skinny_max_rows``). On
# the H200 (Llama-3-8B's projections) it beat cuBLAS W8A8 with its quantization kernel by
# 1.1-1.9x per projection at 4-32 rows, and at 64 rows with x quantized first 102 against 113 us
# for the four (fp8_gemv_h200_skinny{,_qfirst}_2026-12-02.json). In the engine, per-channel
# weights at batch 16 / 64: 4,201 / 10,073 against 3,121 / 9,643 tok/s on cuBLAS
# (lowbit_decode_h200_skinny_default_2026-12-02.json); 128 x 128 blocks at 48 / 64: +13% / +10%
# against their Triton GEMM (lowbit_decode_h200_skinny64_2026-12-02.json). At one row the
# CUDA-core GEMV is faster still (qkv 10.8 against 13.3 us).
DEFAULT_ROWS = 64
# Past this many rows the default quantizes x before the launch: in the loop, every program of
# a column of tiles would quantize the same x (sm_90 SASS at 64 rows: 616 loop instructions a
# thread, against 197 with x loaded as e4m3).
QUANTIZE_FIRST_ABOVE = 32
E4M3_MAX = constexpr(FP8_MAX)
# x's scale group: the default tile's K step. A caller that quantizes x itself (``x_scales``)
# does so in groups of it.
X_GROUP = 128


PREFETCH_ENV = "KVSERVE_FP8_SKINNY_PREFETCH"
PREFETCH_STEPS = (0, 1, 2, 4, 8)  # a power of two of K steps: one request a line a step


@functools.cache
def skinny_prefetch_steps() -> int:
    """``KVSERVE_FP8_SKINNY_PREFETCH``: K steps of W (0, 1, 2, 4 or 8) a program of the chained
    loop asks of L2 before it waits for the kernel before (``Fp8SkinnyConfig.prefetch_steps``).
    Four by default: on an H100, Llama-3-8B FP8 decode at batch 48 / 64 went from 7,258 / 8,689
    to 7,339 / 8,779 tok/s (+1.1% / +1.0%, two alternating rounds a side, each within 0.2%;
    env_ab_s69_fp8_chained_2026-12-06.json)."""
    value = os.environ.get(PREFETCH_ENV, "4")
    if value not in {str(steps) for steps in PREFETCH_STEPS}:
        raise ConfigError(f"{PREFETCH_ENV}={value!r}: expected 0, 1, 2, 4 or 8")
    return int(value)


@dataclass(frozen=True)
class Fp8SkinnyConfig:
    block_n: int = 128  # rows of W per program: the MMA's M side
    block_k: int = 128  # also the activation scale group
    block_m: int = 16  # rows of x per program, padded: the MMA's N side (16, 32 or 64)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # x quantized by one kernel before the launch (fp8_quant.quantize_fp8, groups of block_k)
    # instead of in the loop by every program of a column of tiles
    quantize_first: bool = False
    # K steps of W (1, 2, 4 or 8) a program of the chained loop (X_ROW_SCALE) asks of L2
    # before its dependent-launch wait: W never changes while serving, x does, and a dependent
    # launch's programs start while the kernel before still runs
    prefetch_steps: int = 0

    def __post_init__(self) -> None:
        blocks = (self.block_n, self.block_k, self.block_m)
        if any(b < 16 or b != next_pow2(b) for b in blocks) or self.split_k < 1:
            raise ValueError(f"blocks must be powers of two >= 16 and split_k >= 1: {self}")
        if self.prefetch_steps not in PREFETCH_STEPS:
            raise ValueError(f"prefetch_steps must be one of {PREFETCH_STEPS}: {self}")


@jit
def _e4m3_rounded(v):
    """fp32 ``v`` (|v| <= 448) rounded to the nearest e4m3 value, ties to even, in fp32 math.
    Triton 3.6's interpreter drops the carry when a conversion rounds up to the next power of
    two (31.8 -> 16) and multiplies e4m3 dot operands wrongly; this stands in for both there."""
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exp = tl.maximum(exponent, -6) - 3  # three mantissa bits; subnormals below 2**-6
    step = ((step_exp + 127) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2**23: adding it rounds |y| < 2**22 to an integer, ties to even
    return ((v / step + magic) - magic) * step


@jit
def _x_step(x_ptrs, loaded_scale, k_mask, EVEN_K: tl.constexpr, X_FP8: tl.constexpr,
            WIDEN: tl.constexpr):  # fmt: skip
    """One K step's x tile [BLOCK_M, BLOCK_K] in e4m3 (as fp32 values when WIDEN) and its row
    scales [BLOCK_M]: loaded, with the scales the caller loaded (X_FP8), or quantized here from
    16-bit x by each row's amax."""
    if X_FP8:
        x_q = tl.load(x_ptrs) if EVEN_K else tl.load(x_ptrs, mask=k_mask, other=0.0)
        x_scale = loaded_scale
        if WIDEN:
            x_q = x_q.to(tl.float32)
    else:
        if EVEN_K:
            x = tl.load(x_ptrs).to(tl.float32)
        else:
            x = tl.load(x_ptrs, mask=k_mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        x_scale = amax / E4M3_MAX
        x = x * (1.0 / tl.where(amax > 0.0, x_scale, 1.0))[:, None]  # zeros stay zeros
        x_q = _e4m3_rounded(x) if WIDEN else x.to(tl.float8e4nv)
    return x_q, x_scale


@jit
def _chained_steps(
    acc, w_ptrs, x_ptrs, k_start, k_end, K, rk, EVEN_K: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The K loop of an e4m3 x with one scale a row: each step's MMA accumulates into ``acc``
    itself, so the compiler keeps one in flight while the next step's tiles load (per-step
    scales make it wait for each product and multiply it into the accumulator)."""
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x_q = tl.load(x_ptrs)
        else:
            k_mask = (k0 + rk < K)[None, :]
            w = tl.load(w_ptrs, mask=k_mask, other=0.0)
            x_q = tl.load(x_ptrs, mask=k_mask, other=0.0)
        if WIDEN:
            acc = tl.dot(w.to(tl.float32), tl.trans(x_q.to(tl.float32)), acc,
                         input_precision="ieee")  # fmt: skip
        else:
            acc = tl.dot(w, tl.trans(x_q), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


@jit
def _prefetch_w(w_ptr, stride_wn, rn, k_start, k_end, N, SPAN: tl.constexpr):
    """Asks L2 for the first SPAN columns (bytes) of this program's W rows ``rn``, one request a
    128-byte line, so that the first loads after the wait find them there. GPU only."""
    cols = k_start + tl.arange(0, SPAN // 128) * 128
    ptrs = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + cols[None, :]
    prefetch_l2(ptrs, (rn < N)[:, None] & (cols < k_end)[None, :])


@jit
def _scaled_steps(
    acc, w_ptrs, x_ptrs, xs_rows, block_scales, k_start, k_end, K, rk, EVEN_K: tl.constexpr,
    X_FP8: tl.constexpr, WIDEN: tl.constexpr, SCALE_BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The K loop with a scale a step (x's per row, W's per block): each step's product times
    its scales into ``acc``. The scales are loaded a step ahead (the last step's again at the
    last step): Triton's pipeliner takes only the tiles that feed the MMA, and a scale load in
    its own step waits in front of that step's scaling."""
    x_scale_ahead = 0.0
    w_scale_ahead = 0.0
    if X_FP8:
        x_scale_ahead = tl.load(xs_rows + k_start // BLOCK_K)
    if SCALE_BLOCK_N:
        w_scale_ahead = tl.load(block_scales + k_start // BLOCK_K)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_mask = (k0 + rk < K)[None, :]
        w = tl.load(w_ptrs) if EVEN_K else tl.load(w_ptrs, mask=k_mask, other=0.0)
        x_q, x_scale = _x_step(x_ptrs, x_scale_ahead, k_mask, EVEN_K, X_FP8, WIDEN)
        w_scale = w_scale_ahead
        step_ahead = tl.minimum(k0 + BLOCK_K, k_end - 1) // BLOCK_K
        if X_FP8:
            x_scale_ahead = tl.load(xs_rows + step_ahead)
        if SCALE_BLOCK_N:
            w_scale_ahead = tl.load(block_scales + step_ahead)
        if WIDEN:
            part = tl.dot(w.to(tl.float32), tl.trans(x_q), input_precision="ieee")
        else:
            part = tl.dot(w, tl.trans(x_q))
        if SCALE_BLOCK_N:
            acc += part * x_scale[None, :] * w_scale[:, None]
        else:
            acc += part * x_scale[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


@_jit
def _fp8_skinny_kernel(
    x_ptr,  # [M, K]: bf16 / fp16, or e4m3 (X_FP8)
    xs_ptr,  # X_FP8: fp32 [M, K / BLOCK_K], x's scales
    w_ptr,  # float8e4nv [N, K]
    rs_ptr,  # fp32 [N], [1] (SCALAR_ROW_SCALE) or [N / SCALE_BLOCK_N, K / BLOCK_K]: W's scales
    bias_ptr,
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, BLOCK_M]; unused when DIRECT
    counter_ptr,  # int32 [tiles], zero between launches; unused when DIRECT
    M,
    N,
    K,
    stride_xm,
    stride_xs,
    stride_wn,
    stride_om,
    stride_rs,  # SCALE_BLOCK_N: per block row of W's scales
    k_per_split,  # a multiple of BLOCK_K
    num_splits,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask
    DIRECT: tl.constexpr,  # num_splits == 1: write the output
    SCALAR_ROW_SCALE: tl.constexpr,
    SCALE_BLOCK_N: tl.constexpr,  # rows of W per block scale (each BLOCK_K columns); 0: none
    HAS_BIAS: tl.constexpr,
    X_FP8: tl.constexpr,  # x quantized before the launch (Fp8SkinnyConfig.quantize_first)
    WIDEN: tl.constexpr,  # interpreted: the dot in fp32 on e4m3 values (_e4m3_rounded)
    USE_PDL: tl.constexpr,
    # X_FP8 with one scale a row for all of K (xs [M, 1]; W without blocks): the MMAs chain into
    # one accumulator, scaled once after the loop
    X_ROW_SCALE: tl.constexpr = False,
    PREFETCH_STEPS: tl.constexpr = 0,  # Fp8SkinnyConfig.prefetch_steps
):
    rn, rm, rk, k_start, k_end, w_ptrs, x_ptrs = tile_start(
        x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, k_per_split, BLOCK_N, BLOCK_M, BLOCK_K
    )
    xs_rows = xs_ptr + (rm % M) * stride_xs  # X_FP8: x's scales, one per row and K step
    block_scales = rs_ptr  # SCALE_BLOCK_N: W's scales of this program's rows
    if SCALE_BLOCK_N:
        block_scales = rs_ptr + ((rn % N) // SCALE_BLOCK_N) * stride_rs
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if PREFETCH_STEPS:
        _prefetch_w(w_ptr, stride_wn, rn, k_start, k_end, N, PREFETCH_STEPS * BLOCK_K)
    pdl_wait(USE_PDL)
    if X_ROW_SCALE:
        acc = _chained_steps(acc, w_ptrs, x_ptrs, k_start, k_end, K, rk, EVEN_K, WIDEN, BLOCK_K)
        acc = acc * tl.load(xs_rows)[None, :]
    else:
        acc = _scaled_steps(
            acc, w_ptrs, x_ptrs, xs_rows, block_scales, k_start, k_end, K, rk, EVEN_K, X_FP8,
            WIDEN, SCALE_BLOCK_N, BLOCK_K,
        )  # fmt: skip
    pdl_release(USE_PDL)
    if SCALAR_ROW_SCALE:
        acc = acc * tl.load(rs_ptr)
    _finish_tile(
        acc, tile_index(), tl.program_id(2), num_splits, ws_ptr, counter_ptr, rs_ptr,
        bias_ptr, out_ptr, rn, rm, M, N, stride_om, BLOCK_N, BLOCK_M,
        not SCALAR_ROW_SCALE and not SCALE_BLOCK_N, HAS_BIAS, DIRECT,
    )  # fmt: skip


def fp8_skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Fp8SkinnyConfig | None = None,
    *,
    block: tuple[int, int] | None = None,
    pdl: bool = False,
    gated: bool = False,
    x_scales: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    x_row_scale: bool = False,
) -> torch.Tensor:
    """``x [M, K]`` (M <= ``MOST_ROWS``) @ ``(weight * scale).T`` (+ ``bias``) in x's dtype, on
    CUDA; ``block``: ``scale`` is per block of that many (rows, columns) of ``weight``.
    ``pdl``: programmatic dependent launch (``kvserve.kernels._triton``). ``gated``: ``x
    [M, 2K]`` is a SwiGLU's gate then up, and the product is of ``silu(gate) * up`` as
    ``silu_and_mul`` rounds it; where x is quantized before the launch the quantization kernel
    applies it (one launch, the same bits), else ``silu_and_mul`` runs first. ``x_scales``: x
    is e4m3 already, with fp32 scales ``[M, K / block_k]`` (the config's K step, ``X_GROUP``
    by default) or, W without blocks, ``[M, 1]`` (a scale a row), and the output is in
    ``out_dtype``. ``x_row_scale``: where x is quantized before the launch, W without blocks,
    one scale a row (a per-token scheme) in place of one a K step, so that the K loop chains
    its MMAs (``_chained_steps``)."""
    require_triton()
    m, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    n = weight.shape[0]
    if m > MOST_ROWS or weight.dtype != FP8 or weight.stride(1) != 1:
        raise ValueError(f"fp8_skinny_linear takes <= {MOST_ROWS} rows and a row-major e4m3 W")
    chained = chains_mmas(block, x_row_scale, x_scales, k)
    cfg = config or fp8_skinny_config(m, n, k, num_sms=sm_count(x.device), chained=chained)
    if block is not None and (block[1] != cfg.block_k or block[0] % cfg.block_n):
        raise ValueError(f"fp8_skinny_linear: scale blocks {block} do not fit the tile {cfg}")
    _check_quantized_x(x, x_scales, gated, cfg.block_k, rows_ok=block is None)
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    split = SplitLaunch.plan(m, n, k, cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, out)
    scale = scale.float() if block is not None else scale.reshape(-1).float()
    if x_scales is None and cfg.quantize_first and k % cfg.block_k == 0:
        group = None if x_row_scale and block is None else cfg.block_k
        x, x_scales = quantize_fp8(x, group, gated=gated)
    elif gated:  # x_scales given with gated is refused above
        x = silu_and_mul(x)
    x_fp8 = x_scales is not None
    row_scale = x_fp8 and block is None and x_scales.shape[1] == 1
    x_scales = x_scales if x_fp8 else out  # a placeholder unless x_fp8
    _fp8_skinny_kernel[split.grid](
        x, x_scales, weight, scale, bias if bias is not None else out, out, split.workspace,
        split.counters, m, n, k, x.stride(0), x_scales.stride(0), weight.stride(0),
        out.stride(0), scale.stride(0), split.k_per_split, split.splits,
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, DIRECT=split.direct,
        SCALAR_ROW_SCALE=block is None and scale.numel() == 1,
        SCALE_BLOCK_N=block[0] if block is not None else 0,
        HAS_BIAS=bias is not None, X_FP8=x_fp8, WIDEN=interpreting(), X_ROW_SCALE=row_scale,
        PREFETCH_STEPS=cfg.prefetch_steps if row_scale and not interpreting() else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(pdl),
    )  # fmt: skip
    return out


def chains_mmas(
    block: tuple[int, int] | None, x_row_scale: bool, x_scales: torch.Tensor | None, k: int
) -> bool:
    """Whether a launch's K loop chains its MMAs, so that its default config is
    ``fp8_skinny_config(chained=True)``'s: W without blocks, and x given in e4m3 with one
    scale a row, or to be quantized so (``x_row_scale``) where K is a whole number of the
    default's K steps (else x stays 16-bit)."""
    if block is not None:
        return False
    if x_scales is None:
        return x_row_scale and k % X_GROUP == 0
    return tuple(x_scales.shape[1:]) == (1,)


def _check_quantized_x(
    x: torch.Tensor, x_scales: torch.Tensor | None, gated: bool, block_k: int, rows_ok: bool
) -> None:
    """An e4m3 x comes with one fp32 scale per row and K step (or, ``rows_ok``, per row), and
    takes no SiLU-mul."""
    if x_scales is None:
        if x.dtype == FP8:
            raise ValueError("fp8_skinny_linear: an e4m3 x needs its x_scales")
        return
    m, k = x.shape
    want = (m, k // block_k)
    shape_ok = tuple(x_scales.shape) == want or (rows_ok and tuple(x_scales.shape) == (m, 1))
    if gated or x.dtype != FP8 or k % block_k or not shape_ok:
        raise ValueError(
            f"fp8_skinny_linear: a quantized x is e4m3 [M, K] (K a multiple of {block_k}) with "
            f"fp32 scales {want}{' or (M, 1)' if rows_ok else ''}, not gated; got {x.dtype} "
            f"{tuple(x.shape)}, scales {tuple(x_scales.shape)}"
        )
    if x_scales.dtype != torch.float32 or x_scales.stride(1) != 1:
        raise ValueError("fp8_skinny_linear: x_scales must be fp32 and row-major")


def fp8_skinny_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    group: int = 128,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The kernel's math in fp32 on any device: x quantized per row and group of ``group``
    columns (the last group may be short), times the dequantized weight."""
    k = x.shape[1]
    padded = torch.nn.functional.pad(x.float(), (0, -k % group))  # zeros: no group's amax grows
    x_q, x_scale = quantize_fp8_reference(padded, group)
    x_deq = dequantize_fp8_activation(x_q, x_scale)[:, :k]
    y = x_deq @ dequantize_fp8_weight(weight, scale, block).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
_MIN_K_TILES_PER_SPLIT = 2
_PROGRAMS_PER_SM = 2
_SMEM_PER_PROGRAM = 112 * 1024  # two programs an H100/H200 SM (227 KB)


def fp8_skinny_config(
    m: int,
    n: int,
    k: int,
    *,
    num_sms: int = 132,
    block_n: int = 0,
    block_k: int = X_GROUP,
    block_m: int = 0,
    programs_per_sm: int = 0,
    num_stages: int = 0,
    quantize_first: bool = False,
    chained: bool = False,
) -> Fp8SkinnyConfig:
    """``block_n`` rows of W (0: 128, or ``_chained_tiling``'s) by 128 of K per program, all of
    x's rows (``block_m`` 0) or tiles of ``block_m``; K split until about ``programs_per_sm``
    programs an SM (0: two, one past 32 rows), keeping at least two K steps per split; as many
    stages (at most 4) as leave room for two programs an SM (``num_stages`` 0). On the H200
    (Llama-3-8B's qkv / o / gate_up / down): at 64 rows 3 stages against 4 took 25.3 / 20.6 /
    62.6 / 39.5 to 20.1 / 15.9 / 49.4 / 30.5 us (fp8_gemv_h200_skinny_2026-12-02.json); then
    with x quantized first, one program an SM against two 18.3 / 14.9 / 37.8 / 31.4 against
    19.1 / 18.0 / 37.8 / 33.8 us (cuBLAS 16.6 / 16.0 / 40.0 / 40.0;
    fp8_gemv_h200_skinny_qfirst_2026-12-02.json).

    ``chained``: the launch chains its MMAs (x quantized first with a scale a row, W without
    blocks): past 32 rows, ``_chained_tiling``'s tiles and ``KVSERVE_FP8_SKINNY_PREFETCH``'s
    L2 requests."""
    quantize_first = quantize_first or m > QUANTIZE_FIRST_ABOVE
    chained = chained and m > QUANTIZE_FIRST_ABOVE
    block_m = block_m or min(MAX_ROWS, max(16, next_pow2(m)))
    if chained and not (block_n or programs_per_sm or num_stages):
        block_n, programs_per_sm, num_stages = _chained_tiling(m, n, block_m, num_sms)
    block_n = block_n or 128
    programs_per_sm = programs_per_sm or (1 if m > QUANTIZE_FIRST_ABOVE else _PROGRAMS_PER_SM)
    x_bytes = 1 if quantize_first else 2
    stage_bytes = (block_n + x_bytes * block_m) * block_k
    num_stages = num_stages or max(2, min(4, _SMEM_PER_PROGRAM // stage_bytes))
    tiles = -(-m // block_m) * -(-n // block_n)
    k_tiles = -(-k // block_k)
    split = 1
    for s in _SPLITS:
        too_many = tiles * s > programs_per_sm * num_sms
        if s > 1 and (too_many or k_tiles // s < _MIN_K_TILES_PER_SPLIT):
            break
        split = s
    warps = 8 if block_n >= 256 else 4  # a warpgroup per 128 W rows
    prefetch = skinny_prefetch_steps() if chained else 0
    return Fp8SkinnyConfig(
        block_n, block_k, block_m, split, warps, num_stages, quantize_first, prefetch
    )


def _chained_tiling(m: int, n: int, block_m: int, num_sms: int) -> tuple[int, int, int]:
    """(W rows, programs an SM, stages) of a chained launch past 32 rows (0s: the default's):
    where tiles of 64 rows of W fit one an SM, those, with K split to one program an SM and 8
    stages (128 KB) in flight. Fewer K splits spare the split-K tail (a partial tile of fp32 a
    split, summed by the last to arrive). On an H100 (Llama-3-8B's projections at 64 rows, x
    quantized first with a scale a row, the quantization kernel timed with each;
    fp8_gemv_s69_tma_tiling_h100), against the default (128 rows, K split to one program an SM,
    4 stages): qkv 18.0 -> 15.1 us (K unsplit), o 15.6 -> 13.8 and down 32.9 -> 30.2 (K in
    two). Past one an SM (gate_up, 448 tiles) the default stays: 48.0 us against 49.3 for 64
    rows at two an SM with 6 stages, 51.4 at one an SM with 8."""
    if -(-m // block_m) * -(-n // 64) <= num_sms:
        return 64, 1, 8
    return 0, 0, 0


# (W rows, K a step, programs an SM, stages (0: as many as fit), x rows a tile (0: all), x
# quantized before the launch); the last rows only past 16 rows of x
_CANDIDATE_TILES = (
    (128, 128, 1, 4, 0, False), (128, 128, 4, 4, 0, False), (128, 128, 2, 3, 0, False),
    (128, 128, 2, 6, 0, False), (64, 128, 2, 4, 0, False), (64, 128, 4, 4, 0, False),
    (128, 256, 2, 3, 0, False), (256, 128, 2, 3, 0, False), (64, 256, 4, 4, 0, False),
    (128, 128, 2, 4, 32, False), (128, 128, 2, 4, 16, False), (128, 128, 4, 4, 16, False),
    (128, 128, 2, 0, 0, True), (128, 128, 4, 0, 0, True), (128, 128, 2, 0, 32, True),
    (64, 128, 1, 0, 0, True), (64, 128, 2, 0, 0, True), (128, 256, 1, 0, 0, True),
    (256, 128, 1, 0, 0, True), (256, 128, 2, 0, 0, True), (64, 128, 1, 8, 0, True),
)  # fmt: skip


def fp8_skinny_candidates(m: int, n: int, k: int, *, num_sms: int = 132) -> list[Fp8SkinnyConfig]:
    """The default, then tiles of 64 / 128 / 256 W rows and 128 / 256 K at 1-4 programs an SM
    and 3-6 stages, x in tiles of 16 or 32 (W read once from memory, then from L2), and past 16
    rows x quantized before the launch."""
    configs = [fp8_skinny_config(m, n, k, num_sms=num_sms)]
    for block_n, block_k, per_sm, stages, block_m, quantize_first in _CANDIDATE_TILES:
        if (block_m and block_m >= m) or (quantize_first and m <= 16):
            continue
        cfg = fp8_skinny_config(m, n, k, num_sms=num_sms, block_n=block_n, block_k=block_k,
                                programs_per_sm=per_sm, num_stages=stages, block_m=block_m,
                                quantize_first=quantize_first)  # fmt: skip
        if cfg not in configs:
            configs.append(cfg)
    return configs
