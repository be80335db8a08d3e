"""NVFP4: E2M1 values, an FP8 e4m3 scale per 16 along K, an fp32 per-tensor scale.

Checkpoint layouts read (per linear ``<prefix>``; ``input_scale``/``input_global_scale`` are
read and ignored: on Hopper the activations stay bf16):

- ModelOpt (``quant_algo: NVFP4``): ``weight`` uint8 [N, K/2], ``weight_scale`` e4m3 [N, K/16],
  ``weight_scale_2`` fp32 scalar; W = e2m1 * weight_scale * weight_scale_2.
- compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed``, ``weight_scale`` as above and
  ``weight_global_scale`` = 1 / weight_scale_2 (it stores the reciprocal).
- online (``--quantization nvfp4``): ``weight`` in float, quantized here as ModelOpt does:
  per-tensor scale amax / (6 * 448), block scales block_amax / 6 in units of it.
"""

from __future__ import annotations

import torch

from kvserve.kernels.fp4_reference import E2M1_MAX, NVFP4_GROUP
from kvserve.quant.fp4_common import Fp4Weight, encode_e2m1, pack_e2m1, split_groups
from kvserve.quant.fp4_method import Fp4Format, Fp4LinearMethod, Reader, ignored, packed_rows

E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9


def quantize_nvfp4(weight: torch.Tensor) -> Fp4Weight:
    """A float [N, K] weight (K a multiple of 16) -> NVFP4 with its own per-tensor scale."""
    blocks = split_groups(weight, NVFP4_GROUP)
    amax = blocks.abs().amax()
    per_tensor = amax / (E2M1_MAX * E4M3_MAX) if amax > 0 else torch.ones_like(amax)
    block_amax = blocks.abs().amax(dim=-1)
    block_scale = (block_amax / (E2M1_MAX * per_tensor)).clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    step = block_scale.float() * per_tensor
    codes = encode_e2m1(blocks / step.unsqueeze(-1)).flatten(1)
    row_scale = per_tensor.float().expand(weight.shape[0]).contiguous()
    return Fp4Weight(pack_e2m1(codes), block_scale, row_scale)


def _e4m3(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    return {"weight_scale": loaded.to(torch.float8_e4m3fn)}


def _per_tensor(reciprocal: bool) -> Reader:
    def read(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
        value = loaded.float().reshape(-1)
        if value.numel() != 1:
            raise ValueError(f"a per-tensor scale has one value, got shape {tuple(loaded.shape)}")
        value = 1.0 / value if reciprocal else value
        return {"weight_row_scale": value.expand(rows)}

    return read


def _online(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    q = quantize_nvfp4(loaded)
    return {
        "weight_packed": q.packed,
        "weight_scale": q.block_scale,
        "weight_row_scale": q.row_scale,
    }


LAYOUTS: dict[str, dict[str, Reader]] = {
    "modelopt": {
        "weight": packed_rows,
        "weight_scale": _e4m3,
        "weight_scale_2": _per_tensor(reciprocal=False),
        "input_scale": ignored,
    },
    "compressed-tensors": {
        "weight_packed": packed_rows,
        "weight_scale": _e4m3,
        "weight_global_scale": _per_tensor(reciprocal=True),
        "input_global_scale": ignored,
    },
    "online": {"weight": _online},
}
OPTIONAL = ("input_scale", "input_global_scale")


def _dummy_scales(rows: int, groups: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Block scales in [0.5, 1) and a per-tensor scale of 1/250: |W| <= 0.024, like the
    unquantized dummy's uniform(-0.02, 0.02)."""
    uniform = torch.rand(rows, groups, generator=gen, device=gen.device)
    row_scale = torch.full((rows,), 1 / 250, device=gen.device)
    return {
        "weight_scale": (0.5 + 0.5 * uniform).to(torch.float8_e4m3fn),
        "weight_row_scale": row_scale,
    }


NVFP4 = Fp4Format(
    name="nvfp4",
    group=NVFP4_GROUP,
    scale_dtype=torch.float8_e4m3fn,
    has_row_scale=True,
    layouts=LAYOUTS,
    optional=OPTIONAL,
    dummy_scales=_dummy_scales,
)


def make_method(config: object) -> Fp4LinearMethod:
    return Fp4LinearMethod(NVFP4, getattr(config, "layout", "online"))
