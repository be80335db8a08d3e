"""Skinny GEMM ``y = x @ W.T`` for decode steps: few rows of x [M, K] against a large W [N, K].

Reference: ``F.linear(x, weight)``.

With M <= 64 the product is a stream over W, so the kernel is laid out for bandwidth ("swap AB"):
a program owns BLOCK_N rows of W and every row of x padded to BLOCK_M, and computes the tile
transposed, ``W_tile @ x_tile.T`` [BLOCK_N, BLOCK_M]. W's rows then sit on the MMA's M side
(>= 64, so Hopper's wgmma applies) and the few tokens on its N side (16..64).

Grid ``(M tiles, N tiles, splits)``. When N / BLOCK_N programs would leave SMs idle, K is cut
into splits that each store an fp32 partial tile to a workspace. The split that arrives last at
its tile (an arrival counter per tile) sums all partials in split order and writes the output,
then zeroes the counter for the next launch: one launch, and deterministic, since the order of
the sum does not depend on which split arrives last. (A second reduction kernel was 0.3-1 us
slower per call on the H200: benchmarks/results/skinny_gemm_h200_2026-11-29.json.)

An FP8 weight-only mode of this kernel (e4m3 W widened in registers) decoded 8% slower in the
engine than the W8A8 path at 1, 8 and 16 rows (lowbit_decode_h200_w8a16_ab_2026-12-01.json)
and was removed; FP8 steps of one token take the CUDA-core GEMV of ``word_gemv.py``, and of
2-64 tokens the FP8 tensor-core kernel of this layout, ``fp8_skinny_gemm.py``.

The bf16 kernel is off the engine's path by default (``KVSERVE_BF16_SKINNY_ROWS`` in
``quant/unquantized.py`` puts small steps on it). On the H200 it ties cuBLAS on Llama-3-8B's
projections and leads it by 3-8% on a 128K-vocabulary weight in isolation, but the LM head on
it was no faster in the engine (benchmarks/results/lm_head_ab_h200_2026-11-29.json), nor were
Qwen3-30B-A3B's projections with programmatic dependent launch (306 against 303 tok/s at
batch 1, moe_decode_h200_s35_head{,_skinny}). Loading each program's first W tile before the
dependent-launch wait did not change that (ee8f395: 306 / 303 against 305 / 308 tok/s, and
3,426 / 3,430 against 3,457 / 3,452 at batch 64, moe_decode_h200_s39_{skinny,head}{1,2}) and
failed one 33-row candidate config on the H200, so it was reverted. It is the
base for what could beat cuBLAS: the RMSNorm fused into the prologue and SiLU-and-multiply into
the down projection's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvserve.kernels._triton import (
    HAS_TRITON,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    sm_count,
    tl,
    triton,
)

MAX_ROWS = 64  # without a config, more rows go to cuBLAS (it re-reads no W tile per M tile)
_SPLITS = (1, 2, 3, 4, 6, 8)
_MIN_K_TILES_PER_SPLIT = 4
_SMEM_PER_PROGRAM = 112 * 1024  # two programs fit in an H100/H200 SM (227 KB)
_SMEM_MAX = 200 * 1024


def _jit(fn: Callable[..., Any]) -> Any:
    """``jit`` for the kernels, whose M is not specialized: M == 1 or M % 16 == 0 would each
    compile another kernel for nothing, since M only masks rows."""
    return triton.jit(fn, do_not_specialize=["M"]) if HAS_TRITON else fn


@dataclass(frozen=True)
class SkinnyGemmConfig:
    block_n: int = 64  # rows of W per program: the MMA's M side
    block_k: int = 128
    block_m: int = 16  # rows of x per program, padded: the MMA's N side (16, 32 or 64)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        blocks = (self.block_n, self.block_k, self.block_m)
        if any(b < 16 or b != next_pow2(b) for b in blocks) or self.split_k < 1:
            raise ValueError(f"blocks must be powers of two >= 16 and split_k >= 1: {self}")


@jit
def _store_out_tile(out_ptr, acc, rn, rm, M, N, stride_om):
    """``acc`` [BLOCK_N, BLOCK_M] is the transposed output tile."""
    mask = (rn < N)[:, None] & (rm < M)[None, :]
    ptrs = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@jit
def _sum_splits(tile_ws, num_splits, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Partials of one tile, summed in split order: [num_splits, BLOCK_N, BLOCK_M] fp32."""
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for s in range(num_splits):
        # .cg: read from L2, where other SMs' stores are, not from this SM's L1
        total += tl.load(tile_ws + s * BLOCK_N * BLOCK_M + offs, cache_modifier=".cg")
    return total


