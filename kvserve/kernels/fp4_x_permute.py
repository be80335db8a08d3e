"""x's columns in the asynchronous FP4 GEMM's K-step permutation (``fp4_async_decode``) by one
Triton kernel: each program gathers a block of one row's permuted columns (pairs of adjacent
columns stay together, so its loads are 4-byte pieces of a 64-byte span) and stores them
contiguously. The reference, ``fp4_step_order.permute_x_steps``, is torch's copy of a
7-dimensional strided view; Nsight Compute (s75, H100) put the GEMM kernel alone 2-6 us below
its CUDA-graph time with that copy, at 64 rows of Llama-3-8B's o and down. With this kernel
instead, the GEMM's graph time fell 1-2 us in each of s76's 48 best-of cases (H100, 32-128 rows,
both formats: ``benchmarks.fp4_async --permutes torch,triton``).
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
    triton,
)
from kvserve.kernels.fp4_step_order import check_step_order, step_source_columns

_MAX_BLOCK = 2048  # columns a program


@jit
def _permute_x_steps_kernel(
    x_ptr, out_ptr, K, stride_xm, stride_om, BITS: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    k = step_source_columns(p, BITS)
    mask = p < K
    pdl_wait(USE_PDL)
    values = tl.load(x_ptr + row * stride_xm + k, mask=mask)
    pdl_release(USE_PDL)
    tl.store(out_ptr + row * stride_om + p, values, mask=mask)


def permute_x_steps_triton(x: torch.Tensor, bits: bool = False, pdl: bool = False) -> torch.Tensor:
    """``permute_x_steps(x, bits)`` (x [M, K], K a multiple of 128) by one kernel launch: a new
    contiguous tensor; ``pdl``: programmatic dependent launch."""
    require_triton()
    m, k = x.shape
    check_step_order(k, bits)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(m, k, dtype=x.dtype, device=x.device)
    if m and k:
        block = min(next_pow2(k), _MAX_BLOCK)
        _permute_x_steps_kernel[(m, triton.cdiv(k, block))](
            x, out, k, x.stride(0), out.stride(0), BITS=bits, BLOCK=block, **launch_options(pdl)
        )
    return out
