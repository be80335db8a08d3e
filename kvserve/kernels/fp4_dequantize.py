"""An FP4 weight (layout in ``fp4_reference.py``) dequantized whole, to a dense [N, K] in x's
dtype, for the steps of many rows where the FP4 GEMM (``fp4_gemm.py``) chooses
``DequantGemmConfig``: the dense weight then goes to cuBLAS.

Why: the fused kernel decodes each W tile once per tile of x rows (128), so a prefill chunk of
M rows decodes the weight M / 128 times, and the decode competes with the MMA for issue slots.
Writing the dense weight once costs 2 bytes a value of extra traffic (Llama-3-8B's gate_up:
about 90 us on an H200), which pays from two x tiles on (``fp4_gemm.DEQUANT_GEMM_MIN_ROWS``,
measured by ``benchmarks/fp4_gemm.py``). Engine prefill of Llama-3-8B went from 0.46-0.50x to
0.96-1.01x of bf16's rate with it.

The decode is ``fp4_tile.dequant_tile`` (exact in fp32); the per-row (NVFP4 per-tensor) scale is
multiplied in fp32 before the one rounding to x's dtype, the weight's bf16 rounding that the CPU
path (``fp4_reference.dequantize_fp4``) makes as well. The dense weight is a temporary of the
caching allocator, so the engine's activation profile (a largest step) counts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.kernels._triton import jit, require_triton, tl
from kvserve.kernels.fp4_reference import group_size_of
from kvserve.kernels.fp4_tile import code_words, dequant_tile


@dataclass(frozen=True)
class DequantGemmConfig:
    """Dequantize W, then cuBLAS. The tile is the dequantizing kernel's: rows of W by K values
    a program. 32 x 512 against 64 x 256, Llama-3-8B qkv / o / gate_up / down on an H200, NVFP4:
    21.8 / 16.2 / 90.5 / 46.1 -> 20.4 / 15.3 / 87.2 / 44.0 us (74 / 65 / 81 / 80% of the copy
    rate), MXFP4 alike; five tiles in fp4_gemm_h200_dqtiles_2026-12-02.json."""

    block_n: int = 32
    block_k: int = 512
    num_warps: int = 4


@jit
def _dequantize_kernel(
    w_ptr,  # uint8 [N, K/2], or int32 [N, K/8] (WORD_DEQUANT)
    s_ptr,  # uint8 [N, K/GROUP]: E8M0 exponents or the bytes of e4m3 scales
    rs_ptr,  # fp32 [N]; unused without HAS_ROW_SCALE
    out_ptr,  # [N, K], contiguous
    N,
    K,
    stride_wn,  # in W's elements: bytes, or words
    stride_sn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    WORD_DEQUANT: tl.constexpr,
):
    PER_ELEMENT: tl.constexpr = 8 if WORD_DEQUANT else 2  # codes per element of w_ptr
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rb = k0 // PER_ELEMENT + tl.arange(0, BLOCK_K // PER_ELEMENT)
    rg = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
    rk = k0 + tl.arange(0, BLOCK_K)
    # rows past N wrap onto valid ones; the store masks them
    rows = (rn % N).to(tl.int64)[:, None]
    p_mask = (rb < K // PER_ELEMENT)[None, :]
    p = tl.load(w_ptr + rows * stride_wn + rb[None, :], mask=p_mask, other=0)
    s = tl.load(s_ptr + rows * stride_sn + rg[None, :], mask=(rg < K // GROUP)[None, :], other=0)
    w = dequant_tile(p, s, BLOCK_N, BLOCK_K, GROUP, SCALE_E8M0, tl.float32, WORD_DEQUANT)
    if HAS_ROW_SCALE:
        w = w * tl.load(rs_ptr + rn % N)[:, None]
    mask = (rn < N)[:, None] & (rk < K)[None, :]
    out_ptrs = out_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :]
    tl.store(out_ptrs, w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_fp4_dense(
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None,
    dtype: torch.dtype,
    cfg: DequantGemmConfig | None = None,
) -> torch.Tensor:
    """W [N, K] in ``dtype`` on W's device (a CUDA device, or CPU under Triton's interpreter)."""
    require_triton()
    cfg = cfg or DequantGemmConfig()
    group = group_size_of(block_scale)
    n, k = packed.shape[0], 2 * packed.shape[1]
    out = torch.empty(n, k, dtype=dtype, device=packed.device)
    w = code_words(packed)
    grid = (-(-n // cfg.block_n), -(-k // cfg.block_k))
    _dequantize_kernel[grid](
        w,
        block_scale.view(torch.uint8),
        row_scale if row_scale is not None else out,
        out,
        n,
        k,
        w.stride(0),
        block_scale.stride(0),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP=group,
        SCALE_E8M0=block_scale.dtype == torch.uint8,
        HAS_ROW_SCALE=row_scale is not None,
        WORD_DEQUANT=w.dtype == torch.int32,
        num_warps=cfg.num_warps,
    )
    return out


def dequant_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: DequantGemmConfig,
) -> None:
    """``out`` [M, N] = x [M, K] @ W.T (+ bias), W dequantized to x's dtype first."""
    dense = dequantize_fp4_dense(packed, block_scale, row_scale, x.dtype, cfg)
    if bias is None:
        torch.mm(x, dense.t(), out=out)
    else:
        torch.addmm(bias, x, dense.t(), out=out)
