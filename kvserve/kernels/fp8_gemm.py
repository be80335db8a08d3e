"""FP8 (e4m3) GEMMs ``y = (xq * xs) @ (w * ws).T``: ``xq [M, K]`` and ``w [N, K]`` in
float8_e4m3fn with fp32 scales, output in the activation dtype.

Scale layouts: ``xs`` a scalar, per row ``[M, 1]`` or per row and K-group ``[M, K / bk]``;
``ws`` a scalar, per output channel ``[N]`` or per ``bn x bk`` block ``[N / bn, K / bk]``.

- ``fp8_gemm_reference``: dequantize both and multiply in fp32 (any device; the CPU path).
- ``scaled_mm``: per-tensor / per-channel weights with per-tensor / per-token activations on
  FP8 tensor cores through ``torch._scaled_mm`` (cuBLASLt / CUTLASS; sm_89+, K and N multiples
  of 16).
- ``fp8_block_gemm``: block-wise weights (DeepSeek / Qwen3-FP8 layout) with per-token-group
  activations in a Triton kernel; each K step of one group multiplies the fp32 partial product
  by the row's and the block's scales.
- ``blockwise_scaled_mm``: the same layouts through ``torch._scaled_mm``'s 1 x 128 by 128 x 128
  recipe (cuBLASLt >= 12.9, sm_90 only; ``blockwise_scaled_mm_fits``).
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import jit, require_triton, tl, triton
from kvserve.kernels.fp8_quant import dequantize_fp8_activation, m_major


def dequantize_fp8_weight(
    w: torch.Tensor, ws: torch.Tensor, block: tuple[int, int] | None = None
) -> torch.Tensor:
    """fp32 ``w * ws`` for a scalar, per-channel ``[N]`` or block ``[N/bn, K/bk]`` scale."""
    n, k = w.shape
    if block is not None:
        bn, bk = block
        full = ws.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        return w.float() * full
    if ws.numel() == 1:
        return w.float() * ws.float().reshape(())
    return w.float() * ws.float().reshape(n, 1)


def fp8_gemm_reference(
    xq: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    out_dtype: torch.dtype,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    x = dequantize_fp8_activation(xq, xs)
    return (x @ dequantize_fp8_weight(w, ws, block).T).to(out_dtype)


def scaled_mm(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """Tensor-core FP8 GEMM. A scalar scale on one side and a vector on the other is broadcast
    to rows/columns (cuBLAS takes both tensor-wise or both row-wise)."""
    m, n = xq.shape[0], w.shape[0]
    if xs.numel() == 1 and ws.numel() == 1:
        half = out_dtype in (torch.bfloat16, torch.float16)
        out = torch._scaled_mm(
            xq, w.t(), scale_a=xs.reshape(()), scale_b=ws.reshape(()),
            out_dtype=out_dtype if half else torch.bfloat16, use_fast_accum=True,
        )  # fmt: skip
        return out if half else out.to(out_dtype)
    scale_a = xs.reshape(-1, 1).expand(m, 1).contiguous() if xs.numel() == 1 else xs
    scale_b = ws.reshape(1, -1).expand(1, n).contiguous() if ws.numel() == 1 else ws.view(1, n)
    # row-wise scaling produces bf16 only
    out = torch._scaled_mm(
        xq, w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=True
    )
    return out if out_dtype == torch.bfloat16 else out.to(out_dtype)


@jit
def _grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program in a 1-D grid, ``GROUP_M`` row tiles at a time
    down each run of column tiles: programs in flight together share a band of W's columns
    (read once from memory, then from L2) instead of each wave streaming all of W again.
    ``GROUP_M`` 1: row tile by row tile."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@jit
def _block_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_cm,
    GROUP_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am
    b_cols = b_ptr + rn[None, :].to(tl.int64) * stride_bn
    as_rows = as_ptr + rm * stride_asm
    bs_rows = bs_ptr + (rn // GROUP_N) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The scales are loaded in their own step: loading them a step ahead took 225 -> 255
    # registers and was slower on the H200 in 17 of 20 shapes (s59, fp8_block_gemm_h200_s59_*).
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + rk
        a = tl.load(a_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_cols + k[:, None], mask=(k < K)[:, None] & n_ok[None, :], other=0.0)
        a_s = tl.load(as_rows + kb * stride_ask, mask=m_ok, other=0.0)
        b_s = tl.load(bs_rows + kb, mask=n_ok, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _block_config(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by row count: few rows stream the weight."""
    if m <= 16:
        return 16, 64, 4, 4
    if m <= 64:
        return 64, 64, 4, 4
    return 128, 128, 8, 3


