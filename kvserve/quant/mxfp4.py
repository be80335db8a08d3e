"""MXFP4 (OCP microscaling): E2M1 values and an E8M0 scale (a power of two, stored as the
biased exponent byte) per 32 along K. No per-tensor scale.

Checkpoint layouts read (per linear ``<prefix>``):

- gpt-oss (``quant_method: mxfp4``): ``weight_blocks`` uint8 [N, K/32, 16] and
  ``weight_scales`` uint8 [N, K/32]. gpt-oss itself stores only its MoE experts this way
  (``experts.gate_up_proj_blocks``); kvserve reads the same tensors for a dense linear.
- compressed-tensors ``mxfp4-pack-quantized``: ``weight_packed`` uint8 [N, K/2] and
  ``weight_scale`` uint8 [N, K/32].
- ModelOpt (``quant_algo: MXFP4``): ``weight`` uint8 [N, K/2] and ``weight_scale`` uint8.
- online (``--quantization mxfp4``): float ``weight``, scaled as the OCP spec does:
  2**(floor(log2(block_amax)) - 2), values past 6 saturating.
"""

from __future__ import annotations

import torch

from kvserve.kernels.fp4_reference import MXFP4_GROUP
from kvserve.quant.fp4_common import Fp4Weight, encode_e2m1, pack_e2m1, split_groups
from kvserve.quant.fp4_method import Fp4Format, Fp4LinearMethod, Reader, packed_rows

E2M1_EMAX = 2  # exponent of E2M1's largest power of two (4 <= 6 < 8)
E8M0_BIAS = 127


def quantize_mxfp4(weight: torch.Tensor) -> Fp4Weight:
    """A float [N, K] weight (K a multiple of 32) -> MXFP4."""
    blocks = split_groups(weight, MXFP4_GROUP)
    block_amax = blocks.abs().amax(dim=-1)
    exponent = torch.floor(torch.log2(block_amax)) - E2M1_EMAX
    exponent = torch.where(block_amax > 0, exponent, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    step = torch.ldexp(torch.ones_like(exponent), exponent.to(torch.int32))
    codes = encode_e2m1(blocks / step.unsqueeze(-1)).flatten(1)
    block_scale = (exponent + E8M0_BIAS).to(torch.uint8)
    return Fp4Weight(pack_e2m1(codes), block_scale, None)


def _e8m0(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    if loaded.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise ValueError(f"MXFP4 scales are E8M0 bytes (uint8), got {loaded.dtype}")
    return {"weight_scale": loaded.view(torch.uint8)}


def _online(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    q = quantize_mxfp4(loaded)
    return {"weight_packed": q.packed, "weight_scale": q.block_scale}


LAYOUTS: dict[str, dict[str, Reader]] = {
    "mxfp4": {"weight_blocks": packed_rows, "weight_scales": _e8m0},
    "compressed-tensors": {"weight_packed": packed_rows, "weight_scale": _e8m0},
    "modelopt": {"weight": packed_rows, "weight_scale": _e8m0},
    "online": {"weight": _online},
}


def _dummy_scales(rows: int, groups: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """2**-8 or 2**-9 per block: |W| <= 0.023, like the unquantized dummy's 0.02."""
    exponent = E8M0_BIAS - 8 - torch.randint(0, 2, (rows, groups), generator=gen, device=gen.device)
    return {"weight_scale": exponent.to(torch.uint8)}


MXFP4 = Fp4Format(
    name="mxfp4",
    group=MXFP4_GROUP,
    scale_dtype=torch.uint8,
    has_row_scale=False,
    layouts=LAYOUTS,
    optional=(),
    dummy_scales=_dummy_scales,
)


def make_method(config: object) -> Fp4LinearMethod:
    return Fp4LinearMethod(MXFP4, getattr(config, "layout", "online"))
