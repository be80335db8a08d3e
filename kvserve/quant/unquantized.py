"""Dense weight in the model dtype: ``y = x @ W.T + b``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.quant.method import copy_checked, shard_rows, unknown_param

if TYPE_CHECKING:
    from kvserve.layers.linear import Linear


class UnquantizedLinearMethod:
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
        return F.linear(x, layer.weight, bias)


def make_method(config: object) -> UnquantizedLinearMethod:
    return UnquantizedLinearMethod()
