"""FP8 (e4m3) quantization of activations: dynamic per token, per token-group, or with a
static per-tensor scale.

``x [M, K]`` -> ``(q [M, K] float8_e4m3fn, scales fp32)``: per token ``[M, 1]``, per group of
``group`` columns ``[M, K / group]``, static: the given scale. ``x ~= q * scale``; a dynamic
scale is ``amax / 448`` of its row or group (never below a tiny floor, so zero rows stay zero).
One Triton program per (row, group) on CUDA; the torch reference elsewhere.

``gated``: ``x [M, 2K]`` holds a SwiGLU's gate then up, and what is quantized is
``silu(gate) * up`` rounded to x's dtype, as ``activation.silu_and_mul`` stores it: one launch
for the two (an FP8 MoE's down projection at decode, ``fused_moe_fp8``), the same bits as both.
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
from kvserve.kernels.activation import silu_and_mul_reference, silu_mul

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12 / FP8_MAX


def quantize_fp8_reference(
    x: torch.Tensor,
    group: int | None = None,
    static_scale: torch.Tensor | None = None,
    gated: bool = False,
    scales_m_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scales_m_major``: dynamic scales laid out as ``quantize_fp8`` says."""
    if gated:
        x = silu_and_mul_reference(x.float()).to(x.dtype)
    x32 = x.float()
    if static_scale is not None:
        scale = static_scale.float()
        return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    m, k = x32.shape
    g = k if group is None else group
    if k % g:
        raise ValueError(f"{k} columns do not split into groups of {g}")
    grouped = x32.view(m, k // g, g)
    scale = (grouped.abs().amax(dim=-1) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (grouped / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(m, k), m_major(scale) if scales_m_major else scale


def dequantize_fp8_activation(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``q * scale`` for any scale layout ``quantize_fp8_*`` returns."""
    m, k = q.shape
    if scale.numel() == 1:
        return q.float() * scale.float().reshape(())
    groups = scale.shape[-1]
    return (q.float().view(m, groups, k // groups) * scale.float()[..., None]).view(m, k)


@jit
def _quant_kernel(
    x_ptr, q_ptr, s_ptr, static_ptr, K, stride_x, stride_q, stride_sm, stride_sg,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, STATIC: tl.constexpr, GATED: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    row = tl.program_id(0)
    grp = tl.program_id(1)
    cols = grp * GROUP + tl.arange(0, BLOCK)
    mask = (tl.arange(0, BLOCK) < GROUP) & (cols < K)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    x = tl.load(x_row + cols, mask=mask, other=0.0)
    if GATED:  # x's row is [gate | up], K columns each
        up = tl.load(x_row + K + cols, mask=mask, other=0.0)
        x = silu_mul(x, up).to(x_ptr.dtype.element_ty)
    x = x.to(tl.float32)
    if STATIC:
        scale = tl.load(static_ptr).to(tl.float32)
    else:
        amax = tl.max(tl.abs(x), axis=0)
        scale = tl.maximum(amax / 448.0, 1e-12 / 448.0)
        tl.store(s_ptr + row * stride_sm + grp * stride_sg, scale)
    q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
    tl.store(q_ptr + row.to(tl.int64) * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def quantize_fp8(
    x: torch.Tensor,
    group: int | None = None,
    static_scale: torch.Tensor | None = None,
    *,
    pdl: bool = False,
    gated: bool = False,
    scales_m_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``quantize_fp8_reference``, one kernel launch on CUDA (no host sync).
    ``scales_m_major``: dynamic scales ``[M, groups]`` laid out with strides ``(1, M)`` (what
    cuBLASLt's block-scaled GEMM reads: ``fp8_gemm.blockwise_scaled_mm``)."""
    if x.device.type != "cuda":
        return quantize_fp8_reference(x, group, static_scale, gated, scales_m_major)
    return launch_quant_kernel(x, group, static_scale, pdl, gated, scales_m_major)


def m_major(scales: torch.Tensor) -> torch.Tensor:
    """``scales [M, G]`` with strides ``(1, M)`` (the same values)."""
    return scales.t().contiguous().t()


def empty_scales(m: int, groups: int, device: torch.device, rows_first: bool) -> torch.Tensor:
    """fp32 ``[m, groups]``, row-major or (``rows_first``: M-major) with strides ``(1, m)``."""
    if rows_first:
        return torch.empty((groups, m), device=device).t()
    return torch.empty((m, groups), device=device)


def launch_quant_kernel(
    x: torch.Tensor,
    group: int | None,
    static_scale: torch.Tensor | None,
    pdl: bool,
    gated: bool,
    scales_m_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8``'s kernel launch on any device (Triton's interpreter runs it on CPU)."""
    require_triton()
    m, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    assert x.stride(-1) == 1
    g = k if group is None else group
    if k % g:
        raise ValueError(f"{k} columns do not split into groups of {g}")
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    static = static_scale is not None
    scales = static_scale if static else empty_scales(m, k // g, x.device, scales_m_major)
    if m == 0:
        return q, scales
    block = next_pow2(g)
    warps = 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16
    _quant_kernel[(m, k // g)](
        x, q, scales, scales, k, x.stride(0), q.stride(0),
        0 if static else scales.stride(0), 0 if static else scales.stride(1),
        GROUP=g, BLOCK=block, STATIC=static, GATED=gated, num_warps=warps, **launch_options(pdl),
    )  # fmt: skip
    return q, scales
