"""SiLU-and-multiply, the gate of a SwiGLU MLP: ``silu(x[:, :I]) * x[:, I:]`` (fp32 inside)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels._triton import jit, launch_options, pdl_release, pdl_wait, require_triton, tl

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
    x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    y = silu_mul(gate, up)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """``x`` [T, 2I] -> [T, I]."""
    require_triton()
    rows, width = x.shape
    assert width % 2 == 0 and x.stride(-1) == 1
    inter = width // 2
    out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    grid = (rows, -(-inter // _BLOCK))
    _silu_and_mul_kernel[grid](
        x, out, inter, x.stride(0), out.stride(0), BLOCK=_BLOCK, num_warps=4, **launch_options(pdl)
    )
    return out
