"""Experts in the model dtype: ``w13`` [E, 2I, H] and ``w2`` [E, H, I]."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from kvserve.kernels.fused_moe import fused_moe_reference
from kvserve.kernels.fused_moe_half_gemv import (
    fused_moe_half_gemv,
    half_moe_gemv_here,
)
from kvserve.quant.moe_method import ExpertReader

if TYPE_CHECKING:
    from kvserve.layers.moe import SparseMoE


def _weight(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    return {"": loaded}


class UnquantizedExpertMethod:
    def create_weights(self, moe: SparseMoE, dtype: torch.dtype) -> None:
        experts, inter, hidden = (
            moe.stacked_experts,
            moe.cfg.expert_intermediate_size,
            moe.hidden_size,
        )
        moe.w13 = nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=dtype), False)
        moe.w2 = nn.Parameter(torch.empty(experts, hidden, inter, dtype=dtype), False)

    def readers(self) -> dict[str, ExpertReader]:
        return {"weight": _weight}

    def required(self) -> tuple[str, ...]:
        return ("weight",)

    def process_after_loading(self, moe: SparseMoE) -> None:
        pass

    def init_dummy(self, moe: SparseMoE, gen: torch.Generator) -> None:
        moe.w13.data.uniform_(-0.02, 0.02, generator=gen)
        moe.w2.data.uniform_(-0.02, 0.02, generator=gen)

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
            from kvserve.kernels.fused_moe import fused_moe

            pdl = moe.kernels.pdl
            on_gemv = half_moe_gemv_here(topk_ids.numel(), moe.w13, moe.w2, x)
            run = fused_moe_half_gemv if on_gemv else fused_moe
            return run(x, moe.w13, moe.w2, topk_weights, topk_ids, pdl, addend, moe.shared_expert)
        return fused_moe_reference(x, moe.w13, moe.w2, topk_weights, topk_ids, addend=addend)


def make_expert_method(config: object) -> UnquantizedExpertMethod:
    return UnquantizedExpertMethod()
