"""RMSNorm, plain and fused with the residual add (Hugging Face semantics).

``rms_norm(x) = weight * (x.float() * rsqrt(mean(x.float() ** 2) + eps)).to(x.dtype)``: the
statistics in fp32, the normalised value rounded to the input dtype before the weight multiply.
One program per row.
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
)
from kvserve.kernels.fp4_step_order import check_step_order, step_positions


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = x + residual
    return rms_norm_reference(residual_out, weight, eps), residual_out


@jit
def normed_row(
    x_ptr,
    residual_ptr,
    sum_ptr,
    weight_ptr,
    row,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_s,
    store_sum,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row ``row``'s ``weight * norm(x (+ residual))`` in fp32, [BLOCK] (zero past ``hidden``),
    before its rounding to the output dtype; with a residual, the sum x + residual is stored in
    ``sum_ptr``'s row (the residual's own for the in-place norm) where ``store_sum``. The caller
    has waited for the kernel before."""
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like torch's x + r
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask & store_sum)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    return normed * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)


@jit
def norm_program_row(USE_PDL: tl.constexpr):
    """A one-row-a-program norm kernel's row, once the kernel before has finished."""
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    return tl.program_id(0).to(tl.int64)


@jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
    PERMUTE: tl.constexpr = False,
    BITS: tl.constexpr = False,
):
    row = norm_program_row(USE_PDL)
    y = normed_row(
        x_ptr, residual_ptr, residual_ptr, weight_ptr, row, hidden, eps, stride_x, stride_r,
        stride_r, True, HAS_RESIDUAL, BLOCK,
    )  # fmt: skip
    cols = tl.arange(0, BLOCK)
    # PERMUTE: in the async FP4 GEMM's step order (a permutation within 128-column steps)
    dest = step_positions(cols, BITS) if PERMUTE else cols
    tl.store(out_ptr + row * stride_o + dest, y.to(out_ptr.dtype.element_ty), mask=cols < hidden)


def row_warps(block: int) -> int:
    """Warps of a program that norms one row of ``block`` (padded) values."""
    return min(16, max(1, block // 512))


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    pdl: bool,
    step_order: bool | None,
) -> torch.Tensor:
    require_triton()
    rows, hidden = x.shape
    assert weight.shape == (hidden,) and x.stride(-1) == 1 and weight.stride(-1) == 1
    check_step_order(hidden, step_order)
    out = torch.empty(
        rows, hidden, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device
    )
    if rows == 0:
        return out
    block = next_pow2(hidden)
    _rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        hidden,
        eps,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        PERMUTE=step_order is not None,
        BITS=bool(step_order),
        num_warps=row_warps(block),
        **launch_options(pdl),
    )
    return out


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    pdl: bool = False,
    step_order: bool | None = None,
) -> torch.Tensor:
    """``x`` [T, H], ``weight`` [H] -> [T, H]; with ``step_order`` (the async FP4 GEMM's
    ``bits``) its columns in that GEMM's K-step permutation (``permute_x_steps``)."""
    return _launch(x, None, weight, eps, pdl, step_order)


def fused_add_rms_norm(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor,  # [T, H]; overwritten with x + residual
    weight: torch.Tensor,  # [H]
    eps: float,
    *,
    pdl: bool = False,
    step_order: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``; the second is ``residual`` itself,
    updated in place (in natural column order, whatever ``step_order``)."""
    assert residual.shape == x.shape and residual.stride(-1) == 1 and residual.dtype == x.dtype
    return _launch(x, residual, weight, eps, pdl, step_order), residual