@jit
def _epilogue(
    acc,
    rs_ptr,
    bias_ptr,
    out_ptr,
    rn,
    rm,
    M,
    N,
    stride_om,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Row scale and bias on the fp32 tile [BLOCK_N, BLOCK_M], then the transposed store."""
    if HAS_ROW_SCALE:
        acc = acc * tl.load(rs_ptr + rn, mask=rn < N, other=0.0)[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
    _store_out_tile(out_ptr, acc, rn, rm, M, N, stride_om)


@jit
def arrive(counter):
    """Counts this program in at ``counter`` once all its threads' stores are out; returns how
    many arrived before it (the last of n arrivals sees n - 1, and its loads after this see
    everything the others stored; it puts the count back to 0 when done)."""
    tl.debug_barrier()  # every thread's stores precede the one-thread release below
    return tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")


@jit
def _finish_tile(
    acc,
    tile,  # this output tile's index among the launch's tiles
    pid_k,
    num_splits,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, BLOCK_M]; unused when DIRECT
    counter_ptr,  # int32 [tiles], zero between launches; unused when DIRECT
    rs_ptr,
    bias_ptr,
    out_ptr,
    rn,
    rm,
    M,
    N,
    stride_om,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: write the output
):
    """The end of a program's tile [BLOCK_N, BLOCK_M]: the output, or this split's partial and,
    for the split that arrives last, the in-order sum and the output."""
    if DIRECT:
        _epilogue(acc, rs_ptr, bias_ptr, out_ptr, rn, rm, M, N, stride_om, HAS_ROW_SCALE, HAS_BIAS)
    else:
        last, total = split_total(
            acc, tile, pid_k, num_splits, ws_ptr, counter_ptr, BLOCK_N, BLOCK_M
        )
        if last:
            _epilogue(
                total, rs_ptr, bias_ptr, out_ptr, rn, rm, M, N, stride_om, HAS_ROW_SCALE, HAS_BIAS
            )


@jit
def split_total(
    acc, tile, pid_k, num_splits, ws_ptr, counter_ptr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr
):  # fmt: skip
    """Stores this split's partial of tile ``tile`` (``_finish_tile``'s workspace and counters).
    The split to arrive last gets (True, the partials summed in split order) and puts the tile's
    counter back to 0 for the next launch; the others get (False, ``acc``)."""
    tile_ws = ws_ptr + tile.to(tl.int64) * num_splits * BLOCK_N * BLOCK_M
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    tl.store(tile_ws + pid_k * BLOCK_N * BLOCK_M + offs, acc)
    last = arrive(counter_ptr + tile) == num_splits - 1
    total = acc
    if last:
        total = _sum_splits(tile_ws, num_splits, BLOCK_N, BLOCK_M)
        tl.store(counter_ptr + tile, 0)
    return last, total


@jit
def tile_start(
    x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, k_per_split,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """A program of grid (M tiles, N tiles, splits): its W rows ``rn``, x rows ``rm``, K offsets
    ``rk``, K range and first W / x tile pointers. Rows past N or M wrap onto valid ones, so
    only K needs a load mask; the store masks them."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k_start = tl.program_id(2) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + (rn % N).to(tl.int64)[:, None] * stride_wn + (k_start + rk)[None, :]
    x_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * stride_xm + (k_start + rk)[None, :]
    return rn, rm, rk, k_start, k_end, w_ptrs, x_ptrs


