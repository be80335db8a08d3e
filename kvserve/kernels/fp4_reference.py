"""Plain-torch reference for FP4 (E2M1) weights: unpack, dequantize, ``x @ W.T``. Runs anywhere;
the Triton kernel in ``fp4_gemm.py`` is tested against it and the CPU linear method uses it.

The one in-memory layout of an FP4 weight [N, K] (both NVFP4 and MXFP4 readers produce it):

- ``packed``       uint8 [N, K/2]: two E2M1 codes per byte, element 2j in the low nibble and
                   2j+1 in the high nibble (ModelOpt, compressed-tensors and gpt-oss all agree);
                   a code is sign (bit 3), exponent (bits 2-1), mantissa (bit 0).
- ``block_scale``  one scale per group of consecutive K values: float8_e4m3fn [N, K/16] (NVFP4)
                   or uint8 E8M0 exponents [N, K/32] (MXFP4, value 2**(e - 127)).
- ``row_scale``    fp32 [N] or None: NVFP4's per-tensor scale, one copy per output row so that a
                   merged q/k/v or gate/up layer keeps each shard's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
E2M1_MAX = 6.0
NVFP4_GROUP = 16
MXFP4_GROUP = 32


def group_size_of(block_scale: torch.Tensor) -> int:
    """16 for FP8 e4m3 scales (NVFP4), 32 for uint8 E8M0 scales (MXFP4)."""
    if block_scale.dtype == torch.float8_e4m3fn:
        return NVFP4_GROUP
    if block_scale.dtype == torch.uint8:
        return MXFP4_GROUP
    raise ValueError(f"FP4 block scales are float8_e4m3fn or uint8 (E8M0), not {block_scale.dtype}")


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> float32 [..., K]: low nibble first."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    pairs = torch.stack((table.repeat(16), table.repeat_interleave(16)), dim=-1)  # byte -> lo, hi
    return pairs[packed.long()].flatten(-2)


def block_scales_to_float(block_scale: torch.Tensor) -> torch.Tensor:
    if block_scale.dtype == torch.uint8:  # E8M0: a bare biased exponent
        ones = torch.ones(block_scale.shape, dtype=torch.float32, device=block_scale.device)
        return torch.ldexp(ones, block_scale.to(torch.int32) - 127)
    return block_scale.float()


def dequantize_fp4(
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The dense weight [N, K] in ``dtype`` (computed in fp32)."""
    group = group_size_of(block_scale)
    values = unpack_e2m1(packed)
    n, k = values.shape
    if block_scale.shape != (n, k // group) or k % group:
        raise ValueError(
            f"block scales {tuple(block_scale.shape)} do not fit a [{n}, {k}] weight in groups"
            f" of {group}"
        )
    scales = block_scales_to_float(block_scale)
    weight = (values.view(n, k // group, group) * scales.unsqueeze(-1)).view(n, k)
    if row_scale is not None:
        weight = weight * row_scale.float().view(n, 1)
    return weight.to(dtype)


def fp4_linear_reference(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` [..., K] @ dequantized W.T (+ bias) in x's dtype."""
    weight = dequantize_fp4(packed, block_scale, row_scale, x.dtype)
    return F.linear(x, weight, bias)
