"""Weight-only FP4 GEMM ``y = x @ W.T``: x [M, K] in bf16/fp16/fp32 against an NVFP4 or MXFP4
weight (layout in ``fp4_reference.py``), dequantized tile by tile in registers. Hopper has no FP4
tensor cores, so the MMA runs in x's dtype with fp32 accumulation.

Reference: ``fp4_linear_reference`` in ``fp4_reference.py``.

Layout of a program: it owns BLOCK_N rows of W and BLOCK_M rows of x, and computes the
transposed tile ``W_tile @ x_tile.T`` [BLOCK_N, BLOCK_M] ("swap AB", as in ``skinny_gemm.py``)
on wgmma, W from registers and x from shared memory, so the weight rows sit on the MMA's M side
and the decode tokens on its N side. Up to 16 rows of x (``Fp4GemmConfig.w_as_b``) it
computes ``x_tile @ W_tile.T`` on mma.sync instead, x's rows on its M side. Grid
``(M tiles, N tiles, splits)``; K is split when the tiles alone would leave SMs idle, with the
same deterministic last-arrival reduction as the skinny GEMM.

Each W tile is decoded in registers by ``fp4_tile.dequant_tile`` (exact in bf16; the per-row
(NVFP4 per-tensor) scale and the bias are applied to the fp32 accumulator in the epilogue).
From ``DEQUANT_GEMM_MIN_ROWS`` rows of x, a step large enough to amortize it, the weight is
instead dequantized whole and multiplied by cuBLAS (``fp4_dequantize.py``).

No host synchronization; the split-K arrival counters reset themselves, so launches can be
captured in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvserve.kernels._triton import (
    interpreting,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    sm_count,
    tl,
)
from kvserve.kernels.fp4_async_choice import AsyncGemmConfig, async_choice
from kvserve.kernels.fp4_async_gemm import fp4_async_linear
from kvserve.kernels.fp4_dequantize import DequantGemmConfig, dequant_gemm
from kvserve.kernels.fp4_reference import NVFP4_GROUP, fp4_linear_reference, group_size_of
from kvserve.kernels.fp4_tile import (
    MAX_BLOCK_M,
    block_m_for,
    code_words,
    dequant_tile,
    first_scales,
    step_scales,
)

# The skinny GEMM's split-K machinery (store, in-order sum, self-resetting counters) is reused
# as is: the reduction does not depend on how the tiles were computed.
from kvserve.kernels.skinny_gemm import _arrival_counters, _finish_tile, _jit
from kvserve.kernels.word_gemv import (
    FP4_PER_WORD,
    GEMV_ROWS,
    SPLIT_COUNTS,
    GemvConfig,
    fp4_gemv_config,
    gemv_candidates,
    launch_word_gemv,
)

_MIN_K_TILES_PER_SPLIT = 2
# Rows up to which the default is the CUDA-core GEMV (word_gemv.py). benchmarks/fp4_gemm.py
# times both kernels at M <= 4: at M = 4 the MMA kernel led on every Llama-3-8B projection but
# one (benchmarks/results/fp4_gemm_h200_gemv1_2026-12-01.json).
GEMV_MAX_ROWS = 1
_SMEM_MAX = 220 * 1024
# Rows from which the default dequantizes W whole and runs cuBLAS (fp4_dequantize.py): past one
# x tile of the MMA kernel, which decodes W once per tile. Llama-3-8B qkv / o / gate_up / down,
# NVFP4, us: at 256 rows 60.3 / 35.9 / 216.6 / 108.5 (MMA default) -> 44.1 / 30.1 / 180.8 / 96.1
# (the best 256-row MMA tiles 53.9 / 35.7 / 177.4 / 87.9); at 512 / 4096 rows the dequantizing
# path is 0.65 / 0.87-0.99x of cuBLAS bf16 on the dense weight
# (fp4_gemm_h200_{stages,dequant}_2026-12-02.json).
DEQUANT_GEMM_MIN_ROWS = MAX_BLOCK_M + 1


@dataclass(frozen=True)
class Fp4GemmConfig:
    block_n: int = 64  # rows of W per program: the MMA's M side
    block_k: int = 128  # unpacked K per step: a multiple of the scale group (16 or 32)
    block_m: int = 16  # rows of x per program, padded: the MMA's N side (16..128)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # W read as 32-bit words, eight codes decoded at a time to f16 (fp4_word_to_halves) instead
    # of byte by byte. Instructions a weight in the sm_90 loop at 64 / 16 rows (Llama-3-8B
    # gate_up, benchmarks/lowbit_sass.py): NVFP4 12.3 / 11.3 -> 7.3 / 6.6, MXFP4 11.3 / 10.6 ->
    # 7.8 / 7.0. On the H200 it took the default tiles' NVFP4 gate_up from 97 / 134 / 328 us to
    # 66 / 105 / 218 us at 16 / 64 / 256 rows (fp4_gemm_h200_words_2026-12-01.json).
    word_dequant: bool = True
    # The decoded W tile as the MMA's B operand (x @ W.T) rather than its A (W @ x.T), on
    # mma.sync with x's rows on its M side; up to 32 rows of x, the default up to 16. On the
    # H200 Llama-3-8B's NVFP4 qkv / o / gate_up / down went from 20.4 / 12.7 / 66.1 / 33.4 to
    # 16.9 / 12.0 / 47.9 / 29.7 us at 16 rows and from 21.9 / 15.2 / 70.9 / 41.3 to
    # 20.8 / 13.9 / 63.8 / 38.1 at 32 (MXFP4 alike; fp4_gemm_h200_wasb{,2}_2026-12-01.json;
    # since s71 W is A again at 32 rows: see mma_config). At 64 rows both ways to do it lost:
    # one dot is wgmma reading W from shared memory, whose decode no longer overlaps the
    # asynchronous MMA (gate_up 92.5 -> 116.2 us), and two 32-row mma.sync dots on one decoded
    # tile took batch-64 decode from 6,988 to 6,635 tok/s
    # (lowbit_decode_wasb64_{head,h64}_2026-12-02.json).
    w_as_b: bool = False

    def __post_init__(self) -> None:
        blocks = (self.block_n, self.block_k, self.block_m)
        if any(b < 16 or b != next_pow2(b) for b in blocks) or self.block_k < 32:
            raise ValueError(f"blocks must be powers of two >= 16 (block_k >= 32): {self}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1: {self}")
        if self.w_as_b and self.block_m > 32:
            raise ValueError(f"w_as_b takes at most 32 rows of x: {self}")


# What fp4_linear runs: the MMA kernel, the CUDA-core GEMV, dequantize-then-cuBLAS, or the
# asynchronous-MMA Gluon kernel (fp4_async_gemm.py)
Fp4Config = Fp4GemmConfig | GemvConfig | DequantGemmConfig | AsyncGemmConfig


@_jit
def _fp4_gemm_kernel(
    x_ptr,
    w_ptr,  # uint8 [N, K/2], or int32 [N, K/8] (WORD_DEQUANT)
    s_ptr,  # uint8 [N, K/GROUP]: E8M0 exponents or the bytes of e4m3 scales
    rs_ptr,  # fp32 [N]; unused without HAS_ROW_SCALE
    bias_ptr,  # [N]; unused without HAS_BIAS
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, BLOCK_M]; unused when DIRECT
    counter_ptr,  # int32 [tiles], zero between launches; unused when DIRECT
    M,
    N,
    K,
    stride_xm,
    stride_wn,  # in W's elements: bytes, or words (WORD_DEQUANT)
    stride_sn,
    stride_om,
    k_per_split,  # a multiple of BLOCK_K
    num_splits,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask
    DIRECT: tl.constexpr,  # num_splits == 1: write the output
    DOT_PRECISION: tl.constexpr,
    WORD_DEQUANT: tl.constexpr,  # Fp4GemmConfig.word_dequant
    W_AS_B: tl.constexpr,  # Fp4GemmConfig.w_as_b: acc is [BLOCK_M, BLOCK_N] until the end
    USE_PDL: tl.constexpr,
):
    PER_ELEMENT: tl.constexpr = 8 if WORD_DEQUANT else 2  # codes per element of w_ptr
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rb = tl.arange(0, BLOCK_K // PER_ELEMENT)
    rg = tl.arange(0, BLOCK_K // GROUP)
    # seen as a multiple of BLOCK_K, the pipeliner copies codes (16 bytes a copy) and scales
    # ahead; else (sm_90 TTGIR) the scales were a plain load each step and codes 8 bytes a copy
    k_start = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    k_end = tl.minimum(k_start + k_per_split, K)
    # Rows past N or M wrap onto valid ones, so only K needs a load mask; the store masks them.
    rows_w = (rn % N).to(tl.int64)[:, None]
    w_ptrs = w_ptr + rows_w * stride_wn + (k_start // PER_ELEMENT + rb)[None, :]
    s_ptrs = s_ptr + rows_w * stride_sn + (k_start // GROUP + rg)[None, :]
    x_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * stride_xm + (k_start + rk)[None, :]
    dtype = x_ptr.dtype.element_ty
    if W_AS_B:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    SCALES_AHEAD: tl.constexpr = BLOCK_K // GROUP < 8  # fp4_tile.step_scales
    s_ahead = first_scales(s_ptrs, k_start, K, rg, GROUP, EVEN_K, SCALES_AHEAD)
    pdl_wait(USE_PDL)  # before the loop's prologue, which loads x
    for k0 in range(k_start, k_end, BLOCK_K):
        # codes, scales, x: the copies issued in the measured kernel's order
        if EVEN_K:
            p = tl.load(w_ptrs)
        else:
            p = tl.load(w_ptrs, mask=(k0 // PER_ELEMENT + rb < K // PER_ELEMENT)[None, :], other=0)
        s, s_ahead = step_scales(
            s_ahead, s_ptrs, k0, k_end, K, rg, GROUP, BLOCK_K, EVEN_K, SCALES_AHEAD
        )
        x = tl.load(x_ptrs) if EVEN_K else tl.load(x_ptrs, mask=(k0 + rk < K)[None, :], other=0.0)
        w = dequant_tile(p, s, BLOCK_N, BLOCK_K, GROUP, SCALE_E8M0, dtype, WORD_DEQUANT)
        if W_AS_B:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K // PER_ELEMENT
        s_ptrs += BLOCK_K // GROUP
        x_ptrs += BLOCK_K
    pdl_release(USE_PDL)
    if W_AS_B:
        acc = tl.trans(acc)
    _finish_tile(
        acc, pid_n * tl.num_programs(0) + pid_m, pid_k, num_splits, ws_ptr, counter_ptr, rs_ptr,
        bias_ptr, out_ptr, rn, rm, M, N, stride_om, BLOCK_N, BLOCK_M, HAS_ROW_SCALE, HAS_BIAS,
        DIRECT,
    )  # fmt: skip


def _check(
    x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor, row_scale: torch.Tensor | None
) -> int:
    group = group_size_of(block_scale)
    n, half_k = packed.shape
    k = 2 * half_k
    if x.shape[-1] != k or k % group or block_scale.shape != (n, k // group):
        raise ValueError(
            f"FP4 GEMM shapes do not fit: x {tuple(x.shape)}, packed {tuple(packed.shape)}, "
            f"scales {tuple(block_scale.shape)} (groups of {group})"
        )
    if packed.dtype != torch.uint8 or packed.stride(1) != 1 or block_scale.stride(1) != 1:
        raise ValueError("packed weight must be uint8 and both it and its scales K-contiguous")
    if row_scale is not None and (row_scale.dtype != torch.float32 or row_scale.numel() != n):
        raise ValueError(f"row scale must be fp32 [{n}]")
    return group


def fp4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    config: Fp4Config | None = None,
    *,
    pdl: bool = False,
    gated: bool = False,
    async_weight: bool = False,
    x_step_order: bool | None = None,
) -> torch.Tensor:
    """``x`` [..., K] @ W.T (+ bias) -> [..., N] in x's dtype; W in the layout of
    ``fp4_reference``. CPU tensors (outside Triton's interpreter) go to the reference. A
    ``GemvConfig`` (at most 4 rows) runs the CUDA-core kernel of ``word_gemv.py``; a
    ``DequantGemmConfig`` dequantizes W and runs cuBLAS (``fp4_dequantize.py``); an
    ``AsyncGemmConfig`` the Gluon kernel of ``fp4_async_gemm.py``, which the default picks by
    ``KVSERVE_FP4_ASYNC`` (``fp4_async_choice.async_choice``) for a weight the caller found it
    takes at load (``async_weight``, from ``fp4_async_choice.weight_fits``). ``pdl``: every
    kernel but cuBLAS's launches with programmatic dependent launch. ``gated`` (the GEMV only):
    W is a gate/up stack and the result silu(gate) * up, [..., N / 2]
    (``word_gemv.launch_word_gemv``). ``x_step_order``: x is in the Gluon kernel's K-step order
    for that ``bits`` already (its producer was told ``async_choice``'s), so only that kernel,
    with that decode, may take the step."""
    group = _check(x, packed, block_scale, row_scale)
    on_reference = x.device.type == "cpu" and not interpreting()
    if gated and (bias is not None or on_reference):
        raise ValueError("fp4_linear: only the GPU's GEMV applies the SiLU-mul, without a bias")
    if on_reference:
        return fp4_linear_reference(x, packed, block_scale, row_scale, bias)
    require_triton()
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = packed.shape[0]
    out = torch.empty(m, n // 2 if gated else n, dtype=x.dtype, device=x.device)
    if m and n:
        cfg = config
        if cfg is None and async_weight:
            from_producer = None if x_step_order is None else group
            cfg = async_choice(x2, n, k, sm_count(x.device), from_producer_group=from_producer)
        cfg = cfg or default_config(m, n, k, num_sms=sm_count(x.device), group=group)
        if gated and not isinstance(cfg, GemvConfig):
            raise ValueError(f"fp4_linear: only the GEMV applies the SiLU-mul, not {cfg}")
        if x_step_order is not None and not (
            isinstance(cfg, AsyncGemmConfig) and cfg.bits == x_step_order
        ):
            raise ValueError(f"fp4_linear: x in the step order of bits={x_step_order}, not {cfg}'s")
        if isinstance(cfg, Fp4GemmConfig):
            _launch(x2, packed, block_scale, row_scale, bias, out, cfg, group, pdl)
        elif isinstance(cfg, DequantGemmConfig):
            dequant_gemm(x2, packed, block_scale, row_scale, bias, out, cfg)
        elif isinstance(cfg, AsyncGemmConfig):
            fp4_async_linear(x2, packed, block_scale, row_scale, bias, split_k=cfg.split_k,
                             num_warps=cfg.num_warps, stages=cfg.stages, bits=cfg.bits,
                             max_registers=cfg.max_registers, x_permuted=x_step_order is not None,
                             out=out, pdl=pdl)  # fmt: skip
        else:
            launch_word_gemv(x2, packed, block_scale, row_scale, bias, out, cfg, group, pdl=pdl,
                             gated=gated)  # fmt: skip
    return out.view(*lead, out.shape[1])


def _launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: Fp4GemmConfig,
    group: int,
    pdl: bool = False,
) -> None:
    m, k = x.shape
    n = packed.shape[0]
    if cfg.block_k % group:
        raise ValueError(f"block_k {cfg.block_k} is not a multiple of the scale group {group}")
    m_tiles, n_tiles = -(-m // cfg.block_m), -(-n // cfg.block_n)
    k_tiles = -(-k // cfg.block_k)
    tiles_per_split = -(-k_tiles // max(1, min(cfg.split_k, k_tiles)))
    splits = -(-k_tiles // tiles_per_split)  # no split may start past K
    k_per_split = tiles_per_split * cfg.block_k
    direct = splits == 1
    w = code_words(packed) if cfg.word_dequant else packed
    words = w.dtype == torch.int32
    ws = counters = out  # placeholders, unused when direct
    if not direct:
        tile_elems = splits * cfg.block_n * cfg.block_m
        ws = torch.empty(m_tiles * n_tiles * tile_elems, dtype=torch.float32, device=x.device)
        counters = _arrival_counters(x.device, m_tiles * n_tiles)
    _fp4_gemm_kernel[(m_tiles, n_tiles, splits)](
        x,
        w,
        block_scale.view(torch.uint8),
        row_scale if row_scale is not None else out,
        bias if bias is not None else out,
        out,
        ws,
        counters,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        block_scale.stride(0),
        out.stride(0),
        k_per_split,
        splits,
        BLOCK_N=cfg.block_n,
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        GROUP=group,
        SCALE_E8M0=block_scale.dtype == torch.uint8,
        HAS_ROW_SCALE=row_scale is not None,
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        DIRECT=direct,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        WORD_DEQUANT=words,
        W_AS_B=cfg.w_as_b,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )


def _splits_with_enough_k(k_tiles: int) -> list[int]:
    """Split counts (fewest first) that leave each split _MIN_K_TILES_PER_SPLIT K tiles."""
    return [s for s in SPLIT_COUNTS if s == 1 or k_tiles // s >= _MIN_K_TILES_PER_SPLIT]


def split_options(tiles: int, k_tiles: int, num_sms: int) -> list[int]:
    """Split counts that give 0.9-4 programs per SM with enough K per split (1 if the tiles
    alone fill the SMs), the fewest first."""
    enough_k = _splits_with_enough_k(k_tiles)
    fits = [s for s in enough_k if 0.9 * num_sms <= tiles * s <= 4 * num_sms]
    if tiles >= 0.9 * num_sms and 1 not in fits:
        fits.insert(0, 1)
    return fits or [enough_k[-1]]


def stages_that_fit(block_n: int, block_k: int, block_m: int, want: int) -> int:
    """Up to ``want`` pipeline stages (>= 2) whose shared memory fits an H100/H200 SM, with
    room for one dequantized bf16 weight tile; 0 if two do not fit."""
    stage = block_n * block_k // 2 + block_n * block_k // 16 + block_m * block_k * 2
    room = _SMEM_MAX - block_n * block_k * 2
    return next((s for s in range(want, 1, -1) if s * stage <= room), 0)


def default_config(
    m: int, n: int, k: int, *, num_sms: int = 132, group: int = NVFP4_GROUP
) -> Fp4Config:
    """Up to GEMV_MAX_ROWS rows: the CUDA-core kernel; from DEQUANT_GEMM_MIN_ROWS, W dequantized
    whole and cuBLAS; between, the MMA kernel (``mma_config``).
    ``group``: values per block scale (NVFP4 16, MXFP4 32)."""
    if m <= GEMV_MAX_ROWS:
        return fp4_gemv_config(n, k // FP4_PER_WORD, m, num_sms, group)
    if m >= DEQUANT_GEMM_MIN_ROWS:
        return DequantGemmConfig()
    return mma_config(m, n, k, num_sms=num_sms)


def mma_config(m: int, n: int, k: int, *, num_sms: int = 132) -> Fp4GemmConfig:
    """64 rows of W by 128 of K per program (256 for up to 16 rows: the weight tile is
    half-byte data), K split until there are PROGRAMS_PER_SM programs for each SM
    (..._AT_128_ROWS at 128 rows of x); 8 warps only for unsplit 128-row tiles (of x, prefill;
    or of W, below).
    At 64 rows of x, 128 rows of W, unsplit, where those tiles alone fill the SMs: every program
    reads its x tile from L2 (at 64 W rows, four times the bytes of its weight tile), and wider W
    tiles halve that (Llama-3-8B gate_up, NVFP4 / MXFP4: 107.0 / 101.6 -> 93.4 / 90.4 us; split
    in two, 102.5 / 101.3; fp4_gemm_h200_splits_2026-12-01.json); narrower shapes need the K
    split more. Those tiles take 8 warps, half the registers a thread (Llama-3-8B gate_up,
    NVFP4 / MXFP4: 93.3 / 90.1 -> 81.7 / 78.9 us; fp4_gemm_h200_wasb64_2026-12-02.json).
    Up to 16 rows of x, W is the MMA's B operand (``Fp4GemmConfig.w_as_b``); at 32 it is the A
    operand again: on one H100 at 32 rows, W as B against W as A on Llama-3-8B's qkv / o / gate_up
    / down took MXFP4 24.2 / 15.0 / 84.7 / 40.7 against 19.0 / 13.2 / 54.5 / 35.7 us (NVFP4
    18.8 / 12.2 / 56.8 / 29.3 against 17.9 / 12.2 / 56.4 / 28.9), and MXFP4 decode at batch 32
    went from 4,030 to 4,826 tok/s (fp4_gemm_s71_h100_*, env_ab_s71_fp4_wa32_*)."""
    block_m = block_m_for(m)
    block_k = 256 if block_m == 16 else 128
    block_n = 128 if block_m == 64 and -(-n // 128) >= num_sms else 64
    tiles = -(-m // block_m) * -(-n // block_n)
    k_tiles = -(-k // block_k)
    if block_n == 128:  # taken where these tiles fill the SMs unsplit (split, they were slower)
        stages, splits = 4, 1
    elif block_m == 64:
        stages = STAGES_AT_64_ROWS
        splits = _wave_split(tiles, k_tiles, HOLDS_AT_64_ROWS_BY_STAGES[stages], num_sms)
    else:
        stages, per_sm = (4, PROGRAMS_PER_SM) if block_m < 64 else (3, PROGRAMS_PER_SM_AT_128_ROWS)
        splits = _split_for(tiles, k_tiles, per_sm * num_sms, 0)
    warps = 8 if (block_m >= 128 or block_n == 128) and splits == 1 else 4
    return Fp4GemmConfig(block_n, block_k, block_m, splits, warps, stages, w_as_b=block_m <= 16)


def _wave_split(tiles: int, k_tiles: int, holds: int, num_sms: int) -> int:
    """Splits that fill the ``holds`` programs an SM holds (of a 64-row tile at some pipeline
    stages) in one wave, and no further."""
    return _split_for(tiles, k_tiles, (holds - 0.1) * num_sms, holds * num_sms)


def _split_for(tiles: int, k_tiles: int, wanted: float, one_wave: int) -> int:
    """The fewest splits giving ``wanted`` programs (the most if none does), but none that
    overflows ``one_wave`` programs (what the SMs hold at once; 0: no such bound) into a second
    wave of a few."""
    enough_k = _splits_with_enough_k(k_tiles)
    splits = next((s for s in enough_k if tiles * s >= wanted), enough_k[-1])
    if one_wave:
        splits = min(splits, max((s for s in enough_k if tiles * s <= one_wave), default=1))
    return splits


# Programs per SM the default splits K up to, below 64 rows of x (two programs fit an SM's
# shared memory there) and at 128. From the full sweep of benchmarks/fp4_gemm.py on Llama-3-8B's
# projections, M = 16 / 64 / 256 (fp4_gemm_h200_splits_2026-12-01.json): e.g. NVFP4 down went
# from 49.8 / 70.8 / 179.4 us at the earlier default (fill the SMs once) to 32.7 / 45.7 / 110.2.
PROGRAMS_PER_SM = 1.9
PROGRAMS_PER_SM_AT_128_ROWS = 1.2
# Programs of a 64-row tile an SM holds at 4, 3 and 2 pipeline stages: shared memory,
# 84 / 64 / 44 KB compiled for sm_90 (operand conversion's buffer included), and registers at 2.
# At 64 rows the default splits K to fill one wave of them, no further: qkv's 96 tiles at 4
# stages and 3 splits made 288 programs, 24 of them a second wave, and 2 splits (192) ran
# faster (NVFP4 32.0-32.5 -> 27.4 us; fp4_gemm_h200_{splits,wasb64}_*.json).
HOLDS_AT_64_ROWS_BY_STAGES = {4: 2, 3: 3, 2: 4}
# The 64 x 64 tile's stages at 64 rows: 3 programs an SM, more warps to hide the decode's
# latency. Llama-3-8B qkv / o / down, 4 stages -> 3 (4 / 6 / 6 splits): NVFP4 26.8 / 17.4 / 44.9
# -> 20.7 / 17.5 / 41.2 us, MXFP4 30.1 / 18.7 / 51.3 -> 22.1 / 18.6 / 44.6; 2 stages (4 / 8 / 8
# splits) 21.1 / 21.7 / 55.0 and 22.5 / 17.2 / 40.1 (fp4_gemm_h200_stages_2026-12-02.json).
STAGES_AT_64_ROWS = 3


# (block_n, block_k, num_warps) to sweep in benchmarks/fp4_gemm.py; (128, 128, 8): twice the
# warps of the 64-row default's wide tile, at half its registers a thread
SWEEP_TILES = (
    (64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 256, 8), (32, 256, 4), (128, 128, 8),
)  # fmt: skip


# (block_n, block_k, num_warps) of the 256-row x tiles swept above 128 rows (none is a default)
WIDE_M_TILES = ((64, 128, 8), (128, 64, 8), (128, 128, 8), (64, 64, 4))


def candidate_configs(
    m: int, n: int, k: int, *, num_sms: int = 132, group: int = NVFP4_GROUP
) -> list[Fp4Config]:
    """Configs worth timing for one shape, ``default_config`` first (above 128 rows that is
    dequantize-then-cuBLAS); then the MMA kernel's default, with W as the other MMA operand (up
    to 32 rows) and with the byte dequant, at other pipeline stages (64 rows), and the 256-row x
    tiles (above 128 rows); then every tile shape with its best-filling split in the same
    variants, before any tile's second choice (so a short list still spans tiles)."""
    block_m = block_m_for(m)
    w_as_b = block_m <= 16  # as default_config; _variants flips it up to 32 rows
    per_tile = []
    for block_n, block_k, warps in SWEEP_TILES:
        stages = stages_that_fit(block_n, block_k, block_m, 3 if block_m >= 128 else 4)
        if not stages:
            continue
        tiles = -(-m // block_m) * -(-n // block_n)
        splits = split_options(tiles, -(-k // block_k), num_sms)[:3]
        per_tile.append(
            [Fp4GemmConfig(block_n, block_k, block_m, s, warps, stages, w_as_b=w_as_b)
             for s in splits]
        )  # fmt: skip
    default = default_config(m, n, k, num_sms=num_sms, group=group)
    configs: list[Fp4Config] = [default]
    mma = mma_config(m, n, k, num_sms=num_sms)
    if m > GEMV_MAX_ROWS:
        configs += [c for c in (mma, *_variants(mma)) if c != default]
    if mma.block_m == 64 and mma.block_n == 64:
        configs += _with_other_stages(mma, m, n, k, num_sms)
    if m > MAX_BLOCK_M:
        configs += _wide_m_configs(m, n, k, num_sms)
    for options in per_tile:
        options[1:1] = _variants(options[0])
    if m <= GEMV_ROWS:
        gemvs = gemv_candidates(n, k // FP4_PER_WORD, rows=m, num_sms=num_sms, scale_group=group)
        configs += [c for c in gemvs if c not in configs]
    for rank in range(max(map(len, per_tile), default=0)):
        for options in per_tile:
            if rank < len(options) and options[rank] not in configs:
                configs.append(options[rank])
    return configs


def _variants(cfg: Fp4GemmConfig) -> list[Fp4GemmConfig]:
    """``cfg`` with W as the other MMA operand (up to 32 rows of x), then with the byte
    dequant."""
    flipped = [replace(cfg, w_as_b=not cfg.w_as_b)] if cfg.block_m <= 32 else []
    return [*flipped, replace(cfg, word_dequant=False)]


def _wide_m_configs(m: int, n: int, k: int, num_sms: int) -> list[Fp4GemmConfig]:
    """WIDE_M_TILES, x in tiles of 256 rows: each W tile is decoded once for a 256-token step,
    not twice."""
    block_m = 2 * MAX_BLOCK_M
    configs = []
    for block_n, block_k, warps in WIDE_M_TILES:
        tiles = -(-m // block_m) * -(-n // block_n)
        split = split_options(tiles, -(-k // block_k), num_sms)[0]
        stages = stages_that_fit(block_n, block_k, block_m, 3)
        configs.append(Fp4GemmConfig(block_n, block_k, block_m, split, warps, stages))
    return configs


def _with_other_stages(
    cfg: Fp4GemmConfig, m: int, n: int, k: int, num_sms: int
) -> list[Fp4GemmConfig]:
    """The 64-row default tile at the other pipeline stage counts, its K split to fill the
    programs an SM then holds in one wave (fewer stages: more programs, more warps to hide the
    decode's latency)."""
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    k_tiles = -(-k // cfg.block_k)
    return [
        replace(cfg, num_stages=stages, split_k=_wave_split(tiles, k_tiles, holds, num_sms))
        for stages, holds in HOLDS_AT_64_ROWS_BY_STAGES.items()
        if stages != cfg.num_stages
    ]