@jit
def tile_index():
    """This program's output tile among the launch's, for ``_finish_tile``."""
    return tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)


@_jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, BLOCK_M]; unused when DIRECT
    counter_ptr,  # int32 [tiles], zero between launches; unused when DIRECT
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    k_per_split,  # a multiple of BLOCK_K
    num_splits,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask
    DIRECT: tl.constexpr,  # num_splits == 1: write the output
    DOT_PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    rn, rm, rk, k_start, k_end, w_ptrs, x_ptrs = tile_start(
        x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, k_per_split, BLOCK_N, BLOCK_M, BLOCK_K
    )
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    pdl_wait(USE_PDL)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            k_mask = (k0 + rk < K)[None, :]
            w = tl.load(w_ptrs, mask=k_mask, other=0.0)
            x = tl.load(x_ptrs, mask=k_mask, other=0.0)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    pdl_release(USE_PDL)
    _finish_tile(
        acc, tile_index(), tl.program_id(2), num_splits, ws_ptr, counter_ptr, out_ptr, bias_ptr,
        out_ptr, rn, rm, M, N, stride_om, BLOCK_N, BLOCK_M, False, HAS_BIAS, DIRECT,
    )  # fmt: skip


# Arrival counters per device, zero between launches. A grown buffer keeps the old one alive, as
# CUDA graphs captured earlier still point at it. Launches on concurrent streams would share them.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def _arrival_counters(device: torch.device, tiles: int) -> torch.Tensor:
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        if buf is not None:
            _RETIRED.append(buf)
        # First use should come before any graph capture (the engine's warm-up does).
        buf = torch.zeros(max(tiles, 1 << 14), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


@dataclass(frozen=True)
class SplitLaunch:
    """A swap-AB launch's grid (M tiles, N tiles, splits), K per split and, with more than one
    split, its fp32 partial-tile workspace and arrival counters (else placeholders)."""

    grid: tuple[int, int, int]
    k_per_split: int  # a multiple of block_k
    workspace: torch.Tensor
    counters: torch.Tensor

    @property
    def splits(self) -> int:
        return self.grid[2]

    @property
    def direct(self) -> bool:
        return self.splits == 1

    @staticmethod
    def plan(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, split_k: int,
             out: torch.Tensor) -> SplitLaunch:  # fmt: skip
        m_tiles, n_tiles, k_tiles = -(-m // block_m), -(-n // block_n), -(-k // block_k)
        k_per_split = -(-k_tiles // max(1, min(split_k, k_tiles))) * block_k
        splits = -(-k_tiles * block_k // k_per_split)  # no split left without K
        workspace = counters = out  # placeholders, unused with one split
        if splits > 1:
            tiles = m_tiles * n_tiles
            size = tiles * splits * block_n * block_m
            workspace = torch.empty(size, dtype=torch.float32, device=out.device)
            counters = _arrival_counters(out.device, tiles)
        return SplitLaunch((m_tiles, n_tiles, splits), k_per_split, workspace, counters)


def _supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.dim() == 2
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.dtype == weight.dtype
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and weight.stride(1) == 1
        and x.device == weight.device
    )


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: SkinnyGemmConfig | None = None,
    bias: torch.Tensor | None = None,
    *,
    pdl: bool = False,
) -> torch.Tensor:
    """``x`` [M, K] @ ``weight`` [N, K].T (+ ``bias``) -> [M, N] in x's dtype, fp32
    accumulation. Without a config, more than ``MAX_ROWS`` rows (or an unsupported layout or
    dtype) go to F.linear. ``pdl``: programmatic dependent launch (``kvserve.kernels._triton``)."""
    if not _supported(x, weight) or (config is None and x.shape[0] > MAX_ROWS):
        return F.linear(x, weight, bias)
    return _skinny(x, weight, config, bias, pdl)


def _skinny(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: SkinnyGemmConfig | None,
    bias: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    require_triton()
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    if x.stride(1) != 1:
        x = x.contiguous()
    cfg = config or default_config(m, n, k, num_sms=sm_count(x.device), elem_bytes=x.element_size())
    _launch(x, weight, out, cfg, bias, pdl)
    return out


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    cfg: SkinnyGemmConfig,
    bias: torch.Tensor | None = None,
    pdl: bool = False,
) -> None:
    m, k = x.shape
    n = weight.shape[0]
    split = SplitLaunch.plan(m, n, k, cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, out)
    _skinny_gemm_kernel[split.grid](
        x,
        weight,
        bias if bias is not None else out,
        out,
        split.workspace,
        split.counters,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        split.k_per_split,
        split.splits,
        BLOCK_N=cfg.block_n,
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0,
        DIRECT=split.direct,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        HAS_BIAS=bias is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )


def block_m_for(m: int) -> int:
    return min(MAX_ROWS, max(16, next_pow2(m)))


def _num_stages(block_n: int, block_k: int, block_m: int, elem_bytes: int) -> int:
    """As many stages (3..5) as fit two programs per SM, or 0 if three do not fit at all."""
    stage = (block_n + block_m) * block_k * elem_bytes
    if 3 * stage > _SMEM_MAX:
        return 0
    return max(3, min(5, _SMEM_PER_PROGRAM // stage))


def _splits_for(tiles: int, k_tiles: int, num_sms: int) -> list[int]:
    """Up to three split counts that give 0.9-4 programs per SM with enough K per split; 1 if
    the tiles alone fill the SMs. The split count is not a compile-time constant, so each one
    costs a sweep no compile."""
    enough_k = [s for s in _SPLITS if s == 1 or k_tiles // s >= _MIN_K_TILES_PER_SPLIT]
    fits = [s for s in enough_k if 0.9 * num_sms <= tiles * s <= 4 * num_sms]
    if tiles >= 0.9 * num_sms and 1 not in fits:
        fits.insert(0, 1)
    return fits[:3] or [enough_k[-1]]


def default_config(
    m: int, n: int, k: int, *, num_sms: int = 132, elem_bytes: int = 2
) -> SkinnyGemmConfig:
    """64 rows of W by 128 of K per program, split K until the programs fill the SMs."""
    block_m, block_n, block_k = block_m_for(m), 64, 128
    tiles = -(-m // block_m) * -(-n // block_n)
    splits = _splits_for(tiles, -(-k // block_k), num_sms)[0]
    stages = _num_stages(block_n, block_k, block_m, elem_bytes) or 2
    return SkinnyGemmConfig(block_n, block_k, block_m, splits, 4, stages)


# (block_n, block_k, num_warps) to sweep; 8 warps only with two 64-row wgmma halves
_SWEEP_TILES = ((64, 64, 4), (64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 128, 8))


def candidate_configs(
    m: int, n: int, k: int, *, num_sms: int = 132, elem_bytes: int = 2
) -> list[SkinnyGemmConfig]:
    """Configs worth timing for one shape (5-17 for the Llama-3-8B shapes), the default first."""
    block_m = block_m_for(m)
    default = default_config(m, n, k, num_sms=num_sms, elem_bytes=elem_bytes)
    configs = [default]
    for block_n, block_k, warps in _SWEEP_TILES:
        stages = _num_stages(block_n, block_k, block_m, elem_bytes)
        if not stages:
            continue
        tiles = -(-m // block_m) * -(-n // block_n)
        for splits in _splits_for(tiles, -(-k // block_k), num_sms):
            cfg = SkinnyGemmConfig(block_n, block_k, block_m, splits, warps, stages)
            if cfg not in configs:
                configs.append(cfg)
    return configs
