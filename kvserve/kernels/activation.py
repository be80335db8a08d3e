"""SiLU-and-multiply, the gate of a SwiGLU MLP: ``silu(x[:, :I]) * x[:, I:]`` (fp32 inside)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels._triton import jit, launch_options, pdl_release, pdl_wait, require_triton, tl
from kvserve.kernels.fp4_step_order import check_step_order, step_positions

_BLOCK = 1024


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


@jit
def silu_mul(gate, up):
    """silu(gate) * up in fp32: the one formula of the SiLU-and-mul kernel and of the FP8
    quantization that takes the gate and up in (``fp8_quant``, ``gated``)."""
    gate = gate.to(tl.float32)
    return gate * tl.sigmoid(gate) * up.to(tl.float32)


@jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    inter,
    stride_x,
    stride_o,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
    PERMUTE: tl.constexpr = False,
    BITS: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    y = silu_mul(gate, up)
    # PERMUTE: in the async FP4 GEMM's step order (a permutation within 128-column steps)
    dest = step_positions(cols, BITS) if PERMUTE else cols
    tl.store(out_ptr + row * stride_o + dest, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor, *, pdl: bool = False, step_order: bool | None = None
) -> torch.Tensor:
    """``x`` [T, 2I] -> [T, I]; with ``step_order`` (the async FP4 GEMM's ``bits``) its columns
    in that GEMM's K-step permutation (``permute_x_steps``)."""
    require_triton()
    rows, width = x.shape
    assert width % 2 == 0 and x.stride(-1) == 1
    inter = width // 2
    check_step_order(inter, step_order)
    out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    grid = (rows, -(-inter // _BLOCK))
    _silu_and_mul_kernel[grid](
        x, out, inter, x.stride(0), out.stride(0), BLOCK=_BLOCK, PERMUTE=step_order is not None,
        BITS=bool(step_order), num_warps=4, **launch_options(pdl),
    )  # fmt: skip
    return out
