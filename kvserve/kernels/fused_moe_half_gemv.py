"""Decode steps of 16-bit (bf16 or fp16) experts on the word GEMV of ``word_gemv.py``, one slot
per program row, two weights a 32-bit word (``half_gemv``'s decoding), each token's k rows and a
shared expert's output summed in the down GEMV's epilogue: what FP4 experts do by default and
FP8 ones (``KVSERVE_FP8_MOE_GEMV``, on by default), in place of the grouped MMA kernel of
``fused_moe.py``. ``KVSERVE_BF16_MOE_GEMV=1`` turns it on; off by default: on the H200 it took
Qwen3-30B-A3B bf16 batch 1 from 310 / 305 to 301 / 303 tok/s (moe_decode_h200_s42_q3_bf16_*,
alternating, one machine), with the GEMV's default tiles (no tuned ``bfloat16_gemv`` entry).
The result is ``fused_moe_reference``'s within bf16 rounding, as ``fused_moe``'s."""

from __future__ import annotations

import functools

import torch

from kvserve.config import env_switch
from kvserve.kernels.fused_moe import ExpertGemm, fused_moe_with, one_slot_per_block
from kvserve.kernels.moe_tiles import expert_tiles
from kvserve.kernels.word_gemv import gated_gemv_enabled, moe_gemv

HALF_MOE_GEMV_ENV = "KVSERVE_BF16_MOE_GEMV"


@functools.cache
def half_moe_gemv_enabled() -> bool:
    """``KVSERVE_BF16_MOE_GEMV``: 1 runs 16-bit experts' decode steps on the word GEMV; 0 (the
    default) on the grouped MMA kernel."""
    return env_switch(HALF_MOE_GEMV_ENV, default=False)


def half_moe_gemv_here(num_slots: int, w13: torch.Tensor, w2: torch.Tensor, x: torch.Tensor,
                       ) -> bool:  # fmt: skip
    """A decode step (one slot per expert block) with the switch on, 16-bit experts in x's
    dtype, both stacks' K even (two weights a word)."""
    return (
        x.dtype in (torch.bfloat16, torch.float16) and w13.dtype == w2.dtype == x.dtype
        and w13.shape[2] % 2 == 0 and w2.shape[2] % 2 == 0
        and one_slot_per_block(num_slots, w13.shape[0]) and half_moe_gemv_enabled()
    )  # fmt: skip


def fused_moe_half_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    pdl: bool = False,
    addend: torch.Tensor | None = None,
    shared: bool = False,
) -> torch.Tensor:
    """``fused_moe`` (same arguments) for a step ``half_moe_gemv_here`` accepts. Tiles: the
    table's ``<dtype>_gemv`` entries, else the GEMV's default."""
    kind = str(w13.dtype).removeprefix("torch.") + "_gemv"
    tiles = expert_tiles(kind, w13.shape, topk_ids, x.device, {}, shared)
    gated = gated_gemv_enabled()
    gemm = half_expert_gemv(w13, w2, pdl, gated)
    return fused_moe_with(
        x, topk_weights, topk_ids, w13.shape[0], w2.shape[1], gemm, tiles, pdl, addend,
        gated_gate_up=gated,
    )  # fmt: skip


def half_expert_gemv(
    w13: torch.Tensor, w2: torch.Tensor, pdl: bool = False, gated: bool = False
) -> ExpertGemm:
    """``fused_moe_half_gemv``'s GEMM over these stacks (decode steps: ``blocks`` is each
    slot's expert); ``gated``: the gate/up GEMV applies the SiLU-mul."""
    stacks = (w13, w2)

    def gemm(a, which, blocks, num_slots, top_k, config, row_weights, token_sum):  # noqa: ANN001, ANN202
        route = (blocks, top_k, row_weights)
        return moe_gemv(a, stacks[which].view(torch.uint8), (None, None), config, 8, route,
                        token_sum, pdl, half_weights=True, gated=gated and which == 0)  # fmt: skip

    return gemm
