"""What NVFP4 and MXFP4 share: E2M1 encoding and packing, and the three tensors of an FP4
weight in kvserve's one layout (see ``kvserve.kernels.fp4_reference``, which decodes them)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.kernels.fp4_reference import E2M1_MAX


class Fp4Weight(NamedTuple):
    packed: torch.Tensor  # uint8 [N, K/2]
    block_scale: torch.Tensor  # float8_e4m3fn [N, K/16] or uint8 E8M0 [N, K/32]
    row_scale: torch.Tensor | None  # fp32 [N] (NVFP4) or None (MXFP4)


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float -> uint8 E2M1 codes (0..15), round to nearest even, saturating at +-6.

    The magnitudes are 0, 0.5 .. 1.5 (step 0.5), 2, 3 (step 1), 4, 6 (step 2): within each
    step the code is the rounded multiple of the step plus the codes below it, and
    ``torch.round`` rounds halves to even, which is E2M1's even mantissa."""
    magnitude = values.float().abs().clamp(max=E2M1_MAX)
    code = torch.where(
        magnitude < 2,
        torch.round(magnitude * 2),
        torch.where(magnitude < 4, torch.round(magnitude) + 2, torch.round(magnitude * 0.5) + 4),
    )
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
