"""RMSNorm (optionally after its residual add) whose output is e4m3 with its scales: the norm
and the activation quantization of the FP8 layer it feeds in one launch, for the steps where
that layer would otherwise run ``fp8_quant.quantize_fp8`` on the norm's output.

``rms_norm_fp8(x, residual, weight, eps, group, static_scale)`` computes what
``quantize_fp8(rms_norm(x + residual), group, static_scale)`` computes: the norm's value is
rounded to the dtype the plain norm stores before its amax and its division by the scale, and
the row is laid out as the plain norm's (8 values a thread), so its fp32 sum of squares adds in
the same order: the same bits (none of 221 million values apart on the H200, 1-1024 rows of
1024-8192 columns). One program per row; a per-group scale needs the group (a power of two) to
divide the row.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    require_triton,
    tl,
)
from kvserve.kernels.fp8_quant import FP8, empty_scales, quantize_fp8_reference
from kvserve.kernels.rmsnorm import (
    fused_add_rms_norm_reference,
    norm_program_row,
    normed_row,
    rms_norm_reference,
    row_warps,
)


def rms_norm_fp8_reference(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    group: int | None = None,
    static_scale: torch.Tensor | None = None,
    scales_m_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)`` of the norm's output; ``residual`` (if any) is updated in place to
    ``x + residual``, as ``fused_add_rms_norm`` does."""
    if residual is None:
        normed = rms_norm_reference(x, weight, eps)
    else:
        normed, summed = fused_add_rms_norm_reference(x, residual, weight, eps)
        residual.copy_(summed)
    return quantize_fp8_reference(normed, group, static_scale, scales_m_major=scales_m_major)


@jit
def _rms_norm_fp8_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    q_ptr,
    s_ptr,  # fp32 [rows, num_groups]; unused when STATIC
    static_ptr,  # fp32 [1]; unused unless STATIC
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_q,
    stride_sm,
    stride_sg,
    num_groups,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUP: tl.constexpr,  # values a scale: a power of two; BLOCK for one scale a row
    STATIC: tl.constexpr,
    NORM_DTYPE: tl.constexpr,  # what the plain norm would store
    USE_PDL: tl.constexpr,
):
    row = norm_program_row(USE_PDL)
    y = normed_row(
        x_ptr, residual_ptr, residual_ptr, weight_ptr, row, hidden, eps, stride_x, stride_r,
        stride_r, True, HAS_RESIDUAL, BLOCK,
    )  # fmt: skip
    y = y.to(NORM_DTYPE).to(tl.float32)
    if STATIC:
        q = y / tl.load(static_ptr).to(tl.float32)
    else:
        groups = tl.reshape(y, (BLOCK // GROUP, GROUP))
        scale = tl.maximum(tl.max(tl.abs(groups), axis=1) / 448.0, 1e-12 / 448.0)
        q = tl.reshape(groups / scale[:, None], (BLOCK,))
        g = tl.arange(0, BLOCK // GROUP)
        tl.store(s_ptr + row * stride_sm + g * stride_sg, scale, mask=g < num_groups)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    # Declared 8 contiguous a thread (not the 16 an e4m3 store would take): the row keeps the
    # plain norm's layout (its sum order, so its bits) with no 8 KB shared-memory conversion
    cols = tl.max_contiguous(tl.arange(0, BLOCK), 8)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=cols < hidden)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def rms_norm_fp8(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor | None,  # [T, H]; overwritten with x + residual
    weight: torch.Tensor,  # [H]
    eps: float,
    group: int | None = None,
    static_scale: torch.Tensor | None = None,
    scales_m_major: bool = False,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [T, H] e4m3, scales)``: per row ``[T, 1]`` (``group`` None), per group of ``group``
    columns ``[T, H / group]`` (``scales_m_major``: with strides ``(1, T)``), or
    ``static_scale`` itself. One launch on any device Triton runs on (its interpreter on
    CPU)."""
    require_triton()
    rows, hidden = x.shape
    assert weight.shape == (hidden,) and x.stride(-1) == 1 and weight.stride(-1) == 1
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(-1) == 1
        assert residual.dtype == x.dtype
    g = hidden if group is None else group
    if hidden % g or (group is not None and group != next_pow2(group)):
        raise ValueError(f"{hidden} columns do not split into power-of-two groups of {g}")
    block = next_pow2(hidden)
    q = torch.empty(rows, hidden, dtype=FP8, device=x.device)
    static = static_scale is not None
    scales = static_scale if static else empty_scales(rows, hidden // g, x.device, scales_m_major)
    if rows == 0:
        return q, scales
    _rms_norm_fp8_kernel[(rows,)](
        x, residual if residual is not None else x, weight, q, scales, scales, hidden, eps,
        x.stride(0), residual.stride(0) if residual is not None else 0, q.stride(0),
        0 if static else scales.stride(0), 0 if static else scales.stride(1), hidden // g,
        HAS_RESIDUAL=residual is not None, BLOCK=block, GROUP=block if group is None else g,
        STATIC=static, NORM_DTYPE=_TL_DTYPES[torch.promote_types(x.dtype, weight.dtype)],
        num_warps=row_warps(block), **launch_options(pdl),
    )  # fmt: skip
    return q, scales
