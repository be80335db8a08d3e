"""The swap-AB FP8 kernel's chained K loop with its W and x tiles fetched by Hopper's tensor
memory accelerator (TMA) instead of per-thread pointer loads.

The case: x quantized before the launch with one scale a row, W per channel or per tensor
(``fp8_skinny_linear``'s ``X_ROW_SCALE``), K a multiple of the K step: decode steps of 33-64
tokens of a per-channel FP8 model. There, on the H200, the pointer-load kernel streamed W at
20-30 GB/s an SM against the ~33 GB/s an SM copy bandwidth needs (ncu, s60: qkv / o / down of
Llama-3-8B at 38% / 28% / 55% of DRAM peak, one warp a scheduler issuing every 7 cycles): each
thread works out and issues its share of every tile's 16-byte copies and waits on them. A
tensor-map copy is one instruction a tile, issued by one thread, landing in shared memory in the
MMA's layout with its arrival on a barrier; Triton's pipeliner keeps ``num_stages`` of them in
flight. Rows of W past N and of x past M are zero-filled by the copy, so no load needs a mask.

Reference: ``fp8_skinny_reference`` (the math is the pointer kernel's ``_chained_steps``, and the
end of a tile, split K included, is the same ``_finish_tile``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvserve.kernels._triton import jit, launch_options, pdl_release, pdl_wait, prefetch_l2, tl
from kvserve.kernels.skinny_gemm import SplitLaunch, _finish_tile, _jit, tile_index

if TYPE_CHECKING:
    from kvserve.kernels.fp8_skinny_gemm import Fp8SkinnyConfig


@jit
def _tma_steps(acc, w_desc, x_desc, n0, m0, k_start, k_end, BLOCK_K: tl.constexpr,
               WIDEN: tl.constexpr):  # fmt: skip
    """The K loop: each step's W [BLOCK_N, BLOCK_K] and x [BLOCK_M, BLOCK_K] tiles by tensor
    map, their MMA accumulated into ``acc`` (so one stays in flight while the next loads)."""
    for k0 in range(k_start, k_end, BLOCK_K):
        w = w_desc.load([n0, k0])
        x_q = x_desc.load([m0, k0])
        if WIDEN:
            acc = tl.dot(w.to(tl.float32), tl.trans(x_q.to(tl.float32)), acc,
                         input_precision="ieee")  # fmt: skip
        else:
            acc = tl.dot(w, tl.trans(x_q), acc)
    return acc


@jit
def _prefetch_w(w_ptr, stride_wn, n0, k_start, k_end, N, BLOCK_N: tl.constexpr,
                SPAN: tl.constexpr):  # fmt: skip
    """Asks L2 for the first SPAN columns (bytes) of this program's W rows, one request a
    128-byte line, so that the first tensor-map copies after the wait find them there."""
    rows = n0 + tl.arange(0, BLOCK_N)
    cols = k_start + tl.arange(0, SPAN // 128) * 128
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + cols[None, :]
    prefetch_l2(ptrs, (rows < N)[:, None] & (cols < k_end)[None, :])


@_jit
def _fp8_skinny_tma_kernel(
    w_desc,  # tensor map of float8e4nv W [N, K], tiles [BLOCK_N, BLOCK_K]
    x_desc,  # tensor map of float8e4nv x [M, K], tiles [BLOCK_M, BLOCK_K]
    w_ptr,  # W itself, for PREFETCH_STEPS
    xs_ptr,  # fp32 [M, 1]: x's scale a row
    rs_ptr,  # fp32 [N] or [1] (SCALAR_ROW_SCALE): W's scales
    bias_ptr,
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, BLOCK_M]; unused when DIRECT
    counter_ptr,  # int32 [tiles], zero between launches; unused when DIRECT
    M,
    N,
    K,
    stride_wn,
    stride_xs,
    stride_om,
    k_per_split,  # a multiple of BLOCK_K
    num_splits,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DIRECT: tl.constexpr,
    SCALAR_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WIDEN: tl.constexpr,  # interpreted: the dot in fp32 on e4m3 values
    USE_PDL: tl.constexpr,
    # K steps of W asked of L2 before the wait for the kernel before (W never changes while
    # serving; x does): a dependent launch's programs start while that kernel runs
    PREFETCH_STEPS: tl.constexpr = 0,
):
    n0 = tl.program_id(1) * BLOCK_N
    m0 = tl.program_id(0) * BLOCK_M
    rn = n0 + tl.arange(0, BLOCK_N)
    rm = m0 + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(2) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if PREFETCH_STEPS:
        _prefetch_w(w_ptr, stride_wn, n0, k_start, k_end, N, BLOCK_N, PREFETCH_STEPS * BLOCK_K)
    pdl_wait(USE_PDL)
    acc = _tma_steps(acc, w_desc, x_desc, n0, m0, k_start, k_end, BLOCK_K, WIDEN)
    pdl_release(USE_PDL)
    acc = acc * tl.load(xs_ptr + (rm % M) * stride_xs)[None, :]
    if SCALAR_ROW_SCALE:
        acc = acc * tl.load(rs_ptr)
    _finish_tile(
        acc, tile_index(), tl.program_id(2), num_splits, ws_ptr, counter_ptr, rs_ptr,
        bias_ptr, out_ptr, rn, rm, M, N, stride_om, BLOCK_N, BLOCK_M, not SCALAR_ROW_SCALE,
        HAS_BIAS, DIRECT,
    )  # fmt: skip


def tma_takes(x: torch.Tensor, weight: torch.Tensor, block_k: int) -> bool:
    """Whether tensor maps can describe x and W [., K] e4m3: K a whole number of K steps, rows
    16-byte aligned and contiguous in K, bases 16-byte aligned."""
    k = weight.shape[1]
    return (
        k % block_k == 0
        and all(t.stride(1) == 1 and t.stride(0) % 16 == 0 for t in (x, weight))
        and all(t.data_ptr() % 16 == 0 for t in (x, weight))
    )


def launch_fp8_skinny_tma(
    x: torch.Tensor,  # e4m3 [M, K]
    x_scales: torch.Tensor,  # fp32 [M, 1]
    weight: torch.Tensor,  # e4m3 [N, K]
    scale: torch.Tensor,  # fp32 [N] or [1]
    bias: torch.Tensor | None,
    out: torch.Tensor,  # [M, N]
    cfg: Fp8SkinnyConfig,
    split: SplitLaunch,
    widen: bool,
    pdl: bool,
) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = weight.shape[0]
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    _fp8_skinny_tma_kernel[split.grid](
        w_desc, x_desc, weight, x_scales, scale, bias if bias is not None else out, out,
        split.workspace, split.counters, m, n, k, weight.stride(0), x_scales.stride(0),
        out.stride(0), split.k_per_split, split.splits, BLOCK_N=cfg.block_n,
        BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, DIRECT=split.direct,
        SCALAR_ROW_SCALE=scale.numel() == 1, HAS_BIAS=bias is not None, WIDEN=widen,
        PREFETCH_STEPS=0 if widen else cfg.prefetch_steps, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch_options(pdl),
    )  # fmt: skip
