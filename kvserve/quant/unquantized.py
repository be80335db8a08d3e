"""Dense weight in the model dtype: ``y = x @ W.T + b``."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.kernels._triton import hopper_or_newer
from kvserve.kernels.skinny_gemm import MAX_ROWS as SKINNY_MAX_ROWS
from kvserve.kernels.skinny_gemm import skinny_linear
from kvserve.kernels.word_gemv import GEMV_ROWS, half_gemv
from kvserve.quant.method import (
    SixteenBitInput,
    copy_checked,
    rows_from_env,
    shard_rows,
    unknown_param,
)

if TYPE_CHECKING:
    from kvserve.layers.linear import Linear


class UnquantizedLinearMethod(SixteenBitInput):
    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        shape = (layer.out_features, layer.in_features)
        layer.weight = nn.Parameter(torch.empty(shape, dtype=dtype), False)

    def checkpoint_params(self, layer: Linear) -> tuple[str, ...]:
        return ("weight",)

    def load_param(self, layer: Linear, name: str, loaded: torch.Tensor, shard: int) -> None:
        if name != "weight":
            raise unknown_param(layer, name, "unquantized")
        copy_checked(layer.weight.data[shard_rows(layer, shard)], loaded, f"{layer.prefix}.weight")

    def process_after_loading(self, layer: Linear) -> None:
        pass

    def init_dummy(self, layer: Linear, gen: torch.Generator) -> None:
        layer.weight.data.uniform_(-0.02, 0.02, generator=gen)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if _gemv_here(layer.weight, x):
            return half_gemv(x, layer.weight, bias, pdl=layer.launch_pdl)
        if x.shape[0] <= skinny_max_rows() and x.is_cuda and hopper_or_newer(x.device):
            return skinny_linear(x, layer.weight, None, bias, pdl=layer.launch_pdl)
        return F.linear(x, layer.weight, bias)

    def apply_gated(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        if not _gemv_here(layer.weight, x):
            return None
        return half_gemv(x, layer.weight, pdl=layer.launch_pdl, gated=True)


def _gemv_here(weight: torch.Tensor, x: torch.Tensor) -> bool:
    """A step of at most ``gemv_rows_for(weight)`` tokens, 16-bit and on a GPU, weight and x
    alike."""
    return (
        0 < x.shape[0] <= gemv_rows_for(weight.numel()) and x.is_cuda and x.dtype == weight.dtype
        and x.dtype in (torch.bfloat16, torch.float16) and x.shape[-1] % 2 == 0
    )  # fmt: skip


SKINNY_ROWS_ENV = "KVSERVE_BF16_SKINNY_ROWS"
GEMV_ROWS_ENV = "KVSERVE_BF16_GEMV_ROWS"


# With KVSERVE_BF16_GEMV_ROWS unset, one-token steps of weights of at most this many values take
# the GEMV: launched dependently, it loads its weights while the kernel before still runs, which
# cuBLAS cannot, and that pays where the read is short. On the H200 at batch 1 (s42, one machine,
# alternating): Qwen3-30B-A3B (q/k/v 10.5M values, o 8.4M) 309 / 309 -> 318 / 318 tok/s with its
# layers on the GEMV; Llama-3-8B (16.8M-117M) 213 / 211 -> 210 / 210, and its gate/up and down
# alone were slower on it (64.7 / 33.9 against cuBLAS's 55.5 / 30.7 us), so they stay on cuBLAS.
GEMV_SMALL_WEIGHT = 12 * 2**20


@functools.cache
def gemv_max_rows() -> int | None:
    """``KVSERVE_BF16_GEMV_ROWS`` (0-4): steps of at most this many tokens take the word GEMV
    (``kernels/word_gemv.py``'s ``half_gemv``: two 16-bit weights a word, fp32 FMAs) instead of
    cuBLAS, for every bf16/fp16 layer; None when unset (``gemv_rows_for``'s rule)."""
    if GEMV_ROWS_ENV not in os.environ:
        return None
    return rows_from_env(GEMV_ROWS_ENV, 0, GEMV_ROWS)


def gemv_rows_for(weight_values: int) -> int:
    """The most tokens a step of a weight of this many values runs on the GEMV: the setting,
    or unset, one token for weights of at most ``GEMV_SMALL_WEIGHT`` values."""
    rows = gemv_max_rows()
    if rows is None:
        return 1 if weight_values <= GEMV_SMALL_WEIGHT else 0
    return rows


@functools.cache
def skinny_max_rows() -> int:
    """Steps of at most this many tokens (0-64) take the swap-AB kernel of
    ``kernels/skinny_gemm.py`` on sm_90+ instead of cuBLAS (``KVSERVE_BF16_SKINNY_ROWS``; off by
    default). With it at 64, Qwen3-30B-A3B decoded 306 / 3,492 tok/s at batch 1 / 64 against
    303 / 3,494 on cuBLAS (moe_decode_h200_s35_head{,_skinny}, one machine): within noise."""
    return rows_from_env(SKINNY_ROWS_ENV, 0, SKINNY_MAX_ROWS)


def make_method(config: object) -> UnquantizedLinearMethod:
    return UnquantizedLinearMethod()