def fp8_block_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    block: tuple[int, int],
    out_dtype: torch.dtype,
    *,
    group_m: int = 8,
) -> torch.Tensor:
    """``xs [M, K/bk]`` per token group (any strides), ``ws [N/bn, K/bk]`` per weight block.
    ``group_m``: row tiles that walk W's column tiles together (``_grouped_tile``; the same
    bits for any value)."""
    require_triton()
    m, k = xq.shape
    n = w.shape[0]
    bn, bk = block
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    block_m, block_n, warps, stages = _block_config(m)
    block_n = min(block_n, bn)  # one weight-scale row per tile column group at most
    grid = (triton.cdiv(n, block_n) * triton.cdiv(m, block_m),)
    _block_gemm_kernel[grid](
        xq, xs, w, ws, out, m, n, k,
        xq.stride(0), xs.stride(0), xs.stride(1), w.stride(0), ws.stride(0), out.stride(0),
        GROUP_N=bn, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk, GROUP_M=group_m,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def blockwise_scaled_mm_fits(w: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether ``blockwise_scaled_mm`` takes GEMMs with weight ``w``: 128 x 128 blocks on an
    sm_90 GPU (cuBLASLt has the recipe there only), N whole blocks, and K / 128 a multiple of 4
    (the weight scales' rows 16-byte aligned)."""
    n, k = w.shape
    return (
        block == (128, 128)
        and w.is_cuda
        and torch.cuda.get_device_capability(w.device)[0] == 9
        and n % 128 == 0
        and k % 512 == 0
    )


CUBLAS_BLOCKWISE_ROWS = 4  # x's M-major scale columns start 16-byte aligned


def rows_padded_for_cublas(xq: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x's e4m3 rows and scales for cuBLASLt's block-scaled GEMM: the scales M-major, and both
    padded with zero rows (scales 1) to a multiple of ``CUBLAS_BLOCKWISE_ROWS`` rows, so that
    each K group's column of scales starts 16-byte aligned (other users of this recipe pad M
    so; a copy only where M is not a multiple already)."""
    m = xq.shape[0]
    pad = -m % CUBLAS_BLOCKWISE_ROWS
    if pad == 0:
        return xq, xs if xs.stride(0) == 1 else m_major(xs)
    zeros = torch.zeros((pad, xq.shape[1]), dtype=torch.uint8, device=xq.device)
    padded_q = torch.cat([xq.view(torch.uint8), zeros]).view(xq.dtype)
    padded_s = torch.ones((xs.shape[1], m + pad), dtype=torch.float32, device=xs.device)
    padded_s[:, :m] = xs.t()
    return padded_q, padded_s.t()


def blockwise_scaled_mm(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``fp8_block_gemm``'s product (``xs [M, K/128]``, ``ws [N/128, K/128]``) on cuBLASLt's
    block-scaled FP8 GEMM. cuBLAS reads x's scales M-major (strides ``(1, M)``: a copy of
    ``xs`` unless its quantization wrote them so, ``scales_m_major``) over a multiple of 4 rows
    (``rows_padded_for_cublas``), and W's as ``ws`` is (``ws.t()`` is the K-major view it
    wants for ``w.t()``)."""
    m = xq.shape[0]
    xq, scale_a = rows_padded_for_cublas(xq, xs)
    half = out_dtype in (torch.bfloat16, torch.float16)
    out = torch._scaled_mm(
        xq, w.t(), scale_a=scale_a, scale_b=ws.t(), out_dtype=out_dtype if half else torch.bfloat16
    )[:m]
    return out if half else out.to(out_dtype)
