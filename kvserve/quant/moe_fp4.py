"""Weight-only FP4 experts (NVFP4 or MXFP4), each expert in the one FP4 layout of
``kernels.fp4_reference``: ``w13`` uint8 [E, 2I, H/2] and ``w2`` [E, H, I/2] packed E2M1,
``w13_scale`` / ``w2_scale`` block scales ([E, rows, K/16] e4m3 or [E, rows, K/32] E8M0) and,
for NVFP4, ``w13_row_scale`` / ``w2_row_scale`` fp32 [E, rows] (each expert projection's own
per-tensor scale, repeated per row).

A checkpoint layout's tensors are read by the dense FP4 format's own readers
(``nvfp4.LAYOUTS`` / ``mxfp4.LAYOUTS``: ModelOpt, compressed-tensors, online), one expert
projection at a time. GPU: ``kernels.fused_moe_fp4``; elsewhere its torch reference, with the
dequantized experts kept after the first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from kvserve.errors import ModelLoadError
from kvserve.kernels.fused_moe import fused_moe_reference
from kvserve.kernels.fused_moe_fp4 import Fp4Stack, dequantize_fp4_experts, fused_moe_fp4
from kvserve.quant.fp4_method import Fp4Format, Reader
from kvserve.quant.moe_method import ExpertReader
from kvserve.quant.mxfp4 import MXFP4, quantize_mxfp4
from kvserve.quant.nvfp4 import NVFP4, quantize_nvfp4

if TYPE_CHECKING:
    from kvserve.layers.moe import SparseMoE

FORMATS = {"nvfp4": NVFP4, "mxfp4": MXFP4}
# the dense layer's tensor names -> the suffix of the expert stacks
_SUFFIX = {"weight_packed": "", "weight_scale": "_scale", "weight_row_scale": "_row_scale"}
_CPU_DENSE = "_fp4_experts_dequantized"
_DUMMY_CHUNK = 16  # experts drawn at a time by init_dummy


def quantize_fp4_experts(w: torch.Tensor, fmt: str) -> Fp4Stack:
    """Float [E, N, K] -> (packed, block scales, row scales or None), each expert quantized on
    its own (NVFP4: its own per-tensor scale)."""
    quantize = quantize_nvfp4 if fmt == "nvfp4" else quantize_mxfp4
    parts = [quantize(w[e]) for e in range(w.shape[0])]
    rows = None if parts[0].row_scale is None else torch.stack([p.row_scale for p in parts])
    return torch.stack([p.packed for p in parts]), torch.stack([p.block_scale for p in parts]), rows


def _expert_reader(read: Reader) -> ExpertReader:
    def expert_read(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
        try:
            return {_SUFFIX[name]: value for name, value in read(loaded, rows).items()}
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc

    return expert_read


class Fp4ExpertMethod:
    def __init__(self, fmt: Fp4Format, layout: str) -> None:
        if layout not in fmt.layouts:
            raise ModelLoadError(
                f"{fmt.name}: no reader for the {layout} layout "
                f"(kvserve reads {', '.join(fmt.layouts)})"
            )
        self.format, self.layout = fmt, layout

    def create_weights(self, moe: SparseMoE, dtype: torch.dtype) -> None:
        experts, inter, hidden = (
            moe.stacked_experts,
            moe.cfg.expert_intermediate_size,
            moe.hidden_size,
        )
        group = self.format.group
        if inter % group or hidden % group:
            raise ModelLoadError(
                f"{moe.prefix}: {self.format.name} experts need hidden size {hidden} and expert "
                f"intermediate size {inter} to be multiples of {group}"
            )
        for stack, rows, k in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
            packed = torch.zeros(experts, rows, k // 2, dtype=torch.uint8)
            scale = torch.zeros(experts, rows, k // group, dtype=self.format.scale_dtype)
            setattr(moe, stack, nn.Parameter(packed, False))
            setattr(moe, f"{stack}_scale", nn.Parameter(scale, False))
            row_scale = torch.ones(experts, rows) if self.format.has_row_scale else None
            setattr(moe, f"{stack}_row_scale", _maybe_param(row_scale))

    def readers(self) -> dict[str, ExpertReader]:
        return {name: _expert_reader(r) for name, r in self.format.layouts[self.layout].items()}

    def required(self) -> tuple[str, ...]:
        layout = self.format.layouts[self.layout]
        return tuple(name for name in layout if name not in self.format.optional)

    def process_after_loading(self, moe: SparseMoE) -> None:
        moe.__dict__.pop(_CPU_DENSE, None)

    def init_dummy(self, moe: SparseMoE, gen: torch.Generator) -> None:
        for stack in ("w13", "w2"):
            packed = getattr(moe, stack)
            for start in range(0, packed.shape[0], _DUMMY_CHUNK):  # bounds the int64 codes
                part = packed.data[start : start + _DUMMY_CHUNK]
                codes = torch.randint(0, 256, part.shape, generator=gen, device=gen.device)
                part.copy_(codes.to(torch.uint8))
            experts, rows, groups = getattr(moe, f"{stack}_scale").shape
            scales = self.format.dummy_scales(experts * rows, groups, gen)
            for name, value in scales.items():
                param = getattr(moe, stack + _SUFFIX[name])
                param.data.copy_(value.view(param.shape))

    def apply(
        self,
        moe: SparseMoE,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        triton: bool,
        addend: torch.Tensor | None = None,
    ) -> torch.Tensor:
        w13, w2 = _stack(moe, "w13"), _stack(moe, "w2")
        if triton:
            pdl, shared = moe.kernels.pdl, moe.shared_expert
            return fused_moe_fp4(x, w13, w2, topk_weights, topk_ids, pdl, addend, shared)
        dense = moe.__dict__.get(_CPU_DENSE)
        if dense is None:
            dense = (dequantize_fp4_experts(w13), dequantize_fp4_experts(w2))
            moe.__dict__[_CPU_DENSE] = dense
        out = fused_moe_reference(x.float(), *dense, topk_weights, topk_ids, addend=addend)
        return out.to(x.dtype)


def _stack(moe: SparseMoE, name: str) -> Fp4Stack:
    return getattr(moe, name), getattr(moe, f"{name}_scale"), getattr(moe, f"{name}_row_scale")


def _maybe_param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, False)


def make_nvfp4_method(config: object) -> Fp4ExpertMethod:
    return Fp4ExpertMethod(NVFP4, getattr(config, "layout", "online"))


def make_mxfp4_method(config: object) -> Fp4ExpertMethod:
    return Fp4ExpertMethod(MXFP4, getattr(config, "layout", "online"))
