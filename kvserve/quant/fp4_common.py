"""What NVFP4 and MXFP4 share: E2M1 encoding and packing, and the three tensors of an FP4
weight in kvserve's one layout (see ``kvserve.kernels.fp4_reference``, which decodes them)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.kernels.fp4_reference import E2M1_MAX

# Midpoints between neighbouring E2M1 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
# Ties go to the even code (mantissa bit 0): these midpoints round up, the others down.
_ROUND_UP_TIES = (0.75, 1.75, 3.5)


class Fp4Weight(NamedTuple):
    packed: torch.Tensor  # uint8 [N, K/2]
    block_scale: torch.Tensor  # float8_e4m3fn [N, K/16] or uint8 E8M0 [N, K/32]
    row_scale: torch.Tensor | None  # fp32 [N] (NVFP4) or None (MXFP4)


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float -> uint8 E2M1 codes (0..15), round to nearest even, saturating at +-6."""
    magnitude = values.float().abs().clamp(max=E2M1_MAX)
    bounds = torch.tensor(_MIDPOINTS, device=values.device)
    code = torch.bucketize(magnitude, bounds)  # a midpoint itself goes down
    for tie in _ROUND_UP_TIES:
        code += magnitude == tie
    return code.to(torch.uint8) | (torch.signbit(values).to(torch.uint8) << 3)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] -> [..., K/2], element 2j in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 packing needs an even K, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def split_groups(weight: torch.Tensor, group: int) -> torch.Tensor:
    """[N, K] float -> fp32 [N, K/group, group]; K must be a multiple of ``group``."""
    if weight.dim() != 2 or weight.shape[1] % group:
        raise ValueError(
            f"FP4 quantization needs a 2-D weight with K a multiple of {group}, "
            f"got {tuple(weight.shape)}"
        )
    return weight.float().reshape(weight.shape[0], -1, group)
