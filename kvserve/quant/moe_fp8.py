"""FP8 (e4m3) experts: ``w13`` [E, 2I, H] and ``w2`` [E, H, I] in float8_e4m3fn with fp32
scales ``w13_scale`` / ``w2_scale``, either per 128x128 block ([E, rows/128, K/128]; with
dynamic per-token-group activations: Qwen3-30B-A3B-FP8, GLM-4.5-Air-FP8) or per output
channel ([E, rows]; with dynamic per-token activations: compressed-tensors FP8_DYNAMIC, and
``--quantization fp8``, which quantizes each expert as it is read). Per-tensor weight scales
(``quant_method: fp8`` without blocks) become per-channel ones. Static or per-tensor activation
scales are refused for experts.

GPU: ``kernels.fused_moe_fp8`` (FP8 tensor cores); elsewhere its torch reference, with the
dequantized fp32 experts kept beside the FP8 ones after the first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from kvserve.errors import ModelLoadError
from kvserve.kernels.fp8_quant import FP8
from kvserve.kernels.fused_moe import fused_moe_reference
from kvserve.kernels.fused_moe_fp8 import (
    dequantize_fp8_experts,
    fake_quant_fp8,
    fused_moe_fp8,
)
from kvserve.quant.fp8_config import Fp8Spec, fp8_spec
from kvserve.quant.fp8_method import ZERO_POINTS
from kvserve.quant.fp8_weights import quantize_weight
from kvserve.quant.moe_method import ExpertReader, check_divides
from kvserve.quant.schemes import QuantConfig, UnsupportedQuantization

if TYPE_CHECKING:
    from kvserve.layers.moe import SparseMoE

_CPU_DENSE = "_fp8_experts_dequantized"
_DUMMY_CHUNK = 16  # experts drawn at a time by init_dummy (bounds its fp32 temporaries)


def quantize_fp8_experts(
    w: torch.Tensor, block: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float [E, N, K] -> (fp8 [E, N, K], fp32 scales [E, N/bn, K/bk] or [E, N])."""
    pairs = [quantize_weight(w[e], "block" if block else "channel", block) for e in range(len(w))]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def _expert_block(spec: Fp8Spec, source: str) -> tuple[int, int] | None:
    """The experts' scale layout: a block, or None for per-channel."""
    if spec.online:
        return None
    if spec.weight == "block" and spec.activation == "group":
        return spec.block
    if spec.weight in ("channel", "tensor") and spec.activation == "token":
        return None
    raise UnsupportedQuantization(
        f"fp8 ({source}): {spec.weight} weights with {spec.activation} activations are not "
        "supported for mixture-of-experts layers; experts run 128x128-block weights with "
        "dynamic per-group activations or per-channel/per-tensor weights with dynamic "
        "per-token activations"
    )


class Fp8ExpertMethod:
    def __init__(self, spec: Fp8Spec, source: str) -> None:
        self.spec = spec
        self.block = _expert_block(spec, source)

    def create_weights(self, moe: SparseMoE, dtype: torch.dtype) -> None:
        experts, inter, hidden = (
            moe.stacked_experts,
            moe.cfg.expert_intermediate_size,
            moe.hidden_size,
        )
        moe.w13 = nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=FP8), False)
        moe.w2 = nn.Parameter(torch.empty(experts, hidden, inter, dtype=FP8), False)
        if self.block is None:
            scale13, scale2 = (experts, 2 * inter), (experts, hidden)
        else:
            bn, bk = self.block
            check_divides(moe, bn, bk, f"fp8 with {bn}x{bk} weight blocks")
            scale13 = (experts, 2 * inter // bn, hidden // bk)
            scale2 = (experts, hidden // bn, inter // bk)
        moe.w13_scale = nn.Parameter(torch.ones(scale13), False)
        moe.w2_scale = nn.Parameter(torch.ones(scale2), False)

    def readers(self) -> dict[str, ExpertReader]:
        if self.spec.online:
            return {"weight": _online}
        readers: dict[str, ExpertReader] = {
            "weight": _fp8_weight,
            self.spec.scale_name: _block_scale if self.block else _channel_scale,
            "input_scale": _ignored,  # dynamic activations: a calibrated scale is unused
        }
        return readers | {name: _zero_point for name in ZERO_POINTS}

    def required(self) -> tuple[str, ...]:
        return ("weight",) if self.spec.online else ("weight", self.spec.scale_name)

    def process_after_loading(self, moe: SparseMoE) -> None:
        moe.__dict__.pop(_CPU_DENSE, None)

    def init_dummy(self, moe: SparseMoE, gen: torch.Generator) -> None:
        for w, scale in ((moe.w13, moe.w13_scale), (moe.w2, moe.w2_scale)):
            for start in range(0, w.shape[0], _DUMMY_CHUNK):
                chunk = torch.empty(w[start : start + _DUMMY_CHUNK].shape, device=w.device)
                chunk.uniform_(-0.02, 0.02, generator=gen)
                q, s = quantize_fp8_experts(chunk, self.block)
                w.data[start : start + len(q)] = q
                scale.data[start : start + len(q)] = s

    def apply(
        self,
        moe: SparseMoE,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        triton: bool,
        addend: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if triton:
            return fused_moe_fp8(
                x, moe.w13, moe.w13_scale, moe.w2, moe.w2_scale, topk_weights, topk_ids,
                self.block, moe.kernels.pdl, addend, moe.shared_expert,
            )  # fmt: skip
        w13, w2 = self._dequantized(moe)
        group = self.block[1] if self.block else None

        def quant(t: torch.Tensor) -> torch.Tensor:
            return fake_quant_fp8(t, group)

        out = fused_moe_reference(
            x.float(), w13, w2, topk_weights, topk_ids, quant, x.dtype, addend
        )
        return out.to(x.dtype)

    def _dequantized(self, moe: SparseMoE) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 experts for the reference, dequantized once (the CPU path is for
        correctness; dequantizing every layer on every step would make it crawl)."""
        cached = moe.__dict__.get(_CPU_DENSE)
        if cached is None:
            cached = (
                dequantize_fp8_experts(moe.w13, moe.w13_scale, self.block),
                dequantize_fp8_experts(moe.w2, moe.w2_scale, self.block),
            )
            moe.__dict__[_CPU_DENSE] = cached
        return cached


def _fp8_weight(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    if loaded.dtype != FP8:
        raise ModelLoadError(f"an FP8 expert weight is float8_e4m3fn, got {loaded.dtype}")
    return {"": loaded}


def _block_scale(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    return {"_scale": loaded.float()}


def _channel_scale(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    """Per channel ([rows] or [rows, 1]) or per tensor (one value, repeated per row)."""
    flat = loaded.float().reshape(-1)
    return {"_scale": flat.expand(rows) if flat.numel() == 1 else flat}


def _online(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    q, scale = quantize_weight(loaded, "channel")
    return {"": q, "_scale": scale}


def _ignored(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    return {}


def _zero_point(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    if loaded.float().abs().max() != 0:
        raise ModelLoadError("fp8 is symmetric, but the zero point is not 0")
    return {}


def make_expert_method(config: QuantConfig) -> Fp8ExpertMethod:
    return Fp8ExpertMethod(fp8_spec(config), config.source)
